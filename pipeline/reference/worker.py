"""The reference engine in a worker process of its own, behind a proxy with the engine's API.

The ``tensorrt_llm`` Python model (``pipeline.triton_models.llm``) streams one response per step
from threads that need the interpreter lock of the stub process; a decode loop in the same
interpreter waits for that lock at every step (benchmarks/results/served-worker-own-*.json against
served-worker-stub-*.json). So by default the stub starts
the module ``pipeline.reference.worker ENGINE_DIR [CPUS]`` in a Python process of its own
(through :data:`_BOOT`, so the working directory cannot shadow the code) and talks to it over its stdin and
stdout, one JSON object a line (the vLLM V1 "engine core process" split):

- to the worker: ``{"op": "submit", "request": {GenerationRequest fields}}``,
  ``{"op": "cancel", "id": ...}``, ``{"op": "stats", "token": n}``; end of input shuts the
  engine down. The ``request_id`` the worker sees is the proxy's own, one per submit (a
  counter), never the client's: clients reuse ids (upstream's speculative client sends every
  round under one), and chunks or a cancel routed by a reused id reached the wrong request;
- from the worker: first ``{"op": "ready", <limits>}`` (or ``{"op": "failed", "error": ...}``),
  then ``{"op": "chunk", "id": ..., <Chunk fields>}`` for every chunk of every request, and
  ``{"op": "stats", "token": n, "stats": {...}}`` for every stats op (``ReferenceEngine.stats``).

:class:`EngineProcess` validates requests in front of the worker with the scheduler's own rules
(so bad requests fail synchronously, as in-process) and routes chunks to per-request streams.
If the worker dies, every open stream ends with an error chunk saying so, requests are refused
at once (:class:`EngineUnavailable`) while a new worker starts after a back-off, and after too
many crashes in a row it is not restarted again (:class:`RestartPolicy`); each change is logged
and reported to ``on_health`` (the model's /metrics). The worker inherits stderr (the server
log; its own stdout is redirected there too, the protocol keeps a private copy) and the stub's
process group; it ignores SIGINT/SIGTERM and exits when its stdin closes or its stdout breaks,
and as soon as the stub is gone (the parent-death signal, and a parent-pid poll as a fallback:
:func:`follow_parent`), even while the stub's own exit is held up. Reads the engine dir (in the worker); writes nothing on disk.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import itertools
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable

from pipeline.errors import SpecdeployError
from pipeline.reference.api import (
    Chunk,
    GenerationRequest,
    RequestStats,
    SamplingParams,
    check_prompt_length,
    check_request,
)
from pipeline.reference.stream import ChunkStream

LIMITS = ("max_seq_len", "max_draft_len", "max_batch_size", "eos_token_id", "vocab_size", "max_input_len")
MAX_RESTARTS_ENV = "SPECDEPLOY_WORKER_MAX_RESTARTS"
PARENT_ENV = "SPECDEPLOY_WORKER_PARENT_PID"  # the stub's pid, set by the proxy that starts the worker
BACKOFF_ENV = "SPECDEPLOY_WORKER_RESTART_BACKOFF_S"


# -- wire format -------------------------------------------------------------------------------


def encode(message: dict) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


def request_message(request: GenerationRequest) -> dict:
    return {"op": "submit", "request": dataclasses.asdict(request)}


def request_from(fields: dict) -> GenerationRequest:
    return GenerationRequest(**{**fields, "sampling": SamplingParams(**fields["sampling"])})


def chunk_message(request_id: str, chunk: Chunk) -> dict:
    return {"op": "chunk", "id": request_id, "tokens": chunk.tokens, "finished": chunk.finished,
            "finish_reason": chunk.finish_reason, "error": chunk.error,
            # the chunk's stats are already a snapshot (engine._copy_stats): its fields as they
            # are, not dataclasses.asdict's recursive copy, in the engine thread for every chunk
            "stats": None if chunk.stats is None else vars(chunk.stats)}


def chunk_from(message: dict) -> Chunk:
    stats = message["stats"]
    return Chunk(tokens=message["tokens"], finished=message["finished"], finish_reason=message["finish_reason"],
                 stats=None if stats is None else RequestStats(**stats), error=message["error"])


def error_chunk(error: str) -> Chunk:
    return Chunk(tokens=[], finished=True, finish_reason="error", error=error)


# -- the worker ----------------------------------------------------------------------------------


def serve_engine(engine_dir: Path, cpus: tuple[int, ...] | None, inbox: IO[bytes], outbox: IO[bytes]) -> None:
    """Load the engine, then run requests from ``inbox`` until it closes. Chunks are written by
    the engine thread as they appear (a pipe write, no other thread involved)."""

    lock = threading.Lock()

    def emit(message: dict) -> None:
        data = encode(message)
        try:
            with lock:
                outbox.write(data)
                outbox.flush()
        except OSError:  # the proxy (the stub) is gone: nobody to serve
            os._exit(1)

    # start-up: only the worker loads the engine (torch); the stub that proxies it stays torch-free
    from pipeline.reference.engine import load_engine  # noqa: PLC0415 - start-up: torch (pipeline.reference.engine)

    try:
        engine = load_engine(engine_dir, cpus=cpus)
    except Exception as exc:  # noqa: BLE001 - the proxy raises it in the stub
        emit({"op": "failed", "error": f"{type(exc).__name__}: {exc}"})
        return
    emit({"op": "ready", **{key: getattr(engine, key) for key in LIMITS}})
    try:
        for line in inbox:
            message = json.loads(line)
            if message["op"] == "submit":
                request = request_from(message["request"])
                request_id = request.request_id
                try:
                    engine.submit(request, on_chunk=lambda chunk, rid=request_id: emit(chunk_message(rid, chunk)))
                except Exception as exc:  # noqa: BLE001 - checked in the proxy already; a race ends the stream
                    emit(chunk_message(request_id, error_chunk(f"{type(exc).__name__}: {exc}")))
            elif message["op"] == "cancel":
                engine.cancel(message["id"])
            elif message["op"] == "stats":
                emit({"op": "stats", "token": message.get("token"), "stats": engine.stats()})
    finally:
        engine.shutdown()


PR_SET_PDEATHSIG = 1
PARENT_POLL_S = 0.2


def follow_parent(parent_pid: int) -> None:
    """End this process when ``parent_pid`` (the stub) is gone, however it went: the kernel's
    parent-death signal (SIGKILL; Linux), and a thread that polls the parent pid as a fallback (no
    prctl, or a parent that died before the signal was armed). Closing stdin ends the worker too,
    but only once the stub's pipe is closed by the stub's exit: a stub held in its exit would
    hold the worker as well."""
    with contextlib.suppress(OSError, AttributeError):

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_POLL_S)
        os._exit(1)  # nobody to serve: no engine shutdown, no flush

    if os.getppid() != parent_pid:
        os._exit(1)
    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    # like the Python-backend stub, the worker follows its owner instead of signals: it ends when
    # its stdin closes (the model's finalize) or the stub is gone, so a SIGTERM sent to the
    # whole server tree cannot take it away before the model has finalized
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    follow_parent(int(os.environ.get(PARENT_ENV) or os.getppid()))
    cpus = tuple(int(c) for c in args[1].split(",")) if len(args) > 1 and args[1] else None
    # the protocol keeps the original stdout; anything else written to fd 1 (a library's print,
    # C code) goes to stderr, the server log, instead of into the protocol
    outbox = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    serve_engine(Path(args[0]), cpus, sys.stdin.buffer, outbox)
    # the orderly part is done (the engine shut down, every reply written): flush what is buffered
    # and leave without interpreter finalization, which for a process that imported torch costs
    # a large share of a server's stop (tearing down modules and threads nobody will use again)
    with contextlib.suppress(OSError, ValueError):
        outbox.flush()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(0)


# -- the proxy in the stub -----------------------------------------------------------------------


class EngineUnavailable(RuntimeError):
    """The engine worker is down: restarting after a crash, or no longer restarted."""


@dataclass(frozen=True)
class RestartPolicy:
    """How a worker that died is restarted: after ``backoff_s``, doubled for every crash in a row
    up to ``max_backoff_s``; at most ``max_restarts`` times in a row (a failed restart counts as
    a crash); a worker that served ``stable_s`` starts the count afresh."""

    max_restarts: int = 5
    backoff_s: float = 0.5
    max_backoff_s: float = 8.0
    stable_s: float = 60.0

    @classmethod
    def from_env(cls, env=None) -> "RestartPolicy":
        """Defaults, or ``SPECDEPLOY_WORKER_MAX_RESTARTS`` / ``SPECDEPLOY_WORKER_RESTART_BACKOFF_S``."""
        env = os.environ if env is None else env
        policy = cls()
        if env.get(MAX_RESTARTS_ENV):
            policy = dataclasses.replace(policy, max_restarts=int(env[MAX_RESTARTS_ENV]))
        if env.get(BACKOFF_ENV):
            policy = dataclasses.replace(policy, backoff_s=float(env[BACKOFF_ENV]))
        return policy

    def delay(self, in_a_row: int) -> float:
        return min(self.backoff_s * 2 ** (in_a_row - 1), max(self.max_backoff_s, self.backoff_s))


@dataclass(frozen=True)
class WorkerHealth:
    """What ``on_health`` hears after every change (the model publishes it on /metrics)."""

    up: bool
    crashes: int  # unexpected exits so far, failed restarts included
    given_up: bool


def exit_reason(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
        return f"killed by signal {-code}"
    return f"exit status {code}"


class RemoteHandle(ChunkStream):
    """A request of the worker; ``wire_id`` is its name between proxy and worker."""

    def __init__(self, owner: "EngineProcess", request: GenerationRequest, on_chunk, wire_id: str):
        super().__init__(request, on_chunk)
        self._owner = owner
        self.wire_id = wire_id

    def cancel(self) -> None:
        self._owner._cancel_wire(self.wire_id)

    def abandon(self) -> None:
        """Cancel in the worker and stop routing: the stream ends here, whatever the worker does."""
        self._owner._cancel_wire(self.wire_id)
        if self._owner._drop(self.wire_id):
            self._put(Chunk(tokens=[], finished=True, finish_reason="cancelled"))


# `python -m` puts the working directory first on sys.path, so a checkout there would shadow the
# code copy a rendered model passes on through PYTHONPATH; PYTHONSAFEPATH (which the model also
# sets) prevents that only from Python 3.11 on. The worker therefore starts through `-c`, drops
# the working directory's entry itself and runs the module named by its first argument.
_BOOT = ("import runpy, sys\n"
         "if sys.path[:1] == ['']: del sys.path[0]\n"
         "runpy.run_module(sys.argv.pop(1), run_name='__main__', alter_sys=True)")


class EngineProcess:
    """The engine API (``submit``/``cancel``/``shutdown`` and the limits) over a worker process
    that is restarted when it dies (:class:`RestartPolicy`); while it is down, and once its
    restarts ran out, ``submit`` raises :class:`EngineUnavailable` at once."""

    def __init__(self, engine_dir: Path, cpus: tuple[int, ...] | None = None, python: str | None = None, *,
                 name: str = "", policy: RestartPolicy | None = None,
                 on_health: Callable[[WorkerHealth], object] | None = None):
        # the stub's sys.executable is the environment's python3 (serve puts its bin first on PATH)
        python = python or sys.executable or shutil.which("python3")
        self._engine_dir = engine_dir
        self._argv = [python, "-c", _BOOT, "pipeline.reference.worker", str(engine_dir), ",".join(map(str, cpus or ()))]
        self._name = name or Path(engine_dir).name
        self._policy = policy or RestartPolicy.from_env()
        self._on_health = on_health
        self._streams: dict[str, RemoteHandle] = {}  # wire id → stream
        self._wire_ids = itertools.count(1)
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._down: str | None = None  # why the worker cannot take requests now
        self._closing = threading.Event()
        self._crashes = self._in_a_row = 0
        self._stats_lock = threading.Lock()  # one stats op at a time
        self._stats_replies: "queue.SimpleQueue[dict]" = queue.SimpleQueue()
        self._stats_token = 0
        self._process, ready = self._start()
        for key in LIMITS:
            setattr(self, key, ready.get(key))
        self._started_at = time.monotonic()
        self._supervisor = threading.Thread(target=self._supervise, name="engine-worker-supervisor", daemon=True)
        self._supervisor.start()

    @property
    def pid(self) -> int:
        return self._process.pid

    def submit(self, request: GenerationRequest, on_chunk: Callable[[Chunk], object] | None = None) -> RemoteHandle:
        check_prompt_length(len(request.input_ids), self.max_input_len)
        check_request(request, self.vocab_size, self.max_draft_len, self.max_seq_len)
        if not request.request_id:
            request.request_id = uuid.uuid4().hex
        with self._lock:
            if self._down:
                raise EngineUnavailable(self._down)
            stream = RemoteHandle(self, request, on_chunk, str(next(self._wire_ids)))
            self._streams[stream.wire_id] = stream
            process = self._process
        self._write(process, request_message(dataclasses.replace(request, request_id=stream.wire_id)))
        return stream

    def generate(self, request: GenerationRequest):
        return self.submit(request).result()

    def cancel(self, request_id: str) -> bool:
        """Cancel every open request submitted under the client's ``request_id``."""
        with self._lock:
            wires = [wire for wire, stream in self._streams.items() if stream.request_id == request_id]
        for wire in wires:
            self._cancel_wire(wire)
        return bool(wires)

    def _cancel_wire(self, wire_id: str) -> None:
        with self._lock:
            known, process = wire_id in self._streams, self._process
        if known:
            self._write(process, {"op": "cancel", "id": wire_id})

    def _drop(self, wire_id: str) -> bool:
        """Stop routing ``wire_id``'s chunks (True if it was still routed)."""
        with self._lock:
            return self._streams.pop(wire_id, None) is not None

    def stats(self, timeout: float = 5.0) -> dict | None:
        """The worker engine's :data:`~pipeline.reference.api.ENGINE_STATS`, plus
        ``proxy_open_requests`` (streams this proxy still routes); None while the worker is
        down or when it does not answer within ``timeout``."""
        with self._stats_lock:
            with self._lock:
                if self._down or self._closing.is_set():
                    return None
                process = self._process
            self._stats_token += 1
            token = self._stats_token
            self._write(process, {"op": "stats", "token": token})
            deadline = time.monotonic() + timeout
            while (left := deadline - time.monotonic()) > 0:
                try:
                    reply = self._stats_replies.get(timeout=left)
                except queue.Empty:
                    break
                if reply.get("token") == token:  # an older, timed-out reply is dropped
                    with self._lock:
                        return {**reply["stats"], "proxy_open_requests": len(self._streams)}
            return None

    def shutdown(self, timeout: float = 30.0) -> None:
        with self._lock:
            self._closing.set()
            process = self._process
        self._close(process, timeout)
        self._supervisor.join(timeout=5)

    # -- the worker's lifetime -------------------------------------------------------------------

    def _start(self) -> tuple[subprocess.Popen, dict]:
        """A worker, ready (its limits), or SpecdeployError."""
        try:
            process = subprocess.Popen(self._argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       env={**os.environ, PARENT_ENV: str(os.getpid())})
        except OSError as exc:
            raise SpecdeployError(f"cannot start the engine worker ({self._argv[0]}): {exc}") from None
        first = process.stdout.readline()
        try:
            ready = json.loads(first) if first.strip() else {"op": "failed", "error": "the worker exited before it was ready"}
        except ValueError:
            ready = {"op": "failed", "error": f"the worker said {first[:200]!r} instead of ready"}
        if ready.get("op") != "ready":
            process.kill()
            process.wait()
            raise SpecdeployError(f"engine worker for {self._engine_dir}: {ready.get('error')}")
        return process, ready

    def _close(self, process: subprocess.Popen, timeout: float) -> None:
        with self._write_lock, contextlib.suppress(OSError):
            process.stdin.close()  # end of input: the worker shuts its engine down and exits
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def _write(self, process: subprocess.Popen, message: dict) -> None:
        try:
            with self._write_lock:
                process.stdin.write(encode(message))
                process.stdin.flush()
        except (OSError, ValueError):  # the worker is gone; the supervisor ends the streams
            pass

    def _relay(self, process: subprocess.Popen) -> None:
        """Route the worker's chunks to their streams until its output ends."""
        for line in process.stdout:
            try:
                message = json.loads(line)
            except ValueError:  # a line cut short by the worker's death; end of output follows
                continue
            if message.get("op") == "stats":
                self._stats_replies.put(message)
                continue
            chunk = chunk_from(message)
            with self._lock:
                stream = self._streams.pop(message["id"], None) if chunk.finished else self._streams.get(message["id"])
            if stream is not None:
                stream._put(chunk)

    def _supervise(self) -> None:
        process = self._process
        try:
            while process is not None:
                self._relay(process)
                code = process.wait()
                if self._closing.is_set():
                    return
                process = self._recover(f"the engine worker (pid {process.pid}) died: {exit_reason(code)}")
        except Exception as exc:  # noqa: BLE001 - never leave streams hanging
            self._set_down(f"the engine worker's supervisor failed: {type(exc).__name__}: {exc}", given_up=True)

    def _recover(self, reason: str) -> subprocess.Popen | None:
        """After a crash: back off, restart; give up after too many crashes in a row."""
        stable = time.monotonic() - self._started_at >= self._policy.stable_s
        self._in_a_row = 1 if stable else self._in_a_row + 1
        while True:
            self._crashes += 1
            if self._in_a_row > self._policy.max_restarts:
                self._set_down(f"{reason}; it crashed {self._in_a_row} times in a row, so it is not restarted "
                               f"again: {self._name} fails every request until the server is restarted", given_up=True)
                return None
            delay = self._policy.delay(self._in_a_row)
            self._set_down(f"{reason}; restarting it in {delay:g} s (restart {self._in_a_row} of "
                           f"{self._policy.max_restarts} in a row): retry the request shortly")
            if self._closing.wait(delay):
                return None
            try:
                process, _ready = self._start()
            except SpecdeployError as exc:
                reason, self._in_a_row = f"the restarted engine worker failed to start: {exc}", self._in_a_row + 1
                continue
            return self._resume(process)

    def _resume(self, process: subprocess.Popen) -> subprocess.Popen | None:
        with self._lock:
            if self._closing.is_set():
                closing = True
            else:
                closing, self._process, self._down, self._started_at = False, process, None, time.monotonic()
        if closing:
            self._close(process, 30.0)
            return None
        _log(self._name, f"engine worker restarted (pid {process.pid})")
        self._report()
        return process

    def _set_down(self, reason: str, given_up: bool = False) -> None:
        """Refuse new requests with ``reason``; end every open stream with it."""
        with self._lock:
            self._down = reason
            open_streams, self._streams = list(self._streams.values()), {}
        _log(self._name, reason)
        for stream in open_streams:
            stream._put(error_chunk(reason))
        self._report(given_up)

    def _report(self, given_up: bool = False) -> None:
        if self._on_health is not None:
            with contextlib.suppress(Exception):
                self._on_health(WorkerHealth(up=self._down is None, crashes=self._crashes, given_up=given_up))


def _log(name: str, message: str) -> None:
    """A line in the server log (the stub's stderr)."""
    print(f"specdeploy: {name}: {message}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
