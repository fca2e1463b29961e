"""The reader's side of a request: the stream of :class:`~pipeline.reference.api.Chunk` objects
that :meth:`Engine.submit` returns, fed by whoever produces the chunks (the engine's own loop in
:class:`pipeline.reference.engine.Handle`, a worker process's proxy in
:class:`pipeline.reference.worker.RemoteHandle`). No torch: the Triton stub that proxies an engine
worker reads streams without loading the engine (docs/architecture.md)."""

from __future__ import annotations

import queue
import time
from typing import Callable, Iterator

from pipeline.reference.api import Chunk, GenerationRequest, GenerationResult


class RequestStalled(TimeoutError):
    """No chunk of a request came before its deadline: the engine lost it or is stuck."""


class ChunkStream:
    """A request's stream of chunks (see :class:`pipeline.reference.api.RequestHandle`): fed by
    ``_put`` from the thread that produces chunks, read by ``chunks``/``result``. ``cancel`` is
    the producer's business (:class:`pipeline.reference.engine.Handle`, the worker proxy in
    :mod:`pipeline.reference.worker`); ``abandon`` is a cancel by a reader that will not wait
    for the cancelled final chunk (a stalled request: its producer may never send one)."""

    def __init__(self, request: GenerationRequest, on_chunk: Callable[[Chunk], object] | None = None):
        self.request_id = request.request_id
        self.max_new_tokens = request.max_new_tokens
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

    def next_chunk(self, timeout: float | None = None) -> Chunk | None:
        """The next chunk, or None when none came within ``timeout`` seconds (None: wait)."""
        try:
            chunk = self._queue.get(timeout=timeout)
        except queue.Empty:
            return None
        self._tokens.extend(chunk.tokens)
        if chunk.finished:
            self._final = chunk
        return chunk

    @property
    def done(self) -> bool:
        return self._final is not None

    def chunks(self, timeout: float | None = None, deadline_s: float | None = None) -> Iterator[Chunk]:
        """``timeout``: the longest wait for one chunk (TimeoutError); ``deadline_s``: the
        longest wait for the final chunk from now (:class:`RequestStalled`)."""
        deadline = None if deadline_s is None else time.monotonic() + deadline_s
        while self._final is None:
            wait = timeout
            if deadline is not None:
                left = max(0.0, deadline - time.monotonic())
                wait = left if wait is None else min(wait, left)
            chunk = self.next_chunk(wait)
            if chunk is None:
                if deadline is not None and time.monotonic() >= deadline:
                    raise RequestStalled(f"request {self.request_id!r} stalled: no final chunk within {deadline_s:g} s")
                raise TimeoutError(f"request {self.request_id!r}: no chunk within {timeout} s")
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

    def abandon(self) -> None:
        self.cancel()
