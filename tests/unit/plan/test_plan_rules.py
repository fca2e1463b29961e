"""Targeted rules of the build plan (TensorRT-LLM 1.x examples READMEs, tensorrt_llm/commands/build.py), independent of the goldens:
flags per mode, the separate baseline, logits only with draft logits, timing caches, version
paths, and no flag outside a per-version allow-list written here (not imported from the code)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_plan_configs import ALL, EXAMPLES

from pipeline.cli import run as cli_run
from pipeline.config import parse_config
from pipeline.errors import ConfigError
from pipeline.plan.planner import make_plan
from pipeline.trtllm.layout import ENV_VAR, resolve_trtllm_root

# trtllm-build flags valid on 0.17 … 0.21 and on 1.0 … 1.2 (tensorrt_llm/commands/build.py). Kept separate on
# purpose: a flag added to the code must be checked against the pinned version and added here.
ALLOWED_BUILD_FLAGS = {
    "0.x": {
        "--checkpoint_dir", "--output_dir", "--output_timing_cache", "--gemm_plugin", "--max_batch_size",
        "--max_input_len", "--max_seq_len", "--max_num_tokens", "--max_beam_width", "--use_paged_context_fmha",
        "--multiple_profiles", "--workers", "--speculative_decoding_mode", "--max_draft_len", "--gather_generation_logits",
    },
}
ALLOWED_BUILD_FLAGS["1.x"] = set(ALLOWED_BUILD_FLAGS["0.x"])
NEVER = {"--tp_size", "--pp_size", "--cp_size", "--max_output_len", "--use_custom_all_reduce", "--enable_xqa",
         "--builder_opt", "--auto_parallel", "--gpus_per_node", "--cluster_key", "--opt_num_tokens", "--gather_context_logits",
         "--paged_kv_cache"}
TRTLLM = sorted(name for name, cfg in ALL.items() if cfg.get("backend", "trtllm") == "trtllm")


def plan_of(cfg: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **kwargs):
    monkeypatch.delenv(ENV_VAR, raising=False)
    return make_plan(parse_config(cfg, workdir=tmp_path), **kwargs)


def flag_value(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def builds(plan) -> dict[str, list[str]]:
    return {s.name.removeprefix("build-"): s.argv for s in plan.steps if s.kind == "build"}


@pytest.mark.parametrize("name", sorted(ALL))
def test_baseline_engine_always_present_and_separate(name, tmp_path, monkeypatch):
    plan = plan_of(ALL[name], tmp_path, monkeypatch)
    assert "baseline" in plan.engines
    assert len(set(plan.engines.values())) == len(plan.engines)
    baseline = plan.step("build-baseline" if plan.backend == "trtllm" else "engine-baseline").argv
    assert "--speculative_decoding_mode" not in baseline
    if plan.backend == "reference":
        assert flag_value(baseline, "--method") == "none" and flag_value(baseline, "--max-draft-len") == "0"


@pytest.mark.parametrize("name", TRTLLM)
def test_build_flags_within_allow_list(name, tmp_path, monkeypatch):
    plan = plan_of(ALL[name], tmp_path, monkeypatch)
    allowed = ALLOWED_BUILD_FLAGS["1.x" if plan.trtllm_version.startswith("1.") else "0.x"]
    for step in plan.steps:
        flags = {a for a in step.argv if a.startswith("--")}
        if step.kind == "build":
            assert step.argv[0] == "trtllm-build"
            assert flags <= allowed, (step.name, flags - allowed)
            assert not flags & NEVER
            for required in ("--checkpoint_dir", "--output_dir", "--output_timing_cache"):
                assert required in step.argv
            for switch in ("--use_paged_context_fmha", "--multiple_profiles"):
                assert flag_value(step.argv, switch) in ("enable", "disable")
        else:
            assert step.kind in ("convert", "quantize", "resolve")
            assert "--tp_size" in step.argv or step.kind == "resolve" or "eagle/quantize.py" in step.argv[1]


@pytest.mark.parametrize("name", TRTLLM)
def test_timing_cache_paths_explicit_and_distinct(name, tmp_path, monkeypatch):
    plan = plan_of(ALL[name], tmp_path, monkeypatch)
    caches = [flag_value(argv, "--output_timing_cache") for argv in builds(plan).values()]
    assert all(c and Path(c).is_absolute() and c.startswith(plan.root) for c in caches)
    assert len(set(caches)) == len(caches)


def test_draft_target_flags(tmp_path, monkeypatch):
    plan = plan_of(EXAMPLES["llama31-8b-draft1b-fp8-h100"], tmp_path, monkeypatch)
    b = builds(plan)
    assert set(b) == {"baseline", "target", "draft"}
    assert flag_value(b["target"], "--speculative_decoding_mode") == "draft_tokens_external"
    assert flag_value(b["target"], "--max_draft_len") == "4"
    assert flag_value(b["target"], "--max_beam_width") == "1"
    for role in ("target", "draft"):
        assert flag_value(b[role], "--use_paged_context_fmha") == "enable"
        assert flag_value(b[role], "--max_batch_size") == "16"
    assert "--speculative_decoding_mode" not in b["draft"] and "--max_draft_len" not in b["draft"]
    # baseline and target are built from the same checkpoint, into separate engines
    assert flag_value(b["baseline"], "--checkpoint_dir") == flag_value(b["target"], "--checkpoint_dir")
    for flag in ("--max_input_len", "--max_seq_len", "--max_num_tokens"):
        assert flag_value(b["baseline"], flag) == flag_value(b["target"], flag)
    expect = plan.step("build-target").expect
    assert expect.speculative_decoding_mode == "draft_tokens_external" and expect.max_draft_len == 4
    assert expect.paged_context_fmha and expect.quant_algo == "FP8" and expect.kv_cache_quant_algo == "FP8"
    assert plan.step("build-draft").expect.speculative_decoding_mode == "none"
    assert plan.num_draft_tokens == 4 and plan.max_draft_len == 4


@pytest.mark.parametrize("use_logits", [False, True])
def test_generation_logits_only_with_draft_logits(use_logits, tmp_path, monkeypatch):
    cfg = json.loads(json.dumps(EXAMPLES["llama31-8b-draft1b-fp8-h100"]))
    cfg["speculation"]["use_draft_logits"] = use_logits
    b = builds(plan_of(cfg, tmp_path, monkeypatch))
    assert ("--gather_generation_logits" in b["target"]) is use_logits
    assert ("--gather_generation_logits" in b["draft"]) is use_logits
    assert "--gather_generation_logits" not in b["baseline"]


def test_awq_tp4_quantize(tmp_path, monkeypatch):
    plan = plan_of(EXAMPLES["llama31-70b-draft8b-int4awq-tp4-a100"], tmp_path, monkeypatch)
    q = plan.step("quantize-target").argv
    assert q[1].endswith("examples/quantization/quantize.py")
    assert flag_value(q, "--qformat") == "int4_awq" and flag_value(q, "--calib_size") == "32"
    assert flag_value(q, "--tp_size") == "4" and "--kv_cache_dtype" not in q
    b = builds(plan)
    assert flag_value(b["target"], "--workers") == "4" and flag_value(b["draft"], "--workers") == "1"
    assert flag_value(b["target"], "--max_draft_len") == "8"
    assert plan.step("build-target").expect.tp == 4 and plan.step("build-target").expect.quant_algo == "W4A16_AWQ"


def test_medusa_route(tmp_path, monkeypatch):
    plan = plan_of(EXAMPLES["vicuna7b-medusa-fp8-h100"], tmp_path, monkeypatch)
    q = plan.step("quantize-speculative").argv
    assert q[1].endswith("examples/quantization/quantize.py")
    assert flag_value(q, "--medusa_model_dir") == "/models/medusa-vicuna-7b-v1.3"
    assert flag_value(q, "--num_medusa_heads") == "4" and flag_value(q, "--max_draft_len") == "10"
    s = builds(plan)["speculative"]
    assert flag_value(s, "--speculative_decoding_mode") == "medusa" and flag_value(s, "--max_beam_width") == "1"
    assert flag_value(s, "--gemm_plugin") == "fp8"  # FP8 at max_batch_size 4: the small-batch FP8 GEMM plugin
    assert plan.step("build-speculative").expect.architecture == "MedusaForCausalLM"
    assert set(plan.engines) == {"baseline", "speculative"}


@pytest.mark.parametrize("batch,plugin", [(1, "fp8"), (4, "fp8"), (5, None), (64, None)])
def test_fp8_gemm_plugin_only_at_small_batch(batch, plugin, tmp_path, monkeypatch):
    cfg = json.loads(json.dumps(EXAMPLES["llama31-8b-baseline-h100"]))
    cfg["target"]["quantization"] = {"format": "fp8"}
    cfg["build"]["max_batch_size"] = batch
    assert flag_value(builds(plan_of(cfg, tmp_path, monkeypatch))["baseline"], "--gemm_plugin") == plugin


def test_medusa_converter_spelling_per_version(tmp_path, monkeypatch):
    new = plan_of(ALL["medusa-fp16-trtllm1.2"], tmp_path, monkeypatch).step("convert-speculative").argv
    old = plan_of(ALL["medusa-fp16-trtllm0.19"], tmp_path, monkeypatch).step("convert-speculative").argv
    for argv in (new, old):
        assert argv[1].endswith("examples/medusa/convert_checkpoint.py")
        assert flag_value(argv, "--medusa_model_dir") and flag_value(argv, "--num_medusa_heads") == "4"
        assert flag_value(argv, "--tp_size") == "2"
    assert flag_value(new, "--model_type") == "llama" and flag_value(new, "--medusa_hidden_act") == "silu"
    assert "--model_type" not in old and "--medusa_hidden_act" not in old


def test_eagle_route(tmp_path, monkeypatch):
    plan = plan_of(EXAMPLES["vicuna7b-eagle-h100"], tmp_path, monkeypatch)
    c = plan.step("convert-speculative").argv
    assert c[1].endswith("examples/eagle/convert_checkpoint.py")
    assert flag_value(c, "--eagle_model_dir") == "/models/EAGLE-Vicuna-7B-v1.3"
    assert flag_value(c, "--num_eagle_layers") == "4" and flag_value(c, "--max_draft_len") == "63"
    assert flag_value(c, "--max_non_leaves_per_layer") == "10"
    s = builds(plan)["speculative"]
    assert flag_value(s, "--speculative_decoding_mode") == "eagle"
    assert flag_value(s, "--use_paged_context_fmha") == "enable"
    assert plan.step("build-speculative").expect.num_eagle_layers == 4


def test_quantized_eagle_is_fp8_two_step(tmp_path, monkeypatch):
    plan = plan_of(ALL["eagle-fp8-trtllm1.2"], tmp_path, monkeypatch)
    q, c = plan.step("quantize-speculative").argv, plan.step("convert-speculative").argv
    assert q[1].endswith("examples/eagle/quantize.py") and flag_value(q, "--qformat") == "fp8"
    assert flag_value(c, "--model_dir") == flag_value(q, "--output_dir") and "--eagle_model_dir" not in c


def test_quantized_eagle_other_than_fp8_rejected(tmp_path, monkeypatch):
    cfg = json.loads(json.dumps(EXAMPLES["vicuna7b-eagle-h100"]))
    cfg["target"]["quantization"] = {"format": "int4_awq"}
    with pytest.raises(ConfigError, match="FP8 only"):
        plan_of(cfg, tmp_path, monkeypatch)


def test_converter_path_follows_version(tmp_path, monkeypatch):
    old = plan_of(ALL["dtm-bf16-trtllm0.18"], tmp_path, monkeypatch)
    assert old.step("convert-target").argv[1] == "/app/examples/llama/convert_checkpoint.py"
    assert flag_value(old.step("convert-target").argv, "--tp_size") == "2"
    for version in ("0.19.0", "1.2.1"):
        cfg = dict(ALL["dtm-bf16-trtllm0.18"], trtllm_version=version)
        new = plan_of(cfg, tmp_path, monkeypatch)
        assert new.step("convert-target").argv[1] == "/app/examples/models/core/llama/convert_checkpoint.py"


@pytest.mark.parametrize("version", ["0.16.0", "1.3.0", "2.0"])
def test_unsupported_trtllm_versions_rejected(version, tmp_path, monkeypatch):
    """The engine runtime's commands exist for 0.17 … 1.2.x only (past 1.2 the default runtime is llm_api)."""
    with pytest.raises(ConfigError, match="trtllm_version"):
        plan_of(dict(EXAMPLES["llama31-8b-baseline-h100"], trtllm_version=version, trtllm_runtime="engine"),
                tmp_path, monkeypatch)


def test_trtllm_root_option(tmp_path, monkeypatch):
    plan = plan_of(EXAMPLES["llama31-8b-baseline-h100"], tmp_path, monkeypatch, trtllm_root="/opt/trtllm")
    assert plan.step("convert-target").argv[1] == "/opt/trtllm/examples/models/core/llama/convert_checkpoint.py"


def test_trtllm_root_precedence_and_image_detection(tmp_path):
    image = tmp_path / "container"
    default = resolve_trtllm_root(environ={}, prefix=image)
    assert (default.path, default.source) == (str(image / "app"), "default")  # no examples/: still /app, reported
    (image / "app" / "examples").mkdir(parents=True)
    found = resolve_trtllm_root(environ={}, prefix=image)
    assert (found.path, found.source) == (str(image / "app"), "ngc-image")
    env = {ENV_VAR: "/opt/TensorRT-LLM"}
    assert resolve_trtllm_root(environ=env, prefix=image).path == "/opt/TensorRT-LLM"
    assert resolve_trtllm_root(configured="/cfg", environ=env, prefix=image).path == "/cfg"
    assert resolve_trtllm_root(cli="/cli", configured="/cfg", environ=env, prefix=image).source == "cli"


def test_env_var_sets_the_examples_root(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_VAR, "/opt/TensorRT-LLM")
    plan = make_plan(parse_config(EXAMPLES["llama31-8b-baseline-h100"], workdir=tmp_path))
    assert plan.step("convert-target").argv[1] == "/opt/TensorRT-LLM/examples/models/core/llama/convert_checkpoint.py"
    assert plan.trtllm_root.source == "env"
    configured = make_plan(parse_config(dict(EXAMPLES["llama31-8b-baseline-h100"], trtllm_root="/cfg"), workdir=tmp_path))
    assert configured.step("convert-target").argv[1].startswith("/cfg/examples/")


def _eagle_head(directory: Path, layers) -> str:
    directory.mkdir(parents=True)
    if layers is not None:
        (directory / "config.json").write_text(json.dumps({"num_hidden_layers": layers, "hidden_size": 4096}))
    return str(directory)


@pytest.mark.parametrize("head_layers,expected", [(1, "1"), (2, "2"), (None, "1")])
def test_fp8_eagle_quantize_gets_the_heads_layer_count_not_the_tree_depth(head_layers, expected, tmp_path, monkeypatch):
    cfg = json.loads(json.dumps(ALL["eagle-fp8-trtllm1.2"]))
    cfg["speculation"]["head_dir"] = _eagle_head(tmp_path / "head", head_layers)
    plan = plan_of(cfg, tmp_path, monkeypatch)
    q, c = plan.step("quantize-speculative").argv, plan.step("convert-speculative").argv
    assert flag_value(q, "--eagle_num_layers") == expected  # the checkpoint's decoder layers
    assert flag_value(c, "--num_eagle_layers") == "4"  # the tree depth
    assert flag_value(q, "--calib_dataset") == "cnn_dailymail"


def test_draft_target_engines_take_the_whole_context_as_input(tmp_path, monkeypatch):
    plan = plan_of(EXAMPLES["llama31-8b-draft1b-fp8-h100"], tmp_path, monkeypatch)
    for role, argv in builds(plan).items():
        assert flag_value(argv, "--max_input_len") == "4095", role  # max_seq_len 4096 − 1
        assert plan.step(f"build-{role}").expect.max_input_len == 4095
    medusa = builds(plan_of(EXAMPLES["vicuna7b-medusa-fp8-h100"], tmp_path, monkeypatch))
    assert {flag_value(a, "--max_input_len") for a in medusa.values()} == {"1024"}


@pytest.mark.parametrize("reuse,paged", [(False, "disable"), (True, "enable")])
def test_paged_context_fmha_flag_follows_what_the_builder_keeps(reuse, paged, tmp_path, monkeypatch):
    cfg = {"name": "int8kv", "hardware": "a100-80gb", "target": {"checkpoint": "/models/Llama-3.1-8B-Instruct",
           "quantization": {"format": "int8_sq", "kv_cache_dtype": "int8"}}, "triton": {"enable_kv_cache_reuse": reuse}}
    argv = plan_of(cfg, tmp_path, monkeypatch).step("build-baseline").argv
    assert flag_value(argv, "--use_paged_context_fmha") == paged  # enable + reuse: validate refuses it


def test_checkpoint_steps_carry_what_trtllm_build_will_read(tmp_path, monkeypatch):
    plan = plan_of(EXAMPLES["llama31-70b-draft8b-int4awq-tp4-a100"], tmp_path, monkeypatch)
    target, draft = plan.step("quantize-target").expect_checkpoint, plan.step("quantize-draft").expect_checkpoint
    assert (target.quant_algo, target.kv_cache_quant_algo, target.tp) == ("W4A16_AWQ", None, 4)
    assert (draft.quant_algo, draft.tp) == ("W4A16_AWQ", 1)
    eagle = plan_of(ALL["eagle-fp8-trtllm1.2"], tmp_path, monkeypatch)
    assert eagle.step("quantize-speculative").expect_checkpoint is None  # a ModelOpt HF export, not a TRT-LLM checkpoint
    final = eagle.step("convert-speculative").expect_checkpoint
    assert (final.architecture, final.quant_algo, final.kv_cache_quant_algo) == ("EagleForCausalLM", "FP8", "FP8")


def test_plan_is_a_dry_run(tmp_path, monkeypatch):
    plan = plan_of(EXAMPLES["llama31-8b-draft1b-fp8-h100"], tmp_path, monkeypatch)
    assert not (tmp_path / "engines").exists()
    assert all(not Path(p).exists() for s in plan.steps for p in s.inputs)


def test_reference_backend_rejects_gpu_formats(tmp_path, monkeypatch):
    cfg = json.loads(json.dumps(ALL["tiny-dtm-reference"]))
    cfg["target"]["quantization"] = {"format": "fp8"}
    with pytest.raises(ConfigError, match="target.quantization.format"):
        plan_of(cfg, tmp_path, monkeypatch)


def test_reference_steps(tmp_path, monkeypatch):
    plan = plan_of(ALL["tiny-eagle-reference"], tmp_path, monkeypatch)
    names = [s.name for s in plan.steps]
    assert names == ["resolve-target", "quantize-target", "resolve-eagle", "engine-baseline", "engine-speculative"]
    for step in plan.steps:
        assert step.argv[1:3] == ["-m", "pipeline.build.reference_step"]
        assert all(Path(p).is_absolute() for p in step.inputs + step.outputs)
    spec = plan.step("engine-speculative").argv
    assert flag_value(spec, "--quantization") == "int8_wo"
    assert flag_value(spec, "--choices") == "[[0],[0,0],[0,0,0]]"


@pytest.mark.parametrize("name", ["tiny-dtm-reference", "tiny-eagle-reference"])
def test_reference_int8_draft_weights_reach_the_speculative_engine_only(name, tmp_path, monkeypatch):
    from pipeline.build.reference_step import main as build_step

    cfg = json.loads(json.dumps(ALL[name]))
    assert "--draft-weights" not in plan_of(cfg, tmp_path, monkeypatch).step("engine-speculative").argv  # float: no flag
    cfg.setdefault("reference", {})["draft_weights"] = "int8"
    plan = plan_of(cfg, tmp_path, monkeypatch)
    spec = plan.step("engine-speculative").argv
    assert spec[spec.index("--draft-weights"):][:2] == ["--draft-weights", "int8"]
    assert all("--draft-weights" not in s.argv for s in plan.steps if s.name != "engine-speculative")
    # the descriptor build_step writes from these flags carries it to the engine's proposer
    method = flag_value(spec, "--method")
    out = tmp_path / "spec"
    argv = ["engine", "--out", str(out), "--role", "speculative", "--model-dir", str(tmp_path), "--method", method,
            "--max-batch-size", "2", "--max-seq-len", "64", "--max-input-len", "32", "--draft-weights", "int8"]
    monkeypatch.setattr("pipeline.build.reference_step.check_checkpoint", lambda path, kind: None)
    argv += {"draft_target": ["--draft-dir", str(tmp_path), "--num-draft-tokens", "3"],
             "eagle": ["--head-dir", str(tmp_path), "--num-layers", "3"]}[method]
    assert build_step(argv) == 0
    proposer = json.loads((out / "engine.json").read_text())["proposer"]
    assert proposer["method"] == method and proposer["draft_int8"] is True


def test_cli_plan_json(tmp_path, capsys):
    import yaml

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(EXAMPLES["llama31-8b-draft1b-fp8-h100"]))
    assert cli_run(["plan", str(path), "--workdir", str(tmp_path), "--json", "--trtllm-root", "/x"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [s["name"] for s in data] == ["quantize-target", "quantize-draft", "build-baseline", "build-target", "build-draft"]
    assert set(data[0]) == {"name", "argv", "inputs", "outputs"}
    assert data[0]["argv"][1] == "/x/examples/quantization/quantize.py"


def test_cli_plan_human(tmp_path, monkeypatch, capsys):
    import shlex

    import yaml

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(EXAMPLES["vicuna7b-medusa-fp8-h100"]))
    monkeypatch.setenv("COLUMNS", "300")
    assert cli_run(["plan", str(path), "--workdir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    plan = make_plan(parse_config(EXAMPLES["vicuna7b-medusa-fp8-h100"], workdir=tmp_path))
    for step in plan.steps:
        assert shlex.join(step.argv) in out
