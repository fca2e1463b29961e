"""The reference engine: loads ``<engine_dir>/engine.json`` (descriptor in
:mod:`pipeline.artefacts.engine`) and the checkpoints it names, and runs an in-flight batching loop
on a background thread around :class:`pipeline.reference.scheduler.Scheduler`.

``submit`` is thread-safe and validates synchronously (``ValueError`` / ``DraftTooLongError``);
requests join the batch between iterations and leave as soon as they finish. Each handle streams
:class:`~pipeline.reference.api.Chunk` objects (new tokens only; the last one ``finished``);
``cancel`` ends a stream with ``finish_reason='cancelled'``. Reads the engine dir; writes nothing.

A request's chunks go to the handle its ``submit`` returned, never to whichever handle holds its
``request_id`` now: clients reuse ids (upstream's speculative-decoding client sends every round
of a request under one id), and a round submitted while the previous round under that id was
being retired used to lose its handle and wait for ever (issue 44). ``request_id`` is only the
name :meth:`ReferenceEngine.cancel` looks up.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from pathlib import Path
from typing import Callable

import torch
from pydantic import ValidationError

from pipeline.artefacts.base import ArtefactError, problem_lines
from pipeline.artefacts.engine import ENGINE_DESCRIPTOR, EngineDescriptor
from pipeline.errors import SpecdeployError
from pipeline.infra.cpu_pinning import pin_this_thread
from pipeline.reference.api import (
    Chunk,
    GenerationRequest,
    GenerationResult,
    RequestStats,
    check_prompt_length,
)
from pipeline.reference.draft_len import engine_max_draft_len
from pipeline.reference.fast.models import FAST_MODELS
from pipeline.reference.modeling import PLAIN_MODELS, ModelTypes
from pipeline.reference.proposers import BUILDERS, BuildContext, Proposer
from pipeline.reference.scheduler import Scheduler
from pipeline.reference.sequence import SeqState, make_generator
from pipeline.reference.stream import ChunkStream

NO_PROPOSER = "none"  # engine.json proposer.method of an engine that drafts nothing

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}


class Handle(ChunkStream):
    """A request of this process's engine."""

    def __init__(self, engine: "ReferenceEngine", seq: SeqState, on_chunk: Callable[[Chunk], object] | None = None):
        super().__init__(seq.request, on_chunk)
        self._engine = engine
        self._seq = seq

    def cancel(self) -> None:
        self._seq.cancelled = True
        self._engine._wake()

    def abandon(self) -> None:
        """Cancel; if the engine loop never took the request (it is stuck), end the stream here."""
        self.cancel()
        if self._engine._withdraw(self._seq):
            self._put(Chunk(tokens=[], finished=True, finish_reason="cancelled", stats=_copy_stats(self._seq.stats)))


class ReferenceEngine:
    """Target + optional proposer + in-flight batching thread (api.Engine)."""

    def __init__(self, scheduler: Scheduler, descriptor: dict, cpus: tuple[int, ...] | None = None):
        self.scheduler = scheduler
        self.cpus = cpus  # the decode thread pins itself to these (pipeline.infra.cpu_pinning); None: unpinned
        self.descriptor = descriptor
        self.role = descriptor.get("role", "baseline")
        self.method = descriptor.get("proposer", {}).get("method", "none")
        self.vocab_size = scheduler.vocab_size
        self.max_draft_len = scheduler.max_draft_len
        self.max_batch_size = scheduler.max_batch_size
        self.max_seq_len = scheduler.max_seq_len
        self.eos_token_id = scheduler.target.shape.eos_token_id
        self.max_input_len = descriptor.get("max_input_len")  # None: max_seq_len bounds the prompt alone
        self._lock = threading.Condition()
        self._waiting: list[SeqState] = []
        self._handles: dict[str, Handle] = {}  # request id → its newest live handle (cancel by id)
        self._streams: dict[int, Handle] = {}  # id(seq) → its handle: where its chunks go
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name="reference-engine", daemon=True)
        self._thread.start()

    # -- public API ------------------------------------------------------------------------

    def submit(self, request: GenerationRequest, on_chunk: Callable[[Chunk], object] | None = None) -> Handle:
        check_prompt_length(len(request.input_ids), self.max_input_len)  # first, as TensorRT-LLM's validate
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
            self._streams[id(seq)] = handle
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

    def stats(self) -> dict:
        """What the engine holds now (:data:`pipeline.reference.api.ENGINE_STATS`): KV slots in
        use (target pool, draft pool), prefix-cache entries and their bound, requests with an
        open stream. Read from any thread; each number is one read of a length."""
        draft_pool = getattr(self.scheduler.proposer, "pool", None)
        with self._lock:
            open_requests = len(self._streams)
        return {"kv_slots_in_use": self.scheduler.pool.in_use(), "kv_slots": self.scheduler.pool.slots,
                "draft_kv_slots_in_use": draft_pool.in_use() if draft_pool is not None else 0,
                "prefix_cache_entries": len(self.scheduler.prefix),
                "prefix_cache_capacity": self.scheduler.prefix.entries, "open_requests": open_requests,
                "kv_tokens_per_slot": self.scheduler.max_seq_len}

    def shutdown(self) -> None:
        with self._lock:
            self._stopped = True
            self._lock.notify()
        self._thread.join(timeout=30)

    def _wake(self) -> None:
        with self._lock:
            self._lock.notify()

    def _withdraw(self, seq: SeqState) -> bool:
        """Take a request the loop has not started yet out of the queue (True), else False."""
        with self._lock:
            at = next((i for i, s in enumerate(self._waiting) if s is seq), None)
            if at is None:
                return False
            del self._waiting[at]
            self._forget(seq)
        return True

    def _forget(self, seq: SeqState) -> None:
        """Drop ``seq``'s handle (under ``_lock``); its id goes only if no newer request took it."""
        handle = self._streams.pop(id(seq), None)
        if handle is not None and self._handles.get(seq.request.request_id) is handle:
            del self._handles[seq.request.request_id]

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
                    self._run_guarded(running, lambda: self.scheduler.step(running))  # noqa: B023 - called at once, inside this iteration
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
        handle = self._streams.get(id(seq))
        if handle is not None:
            handle._put(chunk)

    def _finish(self, seq: SeqState, error: str | None = None) -> None:
        try:
            self.scheduler.release(seq)
        finally:
            self._send(seq, finished=True, error=error)
            with self._lock:
                self._forget(seq)


def _copy_stats(stats: RequestStats) -> RequestStats:
    """A snapshot for a chunk (every step sends one: a shallow copy plus the two lists, not
    ``copy.deepcopy``, which cost ~10x more)."""
    return dataclasses.replace(stats, accepted_per_position=list(stats.accepted_per_position),
                               drafted_per_position=list(stats.drafted_per_position))


# ----------------------------------------------------------------------------------------------
# Construction


def _build_proposer(spec: dict, ctx: BuildContext) -> Proposer | None:
    """The proposer ``spec["method"]`` names (:data:`pipeline.reference.proposers.BUILDERS`).
    ``spec["draft_int8"]``: quantize the draft-side weights (draft model, heads) to int8 at load —
    cheaper draft steps, output unchanged (only acceptance may move)."""
    method = spec.get("method", NO_PROPOSER)
    if method == NO_PROPOSER:
        return None
    if method not in BUILDERS:
        raise SpecdeployError(f"unknown proposer method {method!r}")
    proposer = BUILDERS[method](spec, ctx)
    if spec.get("draft_int8") and ctx.dtype == torch.float32:
        for name in ("model", "heads", "head"):
            if hasattr(proposer, name):
                getattr(proposer, name).to_int8()
    return proposer


def _descriptor(descriptor: EngineDescriptor | dict) -> EngineDescriptor:
    if isinstance(descriptor, EngineDescriptor):
        return descriptor
    try:
        return EngineDescriptor.model_validate(descriptor)
    except ValidationError as exc:
        raise ArtefactError(f"{ENGINE_DESCRIPTOR}: " + "; ".join(problem_lines(exc))) from None


def engine_from_descriptor(descriptor: EngineDescriptor | dict, base: Path = Path("."),
                           cpus: tuple[int, ...] | None = None) -> ReferenceEngine:
    """``fast_paths`` (default true): load the CPU fast path's models
    (:mod:`pipeline.reference.fast`) instead of the plain ones — the same maths, faster."""
    d = _descriptor(descriptor)
    fields = d.dump()  # every field with its default filled in: the engine reads plain data
    dtype = DTYPES[d.compute_dtype]
    models: ModelTypes = FAST_MODELS if d.fast_paths else PLAIN_MODELS
    model_dir = Path(d.model_dir)
    target = models.llama(model_dir if model_dir.is_absolute() else base / model_dir, dtype)
    # baseline/draft: plain; target: external drafts only
    spec = d.proposer.model_dump() if d.role == "speculative" else {"method": "none"}
    proposer = _build_proposer(spec, BuildContext(target, models, dtype, d.max_batch_size, d.max_seq_len + 64, base))
    max_draft = engine_max_draft_len(fields, d.role, None if proposer is None else proposer.max_draft_len)
    scheduler = Scheduler(target, proposer, d.max_batch_size, d.max_seq_len, max_draft, d.prefix_cache_entries,
                          d.draft_len_schedule)
    return ReferenceEngine(scheduler, fields, cpus)


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
    descriptor = EngineDescriptor.load(path)
    set_threads(descriptor.threads)
    return engine_from_descriptor(descriptor, engine_dir, cpus)


def create_engine(model_dir: Path, *, role: str = "baseline", proposer: dict | None = None,
                  cpus: tuple[int, ...] | None = None, **limits) -> ReferenceEngine:
    """Direct constructor for tests and ``bench``: ``limits`` are fields of
    :class:`~pipeline.artefacts.engine.EngineDescriptor` (max_draft_len, max_batch_size,
    max_seq_len, compute_dtype, prefix_cache_entries); the rest take its defaults."""
    fields = {"role": role, "model_dir": model_dir, **limits}
    if proposer is not None:
        fields["proposer"] = proposer
    return engine_from_descriptor(_descriptor(fields), cpus=cpus)
