"""The reference engine in a worker process of its own, behind a proxy with the engine's API.

The ``tensorrt_llm`` Python model (``pipeline.triton_models.llm``) streams one response per step
from threads that need the interpreter lock of the stub process; a decode loop in the same
interpreter waits for that lock at every step (measured on 2 cores: ~0.25 ms a token, served
÷ in-process 0.89 → 0.90–0.93 in a worker). So by default the stub starts
``python -m pipeline.reference.worker ENGINE_DIR [CPUS]`` and talks to it over its stdin and
stdout, one JSON object a line (the vLLM V1 "engine core process" split):

- to the worker: ``{"op": "submit", "request": {GenerationRequest fields}}``,
  ``{"op": "cancel", "id": ...}``; end of input shuts the engine down;
- from the worker: first ``{"op": "ready", <limits>}`` (or ``{"op": "failed", "error": ...}``),
  then ``{"op": "chunk", "id": ..., <Chunk fields>}`` for every chunk of every request.

:class:`EngineProcess` validates requests in front of the worker with the scheduler's own rules
(so bad requests fail synchronously, as in-process), routes chunks to per-request streams, and
ends every open stream with an error chunk if the worker dies. The worker inherits stderr (the
server log; its own stdout is redirected there too, the protocol keeps a private copy) and the
stub's process group (stopping the server stops it); it exits when its stdin closes. Reads the
engine dir (in the worker); writes nothing on disk.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import IO, Callable

from pipeline.errors import SpecdeployError
from pipeline.reference.api import Chunk, GenerationRequest, RequestStats, SamplingParams
from pipeline.reference.engine import ChunkStream
from pipeline.reference.scheduler import check_request

LIMITS = ("max_seq_len", "max_draft_len", "max_batch_size", "eos_token_id", "vocab_size")


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
    from pipeline.reference.engine import load_engine  # noqa: PLC0415 - imports torch

    lock = threading.Lock()

    def emit(message: dict) -> None:
        data = encode(message)
        with lock:
            outbox.write(data)
            outbox.flush()

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
    finally:
        engine.shutdown()


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    cpus = tuple(int(c) for c in args[1].split(",")) if len(args) > 1 and args[1] else None
    # the protocol keeps the original stdout; anything else written to fd 1 (a library's print,
    # C code) goes to stderr, the server log, instead of into the protocol
    outbox = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    serve_engine(Path(args[0]), cpus, sys.stdin.buffer, outbox)


# -- the proxy in the stub -----------------------------------------------------------------------


class RemoteHandle(ChunkStream):
    def __init__(self, owner: "EngineProcess", request: GenerationRequest, on_chunk):
        super().__init__(request, on_chunk)
        self._owner = owner

    def cancel(self) -> None:
        self._owner.cancel(self.request_id)


class EngineProcess:
    """The engine API (``submit``/``cancel``/``shutdown`` and the limits) over a worker process."""

    def __init__(self, engine_dir: Path, cpus: tuple[int, ...] | None = None, python: str | None = None):
        # the stub's sys.executable is the environment's python3 (serve puts its bin first on PATH)
        python = python or sys.executable or shutil.which("python3")
        argv = [python, "-m", "pipeline.reference.worker", str(engine_dir), ",".join(map(str, cpus or ()))]
        try:
            self._process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        except OSError as exc:
            raise SpecdeployError(f"cannot start the engine worker ({argv[0]}): {exc}") from None
        first = self._process.stdout.readline()
        ready = json.loads(first) if first.strip() else {"op": "failed", "error": "the worker exited before it was ready"}
        if ready.get("op") != "ready":
            self._process.kill()
            self._process.wait()
            raise SpecdeployError(f"engine worker for {engine_dir}: {ready.get('error')}")
        for key in LIMITS:
            setattr(self, key, ready[key])
        self._streams: dict[str, RemoteHandle] = {}
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._gone: str | None = None  # why the worker is not there any more
        self._reader = threading.Thread(target=self._read, name="engine-worker-reader", daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self._process.pid

    def submit(self, request: GenerationRequest, on_chunk: Callable[[Chunk], object] | None = None) -> RemoteHandle:
        check_request(request, self.vocab_size, self.max_draft_len, self.max_seq_len)
        if not request.request_id:
            request.request_id = uuid.uuid4().hex
        stream = RemoteHandle(self, request, on_chunk)
        with self._lock:
            if self._gone:
                raise RuntimeError(self._gone)
            self._streams[request.request_id] = stream
        self._write(request_message(request))
        return stream

    def generate(self, request: GenerationRequest):
        return self.submit(request).result()

    def cancel(self, request_id: str) -> bool:
        with self._lock:
            known = request_id in self._streams
        if known:
            self._write({"op": "cancel", "id": request_id})
        return known

    def shutdown(self, timeout: float = 30.0) -> None:
        with self._write_lock:
            try:
                self._process.stdin.close()
            except OSError:
                pass
        try:
            self._process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._reader.join(timeout=5)

    def _write(self, message: dict) -> None:
        try:
            with self._write_lock:
                self._process.stdin.write(encode(message))
                self._process.stdin.flush()
        except (OSError, ValueError):  # the worker is gone; the reader ends the streams
            pass

    def _read(self) -> None:
        for line in self._process.stdout:
            message = json.loads(line)
            chunk = chunk_from(message)
            with self._lock:
                stream = self._streams.pop(message["id"], None) if chunk.finished else self._streams.get(message["id"])
            if stream is not None:
                stream._put(chunk)
        code = self._process.wait()
        with self._lock:
            self._gone = f"the engine worker process exited (code {code})"
            open_streams, self._streams = list(self._streams.values()), {}
        for stream in open_streams:
            stream._put(error_chunk(self._gone))


if __name__ == "__main__":
    main()
