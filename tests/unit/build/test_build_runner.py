"""The build runner: cache, atomic outputs, resume, logs, manifest, engine validation.

TensorRT-LLM cannot run here, so :class:`FakeTrtllm` stands in at that boundary: it behaves like
``convert_checkpoint.py``/``quantize.py``/``trtllm-build`` as far as files go — it reads the flags of
the argv it is given and writes a checkpoint/engine ``config.json`` from them (and rank files per
TP×PP), so the post-build validator checks what the planned argv would really produce. The real
:class:`SubprocessExecutor` is tested on small Python children."""

from __future__ import annotations

import _thread
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import psutil
import pytest

from pipeline.build.builder import (
    BuildInterrupted,
    SubprocessExecutor,
    build,
    dry_run,
    load_manifest,
    trtllm_missing_reason,
)
from pipeline.config import parse_config
from pipeline.errors import BuildError, StaleInputError
from pipeline.plan.planner import Step
from tests.polling import wait_until
from tests.unit.cli_inproc import specdeploy
from tests.unit.plan.test_plan_configs import EXAMPLES

QUANT_ALGO = {"fp8": "FP8", "int4_awq": "W4A16_AWQ", "full_prec": None}
MODES = {None: 1, "draft_tokens_external": 2, "medusa": 4, "eagle": 32}


def flag(argv: list[str], name: str, default=None):
    return argv[argv.index(name) + 1] if name in argv else default


class FakeTrtllm:
    """Records every call; writes the files the real tools would. ``fail_at``: exit 1 at that step
    (after writing a partial output); ``interrupt_at``: raise KeyboardInterrupt there; ``tamper``:
    edit the engine config.json of a step, like a silent builder adjustment."""

    def __init__(self, fail_at: str | None = None, interrupt_at: str | None = None, tamper=None):
        self.calls: list[tuple[str, list[str]]] = []
        self.fail_at, self.interrupt_at, self.tamper = fail_at, interrupt_at, tamper or {}

    def run(self, step: Step, argv: list[str], log_path: Path) -> int:
        self.calls.append((step.name, argv))
        out = Path(flag(argv, "--output_dir"))
        assert out.name.endswith(f".tmp-{os.getpid()}"), "steps must write to a temporary output"
        with open(log_path, "a") as log:
            log.write(f"fake {step.name}\nsome progress\n")
        if step.name == self.interrupt_at:
            out.mkdir(parents=True)
            raise KeyboardInterrupt
        if step.name == self.fail_at:
            out.mkdir(parents=True)
            (out / "rank0.engine").write_bytes(b"half")
            with open(log_path, "a") as log:
                log.write("RuntimeError: out of memory\n")
            return 1
        if argv[0] == "trtllm-build":
            self.engine(step, argv, out)
        else:
            self.checkpoint(argv, out)
        return 0

    @staticmethod
    def checkpoint(argv: list[str], out: Path) -> None:
        tp, pp = int(flag(argv, "--tp_size", 1)), int(flag(argv, "--pp_size", 1))
        kv = flag(argv, "--kv_cache_dtype")
        script = argv[1]
        config = {
            "architecture": "LlamaForCausalLM",
            "vocab_size": 128256,
            "mapping": {"world_size": tp * pp, "tp_size": tp, "pp_size": pp},
            "quantization": {"quant_algo": QUANT_ALGO[flag(argv, "--qformat", "full_prec")],
                             "kv_cache_quant_algo": kv.upper() if kv else None},
        }
        if "--num_medusa_heads" in argv:  # medusa converter or ModelOpt with heads
            config.update(architecture="MedusaForCausalLM", num_medusa_heads=int(flag(argv, "--num_medusa_heads")))
        if script.endswith("eagle/quantize.py"):
            config["quantization"]["quant_algo"] = "FP8"
        if script.endswith("eagle/convert_checkpoint.py"):
            source = Path(flag(argv, "--model_dir")) / "config.json"
            if source.is_file():  # converting a ModelOpt EAGLE checkpoint keeps its quantization
                config["quantization"] = json.loads(source.read_text())["quantization"]
            config.update(architecture="EagleForCausalLM", num_eagle_layers=int(flag(argv, "--num_eagle_layers")),
                          max_non_leaves_per_layer=int(flag(argv, "--max_non_leaves_per_layer")))
        out.mkdir(parents=True)
        (out / "config.json").write_text(json.dumps(config))
        for rank in range(tp * pp):
            (out / f"rank{rank}.safetensors").write_bytes(b"w")

    def engine(self, step: Step, argv: list[str], out: Path) -> None:
        pretrained = json.loads((Path(flag(argv, "--checkpoint_dir")) / "config.json").read_text())
        draft_len = int(flag(argv, "--max_draft_len", 0))
        config = {
            "version": "1.2.1",
            "pretrained_config": pretrained,
            "build_config": {
                "max_batch_size": int(flag(argv, "--max_batch_size")),
                "max_input_len": int(flag(argv, "--max_input_len")),
                "max_seq_len": int(flag(argv, "--max_seq_len")) + draft_len,
                "max_num_tokens": int(flag(argv, "--max_num_tokens")),
                "max_draft_len": draft_len,
                "speculative_decoding_mode": MODES[flag(argv, "--speculative_decoding_mode")],
                "gather_generation_logits": "--gather_generation_logits" in argv,
                "plugin_config": {"use_paged_context_fmha": flag(argv, "--use_paged_context_fmha") == "enable"},
            },
        }
        if step.name in self.tamper:
            self.tamper[step.name](config)
        out.mkdir(parents=True)
        (out / "config.json").write_text(json.dumps(config))
        for rank in range(pretrained["mapping"]["world_size"]):
            (out / f"rank{rank}.engine").write_bytes(b"engine")
        cache = Path(flag(argv, "--output_timing_cache"))
        assert cache.parent.is_dir(), "the runner creates the timing cache directory"
        cache.write_bytes(b"timing")


def dtm(**changes) -> dict:
    cfg = json.loads(json.dumps(EXAMPLES["llama31-8b-draft1b-fp8-h100"]))
    cfg["name"] = "dtm"
    for path, value in changes.items():
        node = cfg
        *parents, last = path.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value
    return cfg


ALL_STEPS = ["quantize-target", "quantize-draft", "build-baseline", "build-target", "build-draft"]


@pytest.fixture
def in_tmp(tmp_path: Path) -> Path:
    """The output root of the test's builds (``workdir=``)."""
    return tmp_path


def leftovers(root: Path) -> list[str]:
    return [str(p) for p in root.rglob("*") if ".tmp-" in p.name or ".old-" in p.name]


def test_first_build_runs_every_step_and_writes_manifest(in_tmp: Path) -> None:
    cfg = parse_config(dtm(), workdir=in_tmp)
    fake = FakeTrtllm()
    manifest = build(cfg, executor=fake, progress=False)
    assert [name for name, _ in fake.calls] == ALL_STEPS
    root = in_tmp / "engines" / "dtm"
    assert json.loads((root / "manifest.json").read_text()) == manifest
    assert manifest["format"] == "specdeploy-manifest/1" and manifest["backend"] == "trtllm"
    assert manifest["method"] == "draft_target" and manifest["trtllm_version"] == "1.2.1"
    assert manifest["engines"] == {r: str(root / r) for r in ("baseline", "target", "draft")}
    assert manifest["max_draft_len"] == 4 and manifest["num_draft_tokens"] == 4
    assert manifest["tokenizer_dir"] == "/models/Llama-3.1-8B-Instruct"
    assert [s["status"] for s in manifest["steps"]] == ["built"] * 5
    assert all(len(s["cache_key"]) == 64 for s in manifest["steps"])
    assert set(manifest["steps"][0]) == {"name", "argv", "inputs", "outputs", "cache_key", "status", "seconds"}
    for role in ("baseline", "target", "draft"):
        assert (root / role / "config.json").is_file() and (root / role / "rank0.engine").is_file()
    assert (root / "logs" / "build-target.log").read_text().startswith("$ trtllm-build --checkpoint_dir")
    assert leftovers(root) == []


def test_second_build_is_fully_cached(in_tmp: Path) -> None:
    cfg = parse_config(dtm(), workdir=in_tmp)
    build(cfg, executor=FakeTrtllm(), progress=False)
    again = FakeTrtllm()
    manifest = build(cfg, executor=again, progress=False)
    assert again.calls == []
    assert [s["status"] for s in manifest["steps"]] == ["cached"] * 5


@pytest.mark.parametrize(
    "change,rebuilt",
    [
        ({"speculation.num_draft_tokens": 6}, ["build-target"]),
        ({"build.max_batch_size": 4}, ["build-baseline", "build-target", "build-draft"]),
        ({"speculation.draft.quantization": {"format": "none"}}, ["convert-draft", "build-draft"]),
        ({"loadtest.concurrency": [1, 16]}, []),
    ],
)
def test_config_change_rebuilds_only_affected_steps(in_tmp: Path, change, rebuilt) -> None:
    build(parse_config(dtm(), workdir=in_tmp), executor=FakeTrtllm(), progress=False)
    fake = FakeTrtllm()
    changed = parse_config(dtm(**change), workdir=in_tmp)
    manifest = build(changed, executor=fake, progress=False)
    assert [name for name, _ in fake.calls] == rebuilt
    assert load_manifest(changed)["config_hash"] == manifest["config_hash"]


def test_input_content_change_rebuilds(in_tmp: Path) -> None:
    model = in_tmp / "hf"
    model.mkdir()
    (model / "config.json").write_text("{}")
    cfg = parse_config(dtm(**{"target.checkpoint": str(model)}), workdir=in_tmp)
    build(cfg, executor=FakeTrtllm(), progress=False)
    (model / "config.json").write_text('{"changed": 1}')
    fake = FakeTrtllm()
    build(cfg, executor=fake, progress=False)
    assert [name for name, _ in fake.calls] == ["quantize-target", "build-baseline", "build-target"]


def test_force_rebuilds_everything(in_tmp: Path) -> None:
    cfg = parse_config(dtm(), workdir=in_tmp)
    build(cfg, executor=FakeTrtllm(), progress=False)
    fake = FakeTrtllm()
    build(cfg, force=True, executor=fake, progress=False)
    assert [name for name, _ in fake.calls] == ALL_STEPS


def test_failing_step_leaves_nothing_half_built_and_resumes(in_tmp: Path) -> None:
    cfg = parse_config(dtm(), workdir=in_tmp)
    root = in_tmp / "engines" / "dtm"
    with pytest.raises(BuildError) as err:
        build(cfg, executor=FakeTrtllm(fail_at="build-target"), progress=False)
    message = str(err.value)
    assert "step build-target failed with exit status 1" in message
    assert str(root / "logs" / "build-target.log") in message and "out of memory" in message
    assert not (root / "target").exists() and not (root / "draft").exists()
    assert (root / "baseline" / "config.json").is_file()
    assert leftovers(root) == [] and not (root / "manifest.json").exists()
    with pytest.raises(StaleInputError, match="run `specdeploy build`"):
        load_manifest(cfg)
    resumed = FakeTrtllm()
    manifest = build(cfg, executor=resumed, progress=False)
    assert [name for name, _ in resumed.calls] == ["build-target", "build-draft"]
    assert [s["status"] for s in manifest["steps"]] == ["cached", "cached", "cached", "built", "built"]


def test_interrupt_inside_step_leaves_nothing_half_built_and_resumes(in_tmp: Path) -> None:
    cfg = parse_config(dtm(), workdir=in_tmp)
    root = in_tmp / "engines" / "dtm"
    with pytest.raises(BuildInterrupted) as err:
        build(cfg, executor=FakeTrtllm(interrupt_at="build-baseline"), progress=False)
    assert "step build-baseline" in str(err.value) and err.value.exit_code == 130
    assert not (root / "baseline").exists() and leftovers(root) == []
    assert not (root / "manifest.json").exists()
    resumed = FakeTrtllm()
    build(cfg, executor=resumed, progress=False)
    assert [name for name, _ in resumed.calls] == ALL_STEPS[2:]


def test_builder_silent_change_fails_validation(in_tmp: Path) -> None:
    def paged_off(config: dict) -> None:
        config["build_config"]["plugin_config"]["use_paged_context_fmha"] = False

    cfg = parse_config(dtm(), workdir=in_tmp)
    with pytest.raises(BuildError) as err:
        build(cfg, executor=FakeTrtllm(tamper={"build-draft": paged_off}), progress=False)
    assert "step build-draft" in str(err.value) and "use_paged_context_fmha is off" in str(err.value)
    root = in_tmp / "engines" / "dtm"
    assert not (root / "draft").exists() and leftovers(root) == [] and not (root / "manifest.json").exists()


def test_planned_argv_produce_valid_engines_for_every_trtllm_example(in_tmp: Path) -> None:
    for name, data in EXAMPLES.items():
        manifest = build(parse_config(data, workdir=in_tmp), executor=FakeTrtllm(), progress=False)
        assert manifest["name"] == name


def test_stale_manifest_detected(in_tmp: Path) -> None:
    cfg = parse_config(dtm(), workdir=in_tmp)
    build(cfg, executor=FakeTrtllm(), progress=False)
    assert load_manifest(cfg)["name"] == "dtm"
    with pytest.raises(StaleInputError, match="re-run `specdeploy build`"):
        load_manifest(parse_config(dtm(**{"build.max_batch_size": 4}), workdir=in_tmp))


def test_dry_run_reports_cache_state(in_tmp: Path) -> None:
    cfg = parse_config(dtm(), workdir=in_tmp)
    assert {r["status"] for r in dry_run(cfg)} == {"run"}
    build(cfg, executor=FakeTrtllm(), progress=False)
    assert {r["status"] for r in dry_run(cfg)} == {"cached"}
    rows = dry_run(parse_config(dtm(**{"speculation.num_draft_tokens": 6}), workdir=in_tmp))
    assert [r["name"] for r in rows if r["status"] == "run"] == ["build-target"]


def test_trtllm_build_without_tensorrt_llm_stops_at_once(in_tmp: Path) -> None:
    if trtllm_missing_reason() is None:
        pytest.skip("TensorRT-LLM is installed here")
    with pytest.raises(BuildError) as err:
        build(parse_config(dtm(), workdir=in_tmp), progress=False)
    assert "specdeploy plan" in str(err.value) and "backend: reference" in str(err.value)
    assert not (in_tmp / "engines" / "dtm" / "logs").exists()


# ------------------------------------------------------------------------------------------------
# The real subprocess executor


def script_step(tmp: Path, code: str) -> tuple[Step, Path]:
    out = tmp / "out"
    step = Step("script", [sys.executable, "-c", textwrap.dedent(code), str(out)], [], [str(out)], {"SPECDEPLOY_TEST": "42"})
    return step, tmp / "script.log"


def test_subprocess_executor_streams_both_outputs_into_log(tmp_path: Path) -> None:
    step, log = script_step(tmp_path, """
        import os, sys
        print("to stdout", flush=True)
        print("to stderr", file=sys.stderr, flush=True)
        os.makedirs(sys.argv[1]); print("env", os.environ["SPECDEPLOY_TEST"])
        sys.exit(3)
    """)
    assert SubprocessExecutor().run(step, step.argv, log) == 3
    text = log.read_text()
    assert "to stdout" in text and "to stderr" in text and "env 42" in text


def test_subprocess_executor_kills_child_group_on_interrupt(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    step, log = script_step(tmp_path, f"""
        import os, subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        open({str(pid_file)!r}, "w").write(f"{{os.getpid()}} {{child.pid}}")
        time.sleep(60)
    """)

    def interrupt_when_started() -> None:
        try:  # interrupted in any case: a step that never started fails the pytest.raises below
            wait_until(pid_file.exists, "the step wrote its pids", 120)
        finally:
            _thread.interrupt_main()

    # interrupt_main() does nothing while SIGINT is ignored, and a CI job started as a background
    # job of a script inherits SIGINT ignored: Ctrl-C's Python handler is installed explicitly
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Thread(target=interrupt_when_started, daemon=True).start()
        with pytest.raises(KeyboardInterrupt):
            SubprocessExecutor(kill_timeout_s=5).run(step, step.argv, log)
    finally:
        signal.signal(signal.SIGINT, previous)
    for pid in map(int, pid_file.read_text().split()):
        wait_until(lambda pid=pid: not psutil.pid_exists(pid), f"process {pid} of the step ended after the interrupt", 5)


def test_sigterm_during_real_build_cleans_up(tmp_path: Path) -> None:
    """A `build` process receiving SIGTERM mid-step kills the step, removes its temporary output
    and writes no manifest."""
    marker = tmp_path / "started"
    driver = tmp_path / "driver.py"
    driver.write_text(textwrap.dedent(f"""
        import sys
        from pipeline.build.builder import SubprocessExecutor, build
        from pipeline.config import parse_config

        class SlowSecondStep(SubprocessExecutor):
            def run(self, step, argv, log_path):
                out = argv[argv.index("--output_dir") + 1]
                code = ("import os, sys, time; os.makedirs(sys.argv[1]); "
                        "open({str(marker)!r}, 'w').write('x'); time.sleep(60)")
                return super().run(step, [sys.executable, "-c", code, out], log_path)

        cfg = parse_config({{"name": "sig", "target": {{"checkpoint": "/models/x"}}}}, workdir={str(tmp_path)!r})
        try:
            build(cfg, executor=SlowSecondStep(), progress=False)
        except Exception as exc:
            print("ERROR", type(exc).__name__, exc)
            sys.exit(getattr(exc, "exit_code", 1))
    """))
    proc = subprocess.Popen([sys.executable, str(driver)], stdout=subprocess.PIPE, text=True)
    wait_until(marker.exists, "the build's step started", 120)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out
    assert "BuildInterrupted" in out and "convert-target" in out
    root = tmp_path / "engines" / "sig"
    assert leftovers(root) == [] and not (root / "checkpoints" / "target-trtllm").exists()
    assert not (root / "manifest.json").exists()


def test_draft_target_pair_mismatch_fails_after_build(in_tmp: Path) -> None:
    def other_vocab(config: dict) -> None:
        config["pretrained_config"]["vocab_size"] = 32000

    with pytest.raises(BuildError, match=r"vocab_size differs: target 128256, draft 32000"):
        build(parse_config(dtm(), workdir=in_tmp), executor=FakeTrtllm(tamper={"build-draft": other_vocab}), progress=False)
    assert not (in_tmp / "engines" / "dtm" / "manifest.json").exists()


def test_manifest_with_missing_engine_dir_is_stale(in_tmp: Path) -> None:
    import shutil

    cfg = parse_config(dtm(), workdir=in_tmp)
    build(cfg, executor=FakeTrtllm(), progress=False)
    shutil.rmtree(in_tmp / "engines" / "dtm" / "draft")
    with pytest.raises(StaleInputError, match="engine dirs that are gone"):
        load_manifest(cfg)
    resumed = FakeTrtllm()
    build(cfg, executor=resumed, progress=False)
    assert [name for name, _ in resumed.calls] == ["build-draft"]


def test_cli_trtllm_build_without_tensorrt_llm(in_tmp: Path) -> None:
    if trtllm_missing_reason() is None:
        pytest.skip("TensorRT-LLM is installed here")
    path = in_tmp / "dtm.yaml"
    path.write_text(json.dumps(dtm()))
    proc = specdeploy("build", str(path), "--workdir", str(in_tmp))  # the CLI's main, in this process
    assert proc.returncode == 5  # the environment lacks TensorRT-LLM: a failure, not NO-GO
    assert proc.stderr.startswith("error: TensorRT-LLM is not installed here") and "Traceback" not in proc.stderr
    assert f"specdeploy plan {path}" in proc.stderr and "backend: reference" in proc.stderr


def test_concurrent_build_of_same_deployment_refused(in_tmp: Path) -> None:
    import fcntl

    root = in_tmp / "engines" / "dtm"
    root.mkdir(parents=True)
    with open(root / ".build.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(BuildError, match="another `specdeploy build` is running"):
            build(parse_config(dtm(), workdir=in_tmp), executor=FakeTrtllm(), progress=False)
    build(parse_config(dtm(), workdir=in_tmp), executor=FakeTrtllm(), progress=False)


# ------------------------------------------------------------------------------------------------
# Before and between steps: the example scripts, the checkpoint trtllm-build will read


def test_build_refuses_missing_scripts_before_any_step(in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("pipeline.build.builder.require_trtllm", lambda cfg: None)  # trtllm-build "installed"
    monkeypatch.setenv("SPECDEPLOY_TRTLLM_ROOT", str(in_tmp / "TensorRT-LLM"))
    with pytest.raises(BuildError) as err:
        build(parse_config(dtm(), workdir=in_tmp), progress=False)
    message = str(err.value)
    script = in_tmp / "TensorRT-LLM" / "examples" / "quantization" / "quantize.py"
    assert f"{script} (step quantize-target); {script} (step quantize-draft)" in message
    assert "git clone --branch v1.2.1 https://github.com/NVIDIA/TensorRT-LLM" in message
    assert "pip install -r TensorRT-LLM/examples/quantization/requirements.txt" in message
    assert not (in_tmp / "engines" / "dtm" / "logs").exists()


class FP8KvExport(FakeTrtllm):
    """A quantizer whose export carries FP8 KV although none was asked for."""

    @staticmethod
    def checkpoint(argv: list[str], out: Path) -> None:
        FakeTrtllm.checkpoint(argv, out)
        config = json.loads((out / "config.json").read_text())
        config["quantization"]["kv_cache_quant_algo"] = "FP8"
        (out / "config.json").write_text(json.dumps(config))


def test_checkpoint_quantization_mismatch_stops_before_trtllm_build(in_tmp: Path) -> None:
    fake = FP8KvExport()
    cfg = parse_config(dtm(**{"target.quantization": {"format": "int4_awq"}, "hardware": "a100-80gb",
                              "speculation.draft.quantization": {"format": "int4_awq"}}), workdir=in_tmp)
    with pytest.raises(BuildError, match="quantization.kv_cache_quant_algo is 'FP8', the plan expects None"):
        build(cfg, executor=fake, progress=False)
    assert [name for name, _ in fake.calls] == ["quantize-target"]
    assert leftovers(in_tmp) == [] and not (in_tmp / "engines" / "dtm" / "checkpoints" / "target-trtllm").exists()
