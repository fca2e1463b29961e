"""Every example in configs/ loads and passes `validate --offline` (the GPU examples point at
checkpoints that are not on this machine; tiny-cpu-* need the demo models' package)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from pipeline.cli import run
from pipeline.config import load_config
from pipeline.validate.preflight import errors_of, run_preflight

CONFIGS = Path(__file__).resolve().parents[3] / "configs"
GPU_EXAMPLES = [
    "llama31-8b-draft1b-fp8-h100.yaml",
    "llama31-70b-draft8b-int4awq-tp4-a100.yaml",
    "vicuna7b-medusa-fp8-h100.yaml",
    "vicuna7b-eagle-h100.yaml",
    "llama31-8b-baseline-h100.yaml",
    "llama31-8b-eagle3-llmapi-h100.yaml",
    "llama31-70b-draft8b-llmapi-h100.yaml",
    "qwen25-coder-7b-ngram-llmapi-h100.yaml",
    "llama31-8b-ngram-engine-h100.yaml",
]


def _demo_available() -> bool:
    try:
        return importlib.util.find_spec("pipeline.demo") is not None
    except ImportError:
        return False


def _example_paths() -> list[Path]:
    paths = sorted(CONFIGS.glob("*.yaml"))
    if not _demo_available():
        paths = [p for p in paths if not p.name.startswith("tiny-cpu-")]
    return paths


def test_gpu_examples_exist():
    assert {p.name for p in CONFIGS.glob("*.yaml")} >= set(GPU_EXAMPLES)


@pytest.mark.parametrize("path", _example_paths(), ids=lambda p: p.stem)
def test_example_validates_offline(path, capsys):
    cfg = load_config(path)
    assert cfg.name == path.stem
    findings = run_preflight(cfg, offline=True)
    assert errors_of(findings) == [], [f.line() for f in errors_of(findings)]
    assert run(["validate", str(path), "--offline"]) == 0
    assert "OK: 0 error(s)" in capsys.readouterr().out


@pytest.mark.parametrize("name", GPU_EXAMPLES)
def test_gpu_examples_get_a_memory_estimate_that_fits(name):
    findings = run_preflight(load_config(CONFIGS / name), offline=True)
    (memory,) = [f for f in findings if f.check == "memory-fit" and f.data]
    assert memory.severity == "info" and memory.data["estimate"]["fits"]


TINY_CPU_CONFIGS = sorted(p.stem for p in CONFIGS.glob("tiny-cpu-*.yaml"))


def test_every_builtin_demo_model_is_shipped():
    """The tiny configs' checkpoints are shipped in the checkout: a missing one is a failure, not a skip."""
    from pipeline.demo import ARTIFACTS_DIR

    missing = [n for n in ("tiny-target", "tiny-draft", "tiny-medusa", "tiny-eagle", "tiny-eagle3")
               if not (ARTIFACTS_DIR / n).is_dir()]
    assert missing == []


@pytest.mark.parametrize("name", TINY_CPU_CONFIGS)
def test_tiny_cpu_examples_validate_with_their_files(name):
    path = CONFIGS / f"{name}.yaml"
    findings = run_preflight(load_config(path), offline=False)
    assert errors_of(findings) == [], [f.line() for f in errors_of(findings)]
    (memory,) = [f for f in findings if f.check == "memory-fit" and f.data]
    assert memory.data["estimate"]["fits"]
