"""An OpenAI-compatible frontend for a served deployment: ``serve --frontend openai``.

A small Starlette app (run by uvicorn) that answers ``POST /v1/completions`` and
``POST /v1/chat/completions`` (streaming SSE and not, ``usage`` included), ``GET /v1/models`` and
``GET /health`` by forwarding each request to the deployment's ensemble (or BLS) over Triton's
gRPC bidirectional stream, one stream call per request. This is the shape of Triton's own OpenAI
frontend (triton-inference-server/server ``python/openai/openai_frontend/``: FastAPI routers in
``frontend/fastapi/routers/completions.py`` and ``chat.py``, a Triton engine in
``engine/triton_engine.py``), which calls the server in-process; this one talks gRPC so it can
front any running Triton of ours without sharing its process.

Reads the tokenizer directory (``tokenizer.json``, and ``tokenizer_config.json``'s chat template
when there is one) for prompt token counts and chat prompts; writes nothing. Run as
``python -m pipeline.serve.openai_frontend --grpc-url H:P --triton-model ensemble --served-model-name N
--tokenizer DIR --port P`` (:func:`start_frontend` does this under the process keeper, so the
frontend ends with its owner). Binds 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from pathlib import Path
from typing import Any, AsyncIterator, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

DEFAULT_HOST = "127.0.0.1"


# ------------------------------------------------------------------------------------------------
# Requests (the fields this frontend honours; others an OpenAI client may send are ignored)


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=0)
    seed: int | None = Field(default=None, ge=0)
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: Literal[1] = 1


class CompletionRequest(_Sampling):
    prompt: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: str
    content: str


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)


def triton_inputs(req: _Sampling, text: str, default_max_tokens: int) -> dict[str, Any]:
    """The ensemble's inputs for one request; temperature 0 means greedy (top_k 1), as in OpenAI."""
    max_tokens = getattr(req, "max_completion_tokens", None) or req.max_tokens or default_max_tokens
    inputs: dict[str, Any] = {"text_input": text, "max_tokens": int(max_tokens), "stream": True,
                              "exclude_input_in_output": True, "return_num_output_tokens": True}
    if req.temperature == 0:
        inputs["top_k"] = 1
    elif req.temperature is not None:
        inputs["temperature"] = float(req.temperature)
    if req.top_k and "top_k" not in inputs:
        inputs["top_k"] = int(req.top_k)
    if req.top_p is not None:
        inputs["top_p"] = float(req.top_p)
    if req.seed is not None:
        inputs["seed"] = int(req.seed)
    return inputs


# ------------------------------------------------------------------------------------------------
# Triton over gRPC


class TritonStream:
    """Sends one request on its own ``ModelStreamInfer`` call; yields ``(text, n_tokens)`` per
    response until Triton flags the final one. Cancelling the consumer (the HTTP client went away:
    Starlette cancels the streaming response) cancels the call, and Triton cancels the request.

    Triton does not pass that cancellation on to an ensemble step already running (core
    ``EnsembleContext::ScheduleSteps`` cancels only the steps it schedules afterwards, r24.10 to
    r25.10), so the ensemble's ``tensorrt_llm`` would generate on to ``max_tokens`` for nobody.
    With ``engine_model`` set (the ensemble's, ``tensorrt_llm``), a request that ends before its
    final response is also stopped there: tensorrtllm_backend's ``stop`` input under the
    request's id, which the ensemble gives its steps (``EnsembleContext`` ``SetId``)."""

    _DTYPES = {"text_input": "BYTES", "max_tokens": "INT32", "stream": "BOOL", "exclude_input_in_output": "BOOL",
               "return_num_output_tokens": "BOOL", "top_k": "INT32", "top_p": "FP32", "temperature": "FP32",
               "seed": "UINT64", "num_draft_tokens": "INT32"}

    def __init__(self, grpc_url: str, model_name: str, extra_inputs: dict[str, Any] | None = None,
                 engine_model: str | None = None):
        self.grpc_url, self.model_name, self.extra_inputs = grpc_url, model_name, dict(extra_inputs or {})
        self.engine_model = engine_model
        self._stub = None
        self._stops: set = set()  # stop calls in flight (a task nobody holds may be collected)

    @property
    def stub(self):
        """Made on first use, inside the server's event loop (an aio channel belongs to one loop)."""
        if self._stub is None:
            import grpc  # noqa: PLC0415 - start-up: grpc (the frontend process loads it once, when it opens its channel)
            from tritonclient.grpc import service_pb2_grpc  # noqa: PLC0415 - start-up: tritonclient (the frontend process's gRPC path; importing this module for its helpers stays light)

            self._stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.aio.insecure_channel(self.grpc_url))
        return self._stub

    def _request(self, inputs: dict[str, Any], request_id: str, model_name: str | None = None,
                 dtypes: dict[str, str] | None = None, extra: bool = True):
        import numpy as np  # noqa: PLC0415 - start-up: numpy (the frontend process's request path; importing this module for its helpers stays light)
        from tritonclient.grpc import InferInput  # noqa: PLC0415 - start-up: tritonclient (the frontend process's gRPC path; importing this module for its helpers stays light)
        from tritonclient.grpc._utils import _get_inference_request  # noqa: PLC0415 - start-up: tritonclient (the frontend process's gRPC path; importing this module for its helpers stays light)

        np_types = {"BYTES": object, "INT32": np.int32, "BOOL": bool, "FP32": np.float32, "UINT64": np.uint64}
        tensors = []
        for name, value in ({**inputs, **self.extra_inputs} if extra else inputs).items():
            dtype = (dtypes or self._DTYPES).get(name, "INT32")
            data = np.array([[value.encode("utf-8") if dtype == "BYTES" else value]], dtype=np_types[dtype])
            tensor = InferInput(name, list(data.shape), dtype)
            tensor.set_data_from_numpy(data)
            tensors.append(tensor)
        request = _get_inference_request(model_name=model_name or self.model_name, inputs=tensors, model_version="",
                                         request_id=request_id, outputs=None, sequence_id=0, sequence_start=False,
                                         sequence_end=False, priority=0, timeout=None, parameters=None)
        request.parameters["triton_enable_empty_final_response"].bool_param = True
        return request

    async def generate(self, inputs: dict[str, Any]) -> AsyncIterator[tuple[str, int]]:
        import grpc  # noqa: PLC0415 - start-up: grpc (the frontend process loads it once, when it opens its channel)
        from tritonclient.grpc import InferResult  # noqa: PLC0415 - start-up: tritonclient (the frontend process's gRPC path; importing this module for its helpers stays light)

        done = asyncio.Event()
        request_id = uuid.uuid4().hex
        request = self._request(inputs, request_id)
        finished = False

        async def requests():
            yield request
            await done.wait()  # keep our side open until the final response (closing early ends the call)

        call = self.stub.ModelStreamInfer(requests())
        try:
            async for response in call:
                if response.error_message:
                    raise TritonError(response.error_message)
                result = InferResult(response.infer_response)
                text = result.as_numpy("text_output")
                ntok = result.as_numpy("num_output_tokens")
                piece = "" if text is None or text.size == 0 else _decode(text.reshape(-1)[0])
                yield piece, (0 if ntok is None else int(ntok.reshape(-1)[0]))
                final = response.infer_response.parameters.get("triton_final_response")
                if final is not None and final.bool_param:
                    finished = True
                    return
            raise TritonError("the stream ended without a final response")
        except grpc.aio.AioRpcError as exc:  # Triton unreachable, or the call failed
            raise TritonError(f"Triton gRPC {exc.code().name}: {exc.details()}") from None
        finally:
            done.set()
            call.cancel()
            if not finished and self.engine_model:
                # a task of its own: this one is being cancelled, and an await here would be too
                task = asyncio.get_running_loop().create_task(self.stop_in_engine(request_id))
                self._stops.add(task)
                task.add_done_callback(self._stops.discard)

    _STOP_DTYPES = {"input_ids": "INT32", "input_lengths": "INT32", "request_output_len": "INT32", "stop": "BOOL"}

    async def stop_in_engine(self, request_id: str, timeout_s: float = 10.0) -> None:
        """Send ``engine_model`` a ``stop`` for ``request_id`` (the inputs upstream's BLS sends to
        stop a call, tensorrtllm_backend@r25.05 ``send_cancellation_request``); wait for its answer."""
        stop = self._request({"input_ids": 0, "input_lengths": 0, "request_output_len": 0, "stop": True}, request_id,
                             self.engine_model, self._STOP_DTYPES, extra=False)
        answered = asyncio.Event()

        async def requests():
            yield stop
            await answered.wait()  # keep the call open until the answer (closing early ends it)

        async def first_answer(call) -> None:
            async for _ in call:
                return

        call = self.stub.ModelStreamInfer(requests())
        try:
            await asyncio.wait_for(first_answer(call), timeout_s)
        except Exception:  # noqa: BLE001 - best effort: the request may have ended meanwhile
            pass
        finally:
            answered.set()
            call.cancel()

    async def ready(self) -> bool:
        from tritonclient.grpc import service_pb2  # noqa: PLC0415 - start-up: tritonclient (the frontend process's gRPC path; importing this module for its helpers stays light)

        try:
            reply = await self.stub.ModelReady(service_pb2.ModelReadyRequest(name=self.model_name), timeout=5)
            return bool(reply.ready)
        except Exception:  # noqa: BLE001 - any failure means not ready
            return False


class TritonError(RuntimeError):
    """Triton answered a request with an error."""


def _decode(value) -> str:
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


# ------------------------------------------------------------------------------------------------
# Tokenizer: prompt token counts and chat prompts


class PromptTokenizer:
    def __init__(self, tokenizer_dir: str | None):
        self._tok = self._template = None
        if not tokenizer_dir:
            return
        path = Path(tokenizer_dir)
        if (path / "tokenizer.json").is_file():
            from tokenizers import Tokenizer  # noqa: PLC0415 - start-up: tokenizers (loading the served tokenizer; importing this module for its helpers stays light)

            self._tok = Tokenizer.from_file(str(path / "tokenizer.json"))
        config = path / "tokenizer_config.json"
        if config.is_file() and json.loads(config.read_text(encoding="utf-8")).get("chat_template"):
            from transformers import AutoTokenizer  # noqa: PLC0415 - start-up: transformers (the SentencePiece fallback of loading the tokenizer)

            self._template = AutoTokenizer.from_pretrained(str(path))

    def count(self, text: str) -> int | None:
        return None if self._tok is None else len(self._tok.encode(text, add_special_tokens=False).ids)

    def chat_prompt(self, messages: list[ChatMessage]) -> str:
        """The model's own chat template when it has one; else the messages' text, one per line."""
        if self._template is not None:
            return self._template.apply_chat_template([m.model_dump() for m in messages], tokenize=False,
                                                      add_generation_prompt=True)
        return "\n".join(m.content for m in messages)


# ------------------------------------------------------------------------------------------------
# The app


def _error(status: int, message: str, kind: str = "invalid_request_error"):
    from starlette.responses import JSONResponse  # noqa: PLC0415 - start-up: starlette (the ASGI app the frontend process serves; importing this module for its helpers stays light)

    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status_code=status)


def _validation_message(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '(body)'}: {e['msg']}" for e in exc.errors())


class Frontend:
    """The routes; one :class:`TritonStream` shared by all requests (gRPC multiplexes the calls)."""

    def __init__(self, triton: TritonStream, served_model_name: str, tokenizer: PromptTokenizer,
                 default_max_tokens: int = 16):
        self.triton, self.name, self.tokenizer = triton, served_model_name, tokenizer
        self.default_max_tokens = default_max_tokens

    def app(self):
        from starlette.applications import Starlette  # noqa: PLC0415 - start-up: starlette (the ASGI app the frontend process serves; importing this module for its helpers stays light)
        from starlette.routing import Route  # noqa: PLC0415 - start-up: starlette (the ASGI app the frontend process serves; importing this module for its helpers stays light)

        return Starlette(routes=[
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/v1/chat/completions", self.chat, methods=["POST"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/health", self.health, methods=["GET"]),
        ])

    async def models(self, request):
        from starlette.responses import JSONResponse  # noqa: PLC0415 - start-up: starlette (the ASGI app the frontend process serves; importing this module for its helpers stays light)

        return JSONResponse({"object": "list", "data": [{"id": self.name, "object": "model", "owned_by": "specdeploy"}]})

    async def health(self, request):
        from starlette.responses import Response  # noqa: PLC0415 - start-up: starlette (the ASGI app the frontend process serves; importing this module for its helpers stays light)

        return Response(status_code=200 if await self.triton.ready() else 503)

    async def completions(self, request):
        return await self._handle(request, CompletionRequest, "completions")

    async def chat(self, request):
        return await self._handle(request, ChatCompletionRequest, "chat")

    async def _handle(self, request, model: type[_Sampling], api: str):
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "(body): not JSON")
        try:
            req = model.model_validate(body)
        except ValidationError as exc:
            return _error(400, _validation_message(exc))
        if req.model != self.name:
            return _error(404, f"model: '{req.model}' is not served here (this frontend serves '{self.name}')",
                          "not_found_error")
        prompt = req.prompt if api == "completions" else self.tokenizer.chat_prompt(req.messages)
        inputs = triton_inputs(req, prompt, self.default_max_tokens)
        meta = {"id": f"{'chatcmpl' if api == 'chat' else 'cmpl'}-{uuid.uuid4().hex[:24]}", "created": int(time.time()),
                "model": self.name, "object": "chat.completion.chunk" if api == "chat" else "text_completion"}
        prompt_tokens = self.tokenizer.count(prompt)
        if req.stream:
            from starlette.responses import StreamingResponse  # noqa: PLC0415 - start-up: starlette (the ASGI app the frontend process serves; importing this module for its helpers stays light)

            usage = bool(req.stream_options and req.stream_options.include_usage)
            return StreamingResponse(self._sse(inputs, api, meta, prompt_tokens, usage), media_type="text/event-stream")
        return await self._whole(inputs, api, meta, prompt_tokens)

    async def _sse(self, inputs: dict, api: str, meta: dict, prompt_tokens: int | None, usage: bool):
        completion_tokens = 0
        try:
            async for text, ntok in self.triton.generate(inputs):
                completion_tokens += ntok
                if text:
                    yield _sse_event({**meta, "choices": [_choice(api, text, None, delta=True)]})
            reason = "length" if completion_tokens >= inputs["max_tokens"] else "stop"
            yield _sse_event({**meta, "choices": [_choice(api, "", reason, delta=True)]})
            if usage:
                yield _sse_event({**meta, "choices": [], "usage": _usage(prompt_tokens, completion_tokens)})
        except TritonError as exc:
            yield _sse_event({"error": {"message": str(exc), "type": "server_error", "code": 500}})
        yield b"data: [DONE]\n\n"

    async def _whole(self, inputs: dict, api: str, meta: dict, prompt_tokens: int | None):
        from starlette.responses import JSONResponse  # noqa: PLC0415 - start-up: starlette (the ASGI app the frontend process serves; importing this module for its helpers stays light)

        parts, completion_tokens = [], 0
        try:
            async for text, ntok in self.triton.generate(inputs):
                parts.append(text)
                completion_tokens += ntok
        except TritonError as exc:
            return _error(500, str(exc), "server_error")
        reason = "length" if completion_tokens >= inputs["max_tokens"] else "stop"
        obj = "chat.completion" if api == "chat" else "text_completion"
        return JSONResponse({**meta, "object": obj, "choices": [_choice(api, "".join(parts), reason, delta=False)],
                             "usage": _usage(prompt_tokens, completion_tokens)})


def _choice(api: str, text: str, reason: str | None, *, delta: bool) -> dict:
    if api == "completions":
        return {"index": 0, "text": text, "finish_reason": reason, "logprobs": None}
    key = "delta" if delta else "message"
    content = {"content": text} if delta else {"role": "assistant", "content": text}
    return {"index": 0, key: content, "finish_reason": reason}


def _usage(prompt_tokens: int | None, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": (prompt_tokens or 0) + completion_tokens}


def _sse_event(payload: dict) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode("utf-8") + b"\n\n"


# ------------------------------------------------------------------------------------------------
# Running it


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grpc-url", required=True, help="Triton gRPC host:port")
    parser.add_argument("--triton-model", default="ensemble")
    parser.add_argument("--served-model-name", required=True)
    parser.add_argument("--tokenizer", default=None)
    parser.add_argument("--extra-inputs", default="{}", help="JSON object sent with every request")
    parser.add_argument("--default-max-tokens", type=int, default=16)
    parser.add_argument("--engine-model", default=None,
                        help="the engine model a request that ends early is stopped in "
                             "(default: tensorrt_llm behind an ensemble, none otherwise)")
    parser.add_argument("--host", default=DEFAULT_HOST)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    import uvicorn  # noqa: PLC0415 - start-up: uvicorn (the frontend process's server, started once in main)

    engine_model = args.engine_model if args.engine_model is not None else (
        "tensorrt_llm" if args.triton_model == "ensemble" else "")
    frontend = Frontend(TritonStream(args.grpc_url, args.triton_model, json.loads(args.extra_inputs), engine_model),
                        args.served_model_name, PromptTokenizer(args.tokenizer), args.default_max_tokens)
    uvicorn.run(frontend.app(), host=args.host, port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
