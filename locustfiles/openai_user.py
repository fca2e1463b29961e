"""The ``openai`` transport: streaming ``/v1/completions`` or ``/v1/chat/completions`` (SSE).

Imported by ``locustfile.py`` (after gevent's monkey-patching); reads nothing itself. A session
turns the Triton-shaped request of ``lt_common.request_inputs`` into an OpenAI request body (the
prompt or one user message, ``max_tokens``, ``temperature`` (0 is the API's greedy), ``top_p``,
``top_k`` only where asked for, ``seed``, ``stream_options.include_usage``) and fills a
``RequestState`` chunk by chunk, timed when each SSE event is read, never at headers.

Reasoning models: vLLM, SGLang and trtllm-serve stream the thinking before the answer as
``delta.reasoning_content`` (vLLM since its rename: ``delta.reasoning``; trtllm-serve has both
fields). Those deltas are output tokens: the first of them is the first token (TTFT), the first
answer text is recorded beside it (``t_first_answer``), and the two texts are kept apart. Output
length comes from the final ``usage`` event, which counts both (``osl_source: server``); a server
that sends none is re-tokenized with the configured tokenizer (both texts, ``retokenized``) or,
without one, counted one token per chunk (``chunks``). A refusal keeps the server's HTTP status
and body on the request (``http_status``, ``error``). Per-request acceptance, where a server sends it:
vLLM's ``metrics.speculative_decoding`` on the final usage chunk (``--per-request-spec-decode-metrics``).

One keep-alive HTTP/1.1 connection per session over ``geventhttpclient`` (Locust's own fast
client, so no extra dependency and cooperative under gevent).
"""

from __future__ import annotations

import json
import time
from typing import Any, Callable
from urllib.parse import urlsplit

from lt_common import RequestState

API_PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
# Triton-only request fields with no OpenAI counterpart (the server never echoes the prompt here)
_TRITON_ONLY = {"text_input", "messages", "stream", "exclude_input_in_output", "return_perf_metrics", "return_num_output_tokens",
                "max_tokens", "temperature", "top_p", "top_k", "seed"}


def openai_body(inputs: dict[str, Any], model_name: str, api: str, send_top_k: bool | None = None) -> dict[str, Any]:
    """The OpenAI request for one Triton-shaped ``inputs`` dict (same sampling in both arms).

    Triton's ``top_p: 0`` means "off", which OpenAI spells by leaving it out; ``top_k: 0`` likewise.
    ``top_k`` is not an OpenAI field and a strict server refuses it. ``send_top_k`` True sends it as
    given (vLLM, SGLang, trtllm-serve take it); False and None (the default) spell greedy (``top_k:
    1``) the API's way, temperature 0, and send no ``top_k``; None sends any other ``top_k`` (one the
    config set on purpose), False never."""
    body: dict[str, Any] = {"model": model_name, "stream": True, "stream_options": {"include_usage": True},
                            "max_tokens": int(inputs["max_tokens"])}
    if api == "chat":  # a dataset's whole conversation (multi_turn), else the prompt as one user message
        body["messages"] = inputs.get("messages") or [{"role": "user", "content": inputs["text_input"]}]
    else:
        body["prompt"] = inputs["text_input"]
    if "temperature" in inputs:
        body["temperature"] = float(inputs["temperature"])
    if inputs.get("top_p"):
        body["top_p"] = float(inputs["top_p"])
    top_k = int(inputs.get("top_k") or 0)
    if top_k and send_top_k:
        body["top_k"] = top_k
    elif top_k == 1:
        body["temperature"] = 0.0  # greedy, as the OpenAI API asks for it
    elif top_k and send_top_k is None:
        body["top_k"] = top_k
    if "seed" in inputs:
        body["seed"] = int(inputs["seed"])
    body.update({k: v for k, v in inputs.items() if k not in _TRITON_ONLY})  # extra inputs go as given
    return body


REASONING_FIELDS = ("reasoning_content", "reasoning")  # SGLang/trtllm-serve/older vLLM; vLLM now, trtllm GPT-OSS


def chunk_parts(event: dict[str, Any], api: str) -> tuple[str | None, str | None, str | None]:
    """(answer text, reasoning text, finish_reason) of one streamed event's first choice.

    Chat: ``delta.content`` and ``delta.reasoning_content`` / ``delta.reasoning``; completions:
    ``text`` (and the same reasoning fields on the choice, should a server put them there)."""
    choices = event.get("choices") or []
    if not choices:
        return None, None, None
    choice = choices[0]
    holder = (choice.get("delta") or {}) if api == "chat" else choice
    text = holder.get("content") if api == "chat" else holder.get("text")
    reasoning = next((holder[f] for f in REASONING_FIELDS if isinstance(holder.get(f), str) and holder[f]), None)
    return text, reasoning, choice.get("finish_reason")


def vllm_spec_decode(event: dict[str, Any]) -> dict[str, Any] | None:
    """The per-request acceptance vLLM puts on the final usage chunk when started with
    ``--per-request-spec-decode-metrics summary|detailed``: ``metrics.speculative_decoding``
    (vllm 0.32 ``entrypoints/generate/base/protocol.py`` ``SpeculativeDecodingMetrics``, filled from
    ``v1/metrics/stats.py`` ``RequestSpecDecodeMetrics.to_dict``), as the record's perf fields; None
    when the event has none (another server, no speculation, the flag off, ``n`` > 1)."""
    spec = (event.get("metrics") or {}).get("speculative_decoding") if isinstance(event.get("metrics"), dict) else None
    if not isinstance(spec, dict) or spec.get("num_draft_tokens") is None:
        return None
    return {"total_draft_tokens": int(spec["num_draft_tokens"]),
            "total_accepted_draft_tokens": int(spec.get("num_accepted_draft_tokens") or 0),
            "acceptance_rate": spec.get("draft_acceptance_rate")}


def chunk_text(event: dict[str, Any], api: str) -> tuple[str | None, str | None]:
    """(answer text, finish_reason) of one streamed event's first choice; (None, None) when it has none."""
    text, _, reason = chunk_parts(event, api)
    return text, reason


class OpenAIStreamSession:
    """One keep-alive connection to an OpenAI-compatible server; one request at a time."""

    def __init__(self, base_url: str, now: Callable[[], int], api: str = "completions", send_top_k: bool | None = None,
                 retokenize: Callable[[str], int] | None = None, headers: dict[str, str] | None = None,
                 extra_body: dict[str, Any] | None = None):
        if api not in API_PATHS:
            raise ValueError(f"openai_api: expected one of {sorted(API_PATHS)}, got '{api}'")
        parts = urlsplit(base_url if "://" in base_url else f"http://{base_url}")
        self.host, self.port = parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)
        self.ssl = parts.scheme == "https"
        self.prefix = parts.path.rstrip("/").removesuffix("/v1")
        self.now, self.api, self.send_top_k, self.retokenize = now, api, send_top_k, retokenize
        self.headers, self.extra_body = dict(headers or {}), dict(extra_body or {})  # --header / API key, --extra-body
        self.client = None

    def _client(self, timeout_s: float):
        if self.client is None:
            from geventhttpclient import HTTPClient  # noqa: PLC0415 - only this path needs it

            self.client = HTTPClient(self.host, self.port, ssl=self.ssl, concurrency=1,
                                     connection_timeout=min(30.0, timeout_s), network_timeout=timeout_s)
        return self.client

    def send(self, state: RequestState, inputs: dict, model_name: str, timeout_s: float) -> None:
        # --extra-body last: a server-specific field may override a generated one, as vLLM's merges it
        body = json.dumps({**openai_body(inputs, model_name, self.api, self.send_top_k), **self.extra_body}).encode("utf-8")
        deadline = time.monotonic() + timeout_s
        client = self._client(timeout_s)
        try:
            state.t_sent = self.now()
            response = client.post(self.prefix + API_PATHS[self.api], body=body,
                                   headers={**self.headers, "Content-Type": "application/json",
                                            "Accept": "text/event-stream"})
            if response.status_code != 200:
                state.status, state.t_last, state.http_status = "error", self.now(), int(response.status_code)
                state.error = f"HTTP {response.status_code}: {response.read()[:2000].decode('utf-8', 'replace')}"
                return
            self._read_events(state, response, deadline)
            if state.status != "ok":
                self.close()  # the rest of an errored stream is never read: do not reuse the connection
        except Exception as exc:  # noqa: BLE001 - any transport failure is this request's error
            self.close()
            if state.status == "pending":
                state.status = "timeout" if isinstance(exc, TimeoutError) else "error"
                state.error = f"{type(exc).__name__}: {exc}"
                state.t_last = state.t_last or self.now()
        except BaseException:  # a stop (GreenletExit) mid-response: the connection cannot be reused
            self.close()
            raise

    def _read_events(self, state: RequestState, response, deadline: float) -> None:
        usage = None
        finish = None
        while True:
            line = response.readline(b"\n")
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                break
            if not payload:
                continue
            now = self.now()
            try:
                event = json.loads(payload)
            except ValueError:
                state.status, state.t_last = "error", now
                state.error = f"malformed SSE line from the server: {payload[:300].decode('utf-8', 'replace')!r}"
                return
            if not isinstance(event, dict):
                state.status, state.t_last = "error", now
                state.error = f"SSE data is not a JSON object: {payload[:300].decode('utf-8', 'replace')!r}"
                return
            if "error" in event:
                state.status, state.t_last = "error", now
                state.error = f"error event from the server: {json.dumps(event['error'])[:2000]}"
                return
            text, reasoning, reason = chunk_parts(event, self.api)
            state.add_chunk(now, text, None, reasoning)
            finish = reason or finish
            usage = event.get("usage") or usage
            spec = vllm_spec_decode(event)
            if spec is not None:
                state.update_perf(spec)
            if time.monotonic() > deadline:
                raise TimeoutError("request exceeded request_timeout_s")
        self._count_tokens(state, usage)
        if finish == "abort":
            state.status, state.error = "error", "the server aborted the request (finish_reason 'abort')"
        elif finish is None and usage is None:
            state.status, state.error = "error", "stream ended without a finish_reason"
        else:
            state.status = "ok"

    def _count_tokens(self, state: RequestState, usage: dict | None) -> None:
        if usage and usage.get("completion_tokens") is not None:
            state.osl_server, state.osl_source = int(usage["completion_tokens"]), "server"
        elif self.retokenize is not None and (state.text_parts or state.reasoning_parts):
            parts = ("".join(state.text_parts), "".join(state.reasoning_parts))
            state.osl_server = sum(int(self.retokenize(part)) for part in parts if part)
            state.osl_source = "retokenized"
        else:
            state.osl_source = "chunks"

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None
