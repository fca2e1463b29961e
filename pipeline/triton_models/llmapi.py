"""``tensorrt_llm`` of the llmapi layout on CPU (``backend: "python"``), the llmapi contract
adapter (:class:`LlmapiModel`) over :class:`~pipeline.triton_models.cpu_engine_model.CpuEngineModel`
(engine start-up, the ``execute`` loop, the drain, the perf KV arithmetic): the reference engine
(:mod:`pipeline.reference`) answering the contract of TensorRT-LLM's Triton llmapi model
(``triton_backend/all_models/llmapi/tensorrt_llm/1/{model.py,helpers.py}`` at NVIDIA/TensorRT-LLM
044a90d / 0df60f9; tensors as its ``config.pbtxt``, recorded in ``pipeline/trtllm/llmapi_facts.yaml``).

Reads ``1/model.yaml`` (``$LLM_CONFIG_PATH`` relative to the model directory, as upstream) through
:mod:`.llmapi_spec` and the ``reference_engine_dir`` parameter (the built engine's CPU-only
settings). What a client sees, as upstream:

- inputs: ``text_input`` (STRING, one prompt; a 2-D tensor or a missing one is an error),
  ``streaming``, ``sampling_param_*`` (scalars: a tensor of another size is "Expected a scalar
  tensor for tensor NAME"), ``return_finish_reason`` / ``return_stop_reason``, ``stop``;
- ``text_output``: STRING [1]. Streaming (decoupled only, else "Streaming is only supported in
  decoupled mode.") sends the text generated so far in every response (the LLM API's
  ``CompletionOutput.text`` is cumulative), the last one carrying the final flag; otherwise one
  response with the completion, the prompt's text in front unless
  ``sampling_param_exclude_input_from_output`` (upstream's default false; streamed text never
  repeats the prompt, as the engine-layout model's deltas);
- ``finish_reason`` / ``stop_reason`` as ``str()`` of the LLM API's values (``"None"`` while
  running); the perf outputs (kv-cache blocks, timings, ``acceptance_rate``,
  ``total_accepted_draft_tokens``, ``total_draft_tokens``) when the request or ``model.yaml``
  asks for perf metrics, each [1] in the dtype ``config.pbtxt`` declares (upstream's model.py
  builds them with ``text_output``'s dtype; we keep to the declared one);
- errors: ``Error generating request: <reason>`` with a ``text_output`` of ``N/A``;
  ``stop`` without a request id: "A request id must be provided for request cancellation";
  a cancelled request ends with "Request cancelled by client" (code CANCELLED).

Not in the CPU engine, refused by name: ``return_cumulative_logprob``, ``best_of`` > 1, penalties.
``sampling_param_stop`` strings stop on their tokens (the engine's stop words) and are cut from
the text, as the LLM API's default ``include_stop_str_in_output=False``.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils
import yaml

from pipeline.triton_models import io, llmapi_spec, parent_watch
from pipeline.triton_models.cpu_engine_model import CpuEngineModel, kv_blocks, send_quietly

STREAMING_NEEDS_DECOUPLED = "Streaming is only supported in decoupled mode."
NO_REQUEST_ID = "A request id must be provided for request cancellation"
CANCELLED = "Request cancelled by client"
NOT_ON_CPU = {"return_cumulative_logprob": "return_cumulative_logprob is not supported by the CPU reference engine"}


class LlmapiError(ValueError):
    """A request the model answers with ``Error generating request: ...``."""


def _scalar(inputs: dict, name: str):
    value = inputs.get(name)
    if value is None:
        return None
    if value.size != 1:
        raise LlmapiError(f"Expected a scalar tensor for tensor {name}")
    item = value.reshape(-1)[0].item()
    return item.decode("utf-8") if isinstance(item, bytes) else item


def _model_yaml(args) -> dict:
    model_dir = Path(args["model_repository"]) / args["model_version"]
    path = model_dir / os.environ.get("LLM_CONFIG_PATH", "model.yaml")
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict):
        raise pb_utils.TritonModelException(f"'{path}' holds no mapping of TRT-LLM engine args")
    return data


class LlmapiModel(CpuEngineModel):
    """The llmapi contract (TensorRT-LLM's Triton llmapi ``tensorrt_llm`` model) on the CPU engine."""

    REQUEST_ERRORS = (LlmapiError,)

    def initialize(self, args):
        from pipeline.artefacts.engine import ENGINE_DESCRIPTOR, EngineDescriptor
        from pipeline.triton_models.tokenizer import TextTokenizer

        config = json.loads(args["model_config"])
        llm_args = _model_yaml(args)
        llm_args.pop("triton_config", None)
        base_dir = Path(io.param(config, "reference_engine_dir"))
        descriptor = llmapi_spec.engine_descriptor(llm_args, EngineDescriptor.load(base_dir / ENGINE_DESCRIPTOR))
        self.perf_default = bool(llm_args.get("return_perf_metrics", False))
        self.tokenizer = TextTokenizer(llm_args.get("tokenizer") or llm_args["model"],
                                       trust_remote_code=bool(llm_args.get("trust_remote_code", False)))
        self._engine_dir = Path(tempfile.mkdtemp(prefix="specdeploy-llmapi-"))  # the engine model.yaml describes
        descriptor.write(self._engine_dir / ENGINE_DESCRIPTOR)
        self._start_serving(config, self._engine_dir, args["model_name"], args["model_version"])
        parent_watch.watch_server(args["model_name"])  # the stub ends with its server

    def finalize(self):
        self.engine.shutdown()
        shutil.rmtree(self._engine_dir, ignore_errors=True)  # kept until now: a restarted worker re-reads it

    def _error_response(self, message: str):
        return _error(f"Error generating request: {message}")

    # -- intake --------------------------------------------------------------------------------

    def _start(self, request, sender):
        inputs = io.snapshot(request)
        user_id = request.request_id()
        if _scalar(inputs, "stop"):
            self._stop(user_id, sender)
            return None
        options, gen_request = self._parse(inputs, user_id)
        try:
            handle = self.engine.submit(gen_request)
        except ValueError as exc:  # the engine's own limits (DraftTooLongError is one)
            raise LlmapiError(str(exc)) from None
        with self._lock:
            self._inflight[gen_request.request_id] = handle
        return lambda: self._drain(gen_request, handle, sender, options, time.monotonic_ns())

    def _parse(self, inputs: dict, user_id: str):
        from pipeline.reference.api import GenerationRequest, SamplingParams, check_prompt_length

        text = inputs.get("text_input")
        if text is None:
            raise LlmapiError("text_input is missing from the request")
        if text.ndim > 1:
            raise LlmapiError("The current implementation only supports text_input being a 1D tensor.")
        prompt_text = io.text(text.reshape(-1)[0], "text_input")
        streaming = bool(_scalar(inputs, "streaming") or False)
        if streaming and not self.decoupled:
            raise LlmapiError(STREAMING_NEEDS_DECOUPLED)
        for name, message in NOT_ON_CPU.items():
            if _scalar(inputs, name):
                raise LlmapiError(message)
        get = lambda name: _scalar(inputs, name)  # noqa: E731 - a one-line reader used only in this block
        try:
            llmapi_spec.check_sampling(get)
        except ValueError as exc:
            raise LlmapiError(str(exc)) from None
        prompt = self.tokenizer.encode(prompt_text, add_special_tokens=True)
        max_new = int(get("sampling_param_max_tokens") or llmapi_spec.DEFAULT_MAX_TOKENS)
        try:  # the executor's first length check (LlmRequest::validate), before max_seq_len's
            check_prompt_length(len(prompt), getattr(self.engine, "max_input_len", None))
        except ValueError as exc:
            raise LlmapiError(str(exc)) from None
        limit = int(getattr(self.engine, "max_seq_len", 0) or 0)
        if limit and len(prompt) + max_new > limit:
            raise LlmapiError(f"Prompt length ({len(prompt)}) + requested output tokens ({max_new}) exceeds the "
                              f"maximum sequence length ({limit})")
        stops = [s for s in _strings(inputs.get("sampling_param_stop")) if s]
        options = {
            "streaming": streaming, "stops": stops, "prompt_ids": list(prompt),
            "exclude_input": bool(get("sampling_param_exclude_input_from_output") or False),
            "perf": bool(get("sampling_param_return_perf_metrics") or self.perf_default),
            "finish_reason": bool(get("return_finish_reason") or False),
            "stop_reason": bool(get("return_stop_reason") or False),
        }
        request_id = f"{user_id or 'llmapi'}-{uuid.uuid4().hex[:8]}"
        gen_request = GenerationRequest(
            input_ids=prompt, max_new_tokens=max_new, end_id=self.tokenizer.end_id, pad_id=self.tokenizer.pad_id,
            stop_words=[self.tokenizer.encode(s, add_special_tokens=False) for s in stops],
            sampling=SamplingParams(**llmapi_spec.sampling_fields(get)), request_id=request_id)
        return options, gen_request

    def _stop(self, user_id: str, sender) -> None:
        if not user_id:
            send_quietly(sender, _error(NO_REQUEST_ID), final=True)
            return
        with self._lock:
            handles = [h for key, h in self._inflight.items() if key.rpartition("-")[0] == user_id]
        for handle in handles:
            handle.cancel()
        send_quietly(sender, _error(CANCELLED, cancelled=True), final=True)

    # -- responses -----------------------------------------------------------------------------

    def _drain(self, gen_request, handle, sender, options: dict, arrival_ns: int) -> None:
        def respond(chunk, generated, stats) -> bool:
            if chunk.finished and chunk.finish_reason == "cancelled":
                return send_quietly(sender, _error(CANCELLED, cancelled=True), final=True)
            if options["streaming"] or chunk.finished:
                return send_quietly(sender, self._response(generated, chunk, stats, options), final=chunk.finished)
            return True

        super()._drain(gen_request.request_id, handle, sender, arrival_ns, respond)

    def _response(self, generated: list[int], chunk, stats, options: dict):
        stop_reason = None
        if chunk.finished and chunk.finish_reason == "stop_word":
            completion = self.tokenizer.decode(generated)
            stop_reason = next((s for s in options["stops"] if completion.endswith(s)), None)
        ids = generated if options["streaming"] or options["exclude_input"] else options["prompt_ids"] + generated
        text = self.tokenizer.decode(ids)  # with the prompt: its tokens decoded with the completion's
        if stop_reason and text.endswith(stop_reason):
            text = text[: len(text) - len(stop_reason)]
        outputs = [io.tensor("text_output", np.array([text.encode("utf-8")], dtype=np.object_))]
        if options["finish_reason"]:
            reason = llmapi_spec.finish_reason(chunk.finish_reason if chunk.finished else None)
            outputs.append(io.tensor("finish_reason", np.array([reason.encode()], dtype=np.object_)))
        if options["stop_reason"]:
            outputs.append(io.tensor("stop_reason", np.array([str(stop_reason).encode()], dtype=np.object_)))
        if options["perf"] and stats is not None:
            outputs += perf_tensors(stats)
        return pb_utils.InferenceResponse(output_tensors=outputs)


def perf_tensors(stats) -> list:
    """The perf outputs of upstream's model, one value each, in config.pbtxt's dtypes."""
    blocks = kv_blocks(stats)
    values = (
        ("kv_cache_reused_block", blocks.reused, np.int32),
        ("kv_cache_missed_block", blocks.total - blocks.reused, np.int32),
        ("kv_cache_alloc_new_blocks", blocks.new, np.int32),
        ("kv_cache_alloc_total_blocks", blocks.total, np.int32),
        ("kv_cache_hit_rate", blocks.reused / blocks.total if blocks.total else 0.0, np.float32),
        ("arrival_time_ns", stats.arrival_time_ns, np.int64),
        ("first_scheduled_time_ns", stats.first_scheduled_time_ns, np.int64),
        ("first_token_time_ns", stats.first_token_time_ns, np.int64),
        ("last_token_time_ns", stats.last_token_time_ns, np.int64),
        ("acceptance_rate", stats.acceptance_rate, np.float32),
        ("total_accepted_draft_tokens", stats.accepted_tokens, np.int32),
        ("total_draft_tokens", stats.draft_tokens, np.int32),
    )
    return [io.tensor(name, np.array([value], dtype=dtype)) for name, value, dtype in values]


def _strings(value) -> list[str]:
    if value is None:
        return []
    return [io.text(v, "sampling_param_stop") for v in value.reshape(-1)]


def _error(message: str, cancelled: bool = False):
    """Upstream's error response: the error plus a text_output of "N/A"."""
    code = getattr(pb_utils.TritonError, "CANCELLED", None) if cancelled else None
    error = pb_utils.TritonError(message) if code is None else pb_utils.TritonError(message, code)
    tensor = io.tensor("text_output", np.array([b"N/A"], dtype=np.object_))
    return pb_utils.InferenceResponse(output_tensors=[tensor], error=error)


TritonPythonModel = LlmapiModel  # the name the stub's model.py imports
