"""`specdeploy build` on every shipped GPU config against a simulated NGC 1.2.1 container.

The container (tests/gpu_sim/container.py) has the image's /app/examples layout with stand-ins for
TensorRT-LLM's example scripts and `trtllm-build` (tests/gpu_sim/build_tools.py), which parse the
upstream flags, read the files the upstream scripts read and write what they write. The
checkpoints (tests/gpu_sim/checkpoints.py) are shaped like the downloads each config names. The
whole project runs for real: the CLI, preflight, the planner, the step runner and its post-step
checks. What only this simulation shows: every step the runner executes is exactly the planned one
(the planned argv themselves are pinned once, by tests/unit/golden/plan/), each passes the stand-in's
transcription of upstream's argument parser, each reads what the step before it wrote, and the
manifest and engines come out as the image's release writes them. A build the shipped configs do not
plan (FP8 EAGLE below) keeps its own golden in tests/gpu_sim/golden/.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from pipeline.cli import run
from pipeline.config import load_config
from pipeline.errors import BuildError
from pipeline.paths import PROJECT_ROOT
from pipeline.plan.planner import make_plan
from tests.gpu_sim import checkpoints as ck
from tests.gpu_sim.container import make_container

CONFIGS = PROJECT_ROOT / "configs"
GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"

# the engine runtime's configs (the LLM-API ones build no engine: tests/unit/render/test_llmapi_render.py)
GPU_CONFIGS = sorted(p.stem for p in CONFIGS.glob("*.yaml")
                     if not p.stem.startswith("tiny-cpu-") and "trtllm_runtime: llm_api" not in p.read_text())


def deploy(tmp_path: Path, config: str, **changes) -> Path:
    data = yaml.safe_load((CONFIGS / f"{config}.yaml").read_text())
    data.update(changes)
    path = tmp_path / f"{data['name']}.yaml"
    path.write_text(yaml.safe_dump(ck.localise(data, tmp_path / "models")))
    return path


@pytest.fixture
def image(tmp_path, monkeypatch):
    box = make_container(tmp_path / "image")
    box.apply(monkeypatch)
    monkeypatch.chdir(tmp_path)
    return box


def _sm(path: Path) -> str:
    return "80" if load_config(path).hardware.startswith("a100") else "90"


def _normalised(entries: list[dict], tmp_path: Path) -> str:
    text = json.dumps([{"tool": e["tool"], "argv": e["argv"]} for e in entries], indent=1)
    return text.replace(str(tmp_path), "<tmp>").replace(f".tmp-{os.getpid()}", ".tmp-<pid>") + "\n"


def _check_golden(name: str, text: str) -> None:
    golden = GOLDEN / f"{name}.json"
    if UPDATE:
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text)
    assert golden.is_file(), f"{golden} missing: generate with UPDATE_GOLDEN=1 and review"
    assert text == golden.read_text(), f"step argv differ from {golden} (review; UPDATE_GOLDEN=1 to accept)"


def _planned(path: Path, tmp_path: Path) -> list[list[str]]:
    """`specdeploy plan` argv with outputs at the runner's temporary paths, interpreter as on PATH."""
    from pipeline.build.builder import redirect_argv
    from pipeline.build.builder import tmp_path as tmp_of

    plan = make_plan(load_config(path))
    return [redirect_argv(s.argv, {o: tmp_of(o) for o in s.outputs}) for s in plan.steps]


def _draft_target_engines_accept_the_whole_context(image, tmp_path: Path) -> None:
    for entry in image.records("trtllm-build"):
        assert _flag(entry["argv"], "--max_input_len") == "4095"
    engines = tmp_path / "engines" / "llama31-8b-draft1b-fp8-h100"
    for role in ("target", "draft"):
        build_config = json.loads((engines / role / "config.json").read_text())["build_config"]
        assert build_config["max_input_len"] == 4095 and build_config["plugin_config"]["use_paged_context_fmha"]


# what one config's build must show besides the common checks, asserted on the same build (a test of
# its own built the same config in the same image again)
BUILD_CHECKS = {"llama31-8b-draft1b-fp8-h100": _draft_target_engines_accept_the_whole_context}


def test_every_build_check_names_a_built_config():
    assert set(BUILD_CHECKS) <= set(GPU_CONFIGS)  # a renamed config must not skip its checks silently


@pytest.mark.slow
@pytest.mark.parametrize("name", GPU_CONFIGS)
def test_build_runs_every_step_against_the_image(name, image, tmp_path, monkeypatch):
    path = deploy(tmp_path, name)
    monkeypatch.setenv("GPU_SIM_SM", _sm(path))
    assert run(["build", str(path), "--no-progress"]) in (0, None)
    entries = image.records()
    recorded = [(["trtllm-build"] if e["tool"] == "trtllm-build" else ["python3", str(image.examples / e["tool"])])
                + e["argv"] for e in entries]
    assert recorded == _planned(path, tmp_path)
    assert all(e["env"]["SPECDEPLOY_TRTLLM_ROOT"] == str(image.app) for e in entries)
    manifest = json.loads((tmp_path / "engines" / load_config(path).name / "manifest.json").read_text())
    assert manifest["trtllm_root"] == str(image.app) and manifest["versions"]["tensorrt_llm"] == "1.2.1"
    for engine in manifest["engines"].values():
        assert json.loads((Path(engine) / "config.json").read_text())["version"] == "1.2.1"
    if name in BUILD_CHECKS:
        BUILD_CHECKS[name](image, tmp_path)


def _argv(image, tool: str) -> list[str]:
    (entry,) = image.records(tool)
    return entry["argv"]


def _flag(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


@pytest.mark.slow
def test_fp8_eagle_quantizes_with_the_heads_layer_count(image, tmp_path, monkeypatch):
    path = deploy(tmp_path, "vicuna7b-eagle-h100", name="vicuna7b-eagle-fp8-h100")
    data = yaml.safe_load(path.read_text())
    data["target"]["quantization"] = {"format": "fp8", "kv_cache_dtype": "fp8"}
    path.write_text(yaml.safe_dump(data))
    assert run(["build", str(path), "--no-progress"]) in (0, None)
    assert _flag(_argv(image, "eagle/quantize.py"), "--eagle_num_layers") == "1"  # the head's decoder layers
    assert _flag(_argv(image, "eagle/convert_checkpoint.py"), "--num_eagle_layers") == "4"  # the tree depth
    _check_golden("vicuna7b-eagle-fp8-h100", _normalised(image.records(), tmp_path))


@pytest.mark.slow  # the simulated image's subprocesses (about 0.9 CPU s): full tier
def test_checkpoint_kv_algorithm_is_checked_before_trtllm_build(image, tmp_path, monkeypatch):
    """A ModelOpt export carrying FP8 KV on an INT4-AWQ checkpoint stops the build at quantize."""
    path = deploy(tmp_path, "llama31-70b-draft8b-int4awq-tp4-a100")
    monkeypatch.setenv("GPU_SIM_SM", "80")
    monkeypatch.setenv("GPU_SIM_FORCE_KV_CACHE_QUANT_ALGO", "FP8")
    with pytest.raises(BuildError) as exc_info:
        run(["build", str(path), "--no-progress"])
    message = str(exc_info.value)
    assert message.startswith("step quantize-target: the target checkpoint does not match the plan, so trtllm-build "
                              "was not started")
    assert "quantization.kv_cache_quant_algo is 'FP8', the plan expects None" in message
    assert [e["tool"] for e in image.records()] == ["quantization/quantize.py"]
    assert not list((tmp_path / "engines" / "llama31-70b-draft8b-int4awq-tp4-a100" / "checkpoints").glob("target-*"))


@pytest.mark.parametrize("name,omit", [("vicuna7b-medusa-fp8-h100", "quantization/quantize.py"),
                                       ("vicuna7b-eagle-h100", "eagle/convert_checkpoint.py")])
def test_missing_script_is_refused_before_any_step(name, omit, tmp_path, monkeypatch):
    box = make_container(tmp_path / "image", omit=(omit,))
    box.apply(monkeypatch)
    monkeypatch.chdir(tmp_path)
    path = deploy(tmp_path, name)
    with pytest.raises(BuildError) as exc_info:
        run(["build", str(path), "--no-progress"])
    message = str(exc_info.value)
    assert f"TensorRT-LLM examples root {box.app} (from $SPECDEPLOY_TRTLLM_ROOT) lacks scripts the plan runs: " \
           f"{box.examples / omit}" in message
    assert f"git clone --branch v1.2.1 https://github.com/NVIDIA/TensorRT-LLM && pip install -r " \
           f"TensorRT-LLM/examples/{Path(omit).parent}/requirements.txt" in message
    assert box.records() == [] and not (tmp_path / "engines").exists()


def test_image_layout_is_found_without_configuration(tmp_path, monkeypatch):
    """No --trtllm-root, no trtllm_root, no variable: the image's /app (here under a prefix)."""
    from pipeline.trtllm.layout import resolve_trtllm_root

    box = make_container(tmp_path / "image")
    box.apply(monkeypatch, examples_root_env=False)
    found = resolve_trtllm_root(prefix=box.root)
    assert (found.path, found.source) == (str(box.app), "ngc-image")
    assert (Path(found.path) / "examples" / "quantization" / "quantize.py").is_file()
