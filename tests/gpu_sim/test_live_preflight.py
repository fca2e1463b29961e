"""The live preflight (`validate --live`, `doctor CONFIG`, the gate of build/serve/run) against
simulated NGC containers (tests/gpu_sim/container.py, tests/gpu_sim/hosts.py): every supported image
passes as an honest host on every shipped GPU config; each realistic host mistake fails on its own
row with the right fix; a seeded fuzz of several mistakes at once gets one failing row per broken
thing and never a traceback.

The honest image carries the real wheel's Requires-Dist for tensorrt_llm and the image's package
versions (tests/gpu_sim/ngc_images.yaml, with sources), so a rule that cries wolf on the image fails
here; the mistakes change one thing the way it changes on a real host and assert the exact row.
"""

from __future__ import annotations

import json
import random

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.version import Version

from pipeline.artefacts.live_preflight import read_record
from pipeline.cli import run
from pipeline.config import load_config
from pipeline.errors import PreflightError
from pipeline.paths import PROJECT_ROOT, model_repo_dir
from pipeline.plan.gpu_layout import GpuLostError, query_gpus
from pipeline.trtllm import versions
from pipeline.validate.live import FAIL, PASS, SKIP, failures, run_host_preflight, run_live_preflight
from pipeline.validate.live.parsers import flag_problems, parse_help, planned_flags
from tests.gpu_sim import hosts
from tests.gpu_sim.container import specdeploy_requires
from tests.gpu_sim.hosts import EAGLE3, ENGINE, GPU_CONFIGS, MASKS, MISTAKES, TP2

CONFIGS = PROJECT_ROOT / "configs"
# every test here runs the preflight's child interpreters (the probes, each script's --help): a CPU
# second or more each, over the quick tier's budget (docs/testing.md)
pytestmark = pytest.mark.slow


def supported_images() -> list[str]:
    """The images of pipeline/trtllm/versions.yaml whose TensorRT-LLM is a published release in the
    range pyproject's `trtllm` extra pins (the line the project supports)."""
    requires, _ = specdeploy_requires()
    (pin,) = [Requirement(r.split(";")[0]) for r in requires if r.startswith("tensorrt-llm") and '"trtllm"' in r]
    carries = versions.load_versions()["images"]["carries"]
    return [tag for tag, entry in carries.items()
            if entry["trtllm"] in versions.releases() and Version(entry["trtllm"]) in pin.specifier]


@pytest.fixture()
def host(tmp_path, monkeypatch):
    made = []

    def make(**kwargs) -> hosts.Host:
        made.append(hosts.enter(tmp_path, monkeypatch, **kwargs))
        return made[-1]

    yield make
    for h in made:
        h.close()


def rows(checks, name_part: str):
    return [c for c in checks if name_part in c.check]


def assert_honest(checks, name: str) -> None:
    assert failures(checks) == [], [c.line() for c in failures(checks)]
    for c in checks:  # a row that cannot know says so: "not used" or "not checked: why", never a silent pass
        assert c.verdict == PASS or c.expected == "not used" or c.found.startswith("not checked:"), (name, c)
    verdicts = {c.check: c.verdict for c in checks}
    for check in ("tensorrt_llm version", "tritonserver", "backend python", "package transformers", "package torch",
                  "checkpoint target", "GPU count", "GPU health", "GPU model", "GPU free memory", "GPU MIG mode"):
        assert verdicts[check] == PASS, (name, check)


# ----------------------------------------------------------------------------------------------
# Honest hosts


def test_the_supported_images_are_the_1_2_1_images():
    assert supported_images() == ["26.04", "26.05", "26.06", "26.07"]


@pytest.mark.parametrize("tag", supported_images())
def test_every_supported_image_passes_on_every_shipped_gpu_config(host, tag):
    h = host(tag=tag)
    for name in GPU_CONFIGS:
        cfg = h.config(name)
        h.use_gpus(cfg.hardware)
        outcome = run_host_preflight(cfg)
        assert outcome.problems() == [], (tag, name, outcome.problems())
        assert_honest(outcome.checks, f"{tag} {name}")
        (triton,) = rows(outcome.checks, "tritonserver")
        assert f"TRITON_VERSION {hosts.IMAGES_TRITON[tag]}" in triton.found
        (model,) = rows(outcome.checks, "GPU model")  # the bandwidth NVML's bus width × memory clock gives
        assert ("2039 GB/s" if cfg.hardware == "a100-80gb" else "3352 GB/s") in model.found


def test_the_package_rule_is_the_installed_extras_beside_tensorrt_llms_pins(host):
    """On the image, transformers 4.57.1 is what tensorrt_llm pins; the installed extra is gpu-host
    (tritonclient present, nvidia-pytriton absent), whose rule does not name transformers at all;
    serving's transformers>=5 does not apply."""
    h = host()
    checks = run_live_preflight(h.config(ENGINE))
    (row,) = rows(checks, "package transformers")
    assert row.verdict == PASS and row.found == "4.57.1"
    assert row.expected == "tensorrt_llm 1.2.1: ==4.57.1; served models: >=4.57,<6"
    assert "specdeploy[gpu-host];" in row.source and f"metadata in {h.box.python}:" in row.source
    (tokenizers,) = rows(checks, "package tokenizers")
    assert tokenizers.expected == "specdeploy[gpu-host]: >=0.20; served models: >=0.20"


def test_a_help_printed_on_stderr_is_read(host):
    """A trtllm-build wrapped so that its help lands on stderr: the parser is read from both streams."""
    h = host()
    h.box.install_trtllm_build(redirect="1>&2")
    (row,) = rows(run_live_preflight(h.config(ENGINE)), "parser trtllm-build")
    assert row.verdict == PASS and row.found.endswith("all planned flags accepted")


# ----------------------------------------------------------------------------------------------
# Realistic mistakes: each fails on its own row with the right fix


@pytest.mark.parametrize("mistake", list(MISTAKES))
def test_each_mistake_fails_on_its_own_row(host, mistake):
    m = MISTAKES[mistake]
    h = host()
    path = h.config_path(m.config)
    h.use_gpus(load_config(path).hardware)
    m.make(h)
    checks = run_live_preflight(load_config(path, h.tmp))
    failed = failures(checks)
    assert [c.check for c in failed] == [m.row], [c.line() for c in failed]
    assert m.found in failed[0].found, failed[0].line()
    assert m.fix in failed[0].fix, failed[0].line()


def test_the_libcuda_fix_is_the_container_toolkit_not_pip(host):
    h = host()
    hosts.no_libcuda(h)
    checks = run_live_preflight(h.config(ENGINE))
    (row,) = rows(checks, "tensorrt_llm version")
    assert "pip install" not in row.fix
    assert all(c.verdict == SKIP and "tensorrt_llm" in c.found for c in rows(checks, "parser"))


def test_a_lost_gpu_is_a_finding_of_plain_validate_not_a_traceback(host):
    """nvidia-smi prints "[GPU is lost]" in a lost GPU's fields: the layout names it (was ValueError)."""
    h = host()
    hosts.lost_gpu(h)
    with pytest.raises(GpuLostError, match=r"'7, \[GPU is lost\]'"):
        query_gpus()
    with pytest.raises(PreflightError) as exc_info:
        run(["validate", str(h.config_path(ENGINE))])
    assert any("GPU is lost" in p for p in exc_info.value.problems)


def test_doctor_reports_a_lost_gpu_as_a_row(host, capsys):
    h = host()
    hosts.lost_gpu(h)
    assert run(["doctor", "--json"]) == 0
    gpus = json.loads(capsys.readouterr().out)["gpus"]["gpus"]
    assert gpus[7] == {"index": 7, "error": "NVMLError_GpuIsLost: GPU is lost"} and gpus[0]["name"] == "NVIDIA H100 80GB HBM3"


# ----------------------------------------------------------------------------------------------
# Fuzz: several mistakes at once, one failing row per broken thing, never a traceback

FUZZABLE = [name for name, m in MISTAKES.items() if m.config == ENGINE and name not in (
    "no NVIDIA driver visible",  # no GPU rows at all: it hides every other GPU mistake by design
    "packages of the interpreter SPECDEPLOY_TRTLLM_PYTHON names",  # another interpreter: the image's mistakes vanish
    "transformers replaced by pip", "the serving extra in the TensorRT-LLM interpreter",  # one row between them
    "no example scripts in the image",  # the same script as the renamed flag
    "an H100 NVL, which no profile describes")]  # the same GPUs as the PCIe variant
FUZZ_SEED, FUZZ_ROUNDS = 20261206, 12


@pytest.mark.parametrize("round_", range(FUZZ_ROUNDS))
def test_fuzz_several_mistakes_at_once(host, round_):
    rng = random.Random(FUZZ_SEED + round_)
    broken = rng.sample(FUZZABLE, rng.randint(2, 6))
    h = host()
    path = h.config_path(ENGINE)
    for name in broken:
        MISTAKES[name].make(h)
    outcome = run_host_preflight(load_config(path, h.tmp))  # raises nothing, whatever is broken
    expected = {MISTAKES[name].row for name in broken}
    for name in broken:
        expected -= MASKS.get(name, set())
    got = [c.check for c in failures(outcome.checks)]
    assert sorted(got) == sorted(expected), (broken, [c.line() for c in failures(outcome.checks)])
    assert not any("the check itself raised" in c.found for c in outcome.checks)


# ----------------------------------------------------------------------------------------------
# Rows that load into the installed classes and parsers


def test_rendered_model_yaml_is_what_gets_loaded(host):
    """After render, the files on disk are checked, not a regeneration: an extra key there fails."""
    h = host()
    cfg = h.config(EAGLE3)
    path = model_repo_dir(cfg, "baseline") / "tensorrt_llm" / "1" / "model.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump({"model": "/models/x", "max_batch_size": 8, "enable_prefix_magic": True,
                                    "triton_config": {"max_batch_size": 0, "decoupled": True}}))
    (failed,) = failures(run_live_preflight(cfg))
    assert failed.check == "LLM args baseline model.yaml"
    assert "enable_prefix_magic: Extra inputs are not permitted" in failed.found and str(path) in failed.expected


def test_a_field_the_installed_class_refuses(host, monkeypatch):
    """A 1.2 build from before the speculative_model rename refuses the field validate accepted."""
    h = host()
    monkeypatch.setenv("GPU_SIM_LLM_ARGS_BUILD", "pre-rename")
    (failed,) = failures(run_live_preflight(h.config(EAGLE3)))
    assert failed.check == "LLM args speculative (to render)"
    assert "speculative_config.speculative_model: Extra inputs are not permitted" in failed.found
    assert failed.wrong_fact.startswith("recorded fact 'TensorRT-LLM 1.2 decoding configs have field "
                                        "speculative_model' (pipeline/trtllm/llmapi_facts.yaml")


def test_a_version_mismatch_names_the_recorded_image_fact(tmp_path, monkeypatch):
    h = hosts.enter(tmp_path, monkeypatch, version="1.2.0")  # an image tagged 26.04 that carries 1.2.0
    (failed,) = failures(run_live_preflight(h.config(ENGINE)))
    assert failed.check == "tensorrt_llm version" and failed.found.startswith("1.2.0")
    assert failed.wrong_fact == ("recorded fact 'nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3 carries "
                                 "TensorRT-LLM 1.2.1' (pipeline/trtllm/versions.yaml) is wrong for this install")


def test_a_value_outside_the_parsers_choices(host):
    h = host()
    (h.box.examples / "quantization" / "quantize.py").write_text(
        "import argparse\np = argparse.ArgumentParser()\n"
        "for f in ('model_dir', 'output_dir', 'dtype', 'kv_cache_dtype', 'calib_size', 'calib_dataset',"
        " 'tp_size', 'pp_size'):\n    p.add_argument('--' + f)\n"
        "p.add_argument('--qformat', choices=['int8_sq', 'int4_awq'])\np.parse_args()\n")
    (failed,) = failures(run_live_preflight(h.config(ENGINE)))
    assert failed.found == "--qformat fp8: not one of {int8_sq,int4_awq}"


def test_help_parsing_reads_argparse_output():
    text = ("usage: x [-h] [--a A] [--b {p,q}] [--c]\n\noptions:\n  -h, --help  show this help\n"
            "  --a A       value\n  --b {p,q}\n              choice\n  --c         switch\n")
    spec = parse_help(text)
    assert spec.options == {"-h": (), "--help": (), "--a": None, "--b": ("p", "q"), "--c": ()}
    flags = planned_flags(["python3", "s.py", "--a", "1", "--b", "r", "--c", "--d", "--c", "v"])
    assert flag_problems(spec, flags) == ["--b r: not one of {p,q}", "--d is not an option", "--c takes no value, got 'v'"]


# ----------------------------------------------------------------------------------------------
# The commands: one preflight


def test_validate_live_and_doctor_run_the_same_checks(host, capsys):
    h = host()
    path = str(h.config_path(ENGINE))
    hosts.draft_of_another_family(h)
    outputs = {}
    for argv in (["validate", path, "--live", "--json"], ["doctor", path, "--json"]):
        with pytest.raises(PreflightError) as exc_info:
            run(argv)
        report = json.loads(capsys.readouterr().out)
        outputs[argv[0]] = (report["findings"], [(c["check"], c["verdict"]) for c in report["live"]],
                            exc_info.value.problems)
    assert outputs["validate"] == outputs["doctor"]
    assert exc_info.value.exit_code == 2  # the draft's checkpoint contradicts the config: the config's error
    findings, live, problems = outputs["doctor"]
    assert ("checkpoint draft", FAIL) in live and any("vocab_size differs" in f["message"] for f in findings)


def test_validate_live_prints_the_table_and_exits_nonzero(host, capsys):
    h = host()
    path = str(h.config_path(TP2))
    hosts.one_gpu(h)
    with pytest.raises(PreflightError) as exc_info:
        run(["validate", path, "--live"])
    out = capsys.readouterr().out
    assert "Live preflight" in out and "GPU count" in out and "FAILED" in out
    assert any(p.startswith("live preflight: GPU count: expected GPUs [0, 1]") for p in exc_info.value.problems)
    # a config error among the problems makes it the config's (2), else the host's failure (5); never NO-GO's 1
    config_errors = [p for p in exc_info.value.problems if not p.startswith("live preflight:")]
    assert exc_info.value.exit_code == (2 if config_errors else 5)


def test_build_refuses_before_any_step_and_skip_live_is_recorded(host):
    h = host()
    path = h.config_path(ENGINE)
    cfg = load_config(path, h.tmp)
    hosts._gpu_variant("NVIDIA A100-SXM4-80GB", 81920)(h)
    with pytest.raises(PreflightError) as exc_info:
        run(["build", str(path), "--no-progress", "--skip-preflight"])
    assert "live preflight: GPU model" in str(exc_info.value) and "--skip-live" in str(exc_info.value)
    assert h.box.records() == []  # no step ran (the parsers' --help is not logged)
    assert read_record(cfg)["status"] == "failed"
    # --skip-live: the gate is passed and the skip recorded (the A100 stand-in then refuses FP8)
    with pytest.raises(Exception):  # noqa: B017 - which step fails first is the build's business
        run(["build", str(path), "--no-progress", "--skip-preflight", "--skip-live"])
    assert read_record(cfg)["status"] == "skipped" and read_record(cfg)["by"] == "--skip-live"
