"""Run a :class:`~pipeline.plan.planner.BuildPlan`: ``specdeploy build``.

Reads the config and the files each step names; writes, under ``engines/<name>/``: every step's
outputs, ``logs/<step>.log`` (the step's stdout + stderr), ``.stamps/<step>.json`` (the cache key
of the outputs in place) and, last, ``manifest.json`` (the contract every later stage reads).

- **No shell**: steps are argv lists, run by a :class:`StepExecutor` (injectable; the default
  :class:`SubprocessExecutor` starts each step in its own process group, stops that tree on
  Ctrl-C/SIGTERM, and the step ends with the build however the build ends).
- **Cache**: a step is skipped when its key — sha256 of the argv plus a fingerprint of each input
  (the producing step's key for outputs of earlier steps, file content otherwise) — equals the
  stamp and its outputs exist.
- **Atomic outputs**: a step writes ``<out>.tmp-<pid>`` (the runner rewrites the argv), which is
  checked (TensorRT-LLM engines against the plan's expectations) and then renamed into place. A
  failure or interrupt removes the temporary outputs and leaves the manifest unwritten; the next
  build resumes at the first step that is not cached.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import shlex
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator, Protocol

from pipeline import __version__
from pipeline.artefacts.live_preflight import provenance_line
from pipeline.artefacts.manifest import MANIFEST_FORMAT, BuildManifest, read_manifest  # noqa: F401 - MANIFEST_FORMAT re-exported
from pipeline.config import DeploymentConfig, config_hash
from pipeline.errors import EXIT_INTERRUPTED, BuildError
from pipeline.infra.atomic import write_json_atomic
from pipeline.infra.owner_lock import DirectoryBusy, owned
from pipeline.infra.processes import spawn
from pipeline.infra.provenance import git_sha, package_version, versions
from pipeline.methods import get_method
from pipeline.paths import PROJECT_ROOT, engine_root, manifest_path
from pipeline.plan.llmapi import missing_modelopt_scripts
from pipeline.plan.planner import BuildPlan, Step, make_plan
from pipeline.trtllm.checkpoint_config import validate_checkpoint_dir
from pipeline.trtllm.engine_config import draft_target_pair_problems, validate_engine_dir
from pipeline.trtllm.layout import missing_scripts, missing_scripts_fix, missing_scripts_message

STAMPS_DIR = ".stamps"
FULL_HASH_LIMIT = 64 * 1024 * 1024  # bigger files are fingerprinted by size + mtime
LOG_TAIL_LINES = 8


class BuildInterrupted(BuildError):
    """Ctrl-C or SIGTERM during a step; nothing half-built is left behind."""

    exit_code = EXIT_INTERRUPTED


class StepExecutor(Protocol):
    def run(self, step: Step, argv: list[str], log_path: Path) -> int:
        """Run ``argv`` (``step.argv`` with outputs pointed at temporary paths), sending stdout and
        stderr to ``log_path``; return the exit status."""


class SubprocessExecutor:
    """Runs each step as a child process in its own process group, output appended to the log;
    under a keeper (:func:`pipeline.infra.processes.spawn`), so a step never outlives the build."""

    def __init__(self, kill_timeout_s: float = 10.0):
        self.kill_timeout_s = kill_timeout_s

    def run(self, step: Step, argv: list[str], log_path: Path) -> int:
        env = {**os.environ, **step.env}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT_ROOT), env.get("PYTHONPATH")]))
        with open(log_path, "ab", buffering=0) as log:
            proc = spawn(argv, env=env, stdout=log, stderr=subprocess.STDOUT, grace_s=self.kill_timeout_s)
            try:
                while True:  # short waits: Ctrl-C/SIGTERM are seen even if another thread got the signal
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        return proc.wait(timeout=0.2)
            except BaseException:
                proc.stop(self.kill_timeout_s)
                raise


# ------------------------------------------------------------------------------------------------
# Fingerprints and cache keys


def _file_fingerprint(path: Path) -> str:
    stat = path.stat()
    if stat.st_size > FULL_HASH_LIMIT:
        return f"size={stat.st_size},mtime={stat.st_mtime_ns}"
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def content_fingerprint(path: Path) -> str:
    """sha256 over a file, or over every file of a directory (relative names + contents)."""
    if not path.exists():
        return "missing"
    if path.is_file():
        return _file_fingerprint(path)
    digest = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(path, followlinks=True):
        dirnames.sort()
        for name in sorted(filenames):
            file_path = Path(dirpath) / name
            digest.update(f"{file_path.relative_to(path)}\0{_file_fingerprint(file_path)}\n".encode())
    return digest.hexdigest()


def cache_key(step: Step, input_fingerprints: list[str]) -> str:
    payload = {"argv": step.argv, "env": step.env, "inputs": list(zip(step.inputs, input_fingerprints))}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


# ------------------------------------------------------------------------------------------------
# Filesystem helpers


def remove_path(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


def tmp_path(out: str) -> str:
    return f"{out}.tmp-{os.getpid()}"


def remove_stale_tmps(out: str) -> None:
    target = Path(out)
    if target.parent.is_dir():
        for stale in target.parent.glob(f"{target.name}.tmp-*"):
            remove_path(stale)


def redirect_argv(argv: list[str], renames: dict[str, str]) -> list[str]:
    """Point every argv element naming an output (or a path inside it) at its temporary path."""
    result = []
    for arg in argv:
        for out, tmp in renames.items():
            if arg == out or arg.startswith(out + os.sep):
                arg = tmp + arg[len(out) :]
                break
        result.append(arg)
    return result


def _log_tail(log_path: Path) -> str:
    try:
        lines = log_path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    tail = [line for line in lines if line.strip()][-LOG_TAIL_LINES:]
    return ("\n  | " + "\n  | ".join(tail)) if tail else ""


@contextlib.contextmanager
def build_lock(root: Path, wait: bool = False) -> Iterator[None]:
    """One build per deployment at a time: ``<root>/.build.lock``, owned as a run directory is
    (:mod:`pipeline.infra.owner_lock`). Taken: BuildError naming the owner, or with ``wait`` a
    wait for it (``specdeploy run``: a second run of the config builds nothing after the first)."""

    def waiting(owner) -> None:
        print(f"  waiting for the build of {root} by {owner.describe() if owner else 'another process'}",
              flush=True)

    try:
        with owned(root, "building", name=".build.lock", wait=wait, on_wait=waiting):
            yield
    except DirectoryBusy as busy:
        who = busy.owner.describe() if busy.owner else "its owner wrote no record"
        raise BuildError(f"another `specdeploy build` is running for {root}: {who} (lock {root / '.build.lock'})") from None


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Turn SIGTERM into KeyboardInterrupt while a build runs (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# ------------------------------------------------------------------------------------------------
# Progress


class _Reporter:
    def begin(self, index: int, total: int, step: Step) -> None: ...

    def end(self, step: Step, status: str, seconds: float) -> None: ...

    def close(self) -> None: ...


class _RichReporter(_Reporter):
    def __init__(self) -> None:
        from rich.console import Console  # noqa: PLC0415 - start-up: rich (the build's spinner, shown only on a terminal)
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn  # noqa: PLC0415 - start-up: rich (the build's spinner, shown only on a terminal)

        self.console = Console(stderr=True)
        self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                                 console=self.console, transient=True)
        self.progress.start()
        self.task = None

    def begin(self, index: int, total: int, step: Step) -> None:
        if self.task is not None:
            self.progress.remove_task(self.task)
        self.task = self.progress.add_task(f"[{index}/{total}] {step.name}", total=None)

    def end(self, step: Step, status: str, seconds: float) -> None:
        mark = "[green]✓[/]" if status == "built" else "[dim]•[/]"
        self.progress.console.print(f"{mark} {step.name}: {status} ({seconds:.1f} s)")

    def close(self) -> None:
        self.progress.stop()


# ------------------------------------------------------------------------------------------------
# The runner


@dataclass
class _Runner:
    cfg: DeploymentConfig
    plan: BuildPlan
    executor: StepExecutor
    force: bool
    reporter: _Reporter
    keys: dict[str, str] = field(default_factory=dict)  # output path → key of the step that made it
    records: list[dict[str, Any]] = field(default_factory=list)

    @property
    def root(self) -> Path:
        return Path(self.plan.root)

    def stamp_path(self, step: Step) -> Path:
        return self.root / STAMPS_DIR / f"{step.name}.json"

    def log_path(self, step: Step) -> Path:
        return self.root / "logs" / f"{step.name}.log"

    def fingerprint(self, path: str) -> str:
        return self.keys.get(path) or content_fingerprint(Path(path))

    def is_cached(self, step: Step, key: str) -> bool:
        if self.force:
            return False
        try:
            stamp = json.loads(self.stamp_path(step).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return False
        return stamp.get("cache_key") == key and all(os.path.lexists(out) for out in step.outputs)

    def run_all(self) -> None:
        for out in (out for step in self.plan.steps for out in step.outputs):
            remove_stale_tmps(out)
        total = len(self.plan.steps)
        for index, step in enumerate(self.plan.steps, 1):
            self.reporter.begin(index, total, step)
            key = cache_key(step, [self.fingerprint(path) for path in step.inputs])
            started = time.monotonic()
            status = "cached" if self.is_cached(step, key) else self.run_step(step, key)
            seconds = round(time.monotonic() - started, 3)
            self.reporter.end(step, status, seconds)
            for out in step.outputs:
                self.keys[out] = content_fingerprint(Path(out)) if step.kind == "resolve" else key
            self.records.append({**step.to_json(), "cache_key": key, "status": status, "seconds": seconds})

    def run_step(self, step: Step, key: str) -> str:
        renames = {out: tmp_path(out) for out in step.outputs}
        for directory in [str(Path(out).parent) for out in step.outputs] + step.scratch_dirs:
            Path(directory).mkdir(parents=True, exist_ok=True)
        log_path = self.log_path(step)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        argv = redirect_argv(step.argv, renames)
        log_path.write_text(f"$ {shlex.join(argv)}\n", encoding="utf-8")
        try:
            status = self.executor.run(step, argv, log_path)
            if status != 0:
                raise BuildError(f"step {step.name} failed with exit status {status}; log: {log_path}{_log_tail(log_path)}")
            for out, tmp in renames.items():
                if not os.path.lexists(tmp):
                    raise BuildError(f"step {step.name} exited 0 but did not write {out}; log: {log_path}")
            if step.expect is not None:
                validate_engine_dir(Path(renames[step.outputs[0]]), step.expect, step.name)
            if step.expect_checkpoint is not None:
                validate_checkpoint_dir(Path(renames[step.outputs[0]]), step.expect_checkpoint, step.name)
        except KeyboardInterrupt:
            self.discard(renames)
            raise BuildInterrupted(
                f"build interrupted during step {step.name} (log: {log_path}); nothing half-built was kept — "
                "re-run `specdeploy build` to resume"
            ) from None
        except BaseException:
            self.discard(renames)
            raise
        self.commit(renames)
        write_json_atomic(self.stamp_path(step), {"cache_key": key, "outputs": step.outputs})
        return "built"

    @staticmethod
    def discard(renames: dict[str, str]) -> None:
        for tmp in renames.values():
            with contextlib.suppress(OSError):
                remove_path(Path(tmp))

    @staticmethod
    def commit(renames: dict[str, str]) -> None:
        for out, tmp in renames.items():
            old = Path(f"{out}.old-{os.getpid()}")
            if os.path.lexists(out):
                os.replace(out, old)
            os.replace(tmp, out)
            if os.path.lexists(old):
                remove_path(old)


def _versions(cfg: DeploymentConfig) -> dict[str, str | None]:
    found = {**versions(()), "specdeploy": __version__}
    if cfg.backend == "trtllm":
        found["tensorrt_llm_pinned"] = cfg.trtllm_version
        found["tensorrt_llm"] = package_version("tensorrt_llm", "tensorrt-llm")
        found["live_preflight"] = provenance_line(cfg)
    else:
        found["torch"] = package_version("torch")
    return found


def _manifest(cfg: DeploymentConfig, plan: BuildPlan, records: list[dict[str, Any]]) -> dict[str, Any]:
    return BuildManifest(
        name=cfg.name, config_hash=plan.config_hash, backend=cfg.backend, method=cfg.method,
        trtllm_version=plan.trtllm_version,
        trtllm_runtime=cfg.runtime if cfg.backend == "trtllm" else None, created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        tool_version=__version__, git_sha=git_sha(),
        engines={role: str(Path(path).absolute()) for role, path in plan.engines.items()},
        tokenizer_dir=os.path.realpath(plan.tokenizer_dir), max_draft_len=plan.max_draft_len,
        num_draft_tokens=plan.num_draft_tokens, trtllm_root=plan.trtllm_root.path if plan.trtllm_root else None,
        steps=records, versions=_versions(cfg),
    ).dump()


def trtllm_missing_reason() -> str | None:
    if shutil.which("trtllm-build") is None:
        return "no `trtllm-build` on PATH"
    if importlib.util.find_spec("tensorrt_llm") is None:
        return "`import tensorrt_llm` fails"
    return None


def require_trtllm(cfg: DeploymentConfig) -> None:
    """Raise :class:`BuildError` at once when a ``trtllm`` build cannot run on this machine."""
    reason = trtllm_missing_reason()
    if reason:
        raise BuildError(
            f"TensorRT-LLM is not installed here ({reason}), so backend 'trtllm' cannot build. "
            f"Run `specdeploy plan {cfg.source_path or 'CONFIG'}` to print the exact commands for a GPU host "
            f"(NGC image {cfg.triton.container_image}), or set `backend: reference` to build the CPU reference engines."
        )


def require_scripts(plan: BuildPlan, cfg: DeploymentConfig) -> None:
    """Raise :class:`BuildError` before any step runs when a TensorRT-LLM script the plan runs is
    missing under the resolved examples root, naming each one and how to get them."""
    if cfg.runs_llm_api:
        problems = missing_modelopt_scripts(plan)
        if problems:
            raise BuildError("; ".join(f"{message}. Fix: {fix}" for message, fix in problems))
        return
    if plan.trtllm_root is None:
        return
    missing = missing_scripts(plan.steps, plan.trtllm_root.path)
    if missing:
        raise BuildError(missing_scripts_message(missing, plan.trtllm_root)
                         + f". Fix: {missing_scripts_fix(missing, plan.trtllm_root.path, cfg.trtllm_version)}")


def _check_engine_pair(plan: BuildPlan) -> None:
    if plan.backend != "trtllm" or not get_method(plan.method).draft_model or "target" not in plan.engines:
        return  # the LLM-API runtime builds no engines (its draft and target are checkpoints)
    problems = draft_target_pair_problems(Path(plan.engines["target"]), Path(plan.engines["draft"]))
    if problems:
        raise BuildError("the draft-target engine pair does not fit together:\n  " + "\n  ".join(problems))


def dry_run(cfg: DeploymentConfig, *, force: bool = False, trtllm_root: str | None = None) -> list[dict[str, Any]]:
    """Which steps a build would run now (``cached`` / ``run``), without running any."""
    plan = make_plan(cfg, trtllm_root)
    runner = _Runner(cfg, plan, SubprocessExecutor(), force, _Reporter())
    rows = []
    for step in plan.steps:
        key = cache_key(step, [runner.fingerprint(p) for p in step.inputs])
        cached = runner.is_cached(step, key)
        for out in step.outputs:
            runner.keys[out] = key if step.kind != "resolve" else content_fingerprint(Path(out))
        rows.append({**step.to_json(), "cache_key": key, "status": "cached" if cached else "run"})
    return rows


def build(
    cfg: DeploymentConfig,
    *,
    force: bool = False,
    executor: StepExecutor | None = None,
    progress: bool = True,
    trtllm_root: str | None = None,
    wait_for_lock: bool = False,
) -> dict[str, Any]:
    """Run the plan of ``cfg`` and write ``engines/<name>/manifest.json``; return the manifest.
    ``wait_for_lock``: wait for another process's build of the deployment instead of refusing.

    Without an injected ``executor`` a ``trtllm`` build needs TensorRT-LLM on this machine and
    stops at once otherwise."""
    plan = make_plan(cfg, trtllm_root)
    if executor is None:
        if cfg.backend == "trtllm":
            if not cfg.runs_llm_api:  # the LLM-API plan runs no TensorRT-LLM command, only ModelOpt
                require_trtllm(cfg)
            require_scripts(plan, cfg)
        executor = SubprocessExecutor()
    engine_root(cfg).mkdir(parents=True, exist_ok=True)
    with build_lock(Path(plan.root), wait=wait_for_lock):
        reporter = _RichReporter() if progress else _Reporter()
        runner = _Runner(cfg, plan, executor, force, reporter)
        try:
            with sigterm_as_interrupt():
                runner.run_all()
        finally:
            reporter.close()
        _check_engine_pair(plan)
        manifest = _manifest(cfg, plan, runner.records)
        write_json_atomic(manifest_path(cfg).absolute(), manifest)
    return manifest


def load_manifest(cfg: DeploymentConfig, *, check_engine_dirs: bool = True) -> dict[str, Any]:
    """The manifest of the last build of ``cfg``; :class:`StaleInputError` when it is missing or was
    built from another version of the config."""
    return read_manifest(manifest_path(cfg), config_hash(cfg), check_engine_dirs=check_engine_dirs)

