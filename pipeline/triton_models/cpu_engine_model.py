"""What the two CPU ``tensorrt_llm`` Python models share, written once: the reference engine
behind a Triton model, whichever tensor contract it answers. The adapters are thin:
:mod:`pipeline.triton_models.llm` (the inflight-batcher contract: token-id tensors, as
tensorrtllm_backend's ``tensorrt_llm`` model) and :mod:`pipeline.triton_models.llmapi` (the llmapi
contract: text in, text out, as TensorRT-LLM's Triton llmapi model). Here:

- engine start-up (:func:`start_engine`): in a worker process of its own (default), or in this
  stub process (``SPECDEPLOY_ENGINE_PROCESS=stub``, on one torch thread) — the one place a hook
  that must run when the engine starts (or the stub must watch its parent) belongs;
- the ``execute`` loop (:meth:`CpuEngineModel.execute`): decoupled, every request gets a thread
  that drains its chunks into its response sender and ``execute`` returns at once;
  non-decoupled, the call's requests are submitted together (the engine batches them) and their
  single responses returned through a :class:`ResponseCollector` (sending a non-decoupled
  response after ``execute`` returned crashed tritonserver 2.51 intermittently under a BLS
  caller, so neither adapter does);
- one request's drain (:meth:`CpuEngineModel._drain`): the periodic cancel check (also while
  the request waits for its first chunk), the error response, the first-token time, the latency
  and spec-decode counters, the in-flight table, and the stall bound (:mod:`.stall`): a request
  with no final chunk by then is failed, cancelled in the engine, logged and counted;
- :func:`send_quietly` (a gone client is not an error) and the KV-block arithmetic of the perf
  outputs (:func:`kv_blocks`; the CPU engine has no blocks, a nominal size turns tokens into them).

Runs only inside the Python-backend stub (imports ``triton_python_backend_utils``). Reads the
engine directory it is given; writes nothing.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import triton_python_backend_utils as pb_utils

from pipeline.infra.cpu_pinning import engine_cpus_from_env
from pipeline.reference.api import ENGINE_PROCESS_ENV
from pipeline.triton_models.metrics import RequestLatency, SpecDecodeCounters
from pipeline.triton_models.stall import StallBound, stalled_message

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
# request threads hand chunks on quickly (the default 5 ms GIL switch interval adds latency per chunk)
SWITCH_INTERVAL_S = 0.0005
CANCEL_CHECK_PERIOD_S = 0.02  # how often a request thread asks Triton whether its client cancelled
IDLE_CHECK_PERIOD_S = 0.25  # the same while no chunk comes (queued, prefilling, or stalled)
TOKENS_PER_KV_BLOCK = 64  # nominal block size for the kv_cache_* perf outputs (the CPU engine has none)


def start_engine(engine_dir: Path, name: str, version: str):
    """The reference engine for model ``name``: its decode thread on the cores ``serve`` gave the
    model (:mod:`pipeline.infra.cpu_pinning`); in its own worker process, restarted if it dies,
    unless ``SPECDEPLOY_ENGINE_PROCESS=stub`` keeps it in this process."""
    cpus = engine_cpus_from_env(name)
    if os.environ.get(ENGINE_PROCESS_ENV, "own") == "stub":
        import torch

        from pipeline.reference.engine import load_engine

        torch.set_num_threads(1)
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:
            pass  # already set in this process (it can only be set once)
        return load_engine(engine_dir, cpus=cpus)
    # its own interpreter: no lock shared with the threads that send responses
    from pipeline.reference.worker import EngineProcess
    from pipeline.triton_models.worker_health import WorkerHealthMetrics

    return EngineProcess(engine_dir, cpus, name=name, on_health=WorkerHealthMetrics(name, version))


def send_quietly(sender, response, final: bool) -> bool:
    """Send, and ignore a client that is gone (cancelled, disconnected): nothing to tell it.
    False when the send failed (the drain then cancels the request: nobody reads it)."""
    try:
        sender.send(response, flags=FINAL if final else 0)
    except Exception:  # noqa: BLE001 - the client is gone; nothing to tell it
        return False
    return True


@dataclass(frozen=True)
class KvBlocks:
    new: int  # blocks the request's new (prefilled) tokens took
    reused: int  # whole blocks of prompt tokens the prefix cache gave
    total: int  # blocks of every prompt token, new or reused


def kv_blocks(stats) -> KvBlocks:
    """The request's KV use in nominal blocks of :data:`TOKENS_PER_KV_BLOCK` tokens."""
    reused = int(getattr(stats, "kv_cache_reused_tokens", 0))
    new = int(getattr(stats, "kv_cache_new_tokens", 0))
    return KvBlocks(new=-(-new // TOKENS_PER_KV_BLOCK), reused=reused // TOKENS_PER_KV_BLOCK,
                    total=-(-(new + reused) // TOKENS_PER_KV_BLOCK))


class ResponseCollector:
    """Stands in for a response sender in non-decoupled mode: keeps the one final response."""

    def __init__(self):
        self._done = threading.Event()
        self._response = None

    def send(self, response=None, flags=0):
        if response is not None:
            self._response = response
        if flags & FINAL:
            self._done.set()

    def is_cancelled(self) -> bool:
        return False

    def wait(self):
        self._done.wait()
        return self._response if self._response is not None else pb_utils.InferenceResponse(output_tensors=[])


class CpuEngineModel:
    """The shared half of a CPU ``tensorrt_llm`` model. An adapter sets ``REQUEST_ERRORS`` (the
    exceptions whose text is the error a client sees), implements :meth:`_start` (one request →
    the function that drains it, or None when answered already) and :meth:`_error_response`, and
    calls :meth:`_start_serving` from its ``initialize``."""

    REQUEST_ERRORS: tuple[type[Exception], ...] = ()

    def _start_serving(self, config: dict, engine_dir: Path, name: str, version: str) -> None:
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        self.stall_bound = StallBound.from_env()
        self.model_name = name
        self.engine = start_engine(engine_dir, name, version)
        self.counters = SpecDecodeCounters(name, version)
        self.latency = RequestLatency(name, version)
        self._lock = threading.Lock()
        self._inflight: dict[str, object] = {}  # engine request id → what cancellation needs

    # -- what an adapter provides ---------------------------------------------------------------

    def _start(self, request, sender) -> Callable[[], None] | None:
        raise NotImplementedError

    def _error_response(self, message: str):
        raise NotImplementedError

    # -- the shared loop ------------------------------------------------------------------------

    def execute(self, requests):
        senders = [request.get_response_sender() if self.decoupled else ResponseCollector() for request in requests]
        drains = []
        for request, sender in zip(requests, senders):
            try:
                drain = self._start(request, sender)
            except self.REQUEST_ERRORS as exc:
                send_quietly(sender, self._error_response(str(exc)), final=True)
            except Exception as exc:  # noqa: BLE001 - report, keep serving
                send_quietly(sender, self._error_response(f"{type(exc).__name__}: {exc}"), final=True)
            else:
                if drain is not None:
                    drains.append(drain)
        if self.decoupled:
            for drain in drains:
                threading.Thread(target=drain, daemon=True).start()
            return None
        for drain in drains:  # all submitted already: the engine generates them as one batch
            drain()
        return [sender.wait() for sender in senders]

    def _drain(self, key: str, handle, sender, arrival_ns: int,
               respond: Callable[[object, list[int], object], bool | None]) -> None:
        """Drain one request's chunks; ``respond(chunk, generated, stats)`` sends what the
        contract sends for that chunk (``generated``: every token so far) and returns False when
        the send failed: the client is gone, so the request is cancelled. Only this thread
        talks to ``sender`` (concurrent IPC on one sender is unsafe); it always ends the
        request with a final response: the engine's, an error, or after the stall bound
        (counted from the request's arrival) the stalled error."""
        generated: list[int] = []
        stats, first_token_ns = None, 0
        next_check = time.monotonic() + CANCEL_CHECK_PERIOD_S
        deadline = (arrival_ns / 1e9 if arrival_ns else time.monotonic()) + self.stall_bound.seconds(handle.max_new_tokens)
        cancel_sent = False
        try:
            while True:
                now = time.monotonic()
                if now >= deadline:
                    self._stalled(key, handle, sender)
                    return
                chunk = handle.next_chunk(min(IDLE_CHECK_PERIOD_S, deadline - now))
                if chunk is None:  # nothing yet: a client that went away meanwhile cancels here too
                    if not cancel_sent and sender.is_cancelled():
                        handle.cancel()
                        cancel_sent = True
                    continue
                stats = chunk.stats or stats
                if not chunk.finished and not cancel_sent and time.monotonic() >= next_check:
                    next_check = time.monotonic() + CANCEL_CHECK_PERIOD_S
                    if sender.is_cancelled():
                        handle.cancel()
                        cancel_sent = True
                if chunk.error:
                    send_quietly(sender, self._error_response(chunk.error), final=True)
                    return
                generated.extend(chunk.tokens)
                first_token_ns = first_token_ns or (time.monotonic_ns() if generated else 0)
                cancelled = chunk.finished and chunk.finish_reason == "cancelled"
                if cancelled:
                    self.counters.cancelled(len(generated))
                if respond(chunk, generated, stats) is False and not cancel_sent and not chunk.finished:
                    handle.cancel()  # nobody takes the responses (a cancelled ensemble, a closed stream)
                    cancel_sent = True
                if chunk.finished:
                    if not cancelled:
                        self.latency.observe(arrival_ns, first_token_ns, time.monotonic_ns(), len(generated))
                    return
        except Exception as exc:  # noqa: BLE001 - the request must still end with a final response
            send_quietly(sender, self._error_response(f"{type(exc).__name__}: {exc}"), final=True)
        finally:
            with self._lock:
                self._inflight.pop(key, None)
            if stats is not None:
                self.counters.add(stats.draft_tokens, stats.accepted_tokens, stats.verify_steps,
                                  stats.accepted_per_position, stats.drafted_per_position)

    def _stalled(self, key: str, handle, sender) -> None:
        """Fail a request the engine did not finish within its bound: cancel it in the engine
        (and stop waiting for it), say so in the server log and on /metrics, answer the client."""
        message = stalled_message(key, self.stall_bound, handle.max_new_tokens)
        try:
            handle.abandon()
        finally:
            self.counters.stalled()
            print(f"specdeploy: {self.model_name}: {message}", file=sys.stderr, flush=True)
            send_quietly(sender, self._error_response(message), final=True)
