"""The CPU reference engine on the llmapi layout without a server: ``validate``'s rules for
``backend: reference`` + ``trtllm_runtime: llm_api`` (each refusal names its field path), what the
CPU model makes of ``model.yaml`` and of the ``sampling_param_*`` inputs
(:mod:`pipeline.triton_models.llmapi_spec`), and ``render`` writing upstream's llmapi repository
for both arms from a build manifest and engine descriptors, with the arm descriptors pointing the
load test at ``tensorrt_llm``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from pipeline.artefacts.engine import (
    DraftTargetProposer,
    Eagle3Proposer,
    EngineDescriptor,
    LookaheadProposer,
    NgramProposer,
    NoProposer,
)
from pipeline.config import config_hash, parse_config
from pipeline.triton_models import llmapi_spec
from pipeline.validate.preflight import errors_of, run_preflight

DT = {"method": "draft_target", "num_draft_tokens": 4, "draft": {"checkpoint": "builtin:tiny-draft"}}
NGRAM = {"method": "ngram", "max_draft_len": 3, "max_matching_ngram_size": 3}
EAGLE3 = {"method": "eagle3", "head_dir": "builtin:tiny-eagle3", "max_draft_len": 3}


def cpu_cfg(speculation=None, workdir=None, **top):
    data = {"name": "cpu-llmapi", "backend": "reference", "hardware": "cpu", "trtllm_runtime": "llm_api",
            "target": {"checkpoint": "builtin:tiny-target"}, "speculation": speculation or {"method": "none"}, **top}
    return parse_config(data, workdir=workdir)


def fields(cfg) -> set[str]:
    return {f.field for f in errors_of(run_preflight(cfg, offline=True))}


# ----------------------------------------------------------------------------------------------
# validate


@pytest.mark.parametrize("speculation", [None, DT, NGRAM, EAGLE3], ids=["none", "draft_target", "ngram", "eagle3"])
def test_methods_the_cpu_llmapi_model_runs_validate(speculation):
    cfg = cpu_cfg(speculation)
    assert cfg.llmapi_layout and not cfg.runs_llm_api
    assert fields(cfg) == set()


def test_only_an_explicit_llm_api_puts_the_reference_engine_on_the_llmapi_layout():
    cfg = parse_config({"name": "cpu", "backend": "reference", "hardware": "cpu", "trtllm_version": "1.3.0rc27",
                        "target": {"checkpoint": "builtin:tiny-target"}})
    assert not cfg.llmapi_layout


@pytest.mark.parametrize(("speculation", "field", "word"), [
    ({**EAGLE3, "model_mode": "two_model"}, "speculation.model_mode", "one-model"),
    ({"method": "medusa", "heads_dir": "/models/medusa", "num_heads": 3}, "speculation.method", "engine-only"),
    ({"method": "eagle", "head_dir": "/models/eagle", "num_layers": 3}, "speculation.method", "engine-only"),
    ({**DT, "orchestration": "bls"}, "speculation.orchestration", "no tensorrt_llm_bls"),
    ({**DT, "use_draft_logits": True}, "speculation.use_draft_logits", "use_draft_logits"),
    ({**NGRAM, "min_matching_ngram_size": 2}, "speculation.min_matching_ngram_size", "min_matching_ngram_size"),
])
def test_what_the_cpu_llmapi_model_cannot_do_is_refused_by_field(speculation, field, word):
    found = [f for f in errors_of(run_preflight(cpu_cfg(speculation), offline=True)) if f.field == field]
    assert found and word in found[0].message


@pytest.mark.parametrize("section", ["extra_llm_args", "extra_speculative_config"])
def test_pass_through_llm_arguments_are_refused(section):
    value = {"enable_attention_dp": True} if section == "extra_llm_args" else {"max_concurrency": 4}
    assert f"llm_api.{section}" in fields(cpu_cfg(NGRAM, llm_api={section: value}))


def test_sweeping_the_draft_length_is_refused():
    cfg = cpu_cfg(DT, loadtest={"sweep_draft_len": [2, 4]})
    assert "loadtest.sweep_draft_len" in fields(cfg)


def test_unrecorded_version_is_refused():
    assert "trtllm_version" in fields(cpu_cfg(NGRAM, trtllm_version="1.1.0"))


# ----------------------------------------------------------------------------------------------
# model.yaml → the engine


def _base(tmp_path: Path, proposer=None) -> EngineDescriptor:
    return EngineDescriptor(role="speculative" if proposer else "baseline", model_dir=str(tmp_path / "target"),
                            proposer=proposer or NoProposer(), max_draft_len=4 if proposer else 0,
                            threads=2, compute_dtype="bfloat16", prefix_cache_entries=7)


def test_baseline_model_yaml_gives_a_plain_engine_with_the_built_cpu_settings(tmp_path):
    d = llmapi_spec.engine_descriptor({"model": str(tmp_path / "target"), "max_batch_size": 3, "max_seq_len": 99},
                                      _base(tmp_path))
    assert (d.role, d.proposer, d.max_draft_len, d.max_batch_size, d.max_seq_len) == ("baseline", NoProposer(), 0, 3, 99)
    assert (d.threads, d.compute_dtype, d.prefix_cache_entries) == (2, "bfloat16", 7)


def test_draft_target_speculative_config_decides_the_proposer(tmp_path):
    built = DraftTargetProposer(draft_dir=str(tmp_path / "draft"), num_draft_tokens=4, draft_int8=True)
    spec = {"decoding_type": "Draft_Target", "max_draft_len": 2, "speculative_model": str(tmp_path / "draft")}
    d = llmapi_spec.engine_descriptor({"model": str(tmp_path / "target"), "speculative_config": spec}, _base(tmp_path, built))
    assert d.role == "speculative" and d.max_draft_len == 2
    assert d.proposer == DraftTargetProposer(draft_dir=str((tmp_path / "draft").resolve()), num_draft_tokens=2, draft_int8=True)


def test_ngram_speculative_config_takes_upstreams_defaults(tmp_path):
    spec = {"decoding_type": "NGram", "max_draft_len": 5, "is_public_pool": False}
    d = llmapi_spec.engine_descriptor({"model": str(tmp_path / "target"), "speculative_config": spec}, _base(tmp_path))
    assert d.proposer == NgramProposer(max_draft_len=5, max_matching_ngram_size=2, min_matching_ngram_size=1,
                                       is_public_pool=False)


def test_lookahead_speculative_config_takes_upstreams_sizes_and_draft_length(tmp_path):
    spec = {"decoding_type": "Lookahead", "max_window_size": 3, "max_ngram_size": 4}
    d = llmapi_spec.engine_descriptor({"model": str(tmp_path / "target"), "speculative_config": spec}, _base(tmp_path))
    assert d.proposer == LookaheadProposer(max_window_size=3, max_ngram_size=4, max_verification_set_size=4)
    assert d.role == "speculative" and d.max_draft_len == 2 + (3 - 1 + 4) * 3  # calculate_speculative_resource


def test_eagle3_speculative_config_runs_the_head_with_the_built_settings(tmp_path):
    built = Eagle3Proposer(head_dir=str(tmp_path / "head"), max_draft_len=5, draft_int8=True)
    spec = {"decoding_type": "Eagle3", "max_draft_len": 2, "speculative_model": str(tmp_path / "head"),
            "eagle3_one_model": True}
    d = llmapi_spec.engine_descriptor({"model": str(tmp_path / "target"), "speculative_config": spec}, _base(tmp_path, built))
    assert d.role == "speculative" and d.max_draft_len == 2
    assert d.proposer == Eagle3Proposer(head_dir=str((tmp_path / "head").resolve()), max_draft_len=2, draft_int8=True)


@pytest.mark.parametrize(("args", "word"), [
    ({"speculative_config": {"decoding_type": "Eagle", "max_draft_len": 3}}, "not available on the CPU"),
    ({"speculative_config": {"decoding_type": "Eagle3", "max_draft_len": 3}}, "speculative_model"),
    ({"speculative_config": {"decoding_type": "Eagle3", "max_draft_len": 3, "speculative_model": "/h",
                             "eagle3_one_model": False}}, "eagle3_one_model"),
    ({"speculative_config": {"decoding_type": "Eagle3", "max_draft_len": 3, "speculative_model": "/h",
                             "eagle_choices": [[0], [1]]}}, "eagle_choices"),
    ({"speculative_config": {"decoding_type": "NGram"}}, "max_draft_len"),
    ({"speculative_config": {"decoding_type": "Lookahead", "max_verification_set_size": 0}}, "positive"),
    ({"speculative_config": {"decoding_type": "Lookahead", "max_ngram_size": 1}}, "max_ngram_size 1"),
    ({"speculative_config": {"decoding_type": "Draft_Target", "max_draft_len": 3}}, "speculative_model"),
    ({"model": "/elsewhere"}, "re-run `specdeploy build`"),
])
def test_model_yaml_the_cpu_engine_cannot_run_fails_the_load(tmp_path, args, word):
    with pytest.raises(llmapi_spec.SpecError, match=word.replace("`", ".")):
        llmapi_spec.engine_descriptor({"model": str(tmp_path / "target"), **args}, _base(tmp_path))


@pytest.mark.parametrize(("inputs", "message"), [
    ({"sampling_param_top_p": 1.5}, "sampling_param_top_p must be in [0, 1], got 1.5"),
    ({"sampling_param_top_k": -1}, "sampling_param_top_k must be >= 0, got -1"),
    ({"sampling_param_temperature": float("nan")}, "sampling_param_temperature must be >= 0"),
    ({"sampling_param_max_tokens": 0}, "sampling_param_max_tokens must be > 0"),
    ({"sampling_param_best_of": 2}, "sampling_param_best_of must be 1 on the CPU reference engine"),
    ({"sampling_param_presence_penalty": 0.1}, "no presence penalty"),
])
def test_sampling_inputs_out_of_range_name_the_input(inputs, message):
    with pytest.raises(ValueError) as caught:
        llmapi_spec.check_sampling(inputs.get)
    assert message in str(caught.value)


@pytest.mark.parametrize(("inputs", "expected"), [
    ({}, {"seed": None}),  # nothing sent: greedy
    ({"sampling_param_temperature": 0.0, "sampling_param_top_p": 0.9}, {"seed": None, "top_k": 1}),
    ({"sampling_param_temperature": 0.7}, {"seed": None, "temperature": 0.7, "top_p": 1.0}),
    ({"sampling_param_top_k": 5, "sampling_param_seed": 3}, {"seed": 3, "top_k": 5}),
])
def test_sampling_fields(inputs, expected):
    from pipeline.reference.api import SamplingParams

    assert llmapi_spec.sampling_fields(inputs.get) == expected
    assert SamplingParams(**expected).greedy == (expected.get("top_k") == 1 or len(expected) == 1)


# ----------------------------------------------------------------------------------------------
# render


def _built(tmp_path: Path, cfg) -> None:
    """The manifest and engine descriptors ``build`` would write (no checkpoints needed to render)."""
    root = tmp_path / "engines" / cfg.name
    draft = tmp_path / "ckpt" / "draft"
    descriptors = {"baseline": _base(tmp_path / "ckpt"),
                   "speculative": _base(tmp_path / "ckpt", DraftTargetProposer(draft_dir=str(draft), num_draft_tokens=4))}
    engines = {}
    for role, descriptor in descriptors.items():
        descriptor.write(root / role / "engine.json")
        engines[role] = str(root / role)
    manifest = {"format": "specdeploy-manifest/1", "name": cfg.name, "config_hash": config_hash(cfg), "backend": "reference",
                "engines": engines, "tokenizer_dir": str(tmp_path / "ckpt" / "target"), "created": "t"}
    (root / "manifest.json").write_text(json.dumps(manifest))


def test_render_writes_upstreams_llmapi_layout_for_both_arms(tmp_path):
    from pipeline.artefacts.deployment import ArmDeployment, descriptor_path
    from pipeline.render.renderer import render
    from pipeline.render.triton_rules import config_param, parse_config_file

    cfg = cpu_cfg(DT, workdir=tmp_path)
    _built(tmp_path, cfg)
    out = render(cfg)
    assert sorted(out) == ["baseline", "speculative"]
    for arm, (repo, _) in out.items():
        model = repo / "tensorrt_llm"
        assert sorted(p.name for p in repo.iterdir()) == ["tensorrt_llm"]
        assert {p.name for p in (model / "1").iterdir()} == {"model.py", "model.yaml", "_specdeploy"}
        assert (model / "1" / "_specdeploy" / "pipeline" / "triton_models" / "llmapi.py").is_file()
        config = parse_config_file(model / "config.pbtxt")
        assert config.max_batch_size == 0 and config.model_transaction_policy.decoupled
        assert config_param(config, "reference_engine_dir") == str(tmp_path / "engines" / cfg.name / arm)
        args = yaml.safe_load((model / "1" / "model.yaml").read_text())
        assert args["model"] == str(tmp_path / "ckpt" / "target")
        assert ("speculative_config" in args) == (arm == "speculative")
        deployment = ArmDeployment.load(descriptor_path(repo))
        assert (deployment.model_name, deployment.drafts, deployment.extra_inputs) == (
            "tensorrt_llm", "engine" if arm == "speculative" else "none", {})
    spec = yaml.safe_load((out["speculative"][0] / "tensorrt_llm" / "1" / "model.yaml").read_text())["speculative_config"]
    assert spec == {"decoding_type": "Draft_Target", "max_draft_len": 4, "speculative_model": str(tmp_path / "ckpt" / "draft")}


def test_the_openai_frontend_is_refused_on_the_llmapi_layout(tmp_path):
    from pipeline.render.renderer import render
    from pipeline.serve.openai_serve import FrontendError, start_frontend

    cfg = cpu_cfg(DT, workdir=tmp_path)
    _built(tmp_path, cfg)
    render(cfg)
    with pytest.raises(FrontendError, match="text_input / sampling_param_"):
        start_frontend(cfg, "speculative", "127.0.0.1:1")
