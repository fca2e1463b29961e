"""The LLM-API runtime's plan, build manifest and render: no engine compile (ModelOpt quantization
only, exact argv), golden renders of the Triton llmapi repository (config.pbtxt + model.yaml) and
of the trtllm-serve options file and command per method and release line, and the render-time
validator refusing what would fail at load. Goldens: tests/unit/golden/render/llmapi-<case>/;
regenerate on purpose with UPDATE_GOLDEN=1."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import yaml

from pipeline.build.builder import build
from pipeline.config import config_hash, parse_config
from pipeline.paths import PROJECT_ROOT
from pipeline.plan.llmapi import MODELOPT_ENV
from pipeline.plan.planner import make_plan
from pipeline.render.llmapi import validate_llmapi_repository
from pipeline.render.renderer import TEMPLATES_DIR, client_target, render
from pipeline.render.triton_rules import RenderError

GOLDEN = Path(__file__).parents[1] / "golden" / "render"
TARGET = "/models/Meta-Llama-3.1-8B-Instruct"
CASES = {
    "none-1.2": ("1.2.1", {"method": "none"}, TARGET),
    "eagle3-1.2": ("1.2.1", {"method": "eagle3", "head_dir": "/models/EAGLE3-LLaMA3.1-Instruct-8B", "max_draft_len": 3}, TARGET),
    "draft_target-1.4": ("1.4.0", {"method": "draft_target", "draft": {"checkpoint": "/models/Llama-3.2-1B-Instruct"},
                                   "num_draft_tokens": 4}, TARGET),
    "ngram-1.4": ("1.4.0", {"method": "ngram", "max_draft_len": 4, "max_matching_ngram_size": 3}, TARGET),
    "mtp-1.3": ("1.3.0", {"method": "mtp", "num_nextn_predict_layers": 1}, "/models/DeepSeek-V3"),
}
# DeepSeek-V3 is not in the known-shape table: the equal KV capacity is given, not estimated
EXTRA = {"mtp-1.3": {"triton": {"max_tokens_in_paged_kv_cache": 16384}}}


@pytest.fixture(autouse=True)
def hermetic(monkeypatch, tmp_path):
    """No nvidia-smi placement, no environment roots, a fresh working directory."""
    monkeypatch.setattr("pipeline.plan.gpu_layout.query_gpus", lambda nvidia_smi=None: None)
    monkeypatch.delenv(MODELOPT_ENV, raising=False)
    monkeypatch.delenv("SPECDEPLOY_TRTLLM_ROOT", raising=False)
    monkeypatch.chdir(tmp_path)


def make_cfg(case: str, **top):
    version, spec, target = CASES[case]
    data = {"name": f"api-{case.replace('_', '-').replace('.', '')}", "backend": "trtllm", "hardware": "h100-sxm-80gb",
            "trtllm_version": version, "trtllm_runtime": "llm_api", "target": {"checkpoint": target},
            "speculation": spec, "build": {"max_batch_size": 8, "max_input_len": 1024, "max_seq_len": 2048},
            **EXTRA.get(case, {}), **top}
    return parse_config(data)


def write_manifest(cfg) -> dict:
    """The manifest `build` writes for an LLM-API plan (model dirs, no engines)."""
    plan = make_plan(cfg)
    manifest = {"format": "specdeploy-manifest/1", "name": cfg.name, "config_hash": config_hash(cfg),
                "backend": "trtllm", "method": cfg.method, "trtllm_version": cfg.trtllm_version,
                "trtllm_runtime": "llm_api", "engines": plan.engines, "tokenizer_dir": plan.tokenizer_dir,
                "created": "2026-12-02T00:00:00+00:00"}
    path = Path("engines") / cfg.name / "manifest.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest))
    return manifest


def rendered_files(cfg) -> dict[str, str]:
    """Every file render writes for ``cfg`` that a golden holds, the working directory as <cwd>."""
    root = Path("engines") / cfg.name
    names = ["model_repo/{v}/tensorrt_llm/config.pbtxt", "model_repo/{v}/tensorrt_llm/1/model.yaml",
             "model_repo/{v}.command.json", "trtllm-serve/{v}/extra_llm_api_options.yaml", "trtllm-serve/{v}/command.json"]
    cwd = str(Path.cwd())
    out = {}
    for variant in ("baseline", "speculative"):
        for name in names:
            path = root / name.format(v=variant)
            if path.is_file():
                out[name.format(v=variant)] = path.read_text().replace(cwd, "<cwd>")
    return out


# ----------------------------------------------------------------------------------------------
# Plan and build


@pytest.mark.parametrize("case", sorted(CASES))
def test_llm_api_plan_compiles_no_engine(case):
    plan = make_plan(make_cfg(case))
    assert plan.steps == []  # unquantized: the LLM API loads the HF checkpoints as they are
    assert plan.engines["baseline"] == CASES[case][2]
    if case.startswith(("eagle3", "draft_target")):
        assert plan.engines["speculative"] == CASES[case][2]
        assert plan.engines["draft"] == (CASES[case][1].get("head_dir") or CASES[case][1]["draft"]["checkpoint"])


def test_quantized_plan_runs_modelopt_only():
    cfg = parse_config({**make_cfg("draft_target-1.4").model_dump(mode="json"), "hardware": "a100-80gb",
                        "target": {"checkpoint": TARGET, "quantization": {"format": "int4_awq", "calibration_size": 512}},
                        "llm_api": {"modelopt_root": "/opt/Model-Optimizer"}})
    plan = make_plan(cfg)
    assert [s.name for s in plan.steps] == ["quantize-target"]
    out = str(Path.cwd() / "engines" / cfg.name / "checkpoints" / "target-int4_awq-modelopt")
    assert plan.steps[0].argv == [
        "python3", "/opt/Model-Optimizer/examples/llm_ptq/hf_ptq.py", "--pyt_ckpt_path", TARGET, "--export_path", out,
        "--qformat", "int4_awq", "--kv_cache_qformat", "none", "--calib_size", "32", "--dataset", "cnn_dailymail",
        "--export_fmt", "hf"]
    assert plan.engines["baseline"] == plan.engines["speculative"] == out
    assert not any(a.endswith(("trtllm-build", "convert_checkpoint.py", "quantize.py")) for s in plan.steps for a in s.argv)


@pytest.mark.parametrize("name,steps", [("llama31-8b-eagle3-llmapi-h100", 0), ("qwen25-coder-7b-ngram-llmapi-h100", 0),
                                        ("llama31-70b-draft8b-llmapi-h100", 2)])
def test_cli_plan_of_the_llm_api_examples_has_no_engine_build(name, steps, capsys):
    from pipeline.cli import run

    assert run(["plan", str(PROJECT_ROOT / "configs" / f"{name}.yaml"), "--json"]) in (0, None)
    plan = json.loads(capsys.readouterr().out)
    assert len(plan) == steps and all(s["name"].startswith("quantize-") for s in plan)
    assert not any("trtllm-build" in a or a.endswith(("convert_checkpoint.py", "quantize.py")) for s in plan for a in s["argv"])
    run(["plan", str(PROJECT_ROOT / "configs" / f"{name}.yaml")])
    out = capsys.readouterr().out
    assert "trtllm-build" not in out and (steps or "no steps — the LLM-API runtime" in out)


def test_modelopt_root_from_the_environment(monkeypatch):
    monkeypatch.setenv(MODELOPT_ENV, "/srv/mo")
    cfg = parse_config({**make_cfg("none-1.2").model_dump(mode="json"),
                        "target": {"checkpoint": TARGET, "quantization": {"format": "fp8", "kv_cache_dtype": "fp8"}}})
    argv = make_plan(cfg).steps[0].argv
    assert argv[1] == "/srv/mo/examples/llm_ptq/hf_ptq.py" and argv[argv.index("--kv_cache_qformat") + 1] == "fp8"


def test_build_needs_no_tensorrt_llm_and_records_model_dirs():
    """An unquantized LLM-API build runs nothing (no trtllm-build here, and none needed)."""
    cfg = make_cfg("eagle3-1.2")
    manifest = build(cfg, progress=False)
    assert manifest["trtllm_runtime"] == "llm_api" and manifest["steps"] == []
    assert manifest["engines"] == {"baseline": TARGET, "speculative": TARGET, "draft": "/models/EAGLE3-LLaMA3.1-Instruct-8B"}


def test_build_names_a_missing_modelopt_checkout():
    cfg = parse_config({**make_cfg("none-1.2").model_dump(mode="json"),
                        "target": {"checkpoint": TARGET, "quantization": {"format": "fp8"}}})
    with pytest.raises(Exception, match=r"hf_ptq.py \(step quantize-target\) does not exist.*git clone https://github.com/NVIDIA/Model-Optimizer"):
        build(cfg, progress=False)


# ----------------------------------------------------------------------------------------------
# Render goldens


@pytest.mark.parametrize("case", sorted(CASES))
def test_render_matches_golden(case):
    cfg = make_cfg(case)
    write_manifest(cfg)
    results = render(cfg)
    assert set(results) == ({"baseline"} if case.startswith("none") else {"baseline", "speculative"})
    for variant, (repo, warnings) in results.items():
        assert warnings == [] and validate_llmapi_repository(cfg, repo) == []
        assert client_target(cfg, variant).model_name == "tensorrt_llm"
        assert os.access(repo.with_name(f"{variant}.launch.sh"), os.X_OK)
    actual = rendered_files(cfg)
    golden_dir = GOLDEN / f"llmapi-{case}"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        shutil.rmtree(golden_dir, ignore_errors=True)
        for rel, text in actual.items():
            (golden_dir / rel).parent.mkdir(parents=True, exist_ok=True)
            (golden_dir / rel).write_text(text)
    expected = {str(p.relative_to(golden_dir)): p.read_text() for p in sorted(golden_dir.rglob("*")) if p.is_file()}
    assert actual == expected, f"golden mismatch for llmapi-{case} (UPDATE_GOLDEN=1 to accept)"


def test_speculative_arm_carries_the_decoding_config_and_baseline_does_not():
    cfg = make_cfg("eagle3-1.2")
    write_manifest(cfg)
    render(cfg)
    root = Path("engines") / cfg.name
    spec = yaml.safe_load((root / "model_repo/speculative/tensorrt_llm/1/model.yaml").read_text())
    base = yaml.safe_load((root / "model_repo/baseline/tensorrt_llm/1/model.yaml").read_text())
    assert spec["speculative_config"] == {"decoding_type": "Eagle3", "max_draft_len": 3, "eagle3_one_model": True,
                                          "speculative_model": "/models/EAGLE3-LLaMA3.1-Instruct-8B"}
    assert "speculative_config" not in base
    # both arms: the same limits and the same KV capacity (an A/B of speculation alone)
    for key in ("max_batch_size", "max_num_tokens", "max_seq_len"):
        assert spec[key] == base[key]
    assert spec["kv_cache_config"]["max_tokens"] == base["kv_cache_config"]["max_tokens"]
    options = yaml.safe_load((root / "trtllm-serve/speculative/extra_llm_api_options.yaml").read_text())
    assert options["speculative_config"] == spec["speculative_config"] and "model" not in options
    argv = json.loads((root / "trtllm-serve/speculative/command.json").read_text())["argv"]
    assert argv[:2] == ["trtllm-serve", TARGET] and argv[-2] == "--extra_llm_api_options"


def test_trtllm_serve_options_turn_on_the_stats_acceptance_is_read_from():
    """trtllm-serve's /prometheus/metrics needs return_perf_metrics and its iteration stats need
    enable_iter_perf_stats (tensorrt_llm/serve/openai_server.py, tensorrt_llm/metrics/collector.py);
    both are LLM arguments the facts know, in both arms (the baseline then reports "no drafts")."""
    from pipeline.trtllm.llmapi_args import args_problems

    cfg = make_cfg("eagle3-1.2")
    write_manifest(cfg)
    render(cfg)
    for arm in ("baseline", "speculative"):
        options = yaml.safe_load((Path("engines") / cfg.name / f"trtllm-serve/{arm}/extra_llm_api_options.yaml")
                                 .read_text())
        assert options["enable_iter_perf_stats"] is True and options["return_perf_metrics"] is True
        assert args_problems(cfg, {**options, "model": TARGET}) == []


def test_user_pass_through_reaches_both_files():
    cfg = make_cfg("ngram-1.4", llm_api={"extra_llm_args": {"disable_overlap_scheduler": True},
                                          "extra_speculative_config": {"is_public_pool": False}})
    write_manifest(cfg)
    render(cfg)
    root = Path("engines") / cfg.name
    spec = yaml.safe_load((root / "model_repo/speculative/tensorrt_llm/1/model.yaml").read_text())
    assert spec["speculative_config"]["is_public_pool"] is False and spec["disable_overlap_scheduler"] is True


# ----------------------------------------------------------------------------------------------
# The validator refuses what Triton or the LLM would


def _rendered_repo(case="eagle3-1.2"):
    cfg = make_cfg(case)
    write_manifest(cfg)
    repo, _ = render(cfg)["speculative"]
    return cfg, repo


def test_validator_refuses_an_unknown_llm_argument():
    cfg, repo = _rendered_repo()
    path = repo / "tensorrt_llm" / "1" / "model.yaml"
    data = yaml.safe_load(path.read_text())
    data["kv_cache_config"]["free_gpu_mem"] = 0.4
    data["speculative_config"]["posterior"] = 0.1
    path.write_text(yaml.safe_dump(data))
    problems = validate_llmapi_repository(cfg, repo)
    assert any("kv_cache_config.free_gpu_mem: unknown field" in p for p in problems), problems
    assert any("speculative_config.posterior: unknown field for Eagle3DecodingConfig" in p for p in problems), problems


def test_validator_refuses_decoupled_mismatch_and_relative_model():
    cfg, repo = _rendered_repo()
    path = repo / "tensorrt_llm" / "1" / "model.yaml"
    data = yaml.safe_load(path.read_text())
    data["triton_config"]["decoupled"] = False
    data["model"] = "models/llama"
    path.write_text(yaml.safe_dump(data))
    problems = validate_llmapi_repository(cfg, repo)
    assert any("decoupled True differs from model.yaml's False" in p for p in problems), problems
    assert any("model 'models/llama' must be an absolute path" in p for p in problems), problems


def test_a_broken_template_fails_render_not_the_server(tmp_path):
    templates = tmp_path / "templates"
    shutil.copytree(TEMPLATES_DIR, templates)
    pbtxt = templates / "llmapi" / "tensorrt_llm" / "config.pbtxt.jinja"
    pbtxt.write_text(pbtxt.read_text().replace("data_type: {{ t.data_type }}", "data_type: TYPE_STRING"))
    cfg = make_cfg("eagle3-1.2")
    write_manifest(cfg)
    with pytest.raises(RenderError, match="tensors differ from upstream's llmapi model"):
        render(cfg, templates)
    assert not (Path("engines") / cfg.name / "model_repo" / "speculative").exists()  # nothing half-written swapped in


def test_config_pbtxt_tensors_are_upstreams():
    """The rendered tensors are exactly those of TensorRT-LLM's llmapi config.pbtxt (recorded at
    c8c6df0): text in, sampling parameters, text out and the perf/acceptance outputs."""
    from pipeline.render.triton_rules import parse_config_file

    _, repo = _rendered_repo()
    config = parse_config_file(repo / "tensorrt_llm" / "config.pbtxt")
    names = [t.name for t in config.input]
    assert names[:2] == ["text_input", "streaming"] and "sampling_param_max_tokens" in names
    outputs = {t.name for t in config.output}
    assert {"text_output", "acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens"} <= outputs
    assert config.max_batch_size == 0 and config.backend == "python"


def test_engine_runtime_goldens_untouched_by_the_llm_api_path():
    """The engine runtime still renders the inflight_batcher_llm layout (its goldens are checked in
    test_render.py); here: a 1.2.1 config without trtllm_runtime stays on it."""
    cfg = parse_config({"name": "engine", "trtllm_version": "1.2.1", "target": {"checkpoint": TARGET}})
    assert cfg.runtime == "engine" and not cfg.runs_llm_api
    assert (PROJECT_ROOT / "tests/unit/golden/render/trtllm-none/baseline/tensorrt_llm/config.pbtxt").is_file()


def test_serve_of_a_rendered_llmapi_arm_without_tritonserver_prints_the_container_line(capsys, monkeypatch):
    from pipeline.cli import run
    from pipeline.serve.server import ServeError, start_deployment

    cfg = make_cfg("ngram-1.4")
    write_manifest(cfg)
    config_path = Path("api.yaml")
    config_path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    assert run(["render", str(config_path)]) in (0, None)
    assert "launch: engines/api-ngram-14/model_repo/speculative.launch.sh" in capsys.readouterr().out
    monkeypatch.setattr("pipeline.serve.llmapi_launch.shutil.which", lambda name: None)
    monkeypatch.setattr("pipeline.serve.server.query_gpus", lambda: None)
    with pytest.raises(ServeError, match=r"(?s)tritonserver is not installed here.*docker run .* sh -c .*exec mpirun"):
        start_deployment(cfg, "speculative")
