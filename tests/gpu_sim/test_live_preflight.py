"""The live preflight (`validate --live`, `doctor CONFIG`, the gate of build/serve/run) against a
simulated NGC 26.04 container, and against deliberately wrong ones that each check must catch.

The container (tests/gpu_sim/container.py) holds what the live checks read: a ``tensorrt_llm``
package reporting its version with LLM-args classes (tests/gpu_sim/trtllm_llm_args.py), the example
scripts and ``trtllm-build`` whose argparse parsers are the stand-ins' (tests/gpu_sim/build_tools.py,
tied to upstream's flags by test_upstream_flags.py), ``tritonserver`` with the image's ``NVIDIA_TRITON_SERVER_VERSION``, the backend
directories and an NVML stand-in (tests/gpu_sim/fake_nvml.py). Every negative case changes one
thing and asserts the one failing row, its fix and, where a recorded fact is contradicted, that
the output names it.
"""

from __future__ import annotations

import json

import pytest
import yaml

from pipeline.cli import run
from pipeline.config import load_config
from pipeline.errors import PreflightError
from pipeline.paths import PROJECT_ROOT, model_repo_dir
from pipeline.validate.live import FAIL, PASS, SKIP, failures, run_live_preflight
from pipeline.validate.live.gate import read_record
from pipeline.validate.live.parsers import flag_problems, parse_help, planned_flags
from tests.gpu_sim.container import make_container

CONFIGS = PROJECT_ROOT / "configs"
ENGINE = "llama31-8b-draft1b-fp8-h100"  # quantize.py + trtllm-build
EAGLE3 = "llama31-8b-eagle3-llmapi-h100"  # LLM API, speculative_model + Eagle3
TP2 = "llama31-70b-draft8b-llmapi-h100"  # two GPUs


@pytest.fixture()
def box(tmp_path, monkeypatch):
    """A passing container, entered for the test (PATH, PYTHONPATH, backends, NVML, examples root)."""
    def make(**kwargs):
        image = make_container(tmp_path / "image", **kwargs)
        image.apply(monkeypatch)
        for key in ("GPU_SIM_NVML", "GPU_SIM_SM", "GPU_SIM_LLM_ARGS_BUILD", "SPECDEPLOY_TRTLLM_PYTHON"):
            monkeypatch.delenv(key, raising=False)
        monkeypatch.chdir(tmp_path)
        return image

    return make


def config(name: str, tmp_path):
    return load_config(CONFIGS / f"{name}.yaml", tmp_path)


def rows(checks, name_part: str):
    return [c for c in checks if name_part in c.check]


def only_failure(checks):
    failed = failures(checks)
    assert len(failed) == 1, [c.line() for c in failed]
    return failed[0]


# ----------------------------------------------------------------------------------------------
# A container that matches


@pytest.mark.parametrize("name", [ENGINE, EAGLE3, "qwen25-coder-7b-ngram-llmapi-h100"])
def test_a_matching_container_passes_every_check(box, tmp_path, name):
    box()
    checks = run_live_preflight(config(name, tmp_path))
    assert failures(checks) == [], [c.line() for c in failures(checks)]
    verdicts = {c.check: c.verdict for c in checks}
    assert verdicts["tensorrt_llm version"] == PASS and verdicts["tritonserver"] == PASS
    assert verdicts["backend python"] == PASS and {"GPU count", "GPU model", "GPU memory", "GPU MIG mode"} <= set(verdicts)
    if name == ENGINE:
        assert verdicts["backend tensorrtllm"] == PASS
        assert verdicts["parser examples/quantization/quantize.py"] == PASS and verdicts["parser trtllm-build"] == PASS
    else:
        assert verdicts["backend tensorrtllm"] == SKIP  # the llmapi model runs on the python backend
        llm = rows(checks, "LLM args")
        assert len(llm) == 2 and all(c.verdict == PASS for c in llm)


def test_rendered_model_yaml_is_what_gets_loaded(box, tmp_path):
    """After render, the files on disk are checked, not a regeneration: an extra key there fails."""
    box()
    cfg = config(EAGLE3, tmp_path)
    path = model_repo_dir(cfg, "baseline") / "tensorrt_llm" / "1" / "model.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump({"model": "/models/x", "max_batch_size": 8, "enable_prefix_magic": True,
                                    "triton_config": {"max_batch_size": 0, "decoupled": True}}))
    failed = only_failure(run_live_preflight(cfg))
    assert failed.check == "LLM args baseline model.yaml"
    assert "enable_prefix_magic: Extra inputs are not permitted" in failed.found
    assert str(path) in failed.expected


# ----------------------------------------------------------------------------------------------
# Deliberately wrong containers: each check catches its own


def test_no_tensorrt_llm_is_one_clear_line(box, tmp_path, monkeypatch):
    image = box()
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "empty"))  # the child interpreter has no tensorrt_llm
    checks = run_live_preflight(config(EAGLE3, tmp_path))
    (version,) = rows(checks, "tensorrt_llm version")
    assert version.verdict == FAIL and "`import tensorrt_llm` fails" in version.found
    assert "run inside the TensorRT-LLM container" in version.fix
    assert all(c.verdict == SKIP for c in rows(checks, "LLM args"))  # nothing to load into, said once
    assert image.records() == []  # nothing built


def test_a_version_mismatch_names_the_recorded_image_fact(box, tmp_path):
    box(version="1.2.0")  # an image tagged 26.04 that carries 1.2.0
    checks = run_live_preflight(config(ENGINE, tmp_path))
    failed = only_failure(checks)
    assert failed.check == "tensorrt_llm version" and failed.found.startswith("1.2.0")
    assert 'set trtllm_version: "1.2.0"' in failed.fix
    assert failed.wrong_fact == ("recorded fact 'nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3 carries "
                                 "TensorRT-LLM 1.2.1' (pipeline/trtllm/versions.yaml) is wrong for this install")


def test_a_renamed_flag_is_caught_by_the_scripts_own_parser(box, tmp_path):
    image = box()
    script = image.examples / "quantization" / "quantize.py"
    script.write_text(_renamed_quantize())
    failed = only_failure(run_live_preflight(config(ENGINE, tmp_path)))
    assert failed.check == "parser examples/quantization/quantize.py"
    assert failed.found == "--qformat is not an option"
    assert "is wrong for this install" in failed.wrong_fact


def _renamed_quantize() -> str:
    """A quantize.py whose parser calls --qformat --quant_format (an upstream rename)."""
    return ("import argparse\np = argparse.ArgumentParser()\n"
            + "".join(f"p.add_argument('--{f}')\n" for f in ("model_dir", "output_dir", "dtype", "quant_format",
                                                             "kv_cache_dtype", "calib_size", "calib_dataset",
                                                             "tp_size", "pp_size"))
            + "p.parse_args()\n")


def test_a_value_outside_the_parsers_choices(box, tmp_path):
    image = box()
    script = image.examples / "quantization" / "quantize.py"
    script.write_text("import argparse\np = argparse.ArgumentParser()\n"
                      "for f in ('model_dir', 'output_dir', 'dtype', 'kv_cache_dtype', 'calib_size', 'calib_dataset',"
                      " 'tp_size', 'pp_size'):\n    p.add_argument('--' + f)\n"
                      "p.add_argument('--qformat', choices=['int8_sq', 'int4_awq'])\np.parse_args()\n")
    failed = only_failure(run_live_preflight(config(ENGINE, tmp_path)))
    assert failed.found == "--qformat fp8: not one of {int8_sq,int4_awq}"


def test_a_missing_script(box, tmp_path):
    box(omit=("quantization/quantize.py",))
    failed = only_failure(run_live_preflight(config(ENGINE, tmp_path)))
    assert failed.check == "parser examples/quantization/quantize.py" and failed.found.endswith(": no such file")
    assert "--trtllm-root" in failed.fix


def test_a_field_the_installed_class_refuses(box, tmp_path, monkeypatch):
    """A 1.2 build from before the speculative_model rename refuses the field validate accepted."""
    box()
    monkeypatch.setenv("GPU_SIM_LLM_ARGS_BUILD", "pre-rename")
    failed = only_failure(run_live_preflight(config(EAGLE3, tmp_path)))
    assert failed.check == "LLM args speculative (to render)"
    assert "speculative_config.speculative_model: Extra inputs are not permitted" in failed.found
    assert failed.wrong_fact.startswith("recorded fact 'TensorRT-LLM 1.2 decoding configs have field "
                                        "speculative_model' (pipeline/trtllm/llmapi_facts.yaml")


def test_too_few_gpus(box, tmp_path, monkeypatch):
    box()
    monkeypatch.setenv("GPU_SIM_NVML", "1:81559:NVIDIA H100 80GB HBM3")
    checks = run_live_preflight(config(TP2, tmp_path))
    (count,) = rows(checks, "GPU count")
    assert count.verdict == FAIL and count.expected == "GPUs [0, 1]" and count.source == "triton.gpus"
    assert "give the container GPUs [1]" in count.fix


@pytest.mark.parametrize("nvml,check,word", [
    ("8:81920:NVIDIA A100-SXM4-80GB", "GPU model", "NVIDIA A100-SXM4-80GB"),
    ("8:40960:NVIDIA H100 PCIe", "GPU memory", "40.0 GiB"),
    ("8:81559:NVIDIA H100 80GB HBM3:mig", "GPU MIG mode", "MIG enabled"),
    ("none", "GPUs", "NVML unavailable"),
])
def test_gpu_model_memory_mig_and_no_driver(box, tmp_path, monkeypatch, nvml, check, word):
    box()
    monkeypatch.setenv("GPU_SIM_NVML", nvml)
    failed = only_failure(run_live_preflight(config(ENGINE, tmp_path)))
    assert failed.check == check and word in failed.found


def test_a_triton_of_another_release(box, tmp_path, monkeypatch):
    box()
    monkeypatch.setenv("NVIDIA_TRITON_SERVER_VERSION", "25.12")
    failed = only_failure(run_live_preflight(config(ENGINE, tmp_path)))
    assert failed.check == "tritonserver" and "NVIDIA_TRITON_SERVER_VERSION=25.12" in failed.found


def test_no_tritonserver(box, tmp_path, monkeypatch):
    box()
    monkeypatch.setenv("SPECDEPLOY_TRITONSERVER", str(tmp_path / "nowhere" / "tritonserver"))
    failed = only_failure(run_live_preflight(config(ENGINE, tmp_path)))
    assert failed.check == "tritonserver" and failed.found.startswith("no tritonserver")


def test_a_missing_backend(box, tmp_path):
    image = box()
    for path in (image.backends / "tensorrtllm").iterdir():
        path.unlink()
    failed = only_failure(run_live_preflight(config(ENGINE, tmp_path)))
    assert failed.check == "backend tensorrtllm" and failed.found.endswith(": absent")


# ----------------------------------------------------------------------------------------------
# The commands


def test_validate_live_prints_the_table_and_exits_nonzero(box, tmp_path, monkeypatch, capsys):
    box()
    monkeypatch.setenv("GPU_SIM_NVML", "1:81559:NVIDIA H100 80GB HBM3")
    with pytest.raises(PreflightError) as exc_info:
        run(["validate", str(CONFIGS / f"{TP2}.yaml"), "--live"])
    out = capsys.readouterr().out
    assert "Live preflight" in out and "GPU count" in out and "FAILED" in out
    assert any(p.startswith("live preflight: GPU count: expected GPUs [0, 1]") for p in exc_info.value.problems)
    # a config error among the problems makes it the config's (2), else the host's failure (5); never NO-GO's 1
    config_errors = [p for p in exc_info.value.problems if not p.startswith("live preflight:")]
    assert exc_info.value.exit_code == (2 if config_errors else 5)


def test_doctor_config_passes_in_a_matching_container(box, tmp_path, capsys):
    box()
    assert run(["doctor", str(CONFIGS / f"{EAGLE3}.yaml"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["live"] and all(c["verdict"] in (PASS, SKIP) for c in report["live"])


def test_build_refuses_before_any_step_and_skip_live_is_recorded(box, tmp_path, monkeypatch):
    image = box()
    monkeypatch.setenv("GPU_SIM_NVML", "8:81920:NVIDIA A100-SXM4-80GB")
    cfg = config(ENGINE, tmp_path)
    path = tmp_path / "c.yaml"
    path.write_text((CONFIGS / f"{ENGINE}.yaml").read_text())
    with pytest.raises(PreflightError) as exc_info:
        run(["build", str(path), "--no-progress", "--skip-preflight"])
    assert "live preflight: GPU model" in str(exc_info.value) and "--skip-live" in str(exc_info.value)
    assert image.records() == []  # no step ran (the parsers' --help is not logged)
    assert read_record(cfg)["status"] == "failed"
    # --skip-live: the gate is passed and the skip recorded (the build then fails on the missing checkpoints)
    with pytest.raises(Exception):  # noqa: B017 - which step fails first is the build's business
        run(["build", str(path), "--no-progress", "--skip-preflight", "--skip-live"])
    assert read_record(cfg)["status"] == "skipped" and read_record(cfg)["by"] == "--skip-live"


def test_help_parsing_reads_argparse_output():
    text = ("usage: x [-h] [--a A] [--b {p,q}] [--c]\n\noptions:\n  -h, --help  show this help\n"
            "  --a A       value\n  --b {p,q}\n              choice\n  --c         switch\n")
    spec = parse_help(text)
    assert spec.options == {"-h": (), "--help": (), "--a": None, "--b": ("p", "q"), "--c": ()}
    flags = planned_flags(["python3", "s.py", "--a", "1", "--b", "r", "--c", "--d", "--c", "v"])
    assert flag_problems(spec, flags) == ["--b r: not one of {p,q}", "--d is not an option", "--c takes no value, got 'v'"]


def test_a_package_the_installed_tensorrt_llm_pins_differently(box, tmp_path):
    """The served models' packages are checked against what the installed TensorRT-LLM requires
    (its dist-info), as a pip install that replaced the image's transformers would leave them."""
    image = box()
    metadata = image.site_dir / f"tensorrt_llm-{image.version}.dist-info" / "METADATA"
    metadata.write_text(metadata.read_text() + "Requires-Dist: transformers<4.99\nRequires-Dist: numpy<3\n")
    failed = only_failure(run_live_preflight(config(ENGINE, tmp_path)))
    assert failed.check == "package transformers" and "tensorrt_llm needs transformers<4.99" in failed.fix
    assert "tensorrt_llm: <4.99" in failed.expected
