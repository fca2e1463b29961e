"""Preflight: GPU × quantization × KV dtype × method matrix, method and parallelism rules, files,
tokenizer compatibility on real (tiny) BPE tokenizers, Medusa/EAGLE head checks and memory fit."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from pipeline.config import (
    chain_choices,
    format_choices,
    parse_config,
    tree_non_leaves_per_level,
    tree_problems,
)
from pipeline.facts.hardware import get_profile
from pipeline.facts.memory_fit import GIB, estimate_memory
from pipeline.facts.model_shapes import known_shape
from pipeline.validate.preflight import errors_of, run_preflight
from pipeline.validate.tokenizer_compat import compare_tokenizers
from tests.gpu_sim.container import make_container

TARGET_8B = "/models/Meta-Llama-3.1-8B-Instruct"


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    return make_container(tmp_path_factory.mktemp("image"))


@pytest.fixture(autouse=True)
def in_image(image, monkeypatch):
    """Online checks look for the TensorRT-LLM scripts: run them as on the NGC image."""
    monkeypatch.setenv("SPECDEPLOY_TRTLLM_ROOT", str(image.app))
DRAFT_1B = "/models/Llama-3.2-1B-Instruct"


def gpu_config(hardware="h100-sxm-80gb", fmt="none", kv="auto", method="none", **overrides):
    spec = {
        "none": {"method": "none"},
        "draft_target": {"method": "draft_target", "draft": {"checkpoint": DRAFT_1B, "quantization": {"format": fmt if fmt != "nvfp4" else "none"}}},
        "medusa": {"method": "medusa", "heads_dir": "/models/medusa-llama31-8b", "num_heads": 3},
        "eagle": {"method": "eagle", "head_dir": "/models/EAGLE-LLaMA3-Instruct-8B", "num_layers": 3},
    }[method]
    data = {
        "name": "matrix",
        "backend": "trtllm",
        "hardware": hardware,
        "target": {"checkpoint": TARGET_8B, "quantization": {"format": fmt, "kv_cache_dtype": kv}},
        "speculation": spec,
        "build": {"max_batch_size": 8, "max_input_len": 1024, "max_seq_len": 2048},
        "triton": {"kv_cache_free_gpu_mem_fraction": 0.45},
    }
    for dotted, value in overrides.items():
        node = data
        *parents, leaf = dotted.split("__")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return parse_config(data)


def by_severity(findings, severity):
    return {f.check for f in findings if f.severity == severity}


# (hardware, format, kv dtype, method, expected error checks, expected warning checks ⊆)
MATRIX = [
    ("h100-sxm-80gb", "none", "auto", "none", set(), set()),
    ("h100-sxm-80gb", "fp8", "auto", "none", set(), set()),
    ("h100-sxm-80gb", "fp8", "fp8", "draft_target", set(), set()),
    ("h100-pcie-80gb", "w4a8_awq", "fp8", "draft_target", set(), set()),
    ("h200-141gb", "int4_awq", "auto", "draft_target", set(), set()),
    ("l40s-48gb", "fp8", "fp8", "none", set(), set()),
    ("a100-80gb", "int4_awq", "auto", "draft_target", set(), set()),
    ("a100-80gb", "int8_sq", "auto", "none", set(), set()),
    ("a100-40gb", "int8_wo", "auto", "medusa", set(), {"method"}),
    ("b200-180gb", "nvfp4", "fp8", "none", set(), set()),
    ("a100-80gb", "fp8", "auto", "none", {"gpu-quant"}, set()),
    ("a100-40gb", "w4a8_awq", "auto", "none", {"gpu-quant"}, set()),
    ("h100-sxm-80gb", "nvfp4", "auto", "none", {"gpu-quant"}, set()),
    ("b200-180gb", "int8_sq", "auto", "none", {"gpu-quant"}, set()),
    ("h100-sxm-80gb", "int4_awq", "fp8", "draft_target", {"kv-dtype"}, set()),
    ("h100-sxm-80gb", "fp8", "int8", "draft_target", {"kv-dtype"}, set()),
    ("a100-80gb", "none", "fp8", "draft_target", {"kv-dtype"}, set()),
    # the builder drops paged context FMHA for these KV dtypes; KV reuse (on by default) and EAGLE need it
    ("h100-sxm-80gb", "int4_awq", "fp8", "none", {"kv-dtype"}, set()),
    ("a100-80gb", "int8_sq", "int8", "none", {"kv-dtype"}, set()),
    ("h100-sxm-80gb", "none", "int8", "eagle", {"kv-dtype"}, set()),
    ("h100-sxm-80gb", "int4_awq", "fp8", "eagle", {"kv-dtype", "method"}, set()),
    ("a100-80gb", "none", "fp8", "medusa", {"kv-dtype"}, set()),
    ("h100-sxm-80gb", "fp8", "fp8", "eagle", set(), set()),
    ("h100-sxm-80gb", "int4_awq", "auto", "eagle", {"method"}, set()),
    ("h100-sxm-80gb", "none", "fp32", "none", {"kv-dtype"}, set()),
]


@pytest.mark.parametrize(
    "hardware,fmt,kv,method,errors,warnings", MATRIX,
    ids=[f"{h}-{f}-{k}-{m}" for h, f, k, m, *_ in MATRIX],
)
def test_arch_quant_kv_method_matrix(hardware, fmt, kv, method, errors, warnings):
    findings = run_preflight(gpu_config(hardware, fmt, kv, method), offline=True)
    assert by_severity(findings, "error") == errors, [f.line() for f in errors_of(findings)]
    assert warnings <= by_severity(findings, "warning")


def test_fp8_on_a100_suggests_ampere_formats():
    (finding,) = errors_of(run_preflight(gpu_config("a100-80gb", "fp8"), offline=True))
    assert finding.field == "target.quantization.format"
    assert "int4_awq" in finding.fix and "int8_sq" in finding.fix
    assert "h100-sxm-80gb" in finding.message


def test_nvfp4_fix_names_blackwell():
    (finding,) = errors_of(run_preflight(gpu_config("h100-sxm-80gb", "nvfp4"), offline=True))
    assert "Blackwell" in finding.fix


def test_kv_reuse_error_names_the_setting():
    findings = run_preflight(gpu_config("h100-sxm-80gb", "int4_awq", "fp8"), offline=True)
    (error,) = [f for f in findings if f.check == "kv-dtype"]
    assert error.severity == "error"
    assert "enable_kv_cache_reuse" in error.message and "use_paged_context_fmha" in error.message
    assert "enable_kv_cache_reuse: false" in error.fix


@pytest.mark.parametrize("method", ["none", "medusa"])
def test_lost_paged_fmha_without_kv_reuse_is_a_note_and_the_plan_disables_it(method):
    cfg = gpu_config("a100-80gb", "int8_sq", "int8", method, triton__enable_kv_cache_reuse=False)
    findings = run_preflight(cfg, offline=True)
    (note,) = [f for f in findings if f.check == "kv-dtype"]
    assert note.severity == "info" and "--use_paged_context_fmha disable" in note.message


# ---------------------------------------------------------------------------------------------
# method, version, backend and parallelism rules

RULES = [
    ({"method": "medusa", "build__max_beam_width": 2}, "build.max_beam_width"),
    ({"method": "eagle", "build__max_batch_size": 600}, "build.max_batch_size"),
    ({"method": "eagle", "target__pp": 2}, "target.pp"),
    ({"method": "eagle", "trtllm_version": "0.14.0"}, "trtllm_version"),
    ({"method": "draft_target", "speculation__use_draft_logits": True}, "build.gather_generation_logits"),
    ({"method": "draft_target", "triton__enable_kv_cache_reuse": False}, "triton.enable_kv_cache_reuse"),
    ({"trtllm_version": "1.3.0", "trtllm_runtime": "engine"}, "trtllm_version"),
    ({"target__tp": 3}, "target.tp"),
    ({"target__tp": 16}, "target.tp"),
    ({"method": "draft_target", "speculation__draft__tp": 3}, "speculation.draft.tp"),
    ({"hardware": "cpu"}, "backend"),
    ({"backend": "reference"}, "backend"),
]


@pytest.mark.parametrize("overrides,field", RULES, ids=[r[1] + "-" + str(i) for i, r in enumerate(RULES)])
def test_rule_errors_name_their_field(overrides, field):
    overrides = dict(overrides)
    method = overrides.pop("method", "none")
    errors = errors_of(run_preflight(gpu_config(method=method, **overrides), offline=True))
    assert field in {f.field for f in errors}, [f.line() for f in errors]
    assert all(f.fix for f in errors)


def test_reference_backend_rules():
    data = {
        "name": "cpu", "backend": "reference", "hardware": "cpu",
        "target": {"checkpoint": "builtin:tiny-target", "dtype": "float32", "tp": 2, "quantization": {"format": "fp8"}},
    }
    errors = errors_of(run_preflight(parse_config(data), offline=True))
    assert {f.field for f in errors} == {"target.tp", "target.quantization.format"}
    data["target"].update(tp=1, quantization={"format": "int8_wo"})
    assert errors_of(run_preflight(parse_config(data), offline=True)) == []


@pytest.mark.parametrize("method,dtype,warned", [
    ("medusa", "float32", False), ("medusa", "float64", True), ("none", "float32", True),
    ("dt-engine", "float32", False), ("dt-bls", "float32", True), ("trtllm", "float32", True),
])
def test_int8_draft_weights_warn_where_they_do_nothing(method, dtype, warned):
    dt = {"method": "draft_target", "draft": {"checkpoint": "builtin:tiny-draft"}, "num_draft_tokens": 4}
    spec = {"medusa": {"method": "medusa", "heads_dir": "builtin:tiny-medusa", "num_heads": 4}, "none": {"method": "none"},
            "dt-engine": {**dt, "orchestration": "engine"}, "dt-bls": {**dt, "orchestration": "bls"}, "trtllm": dt}[method]
    data = {"name": "cpu", "backend": "reference", "hardware": "cpu", "speculation": spec,
            "target": {"checkpoint": "builtin:tiny-target", "dtype": "float32"},
            "reference": {"draft_weights": "int8", "compute_dtype": dtype}}
    if method == "trtllm":
        data.update(backend="trtllm", hardware="h100-sxm-80gb", target={"checkpoint": TARGET_8B},
                    speculation={**dt, "draft": {"checkpoint": DRAFT_1B}})
    findings = [f for f in run_preflight(parse_config(data), offline=True) if f.check == "draft-weights"]
    assert [(f.severity, f.field) for f in findings] == ([("warning", "reference.draft_weights")] if warned else [])


def test_offline_says_what_it_skipped():
    findings = run_preflight(gpu_config(method="draft_target"), offline=True)
    notes = [f.message for f in findings if f.check == "offline"]
    assert any("target, draft" in note for note in notes)
    assert any("example scripts not looked for" in note for note in notes)


def test_unknown_model_offline_skips_memory_with_a_note():
    cfg = parse_config({"name": "x", "target": {"checkpoint": "/models/my-private-model"}})
    findings = run_preflight(cfg, offline=True)
    assert errors_of(findings) == []
    assert any(f.check == "memory-fit" and "not estimated" in f.message for f in findings)


def test_unknown_builtin_is_an_error_online():
    cfg = parse_config({"name": "x", "backend": "reference", "hardware": "cpu",
                        "target": {"checkpoint": "builtin:no-such-model", "dtype": "float32"}})
    errors = errors_of(run_preflight(cfg, offline=False))
    assert [f.field for f in errors] == ["target.checkpoint"]
    assert "no-such-model" in errors[0].message


# ---------------------------------------------------------------------------------------------
# tree helpers (structure errors are config errors: see test_config_invalid.py)


def test_tree_helpers():
    tree = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]
    assert tree_problems(tree) == []
    assert tree_non_leaves_per_level(tree) == [1, 2, 1]
    assert chain_choices(3) == [[0], [0, 0], [0, 0, 0]]
    assert format_choices([[0], [0, 1]]) == "{0}, {0, 1}"
    assert tree_problems([[0, 1]]) == ["path [0, 1] needs its prefix [0] in the tree"]


def test_default_medusa_tree_is_a_chain_of_heads():
    cfg = gpu_config(method="medusa")
    assert cfg.speculation.tree == [[0], [0, 0], [0, 0, 0]]
    assert cfg.speculation.engine_max_draft_len == 3


# ---------------------------------------------------------------------------------------------
# checkpoints on disk: tiny Llama-shaped dirs with real BPE tokenizers

BASE_VOCAB = ["<unk>", "a", "b", "c", "d", "e", "h", "l", "o", "ab", "cd", "he", "ll", "hell", "hello"]
MERGES = [("a", "b"), ("c", "d"), ("h", "e"), ("l", "l"), ("he", "ll"), ("hell", "o")]


def write_tokenizer(directory: Path, vocab_tokens=BASE_VOCAB, eos="</s>") -> None:
    from tokenizers import Tokenizer
    from tokenizers.models import BPE

    vocab = {tok: i for i, tok in enumerate(vocab_tokens)}
    merges = [m for m in MERGES if m[0] in vocab and m[1] in vocab and m[0] + m[1] in vocab]
    tokenizer = Tokenizer(BPE(vocab=vocab, merges=merges, unk_token="<unk>"))
    tokenizer.add_special_tokens(["<s>", eos])
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": eos}))


def write_checkpoint(directory: Path, vocab_size: int = 17, hidden: int = 64, tokenizer=True, **tok_kwargs) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab_size,
        "hidden_size": hidden, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "max_position_embeddings": 4096, "tie_word_embeddings": False,
    }
    (directory / "config.json").write_text(json.dumps(config))
    save_file({"model.embed_tokens.weight": np.zeros((vocab_size, hidden), np.float32)}, str(directory / "model.safetensors"))
    if tokenizer:
        write_tokenizer(directory, **tok_kwargs)
    return directory


def dt_config(target: Path, draft: Path, **extra) -> object:
    data = {
        "name": "dt", "hardware": "h100-sxm-80gb",
        "target": {"checkpoint": str(target)},
        "speculation": {"method": "draft_target", "draft": {"checkpoint": str(draft)}},
        "build": {"max_batch_size": 4, "max_input_len": 256, "max_seq_len": 512},
        "triton": {"kv_cache_free_gpu_mem_fraction": 0.45},
        **extra,
    }
    return parse_config(data)


def test_identical_tokenizers_are_compatible(tmp_path):
    target = write_checkpoint(tmp_path / "target")
    draft = write_checkpoint(tmp_path / "draft")
    assert compare_tokenizers(target, draft) == []
    findings = run_preflight(dt_config(target, draft), offline=False)
    assert errors_of(findings) == [], [f.line() for f in findings]
    assert any(f.check == "memory-fit" and f.message.startswith("fits") for f in findings)


def test_one_changed_token_is_named(tmp_path):
    target = write_checkpoint(tmp_path / "target")
    changed = [t if t != "hello" else "hellp" for t in BASE_VOCAB]
    draft = write_checkpoint(tmp_path / "draft", vocab_tokens=changed)
    errors = errors_of(run_preflight(dt_config(target, draft), offline=False))
    assert [f.check for f in errors] == ["tokenizer"]
    assert "id 14: target 'hello' vs draft 'hellp'" in errors[0].message
    assert errors[0].field == "speculation.draft.checkpoint"


def test_special_token_difference_is_named(tmp_path):
    target = write_checkpoint(tmp_path / "target")
    draft = write_checkpoint(tmp_path / "draft", eos="<|eot|>")
    problems = compare_tokenizers(target, draft)
    assert any("eos_token differs: target '</s>' vs draft '<|eot|>'" in p for p in problems)


def test_config_vocab_size_mismatch(tmp_path):
    target = write_checkpoint(tmp_path / "target", vocab_size=17)
    draft = write_checkpoint(tmp_path / "draft", vocab_size=32)
    problems = compare_tokenizers(target, draft)
    assert problems == ["config.json vocab_size differs: target 17 vs draft 32"]
    errors = errors_of(run_preflight(dt_config(target, draft), offline=False))
    assert {f.check for f in errors} == {"tokenizer"}
    assert any("vocab_size differs" in f.message for f in errors)


def test_missing_files_are_reported(tmp_path):
    target = write_checkpoint(tmp_path / "target", tokenizer=False)
    draft = write_checkpoint(tmp_path / "draft")
    (draft / "model.safetensors").unlink()
    errors = errors_of(run_preflight(dt_config(target, draft), offline=False))
    lines = [f.line() for f in errors]
    assert any("target: tokenizer.json or tokenizer.model missing" in line for line in lines), lines
    assert any("draft: *.safetensors or pytorch_model*.bin missing" in line for line in lines), lines


def test_trtllm_routes_accept_bin_weights_the_cpu_engine_does_not(tmp_path):
    target = write_checkpoint(tmp_path / "target")
    draft = write_checkpoint(tmp_path / "draft")
    (draft / "model.safetensors").unlink()
    (draft / "pytorch_model.bin").write_bytes(b"\0")
    assert errors_of(run_preflight(dt_config(target, draft), offline=False)) == []
    cpu = dt_config(target, draft, backend="reference", hardware="cpu")
    lines = [f.line() for f in errors_of(run_preflight(cpu, offline=False)) if f.check == "files"]
    assert lines == [f"speculation.draft.checkpoint: draft: *.safetensors missing in {draft} (fix: the CPU reference "
                     "engine loads safetensors only: convert the .bin/.pt weights to safetensors (or build with "
                     "backend trtllm, which reads them))"]


def test_shard_index_names_missing_shards(tmp_path):
    target = write_checkpoint(tmp_path / "target")
    draft = write_checkpoint(tmp_path / "draft")
    (draft / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"model.embed_tokens.weight": "model.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    errors = errors_of(run_preflight(dt_config(target, draft), offline=False))
    assert [f.message for f in errors] == [
        "draft: model.safetensors.index.json names shards that are missing: model-00002-of-00002.safetensors"]


def test_missing_directory(tmp_path):
    target = write_checkpoint(tmp_path / "target")
    errors = errors_of(run_preflight(dt_config(target, tmp_path / "nowhere"), offline=False))
    assert [f.field for f in errors] == ["speculation.draft.checkpoint"]
    assert "does not exist" in errors[0].message


def _medusa_dir(path: Path, heads: int, hidden: int = 64, vocab: int = 17) -> Path:
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"medusa_num_heads": heads, "medusa_num_layers": 1,
                                                  "hidden_size": hidden, "vocab_size": vocab}))
    tensors = {}
    for i in range(heads):
        tensors[f"{i}.0.linear.weight"] = np.zeros((hidden, hidden), np.float32)
        tensors[f"{i}.0.linear.bias"] = np.zeros((hidden,), np.float32)
        tensors[f"{i}.1.weight"] = np.zeros((vocab, hidden), np.float32)
    save_file(tensors, str(path / "medusa_lm_head.safetensors"))
    return path


def _heads_config(target: Path, spec: dict) -> object:
    return parse_config({"name": "h", "target": {"checkpoint": str(target)}, "speculation": spec,
                         "build": {"max_batch_size": 4, "max_input_len": 256, "max_seq_len": 512}})


def test_medusa_heads_checked(tmp_path):
    target = write_checkpoint(tmp_path / "target")
    heads = _medusa_dir(tmp_path / "heads", heads=2)
    ok = _heads_config(target, {"method": "medusa", "heads_dir": str(heads), "num_heads": 2})
    assert errors_of(run_preflight(ok, offline=False)) == []
    too_many = _heads_config(target, {"method": "medusa", "heads_dir": str(heads), "num_heads": 3})
    errors = errors_of(run_preflight(too_many, offline=False))
    assert [f.field for f in errors] == ["speculation.num_heads"]
    (heads / "medusa_lm_head.safetensors").unlink()
    errors = errors_of(run_preflight(ok, offline=False))
    assert any("medusa_lm_head.safetensors missing" in f.message for f in errors)


def test_medusa_heads_for_another_model(tmp_path):
    target = write_checkpoint(tmp_path / "target")
    heads = _medusa_dir(tmp_path / "heads", heads=2, hidden=32)
    cfg = _heads_config(target, {"method": "medusa", "heads_dir": str(heads), "num_heads": 2})
    errors = errors_of(run_preflight(cfg, offline=False))
    assert any("hidden_size 32 does not match the target's 64" in f.message for f in errors)


def test_eagle_head_without_fc_bias(tmp_path):
    target = write_checkpoint(tmp_path / "target")
    head = tmp_path / "eagle"
    head.mkdir()
    (head / "config.json").write_text(json.dumps({"hidden_size": 64, "vocab_size": 17, "num_hidden_layers": 1}))
    save_file({"fc.weight": np.zeros((64, 128), np.float32)}, str(head / "model.safetensors"))
    cfg = _heads_config(target, {"method": "eagle", "head_dir": str(head), "num_layers": 2})
    errors = errors_of(run_preflight(cfg, offline=False))
    assert len(errors) == 1 and "fc.bias" in errors[0].message


def test_eagle_needs_llama_base(tmp_path):
    target = write_checkpoint(tmp_path / "target")
    config = json.loads((target / "config.json").read_text())
    config["architectures"] = ["Qwen2ForCausalLM"]
    (target / "config.json").write_text(json.dumps(config))
    cfg = _heads_config(target, {"method": "eagle", "head_dir": str(tmp_path / "missing"), "num_layers": 2})
    errors = errors_of(run_preflight(cfg, offline=False))
    assert any("LLaMA-architecture" in f.message for f in errors)


# ---------------------------------------------------------------------------------------------
# memory fit: Llama-3.1-8B BF16 on A100 40 GB. Weights 8.03e9 × 2 B = 14.96 GiB, KV 128 KiB per
# token × 2048 tokens = 0.25 GiB per sequence, activations ≈ 1.0 GiB, margin 2 GiB.


def _memory_config(batch: int):
    return gpu_config("a100-40gb", build__max_batch_size=batch)


def test_memory_rows_match_hand_computation():
    est = estimate_memory(_memory_config(80), get_profile("a100-40gb"), known_shape(TARGET_8B))
    rows = {r.component: r.gib for r in est.rows}
    assert rows["target weights"] == pytest.approx(8_030_261_248 * 2 / GIB, rel=1e-6)
    assert rows["target KV cache"] == pytest.approx(80 * 2048 * 128 * 1024 / GIB)
    assert rows["runtime margin"] == 2.0
    assert 0.9 < rows["activations"] < 1.2


@pytest.mark.parametrize(
    "batch,severity,start",
    [(8, "info", "fits"), (80, "warning", "thin headroom"), (96, "error", "does not fit")],
)
def test_memory_fit_verdicts(batch, severity, start):
    findings = run_preflight(_memory_config(batch), offline=True)
    memory = [f for f in findings if f.check == "memory-fit" and f.data]
    assert len(memory) == 1
    assert memory[0].severity == severity and memory[0].message.startswith(start)
    assert memory[0].data["estimate"]["fits"] is (severity != "error")


def test_tensor_parallel_divides_the_memory():
    one = estimate_memory(gpu_config(), get_profile("h100-sxm-80gb"), known_shape(TARGET_8B))
    four = estimate_memory(gpu_config(target__tp=4), get_profile("h100-sxm-80gb"), known_shape(TARGET_8B))
    kv = lambda e: next(r.gib for r in e.rows if r.component == "target KV cache")  # noqa: E731 - a one-line helper local to this test
    assert kv(four) == pytest.approx(kv(one) / 4)
    assert four.total_gib < one.total_gib


def test_draft_and_draft_length_add_memory():
    base = estimate_memory(gpu_config(), get_profile("h100-sxm-80gb"), known_shape(TARGET_8B))
    dt_cfg = gpu_config(method="draft_target")
    dt = estimate_memory(dt_cfg, get_profile("h100-sxm-80gb"), known_shape(TARGET_8B), known_shape(DRAFT_1B))
    components = [r.component for r in dt.rows]
    assert "draft weights" in components and "draft KV cache" in components
    assert dt.total_gib > base.total_gib
    dt_kv = next(r.gib for r in dt.rows if r.component == "target KV cache")
    base_kv = next(r.gib for r in base.rows if r.component == "target KV cache")
    assert dt_kv == pytest.approx(base_kv * (2048 + 4) / 2048)


def test_json_output_has_memory_table(tmp_path, capsys):
    import yaml

    from pipeline.cli import run

    data = copy.deepcopy(gpu_config().model_dump(mode="json"))
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    assert run(["validate", str(path), "--offline", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["ok"] is True and payload["memory"]["fits"] is True
    assert {r["component"] for r in payload["memory"]["rows"]} >= {"target weights", "target KV cache"}


def test_reference_backend_with_files_fits_in_host_memory(tmp_path):
    target = write_checkpoint(tmp_path / "target")
    heads = _medusa_dir(tmp_path / "heads", heads=2)
    cfg = parse_config({
        "name": "cpu-medusa", "backend": "reference", "hardware": "cpu",
        "target": {"checkpoint": str(target), "dtype": "float32"},
        "speculation": {"method": "medusa", "heads_dir": str(heads), "num_heads": 2},
        "build": {"max_batch_size": 4, "max_input_len": 256, "max_seq_len": 512},
    })
    findings = run_preflight(cfg, offline=False)
    assert errors_of(findings) == [], [f.line() for f in findings]
    (memory,) = [f for f in findings if f.check == "memory-fit" and f.data]
    estimate = memory.data["estimate"]
    assert estimate["device"].startswith("CPU") and estimate["fits"]
    assert {r["component"] for r in estimate["rows"]} >= {"target weights", "Medusa heads"}


def test_text_report_shows_findings_and_memory_table(tmp_path, capsys):
    import yaml

    from pipeline.cli import run
    from pipeline.errors import PreflightError

    data = gpu_config("a100-80gb", "fp8").model_dump(mode="json")
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(PreflightError) as exc_info:
        run(["validate", str(path), "--offline"])
    out = capsys.readouterr().out
    assert "Preflight findings" in out and "Memory per GPU" in out and "FAILED: 1 error(s)" in out
    assert exc_info.value.problems[0].startswith("target.quantization.format: weight format fp8")


# ---------------------------------------------------------------------------------------------
# the formats the shipped GPU examples' checkpoints really ship (tests/gpu_sim/checkpoints.py)

from tests.gpu_sim import checkpoints as shipped  # noqa: E402 - grouped with the tests that use it


def _vicuna(tmp_path: Path) -> Path:
    return shipped.write_model(tmp_path / "vicuna-7b-v1.3", shipped.VICUNA_7B, weights="bin", tokenizer="spm")


def _medusa_cfg(target: Path, heads: Path, num_heads: int = 4, **target_extra) -> object:
    return parse_config({"name": "m", "target": {"checkpoint": str(target), "dtype": "float16", **target_extra},
                         "speculation": {"method": "medusa", "heads_dir": str(heads), "num_heads": num_heads},
                         "build": {"max_batch_size": 4, "max_input_len": 1024, "max_seq_len": 2048},
                         "loadtest": {"sampling": {"top_k": 1}}})


def test_vicuna_bin_spm_and_fasterdecoding_pt_heads_pass(tmp_path):
    heads = shipped.write_medusa_heads(tmp_path / "medusa-vicuna-7b-v1.3")  # config says 2 heads, file holds 5
    findings = run_preflight(_medusa_cfg(_vicuna(tmp_path), heads), offline=False)
    assert errors_of(findings) == [], [f.line() for f in errors_of(findings)]
    (note,) = [f for f in findings if f.check == "heads"]
    assert note.severity == "info" and "medusa_num_heads 2" in note.message and "holds 5" in note.message


def test_medusa_heads_are_counted_in_the_pt_file(tmp_path):
    heads = shipped.write_medusa_heads(tmp_path / "heads", heads=5)
    errors = errors_of(run_preflight(_medusa_cfg(_vicuna(tmp_path), heads, num_heads=6), offline=False))
    assert [(f.field, f.message) for f in errors] == [
        ("speculation.num_heads", "num_heads 6 but medusa_lm_head.pt holds 5 heads (missing 5.1.weight)")]


def test_medusa_head_shapes_come_from_the_weights_when_config_lacks_them(tmp_path):
    heads = shipped.write_medusa_heads(tmp_path / "heads", hidden=5120)
    errors = errors_of(run_preflight(_medusa_cfg(_vicuna(tmp_path), heads), offline=False))
    assert [f.message for f in errors] == ["medusa heads hidden_size 5120 does not match the target's 4096"]


def _eagle_cfg(target: Path, head: Path, fmt: str = "none") -> object:
    return parse_config({"name": "e", "target": {"checkpoint": str(target), "dtype": "float16",
                                                  "quantization": {"format": fmt, "kv_cache_dtype": "auto"}},
                         "speculation": {"method": "eagle", "head_dir": str(head), "num_layers": 4,
                                         "max_non_leaves_per_layer": 4},
                         "build": {"max_batch_size": 4, "max_input_len": 1024, "max_seq_len": 2048}})


@pytest.mark.parametrize("fmt", ["none", "fp8"])
def test_eagle_vicuna_head_as_shipped_passes_both_routes(fmt, tmp_path):
    head = shipped.write_eagle_head(tmp_path / "EAGLE-Vicuna-7B-v1.3")
    findings = run_preflight(_eagle_cfg(_vicuna(tmp_path), head, fmt), offline=False)
    assert errors_of(findings) == [], [f.line() for f in errors_of(findings)]


def test_missing_fc_bias_fails_the_convert_route_only(tmp_path):
    head = shipped.write_eagle_head(tmp_path / "EAGLE-LLaMA3-Instruct-8B", fc_bias=False)
    target = _vicuna(tmp_path)
    (error,) = errors_of(run_preflight(_eagle_cfg(target, head, "none"), offline=False))
    assert "fc.bias" in error.message and "#2588" in error.message
    findings = run_preflight(_eagle_cfg(target, head, "fp8"), offline=False)
    assert errors_of(findings) == []
    assert any(f.severity == "info" and "uses zeros" in f.message for f in findings)


def test_fp8_eagle_route_needs_pytorch_model_bin(tmp_path):
    head = shipped.write_eagle_head(tmp_path / "head", weights="safetensors")
    target = _vicuna(tmp_path)
    assert errors_of(run_preflight(_eagle_cfg(target, head, "none"), offline=False)) == []  # the converter reads it
    (error,) = errors_of(run_preflight(_eagle_cfg(target, head, "fp8"), offline=False))
    assert error.message.startswith("EAGLE head: pytorch_model.bin missing") and "quantize.py" in error.message


def test_fp8_eagle_route_checks_the_heads_layers(tmp_path):
    head = shipped.write_eagle_head(tmp_path / "head", layers=1)
    (head / "config.json").write_text(json.dumps({**shipped.EAGLE_VICUNA_7B, "num_hidden_layers": 2}))
    (error,) = errors_of(run_preflight(_eagle_cfg(_vicuna(tmp_path), head, "fp8"), offline=False))
    assert "lacks layers [1]" in error.message and "--eagle_num_layers 2" in error.message


def test_sentencepiece_tokenizers_compared(tmp_path):
    target = shipped.write_model(tmp_path / "target", shipped.VICUNA_7B, weights="bin", tokenizer="spm")
    draft = shipped.write_model(tmp_path / "draft", shipped.VICUNA_7B, weights="bin", tokenizer="spm")
    assert compare_tokenizers(target, draft) == []
    from pipeline.validate.tokenizer_compat import sentencepiece_model_proto

    model = sentencepiece_model_proto()()
    model.ParseFromString((draft / "tokenizer.model").read_bytes())
    model.pieces[4].piece = "▁z"
    (draft / "tokenizer.model").write_bytes(model.SerializeToString())
    assert compare_tokenizers(target, draft)[0].endswith("id 4: target '▁a' vs draft '▁z'")


# ---------------------------------------------------------------------------------------------
# TensorRT-LLM scripts and draft-target lengths


def test_missing_scripts_are_named_with_the_fix(tmp_path, monkeypatch):
    from tests.gpu_sim.container import make_container as make

    box = make(tmp_path / "old-image", omit=("eagle/convert_checkpoint.py",))
    monkeypatch.setenv("SPECDEPLOY_TRTLLM_ROOT", str(box.app))
    head = shipped.write_eagle_head(tmp_path / "head")
    errors = errors_of(run_preflight(_eagle_cfg(_vicuna(tmp_path), head), offline=False))
    (error,) = errors
    assert error.field == "trtllm_root" and error.check == "scripts"
    assert error.message.startswith(f"{box.examples}/eagle/convert_checkpoint.py (step convert-speculative) does not exist")
    assert "(from env)" in error.message
    assert error.fix.startswith("git clone --branch v1.2.1 https://github.com/NVIDIA/TensorRT-LLM && "
                                "pip install -r TensorRT-LLM/examples/eagle/requirements.txt")
    assert errors_of(run_preflight(_eagle_cfg(_vicuna(tmp_path), head), offline=True)) == []  # offline: not looked for


def test_cli_trtllm_root_reaches_the_script_check(tmp_path, monkeypatch, capsys):
    import yaml

    from pipeline.cli import run
    from pipeline.errors import PreflightError

    head = shipped.write_eagle_head(tmp_path / "head")
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(_eagle_cfg(_vicuna(tmp_path), head).model_dump(mode="json")))
    assert run(["validate", str(path)]) == 0
    with pytest.raises(PreflightError) as exc_info:
        run(["validate", str(path), "--trtllm-root", str(tmp_path / "nowhere")])
    assert all(p.startswith(f"trtllm_root: {tmp_path}/nowhere/examples/") for p in exc_info.value.problems)
    assert len(exc_info.value.problems) == 2  # convert-target + convert-speculative


def test_draft_target_needs_a_step_that_holds_the_whole_context():
    findings = run_preflight(gpu_config(method="draft_target", build__max_num_tokens=1024), offline=True)
    (error,) = [f for f in errors_of(findings) if f.field == "build.max_num_tokens"]
    assert "(2047 = max_seq_len − 1)" in error.message and error.fix == "raise build.max_num_tokens to ≥ 2047"
    notes = [f.message for f in findings if f.severity == "info" and f.field == "build.max_input_len"]
    assert notes and "max_input_len 2047" in notes[0]
