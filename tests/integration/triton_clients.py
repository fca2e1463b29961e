"""Small Triton client helpers for the serving tests and the served benchmark: gRPC unary and
streaming calls (with cancellation), HTTP ``generate`` / ``generate_stream`` (SSE), metrics
scraping, and the upstream-style client-side draft-target loop (tensorrtllm_backend@r25.05
``inflight_batcher_llm/client/e2e_grpc_speculative_decoding_client.py``)."""

from __future__ import annotations

import json
import queue
import re
import time
import urllib.error
import urllib.request
import uuid

import numpy as np

NP_DTYPES = {np.int32: "INT32", np.int64: "INT64", np.float32: "FP32", np.bool_: "BOOL", np.uint64: "UINT64", np.object_: "BYTES"}


def _infer_input(name: str, value):
    import tritonclient.grpc as grpcclient

    array = np.asarray(value)
    if array.dtype.kind in ("U", "S", "O"):
        array = np.array([[v.encode() if isinstance(v, str) else v for v in row] for row in array], dtype=np.object_)
    tensor = grpcclient.InferInput(name, list(array.shape), NP_DTYPES[array.dtype.type])
    tensor.set_data_from_numpy(array)
    return tensor


def text_inputs(prompt, max_tokens: int, **extra) -> dict:
    inputs = {"text_input": np.array([[prompt]], dtype=np.object_), "max_tokens": np.array([[max_tokens]], dtype=np.int32)}
    for name, value in extra.items():
        if isinstance(value, bool):
            inputs[name] = np.array([[value]], dtype=bool)
        elif isinstance(value, int):
            inputs[name] = np.array([[value]], dtype=np.int32)
        elif isinstance(value, float):
            inputs[name] = np.array([[value]], dtype=np.float32)
        else:
            inputs[name] = np.asarray(value)
    return inputs


def grpc_infer(url: str, model: str, inputs: dict, outputs: list[str] | None = None) -> dict:
    """Unary ModelInfer → {output name: numpy}. Raises InferenceServerException on error."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)
    try:
        requested = [grpcclient.InferRequestedOutput(n) for n in outputs] if outputs else None
        result = client.infer(model, [_infer_input(k, v) for k, v in inputs.items()], outputs=requested)
        response = result.get_response()
        return {o.name: result.as_numpy(o.name) for o in response.outputs}
    finally:
        client.close()


class StreamSession:
    """One gRPC channel and one open stream reused for many requests, one at a time — how a
    long-lived service (or a Locust user) talks to Triton, so per-request timings exclude channel
    and stream setup."""

    def __init__(self, url: str, timeout: float = 120.0):
        import tritonclient.grpc as grpcclient

        self._results: "queue.Queue" = queue.Queue()
        self._timeout = timeout
        self._client = grpcclient.InferenceServerClient(url)
        try:
            self._client.start_stream(callback=lambda result, error: self._results.put((result, error)))
        except Exception:
            self._client.close()
            raise

    def generate(self, model: str, inputs: dict, request_id: str | None = None, cancel_after: int | None = None,
                 on_response=None) -> list[dict]:
        """The responses of one request, {output: numpy} each; an error raises. ``cancel_after`` N:
        cancel the stream after N responses (the session cannot be used after that)."""
        self._client.async_stream_infer(model, [_infer_input(k, v) for k, v in inputs.items()],
                                        request_id=request_id or uuid.uuid4().hex, enable_empty_final_response=True)
        responses = []
        deadline = time.monotonic() + self._timeout
        while True:
            result, error = self._results.get(timeout=max(0.1, deadline - time.monotonic()))
            if error is not None:
                raise error
            response = result.get_response()
            if response.outputs:
                responses.append({o.name: result.as_numpy(o.name) for o in response.outputs})
                if on_response is not None and len(responses) == 1:
                    on_response()
            if cancel_after is not None and len(responses) >= cancel_after:
                self._client.stop_stream(cancel_requests=True)
                return responses
            if response.parameters["triton_final_response"].bool_param:
                return responses

    def close(self) -> None:
        self._client.close()


def grpc_stream(url: str, model: str, inputs: dict, cancel_after: int | None = None, timeout: float = 120.0,
                request_id: str | None = None, on_response=None):
    """Stream API (as upstream's end_to_end_grpc_client), one request on its own stream: list of
    {output: numpy} per response; an error raises. ``cancel_after`` N: cancel the stream after N
    responses."""
    session = StreamSession(url, timeout)
    try:
        return session.generate(model, inputs, request_id, cancel_after, on_response)
    finally:
        session.close()


def http_generate(http_url: str, model: str, body: dict, stream: bool = False):
    """POST …/generate (one JSON object) or …/generate_stream (list of SSE event objects).
    Returns (status, payload)."""
    endpoint = "generate_stream" if stream else "generate"
    request = urllib.request.Request(f"{http_url}/v2/models/{model}/{endpoint}", data=json.dumps(body).encode(),  # noqa: S310 - loopback http URL of the server under test
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:  # noqa: S310 - a loopback http URL
            raw = response.read().decode()
            status = response.status
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read().decode() or "{}")
    if not stream:
        return status, json.loads(raw)
    events = [json.loads(line[len("data: "):]) for line in raw.splitlines() if line.startswith("data: ")]
    return status, events


def metric_values(metrics_url: str, family: str) -> dict[str, float]:
    """{model label: value} for one metric family."""
    text = urllib.request.urlopen(metrics_url, timeout=10).read().decode()  # noqa: S310 - loopback http URL of the server under test
    out = {}
    for line in text.splitlines():
        if line.startswith(family + "{"):
            model = re.search(r'model="([^"]*)"', line).group(1)
            out[model] = out.get(model, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def client_side_speculative(url: str, prompt: str, max_tokens: int, num_draft: int,
                            draft_model: str = "tensorrt_llm_draft", target_model: str = "tensorrt_llm") -> str:
    """Draft-target driven by the client with unary gRPC calls, as upstream's client-side loop
    does: preprocessing once; per round the draft proposes with ``input_ids`` and
    the target verifies with ``draft_input_ids``; the target's whole ``output_ids`` become the
    next context; postprocessing at the end (prompt included)."""
    pre = grpc_infer(url, "preprocessing", {
        "QUERY": np.array([[prompt]], dtype=np.object_), "REQUEST_OUTPUT_LEN": np.array([[max_tokens]], dtype=np.int32)})
    prompt_ids = [int(t) for t in pre["INPUT_ID"][0]]
    common = {
        "bad_words_list": pre["BAD_WORDS_IDS"], "stop_words_list": pre["STOP_WORDS_IDS"],
        "beam_width": np.array([[1]], dtype=np.int32), "temperature": np.array([[1.0]], dtype=np.float32),
        "end_id": pre["OUT_END_ID"], "pad_id": pre["OUT_PAD_ID"],
    }
    context = list(prompt_ids)
    while True:
        k = min(num_draft, len(prompt_ids) + max_tokens - len(context) - 1)
        drafts, draft_out = [], None
        if k > 0:
            out = grpc_infer(url, draft_model, {**common, "input_ids": np.array([context], dtype=np.int32),
                                                "input_lengths": np.array([[len(context)]], dtype=np.int32),
                                                "request_output_len": np.array([[k]], dtype=np.int32)})
            assert out["sequence_length"].shape == (1, 1)
            draft_out = [int(t) for t in out["output_ids"].reshape(-1)[: int(out["sequence_length"][0][0])]]
            drafts = draft_out[len(context):]
        target_inputs = {**common, "input_ids": np.array([context], dtype=np.int32),
                         "input_lengths": np.array([[len(context)]], dtype=np.int32),
                         "request_output_len": np.array([[len(drafts) + 1]], dtype=np.int32)}
        if drafts:
            target_inputs["draft_input_ids"] = np.array([drafts], dtype=np.int32)
        out = grpc_infer(url, target_model, target_inputs)
        previous = context
        context = [int(t) for t in out["output_ids"].reshape(-1)[: int(out["sequence_length"].reshape(-1)[0])]]
        if len(context) >= len(prompt_ids) + max_tokens or context == previous or (drafts and draft_out == context):
            break
    post = grpc_infer(url, "postprocessing", {"TOKENS_BATCH": np.array([[context]], dtype=np.int32),
                                              "SEQUENCE_LENGTH": np.array([[len(context)]], dtype=np.int32)})
    return post["OUTPUT"][0].decode()  # OUTPUT is 1-D [batch x beam], as upstream sends it
