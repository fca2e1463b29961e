"""Post-build validation of TensorRT-LLM engine config.json (tensorrt_llm/builder.py EngineConfig): hand-written
configs for every mode pass; each silent builder change fails with a message naming it."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from pipeline.errors import BuildError
from pipeline.trtllm.engine_config import ExpectedEngine, engine_problems, validate_engine_dir

BASE_PRETRAINED = {
    "architecture": "LlamaForCausalLM",
    "dtype": "bfloat16",
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "hidden_size": 4096,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "mapping": {"world_size": 1, "tp_size": 1, "pp_size": 1},
    "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"},
}
BASE_BUILD = {
    "max_input_len": 1024,
    "max_seq_len": 2048,
    "max_batch_size": 8,
    "max_beam_width": 1,
    "max_num_tokens": 8192,
    "opt_num_tokens": None,
    "max_draft_len": 0,
    "speculative_decoding_mode": 1,
    "gather_context_logits": False,
    "gather_generation_logits": False,
    "kv_cache_type": "PAGED",
    "plugin_config": {
        "gpt_attention_plugin": "auto",
        "gemm_plugin": None,
        "context_fmha": True,
        "use_paged_context_fmha": True,
        "use_fp8_context_fmha": True,
        "remove_input_padding": True,
        "tokens_per_block": 32,
        "multiple_profiles": True,
    },
}


def expected(role: str, mode: str = "none", k: int = 0, **overrides) -> ExpectedEngine:
    fields = dict(
        role=role, speculative_decoding_mode=mode, max_draft_len=k, paged_context_fmha=True, quant_algo="FP8",
        kv_cache_quant_algo="FP8", tp=1, pp=1, max_batch_size=8, max_input_len=1024, max_seq_len=2048,
        gather_generation_logits=False, version="1.2.1",
    )
    fields.update(overrides)
    return ExpectedEngine(**fields)


def write_engine(directory: Path, config: dict, ranks: int = 1) -> Path:
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(config))
    for rank in range(ranks):
        (directory / f"rank{rank}.engine").write_bytes(b"\0")
    return directory


def config(pretrained: dict | None = None, build: dict | None = None, version: str = "1.2.1") -> dict:
    cfg = {"version": version, "pretrained_config": copy.deepcopy(BASE_PRETRAINED), "build_config": copy.deepcopy(BASE_BUILD)}
    for key, value in (pretrained or {}).items():
        cfg["pretrained_config"][key] = value
    for key, value in (build or {}).items():
        cfg["build_config"][key] = value
    return cfg


# One hand-written engine config per mode, with the expectation the plan would attach.
GOOD = {
    "baseline": (config(), expected("baseline"), 1),
    "dtm-target": (
        config(build={"speculative_decoding_mode": 2, "max_draft_len": 5, "max_seq_len": 2053, "gather_generation_logits": True}),
        expected("target", "draft_tokens_external", 5, gather_generation_logits=True),
        1,
    ),
    "dtm-draft": (
        config(pretrained={"num_hidden_layers": 16, "hidden_size": 2048}, build={"gather_generation_logits": True}),
        expected("draft", gather_generation_logits=True),
        1,
    ),
    "medusa": (
        config(
            pretrained={"architecture": "MedusaForCausalLM", "num_medusa_heads": 4, "num_medusa_layers": 1, "max_draft_len": 63},
            build={"speculative_decoding_mode": "medusa", "max_draft_len": 63, "max_seq_len": 2111},
        ),
        expected("speculative", "medusa", 63, architecture="MedusaForCausalLM", num_medusa_heads=4),
        1,
    ),
    "eagle": (
        config(
            pretrained={"architecture": "EagleForCausalLM", "num_eagle_layers": 4, "max_draft_len": 63,
                        "max_non_leaves_per_layer": 10, "eagle_net_config": {}, "quantization": {"quant_algo": None, "kv_cache_quant_algo": None}},
            build={"speculative_decoding_mode": 32, "max_draft_len": 63, "max_seq_len": 2115},
        ),
        expected("speculative", "eagle", 63, architecture="EagleForCausalLM", num_eagle_layers=4, quant_algo=None,
                 kv_cache_quant_algo=None),
        1,
    ),
    "tp2-awq": (
        config(
            pretrained={"mapping": {"world_size": 2, "tp_size": 2, "pp_size": 1},
                        "quantization": {"quant_algo": "W4A16_AWQ", "kv_cache_quant_algo": None, "group_size": 128}},
        ),
        expected("baseline", quant_algo="W4A16_AWQ", kv_cache_quant_algo=None, tp=2),
        2,
    ),
}


@pytest.mark.parametrize("mode", sorted(GOOD))
def test_matching_engine_passes(tmp_path: Path, mode: str) -> None:
    cfg, exp, ranks = GOOD[mode]
    engine = write_engine(tmp_path / mode, cfg, ranks)
    assert engine_problems(engine, exp) == []
    validate_engine_dir(engine, exp, "build-x")  # does not raise


# (name, base mode, how the builder changed it, expected message fragment)
SILENT_CHANGES = [
    ("paged-fmha-off", "dtm-target", lambda c: c["build_config"]["plugin_config"].update(use_paged_context_fmha=False),
     "plugin_config.use_paged_context_fmha is off"),
    ("draft-len-lowered", "dtm-target", lambda c: c["build_config"].update(max_draft_len=0),
     "build_config.max_draft_len is 0, expected at least 5"),
    ("mode-dropped", "dtm-target", lambda c: c["build_config"].update(speculative_decoding_mode=1),
     "speculative_decoding_mode is 1 (none), expected draft_tokens_external (2)"),
    ("quant-algo-dropped", "baseline", lambda c: c["pretrained_config"]["quantization"].update(quant_algo=None),
     "quantization.quant_algo is None, expected 'FP8'"),
    ("kv-dtype-changed", "baseline", lambda c: c["pretrained_config"]["quantization"].update(kv_cache_quant_algo="INT8"),
     "kv_cache_quant_algo is 'INT8', expected 'FP8'"),
    ("missing-rank-file", "tp2-awq", None, "missing rank1.engine"),
    ("version-mismatch", "baseline", lambda c: c.update(version="1.1.0"), "version is '1.1.0', expected TensorRT-LLM 1.2.1"),
    ("batch-size-changed", "baseline", lambda c: c["build_config"].update(max_batch_size=4),
     "max_batch_size is 4, expected 8"),
    ("seq-len-clipped", "baseline", lambda c: c["build_config"].update(max_seq_len=1024),
     "max_seq_len is 1024, expected at least 2048"),
    ("logits-missing", "dtm-draft", lambda c: c["build_config"].update(gather_generation_logits=False),
     "gather_generation_logits is False, expected on"),
    ("tp-changed", "tp2-awq", lambda c: c["pretrained_config"]["mapping"].update(tp_size=1, world_size=1),
     "mapping is tp=1 pp=1, expected tp=2 pp=1"),
    ("medusa-arch", "medusa", lambda c: c["pretrained_config"].update(architecture="LlamaForCausalLM"),
     "architecture is 'LlamaForCausalLM', expected MedusaForCausalLM"),
    ("eagle-layers", "eagle", lambda c: c["pretrained_config"].update(num_eagle_layers=1),
     "num_eagle_layers is 1, expected 4"),
    ("context-logits-with-drafts", "dtm-target", lambda c: c["build_config"].update(gather_context_logits=True),
     "gather_context_logits is on with max_draft_len > 0"),
    ("num-tokens-too-small", "dtm-target", lambda c: c["build_config"].update(max_num_tokens=40),
     "max_num_tokens is 40, below max_batch_size × (max_draft_len + 1) = 48"),
]


@pytest.mark.parametrize("name,mode,change,message", SILENT_CHANGES, ids=[c[0] for c in SILENT_CHANGES])
def test_silent_builder_change_fails_with_specific_message(tmp_path: Path, name, mode, change, message) -> None:
    cfg, exp, ranks = GOOD[mode]
    cfg = copy.deepcopy(cfg)
    if change is not None:
        change(cfg)
    else:
        ranks -= 1
    engine = write_engine(tmp_path / name, cfg, ranks)
    problems = engine_problems(engine, exp)
    assert len(problems) == 1, problems
    assert message in problems[0]
    with pytest.raises(BuildError) as err:
        validate_engine_dir(engine, exp, "build-target")
    assert "step build-target" in str(err.value) and message in str(err.value)


def test_several_changes_are_all_named(tmp_path: Path) -> None:
    cfg = copy.deepcopy(GOOD["dtm-target"][0])
    cfg["build_config"]["plugin_config"]["use_paged_context_fmha"] = False
    cfg["build_config"]["max_draft_len"] = 2
    engine = write_engine(tmp_path / "e", cfg)
    problems = engine_problems(engine, GOOD["dtm-target"][1])
    assert len(problems) == 2


def test_old_format_engine_rejected(tmp_path: Path) -> None:
    engine = write_engine(tmp_path / "old", {"builder_config": {}, "plugin_config": {}})
    assert engine_problems(engine, expected("baseline")) == [
        "old-format engine (builder_config, no version): rebuild it with the pinned TensorRT-LLM"
    ]


def test_missing_config_json(tmp_path: Path) -> None:
    (tmp_path / "e").mkdir()
    assert "config.json is missing" in engine_problems(tmp_path / "e", expected("baseline"))[0]


def test_symbolic_and_integer_modes_accepted(tmp_path: Path) -> None:
    for i, value in enumerate([2, "draft_tokens_external", "SpeculativeDecodingMode.DRAFT_TOKENS_EXTERNAL"]):
        cfg = copy.deepcopy(GOOD["dtm-target"][0])
        cfg["build_config"]["speculative_decoding_mode"] = value
        assert engine_problems(write_engine(tmp_path / str(i), cfg), GOOD["dtm-target"][1]) == []


def test_draft_target_pair_rules(tmp_path: Path) -> None:
    from pipeline.trtllm.engine_config import draft_target_pair_problems

    target = write_engine(tmp_path / "t", GOOD["dtm-target"][0])
    draft = write_engine(tmp_path / "d", GOOD["dtm-draft"][0])
    assert draft_target_pair_problems(target, draft) == []
    bad = copy.deepcopy(GOOD["dtm-draft"][0])
    bad["build_config"].update(gather_generation_logits=False, max_batch_size=4, speculative_decoding_mode=2)
    bad["pretrained_config"]["vocab_size"] = 32000
    problems = draft_target_pair_problems(target, write_engine(tmp_path / "bad", bad))
    assert len(problems) == 4


# ------------------------------------------------------------------------------------------------
# The TensorRT-LLM checkpoint a quantize / convert step wrote, before trtllm-build reads it

from pipeline.trtllm.checkpoint_config import ExpectedCheckpoint, checkpoint_problems  # noqa: E402 - grouped with the tests that use it


def _checkpoint(tmp_path: Path, ranks: int = 2, **config) -> Path:
    base = {"architecture": "MedusaForCausalLM", "num_medusa_heads": 4, "mapping": {"world_size": 2, "tp_size": 2, "pp_size": 1},
            "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}}
    base.update(config)
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps(base))
    for rank in range(ranks):
        (tmp_path / f"rank{rank}.safetensors").write_bytes(b"w")
    return tmp_path


MEDUSA_TP2 = ExpectedCheckpoint(role="speculative", quant_algo="FP8", kv_cache_quant_algo="FP8", tp=2, pp=1,
                                architecture="MedusaForCausalLM", num_medusa_heads=4)


def test_matching_checkpoint_passes(tmp_path):
    assert checkpoint_problems(_checkpoint(tmp_path), MEDUSA_TP2) == []


def test_checkpoint_mismatches_are_each_named(tmp_path):
    directory = _checkpoint(tmp_path, ranks=1, architecture="LlamaForCausalLM", num_medusa_heads=2,
                            quantization={"quant_algo": "W4A16_AWQ", "kv_cache_quant_algo": None})
    problems = checkpoint_problems(directory, MEDUSA_TP2)
    assert problems[0] == "quantization.quant_algo is 'W4A16_AWQ', the plan expects 'FP8'"
    assert problems[1].startswith("quantization.kv_cache_quant_algo is None, the plan expects 'FP8'")
    assert problems[2:] == [
        "weight files ['rank0.safetensors'] do not match tp×pp = 2 (expected ['rank0.safetensors', 'rank1.safetensors'])",
        "architecture is 'LlamaForCausalLM', the plan expects MedusaForCausalLM",
        "num_medusa_heads is 2, the plan expects 4",
    ]
    assert checkpoint_problems(tmp_path / "absent", MEDUSA_TP2) == [f"{tmp_path / 'absent' / 'config.json'} is missing"]
