"""The reference engine: loads ``<engine_dir>/engine.json`` (descriptor in
:mod:`pipeline.reference.api`) and the checkpoints it names, and runs an in-flight batching loop
on a background thread around :class:`pipeline.reference.scheduler.Scheduler`.

``submit`` is thread-safe and validates synchronously (``ValueError`` / ``DraftTooLongError``);
requests join the batch between iterations and leave as soon as they finish. Each handle streams
:class:`~pipeline.reference.api.Chunk` objects (new tokens only; the last one ``finished``);
``cancel`` ends a stream with ``finish_reason='cancelled'``. Reads the engine dir; writes nothing.
"""

from __future__ import annotations

import dataclasses
import json
import queue
import threading
import time
import uuid
from pathlib import Path
from typing import Callable, Iterator

import torch

from pipeline.cpu_pinning import pin_this_thread
from pipeline.errors import SpecdeployError
from pipeline.reference.api import (
    ENGINE_DESCRIPTOR,
    ENGINE_FORMAT,
    Chunk,
    GenerationRequest,
    GenerationResult,
    RequestStats,
)
from pipeline.reference.modeling import EagleHead, LlamaModel, MedusaHeads
from pipeline.reference.ngram import NgramProposer
from pipeline.reference.proposers import DraftModelProposer, EagleProposer, MedusaProposer, Proposer
from pipeline.reference.scheduler import Scheduler, SeqState, make_generator

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}
ROLES = ("baseline", "target", "draft", "speculative")


class ChunkStream:
    """A request's stream of chunks (see :class:`pipeline.reference.api.RequestHandle`): fed by
    ``_put`` from the thread that produces chunks, read by ``chunks``/``result``. ``cancel`` is
    the producer's business (:class:`Handle` here, the worker proxy in
    :mod:`pipeline.reference.worker`)."""

    def __init__(self, request: GenerationRequest, on_chunk: Callable[[Chunk], object] | None = None):
        self.request_id = request.request_id
        self._prompt = list(request.input_ids)
        self._on_chunk = on_chunk
        self._queue: "queue.SimpleQueue[Chunk]" = queue.SimpleQueue()
        self._tokens: list[int] = []
        self._final: Chunk | None = None

    def _put(self, chunk: Chunk) -> None:
        if self._on_chunk is not None:
            try:
                chunk.payload = self._on_chunk(chunk)
            except Exception:  # noqa: BLE001 - the consumer sees payload None and builds its own
                chunk.payload = None
        self._queue.put(chunk)

    def chunks(self, timeout: float | None = None) -> Iterator[Chunk]:
        while self._final is None:
            try:
                chunk = self._queue.get(timeout=timeout)
            except queue.Empty:
                raise TimeoutError(f"request {self.request_id!r}: no chunk within {timeout} s") from None
            self._tokens.extend(chunk.tokens)
            if chunk.finished:
                self._final = chunk
            yield chunk

    def result(self, timeout: float | None = None) -> GenerationResult:
        for _ in self.chunks(timeout):
            pass
        final = self._final
        if final.error:
            raise RuntimeError(final.error)
        return GenerationResult(list(self._prompt), list(self._tokens), final.finish_reason, final.stats)

    def cancel(self) -> None:
        raise NotImplementedError


class Handle(ChunkStream):
    """A request of this process's engine."""

    def __init__(self, engine: "ReferenceEngine", seq: SeqState, on_chunk: Callable[[Chunk], object] | None = None):
        super().__init__(seq.request, on_chunk)
        self._engine = engine
        self._seq = seq

    def cancel(self) -> None:
        self._seq.cancelled = True
        self._engine._wake()


class ReferenceEngine:
    """Target + optional proposer + in-flight batching thread (api.Engine)."""

    def __init__(self, scheduler: Scheduler, descriptor: dict, cpus: tuple[int, ...] | None = None):
        self.scheduler = scheduler
        self.cpus = cpus  # the decode thread pins itself to these (pipeline.cpu_pinning); None: unpinned
        self.descriptor = descriptor
        self.role = descriptor.get("role", "baseline")
        self.method = descriptor.get("proposer", {}).get("method", "none")
        self.vocab_size = scheduler.vocab_size
        self.max_draft_len = scheduler.max_draft_len
        self.max_batch_size = scheduler.max_batch_size
        self.max_seq_len = scheduler.max_seq_len
        self.eos_token_id = scheduler.target.shape.eos_token_id
        self._lock = threading.Condition()
        self._waiting: list[SeqState] = []
        self._handles: dict[str, Handle] = {}
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name="reference-engine", daemon=True)
        self._thread.start()

    # -- public API ------------------------------------------------------------------------

    def submit(self, request: GenerationRequest, on_chunk: Callable[[Chunk], object] | None = None) -> Handle:
        self.scheduler.check(request)
        if not request.request_id:
            request.request_id = uuid.uuid4().hex
        seq = SeqState(request=request, params=request.sampling, generator=make_generator(request.sampling.seed),
                       tokens=list(request.input_ids))
        seq.stats.arrival_time_ns = time.monotonic_ns()
        handle = Handle(self, seq, on_chunk)
        with self._lock:
            if self._stopped:
                raise RuntimeError("engine is shut down")
            self._handles[request.request_id] = handle
            self._waiting.append(seq)
            self._lock.notify()
        return handle

    def generate(self, request: GenerationRequest) -> GenerationResult:
        return self.submit(request).result()

    def cancel(self, request_id: str) -> bool:
        with self._lock:
            handle = self._handles.get(request_id)
        if handle is None:
            return False
        handle.cancel()
        return True

    def shutdown(self) -> None:
        with self._lock:
            self._stopped = True
            self._lock.notify()
        self._thread.join(timeout=30)

    def _wake(self) -> None:
        with self._lock:
            self._lock.notify()

    # -- the loop --------------------------------------------------------------------------

    def _loop(self) -> None:
        if self.cpus:
            pin_this_thread(self.cpus)
        active: list[SeqState] = []
        with torch.inference_mode():
            while True:
                with self._lock:
                    while not self._stopped and not active and not self._waiting:
                        self._lock.wait()
                    if self._stopped:
                        break
                    room = self.max_batch_size - len(active)
                    joining, self._waiting = self._waiting[:room], self._waiting[room:]
                for seq in joining:
                    self._run_guarded([seq], lambda s=seq: self.scheduler.admit(s))
                    if seq.cache is not None or seq.finished:
                        active.append(seq)
                active = self._settle(active)
                running = [s for s in active if not s.finished]
                if running:
                    self._run_guarded(running, lambda: self.scheduler.step(running))
                active = self._settle(active)
            for seq in active + self._waiting:
                seq.finish_reason = seq.finish_reason or "cancelled"
                self._finish(seq)

    def _run_guarded(self, seqs: list[SeqState], work) -> None:
        try:
            work()
        except Exception as exc:  # noqa: BLE001 - one bad batch must not kill the server loop
            for seq in seqs:
                seq.finish_reason = "error"
                self._finish(seq, error=f"{type(exc).__name__}: {exc}")

    def _settle(self, active: list[SeqState]) -> list[SeqState]:
        """Stream new tokens; retire finished and cancelled sequences."""
        still = []
        for seq in active:
            if seq.cancelled and not seq.finished:
                seq.finish_reason = "cancelled"
            if seq.finish_reason == "error":
                continue  # already reported
            if seq.finished:
                self._finish(seq)
            else:
                if len(seq.output) > seq.emitted:
                    self._send(seq, finished=False)
                still.append(seq)
        return still

    def _send(self, seq: SeqState, finished: bool, error: str | None = None) -> None:
        new = seq.output[seq.emitted :]
        seq.emitted = len(seq.output)
        chunk = Chunk(tokens=list(new), finished=finished, finish_reason=seq.finish_reason if finished else None,
                      stats=_copy_stats(seq.stats), error=error)
        handle = self._handles.get(seq.request.request_id)
        if handle is not None:
            handle._put(chunk)

    def _finish(self, seq: SeqState, error: str | None = None) -> None:
        try:
            self.scheduler.release(seq)
        finally:
            self._send(seq, finished=True, error=error)
            with self._lock:
                self._handles.pop(seq.request.request_id, None)


def _copy_stats(stats: RequestStats) -> RequestStats:
    """A snapshot for a chunk (every step sends one: a shallow copy plus the two lists, not
    ``copy.deepcopy``, which cost ~10x more)."""
    return dataclasses.replace(stats, accepted_per_position=list(stats.accepted_per_position),
                               drafted_per_position=list(stats.drafted_per_position))


# ----------------------------------------------------------------------------------------------
# Construction


def _path(value: str, base: Path) -> Path:
    path = Path(value)
    return path if path.is_absolute() else (base / path)


def _build_proposer(spec: dict, target: LlamaModel, dtype: torch.dtype, slots: int, max_rows: int,
                    base: Path) -> Proposer | None:
    """``spec["draft_int8"]``: quantize the draft-side weights (draft model, heads) to int8 at
    load — cheaper draft steps, output unchanged (only acceptance may move)."""
    proposer = _make_proposer(spec, target, dtype, slots, max_rows, base)
    if proposer is not None and spec.get("draft_int8") and dtype == torch.float32:
        for name in ("model", "heads", "head"):
            if hasattr(proposer, name):
                getattr(proposer, name).to_int8()
    return proposer


def _make_proposer(spec: dict, target: LlamaModel, dtype: torch.dtype, slots: int, max_rows: int,
                   base: Path) -> Proposer | None:
    method = spec.get("method", "none")
    if method == "none":
        return None
    if method == "draft_target":
        draft = LlamaModel(_path(spec["draft_dir"], base), dtype)
        if draft.shape.vocab_size != target.shape.vocab_size:
            raise SpecdeployError(f"draft vocab {draft.shape.vocab_size} != target vocab {target.shape.vocab_size}")
        return DraftModelProposer(draft, int(spec.get("num_draft_tokens", 4)), slots, max_rows)
    if method == "medusa":
        heads = MedusaHeads(_path(spec["heads_dir"], base), dtype, spec.get("num_heads"))
        return MedusaProposer(heads, int(spec.get("num_heads") or heads.num_heads), spec.get("choices"))
    if method == "eagle":
        head = EagleHead(_path(spec["head_dir"], base), target, dtype)
        choices = spec.get("choices")
        depth = max(len(c) for c in choices) if choices else int(spec.get("num_layers", 4))
        return EagleProposer(head, depth, slots, max_rows, choices)
    if method == "ngram":
        return NgramProposer.from_spec(spec)
    raise SpecdeployError(f"unknown proposer method {method!r}")


def engine_from_descriptor(descriptor: dict, base: Path = Path("."),
                           cpus: tuple[int, ...] | None = None) -> ReferenceEngine:
    role = descriptor.get("role", "baseline")
    if role not in ROLES:
        raise SpecdeployError(f"engine.json: role {role!r} is not one of {ROLES}")
    dtype_name = descriptor.get("compute_dtype", "float32")
    if dtype_name not in DTYPES:
        raise SpecdeployError(f"engine.json: compute_dtype {dtype_name!r} is not one of {sorted(DTYPES)}")
    dtype = DTYPES[dtype_name]
    target = LlamaModel(_path(descriptor["model_dir"], base), dtype)
    max_batch = int(descriptor.get("max_batch_size", 8))
    max_seq = int(descriptor.get("max_seq_len", 512))
    spec = descriptor.get("proposer") or {"method": "none"}
    if role != "speculative":
        spec = {"method": "none"}  # baseline/draft: plain; target: external drafts only
    proposer = _build_proposer(spec, target, dtype, max_batch, max_seq + 64, base)
    if role == "target":
        max_draft = int(descriptor.get("max_draft_len", 0))
    elif proposer is not None:
        max_draft = int(descriptor.get("max_draft_len") or proposer.max_draft_len)
        max_draft = max(max_draft, proposer.max_draft_len)
    else:
        max_draft = 0
    scheduler = Scheduler(target, proposer, max_batch, max_seq, max_draft,
                          int(descriptor.get("prefix_cache_entries", 64)))
    return ReferenceEngine(scheduler, descriptor, cpus)


def set_threads(threads: int) -> None:
    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(threads)
    except RuntimeError:
        pass  # already set in this process (it can only be set once)


def load_engine(engine_dir: Path, cpus: tuple[int, ...] | None = None) -> ReferenceEngine:
    """``cpus``: pin the decode thread to these (``serve`` assigns them; None: unpinned)."""
    engine_dir = Path(engine_dir)
    path = engine_dir / ENGINE_DESCRIPTOR
    if not path.is_file():
        raise SpecdeployError(f"{engine_dir}: no {ENGINE_DESCRIPTOR} (not a reference engine directory)")
    descriptor = json.loads(path.read_text(encoding="utf-8"))
    if descriptor.get("format") != ENGINE_FORMAT:
        raise SpecdeployError(f"{path}: format {descriptor.get('format')!r}, expected {ENGINE_FORMAT!r}")
    set_threads(int(descriptor.get("threads", 1)))
    return engine_from_descriptor(descriptor, engine_dir, cpus)


def create_engine(model_dir: Path, *, role: str = "baseline", proposer: dict | None = None,
                  max_draft_len: int | None = None, max_batch_size: int = 8, max_seq_len: int = 512,
                  compute_dtype: str = "float32", prefix_cache_entries: int = 64,
                  cpus: tuple[int, ...] | None = None) -> ReferenceEngine:
    """Direct constructor for tests and ``bench`` (same fields as engine.json)."""
    descriptor = {
        "format": ENGINE_FORMAT, "role": role, "model_dir": str(model_dir),
        "proposer": proposer or {"method": "none"}, "max_draft_len": max_draft_len or 0,
        "max_batch_size": max_batch_size, "max_seq_len": max_seq_len, "compute_dtype": compute_dtype,
        "prefix_cache_entries": prefix_cache_entries, "threads": 1,
    }
    return engine_from_descriptor(descriptor, cpus=cpus)
