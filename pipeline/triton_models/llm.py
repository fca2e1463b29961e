"""``tensorrt_llm`` on CPU (``backend: "python"``), the inflight-batcher contract adapter
(:class:`InflightBatcherModel`) over :class:`~pipeline.triton_models.cpu_engine_model.CpuEngineModel`
(engine start-up, the ``execute`` loop, the drain, the perf KV arithmetic): adapts Triton tensors to the reference engine
(``pipeline.reference``) and reproduces the `tensorrt_llm` contract (docs/triton-contract.md) — prompt in ``output_ids`` unless excluded,
streaming deltas (decoupled only), end token excluded, ``draft_input_ids`` → accepted + 1 in one
step, the ten perf-metric outputs, ``num_input_tokens``/``num_output_tokens`` (the count in that
response), batch > 1 on decoupled deployments (one response stream per row, ``batch_index``),
cancellation by gRPC cancel or the ``stop`` input, upstream error texts. Before a request is
submitted its inputs pass TensorRT-LLM's ranges and the CPU engine's limits
(:mod:`.request_rules`, docs/request-validation.md): a bad value is an error naming the input.
A thread publishes what the engine holds (KV slots, prefix entries, open requests) as gauges
on /metrics (:mod:`.engine_gauges`).

Decoupled: every request gets its own thread that drains the engine's chunks into the request's
response sender, so ``execute`` returns at once and the engine keeps batching across calls. The
engine runs in a worker process of its own by default (:mod:`pipeline.reference.worker`;
``SPECDEPLOY_ENGINE_PROCESS=stub``, from ``reference.engine_process``, keeps it in this
process): a streaming request's responses are then built in the worker-reader thread
(``on_chunk``) and sent by the draining thread, neither of which holds up the decode loop. In
the stub, responses are built in the engine thread, so the draining thread mostly waits in
``send`` with the interpreter lock released.
Non-decoupled: the requests of one ``execute`` call are submitted together (the engine batches
them) and ``execute`` returns their single responses. Using the response sender after
``execute`` returned in non-decoupled mode (upstream's Python variant does) crashed the bundled
tritonserver 2.51 intermittently (SIGSEGV) when the caller was a BLS model, so we do not.
"""

from __future__ import annotations

import json
import queue
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

from pipeline.reference.api import Chunk
from pipeline.triton_models import io, parent_watch, request_rules
from pipeline.triton_models.cpu_engine_model import (
    CANCEL_CHECK_PERIOD_S,
    CpuEngineModel,
    kv_blocks,
    send_quietly,
)
from pipeline.triton_models.engine_gauges import EngineGauges, period_from_env, start_publisher

STREAMING_NEEDS_DECOUPLED = "Streaming is only supported if model is deployed using decoupled mode."
BATCH_NEEDS_DECOUPLED = (
    "Batch size > 1 requires the tensorrt_llm backend to be using decoupled transaction policy"
)
UNSUPPORTED_FLAGS = {
    "return_log_probs": "return_log_probs is not supported by the CPU reference engine",
    "return_context_logits": "return_context_logits is not supported by the CPU reference engine",
    "return_generation_logits": "return_generation_logits is not supported by the CPU reference engine",
}


@dataclass
class ResponseOptions:
    streaming: bool
    exclude_input: bool
    perf_metrics: bool
    num_input_tokens: bool
    num_output_tokens: bool


def parse_word_list(array: np.ndarray | None) -> list[list[int]]:
    """INT32 [1, 2, L] word-list format → list of token sequences."""
    if array is None or array.size == 0:
        return []
    rows = array.reshape(-1, 2, array.shape[-1])[0]
    ids, offsets = rows[0], [int(o) for o in rows[1] if o >= 0]
    words, start = [], 0
    for end in offsets:
        if end > start:
            words.append([int(t) for t in ids[start:end]])
        start = end
    return words


def _row_inputs(inputs: dict, row: int, batch: int) -> dict:
    """Batch row ``row`` of a request's inputs (tensors without a batch dimension pass whole)."""
    return {k: v[row: row + 1] if v.ndim and v.shape[0] == batch else v for k, v in inputs.items()}


def perf_tensors(stats) -> list:
    def one(name, value, dtype):
        return io.tensor(name, np.array([[value]], dtype=dtype))

    blocks = kv_blocks(stats)
    return [
        one("kv_cache_alloc_new_blocks", blocks.new, np.int32),
        one("kv_cache_reused_blocks", blocks.reused, np.int32),
        one("kv_cache_alloc_total_blocks", blocks.total, np.int32),
        one("arrival_time_ns", stats.arrival_time_ns, np.int64),
        one("first_scheduled_time_ns", stats.first_scheduled_time_ns, np.int64),
        one("first_token_time_ns", stats.first_token_time_ns, np.int64),
        one("last_token_time_ns", stats.last_token_time_ns, np.int64),
        one("acceptance_rate", stats.acceptance_rate, np.float32),
        one("total_accepted_draft_tokens", stats.accepted_tokens, np.int32),
        one("total_draft_tokens", stats.draft_tokens, np.int32),
    ]


class InflightBatcherModel(CpuEngineModel):
    """The inflight-batcher contract (tensorrtllm_backend's ``tensorrt_llm`` model) on the CPU engine."""

    REQUEST_ERRORS = (io.RequestError,)

    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.exclude_default = io.param_bool(config, "exclude_input_in_output", False)
        self._start_serving(config, Path(io.param(config, "gpt_model_path")), args["model_name"], args["model_version"])
        self._gauges_stop = threading.Event()  # slots, prefix entries, open requests on /metrics
        start_publisher(EngineGauges(args["model_name"], args["model_version"]), self._engine_stats,
                        self._gauges_stop, period_from_env())
        parent_watch.watch_server(args["model_name"], self._gauges_stop)  # the stub ends with its server

    def _error_response(self, message: str):
        return io.error_response(message)

    def finalize(self):
        self._gauges_stop.set()
        self.engine.shutdown()

    def _engine_stats(self) -> dict:
        """The engine's numbers (none while its worker is down or busy past the read's
        timeout) and this model's open streams (always: they show requests piling up)."""
        stats = dict(self.engine.stats() or {})
        with self._lock:
            stats["model_open_requests"] = len(self._inflight)
        return stats

    # -- request intake ------------------------------------------------------------------------

    def _start(self, request, sender):
        """Submit one request; return the function that drains its chunks into ``sender``."""
        if io.flag(request, "stop"):
            self._cancel_by_id(request.request_id())
            send_quietly(sender, pb_utils.InferenceResponse(output_tensors=[]), final=True)
            return None
        inputs = io.snapshot(request)
        ids = inputs.get("input_ids")
        batch = ids.shape[0] if ids is not None and ids.ndim > 1 else 1
        if batch > 1 and not self.decoupled:
            raise io.RequestError(BATCH_NEEDS_DECOUPLED)
        arrival_ns = time.monotonic_ns()
        base_id = request.request_id() or uuid.uuid4().hex
        rows = [self._parse(_row_inputs(inputs, b, batch), base_id if b == 0 else f"{base_id}-{b}") for b in range(batch)]
        handles = [self._submit(gen_request, sender, self._streamed_response(options, gen_request.input_ids) if batch == 1 else None)
                   for options, gen_request in rows]
        if batch == 1:
            (options, gen_request), handle = rows[0], handles[0]
            return lambda: self._drain(gen_request.request_id, handle, sender, gen_request.input_ids, options, arrival_ns)
        return lambda: self._drain_rows(rows, handles, sender)

    def _streamed_response(self, options: ResponseOptions, prompt: list[int]):
        """The ``on_chunk`` hook for a streaming request: its response, built in the engine thread
        (cheap) instead of in the sending thread, where building it held the interpreter lock
        against the decoding engine and the engine's step waited longer for it. None for
        non-streaming requests (one response, built at the end)."""
        if not options.streaming:
            return None
        return lambda chunk: None if chunk.error else self._response(chunk.tokens, len(chunk.tokens), prompt, chunk.stats, options)

    def _submit(self, gen_request, sender, on_chunk=None):
        from pipeline.reference.api import DraftTooLongError

        try:
            handle = self.engine.submit(gen_request, on_chunk=on_chunk)
        except DraftTooLongError as exc:
            raise io.RequestError(str(exc)) from None
        except ValueError as exc:
            raise io.RequestError(str(exc)) from None
        with self._lock:
            self._inflight[gen_request.request_id] = (sender, handle)
        return handle

    def _parse(self, request, request_id: str):
        """One batch row's inputs → (ResponseOptions, GenerationRequest); a bad value raises
        RequestError naming the input (the rules: docs/request-validation.md)."""
        from pipeline.reference.api import GenerationRequest

        streaming = io.flag(request, "streaming")
        if streaming and not self.decoupled:
            raise io.RequestError(STREAMING_NEEDS_DECOUPLED)
        for name, message in UNSUPPORTED_FLAGS.items():
            if io.flag(request, name):
                raise io.RequestError(message)
        prompt = self._prompt(request)
        end_id = self._check_rules(request)
        max_new = io.scalar(request, "request_output_len", None)
        if max_new is None:
            raise io.RequestError("request_output_len is not present in the request")  # upstream's text
        max_new = int(max_new)
        limit = int(getattr(self.engine, "max_seq_len", 0) or 0)
        if limit and len(prompt) + max_new > limit:
            raise io.RequestError(
                f"Prompt length ({len(prompt)}) + requested output tokens ({max_new}) exceeds the "
                f"maximum sequence length ({limit})"
            )
        drafts = io.get(request, "draft_input_ids")
        draft_logits = io.get(request, "draft_logits")
        pad_id = io.scalar(request, "pad_id", None)
        gen_request = GenerationRequest(
            input_ids=prompt,
            max_new_tokens=max_new,
            end_id=None if end_id is None or end_id == -1 else end_id,
            pad_id=None if pad_id is None else int(pad_id),
            min_tokens=int(io.scalar(request, "min_tokens", 0) or 0),
            stop_words=parse_word_list(io.get(request, "stop_words_list")),
            bad_words=parse_word_list(io.get(request, "bad_words_list")),
            sampling=self._sampling(request),
            draft_input_ids=None if drafts is None or drafts.size == 0 else [int(t) for t in drafts.reshape(-1)],
            draft_logits=None if draft_logits is None or draft_logits.size == 0
            else draft_logits.reshape(-1, draft_logits.shape[-1]).astype(float).tolist(),
            request_id=request_id,
        )
        if gen_request.request_id in self._inflight:
            gen_request.request_id = f"{gen_request.request_id}-{uuid.uuid4().hex[:8]}"
        options = ResponseOptions(
            streaming=streaming,
            exclude_input=io.flag(request, "exclude_input_in_output", self.exclude_default),
            perf_metrics=io.flag(request, "return_perf_metrics"),
            num_input_tokens=io.flag(request, "return_num_input_tokens"),
            num_output_tokens=io.flag(request, "return_num_output_tokens"),
        )
        return options, gen_request

    @staticmethod
    def _prompt(request) -> list[int]:
        input_ids = io.get(request, "input_ids")
        if input_ids is None:
            # upstream: "input_ids or encoder_input_features is not present in the request"
            raise io.RequestError("input_ids is required: the CPU reference engine takes token ids "
                                  "(encoder_input_features is not supported)")
        input_ids = input_ids.reshape(1, -1)
        length = io.scalar(request, "input_lengths", None)
        if length is None:  # required in the config, yet Triton 2.51 lets a request without it through
            raise io.RequestError("input_lengths is required (upstream: input lengths tensor not provided)")
        length = int(length)
        prompt = [int(t) for t in input_ids[0, : max(0, min(length, input_ids.shape[1]))]]
        if not prompt:
            raise io.RequestError("input_ids is empty")
        return prompt

    def _check_rules(self, request) -> int | None:
        """TensorRT-LLM's ranges, then the CPU engine's limits; returns the end_id (or None)."""
        def get(name):
            return io.scalar(request, name, None)

        end_id = get("end_id")
        try:
            request_rules.check_ranges(get)
            vocab = getattr(self.engine, "vocab_size", None)
            if vocab:
                request_rules.check_end_id(None if end_id is None else int(end_id), int(vocab))
            request_rules.check_cpu_engine(get)
        except request_rules.RuleError as exc:
            raise io.RequestError(str(exc)) from None
        return None if end_id is None else int(end_id)

    @staticmethod
    def _sampling(request):
        from pipeline.reference.api import SamplingParams

        seed = io.scalar(request, "seed", None)
        return SamplingParams(
            temperature=float(io.scalar(request, "temperature", 1.0)),
            top_k=int(io.scalar(request, "runtime_top_k", 0)),
            top_p=float(io.scalar(request, "runtime_top_p", 0.0)),
            seed=None if seed is None else int(seed),
        )

    # -- responses -----------------------------------------------------------------------------

    def _drain(self, key, handle, sender, prompt, options: ResponseOptions, arrival_ns: int = 0) -> None:
        def respond(chunk, generated, stats) -> None:
            if options.streaming:
                response = chunk.payload  # built in the engine thread (see _streamed_response)
                if response is None:
                    response = self._response(chunk.tokens, len(chunk.tokens), prompt, stats, options)
                send_quietly(sender, response, final=chunk.finished)
            elif chunk.finished:
                ids = generated if options.exclude_input else list(prompt) + generated
                send_quietly(sender, self._response(ids, len(generated), prompt, stats, options), final=True)

        super()._drain(key, handle, sender, arrival_ns, respond)

    def _drain_rows(self, rows, handles, sender) -> None:
        """Batch > 1 (decoupled only, docs/triton-contract.md): each row streams its own responses tagged
        with ``batch_index``; only the last row's final response carries the final flag. Feeder
        threads read the engine; this thread alone talks to the sender."""
        merged: "queue.Queue" = queue.Queue()

        def feed(row: int, handle) -> None:
            try:
                for chunk in handle.chunks():
                    merged.put((row, chunk))
            except Exception as exc:  # noqa: BLE001 - report the failure to the client, keep serving
                merged.put((row, Chunk(tokens=[], finished=True, finish_reason="error", error=str(exc))))

        for row, handle in enumerate(handles):
            threading.Thread(target=feed, args=(row, handle), daemon=True).start()
        generated = [[] for _ in rows]
        stats = [None for _ in rows]
        remaining = len(rows)
        next_check = time.monotonic() + CANCEL_CHECK_PERIOD_S
        while remaining:
            row, chunk = merged.get()
            options, gen_request = rows[row]
            stats[row] = chunk.stats or stats[row]
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + CANCEL_CHECK_PERIOD_S
                if sender.is_cancelled():
                    for handle in handles:
                        handle.cancel()
            remaining -= 1 if chunk.finished else 0
            if chunk.error:
                response = io.error_response(chunk.error)
            elif options.streaming:
                response = self._response(chunk.tokens, len(chunk.tokens), gen_request.input_ids, stats[row], options, row)
            elif chunk.finished:
                generated[row].extend(chunk.tokens)
                ids = generated[row] if options.exclude_input else list(gen_request.input_ids) + generated[row]
                response = self._response(ids, len(generated[row]), gen_request.input_ids, stats[row], options, row)
            else:
                generated[row].extend(chunk.tokens)
                continue
            send_quietly(sender, response, final=remaining == 0)
            if chunk.finished:
                if chunk.finish_reason == "cancelled":
                    self.counters.cancelled()
                with self._lock:
                    self._inflight.pop(gen_request.request_id, None)
                if stats[row] is not None:
                    self.counters.add(stats[row].draft_tokens, stats[row].accepted_tokens, stats[row].verify_steps,
                                      stats[row].accepted_per_position, stats[row].drafted_per_position)

    def _response(self, ids, new_count, prompt, stats, options: ResponseOptions, batch_index: int | None = None):
        outputs = [
            io.tensor("output_ids", np.array([[ids]], dtype=np.int32).reshape(1, 1, len(ids))),
            io.tensor("sequence_length", np.array([[len(ids)]], dtype=np.int32)),
        ]
        if options.perf_metrics and stats is not None:
            outputs += perf_tensors(stats)
        if options.num_input_tokens:
            outputs.append(io.tensor("num_input_tokens", np.array([[len(prompt)]], dtype=np.int32)))
        if options.num_output_tokens:
            outputs.append(io.tensor("num_output_tokens", np.array([[new_count]], dtype=np.int32)))
        if batch_index is not None:
            outputs.append(io.tensor("batch_index", np.array([[batch_index]], dtype=np.int32)))
        return pb_utils.InferenceResponse(output_tensors=outputs)

    # -- cancellation --------------------------------------------------------------------------

    def _cancel_by_id(self, request_id: str) -> None:
        with self._lock:
            entries = [(k, h) for k, (_, h) in self._inflight.items() if k == request_id or k.startswith(f"{request_id}-")]
        for _, handle in entries:
            handle.cancel()


TritonPythonModel = InflightBatcherModel  # the name the stub's model.py imports
