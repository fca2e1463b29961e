"""A fake Triton ``generate_stream`` server with known timing, for load-generator self-tests.

Speaks ``POST /v2/models/<m>/generate_stream`` (Server-Sent Events over chunked HTTP/1.1,
keep-alive), ``GET /v2/health/*``, ``GET /v2/models/<m>/ready`` and a one-token ``POST …/generate``. Each request: headers at once, the first token after
``--ttft-ms`` (one token), then chunks of ``--tokens-per-chunk`` k tokens every k × ``--tpot-ms``
until ``max_tokens`` (capped by ``--max-tokens-cap``). So a correct client measures TTFT ≈ D,
TPOT ≈ t and inter-chunk latency ≈ k·t. ``--stall-at-s T --stall-s S`` freezes the server for S
seconds, T seconds after the first request (no chunk leaves during the stall), to show coordinated omission.
Every event carries ``num_output_tokens``; the last also ``acceptance_rate`` and draft counts.
OpenAI mode, same timing: ``POST /v1/completions`` and ``/v1/chat/completions`` stream OpenAI
chunks (``choices[0].text`` / ``delta.content``, ``finish_reason`` on the last), then a ``usage``
chunk when ``stream_options.include_usage`` is asked for (``--no-usage`` never sends one), then
``data: [DONE]``. ``GET /metrics`` exports, in OpenAI mode, vLLM's speculative-decoding counters
for what it streamed (one draft of k tokens per chunk after the first, chunk size − 1 accepted).
``GET /v1/models`` lists ``--served-model`` (default ``fake``). A strict or broken server, for the
fail-fast checks: ``--refuse-every N`` answers every N-th OpenAI request (1 = all) with
``--refuse-status`` and ``--refuse-body`` verbatim (default: transformers serve's 422 for ``top_k``).
A reasoning model: ``--reasoning-tokens R --reasoning-style S`` streams R reasoning tokens first, as
chat deltas shaped like server S's (``reasoning_content``: SGLang, trtllm-serve, older vLLM;
``reasoning``: vLLM since the rename), counted in ``usage`` as upstream's servers count them.
A broken stream: ``--bad-stream malformed`` sends a data line that is not JSON after the first
chunk; ``--bad-stream no-finish`` never sends a ``finish_reason`` nor ``usage``, then ``[DONE]``.
An endpoint behind an auth gateway: ``--api-key K`` answers 401 to any request without
``Authorization: Bearer K`` (every path but the health checks, as vLLM's ``--api-key`` does for /v1).
``--request-log PATH`` appends each request (method, path, headers, JSON body) to PATH as a JSON line,
so a test can read what went over the wire.
Run: ``python locustfiles/fake_server.py --port 0`` prints ``PORT <n>`` once listening.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import time

_PATH = re.compile(r"^/v2/models/([^/]+)(?:/versions/\d+)?/generate_stream$")
_OPENAI_PATHS = {"/v1/completions": "completions", "/v1/chat/completions": "chat"}


class FakeStreamServer:
    def __init__(self, ttft_ms: float, tpot_ms: float, tokens_per_chunk: int, max_tokens_cap: int,
                 stall_at_s: float | None = None, stall_s: float = 0.0, accept_rate: float = 0.75,
                 usage: bool = True, served_model: str = "fake", refuse_every: int = 0, refuse_status: int = 422,
                 refuse_body: str = "", reasoning_tokens: int = 0, reasoning_style: str = "reasoning_content"):
        self.served_model, self.refuse_every, self.refuse_status = served_model, refuse_every, refuse_status
        self.refuse_body = refuse_body.encode()
        self.reasoning_tokens, self.reasoning_style = reasoning_tokens, reasoning_style
        self.openai_requests = 0
        self.bad_stream: str | None = None
        self.ttft = ttft_ms / 1000.0
        self.tpot = tpot_ms / 1000.0
        self.k = max(1, tokens_per_chunk)
        self.cap = max_tokens_cap
        self.accept_rate = accept_rate
        self.usage = usage
        self.spec = {"drafts": 0, "draft_tokens": 0, "accepted_tokens": 0}
        self.stall_at_s, self.stall_s = stall_at_s, stall_s
        self.stall: tuple[float, float] | None = None  # anchored at the first generate request
        self.served = 0
        self.api_key: str | None = None
        self.request_log: str | None = None

    def _log(self, method: str, path: str, headers: dict, body: bytes) -> None:
        if self.request_log:
            try:
                payload = json.loads(body) if body else None
            except ValueError:
                payload = body.decode("utf-8", "replace")
            with open(self.request_log, "a", encoding="utf-8") as fh:
                fh.write(json.dumps({"method": method, "path": path, "headers": headers, "body": payload}) + "\n")

    def _refused(self, path: str, headers: dict) -> bool:
        """--api-key: every request but a health check needs the bearer token."""
        if not self.api_key or path.startswith("/v2/health") or path == "/health":
            return False
        return headers.get("authorization") != f"Bearer {self.api_key}"

    async def _sleep_until(self, deadline: float) -> None:
        """Sleep to an absolute monotonic time, then sit out a stall window if we are inside it."""
        delay = deadline - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        if self.stall is not None:
            start, end = self.stall
            now = time.monotonic()
            if start <= now < end:
                await asyncio.sleep(end - now)

    def _chunk_plan(self, max_tokens: int) -> list[int]:
        total = max(1, min(max_tokens, self.cap))
        plan = [1]
        remaining = total - 1
        while remaining > 0:
            plan.append(min(self.k, remaining))
            remaining -= plan[-1]
        return plan

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:] if ":" in ln)}
                body = await reader.readexactly(int(headers.get("content-length", "0") or 0))
                self._log(method, path, headers, body)
                if self._refused(path, headers):
                    detail = b'{"error": "Unauthorized"}'
                    writer.write(b"HTTP/1.1 401 Unauthorized\r\nContent-Type: application/json\r\nContent-Length: %d"
                                 b"\r\n\r\n%s" % (len(detail), detail))
                    await writer.drain()
                    continue
                if method == "GET" and path == "/metrics":
                    text = "".join(f"# TYPE vllm:spec_decode_num_{name}_total counter\n"
                                   f'vllm:spec_decode_num_{name}_total{{model_name="fake"}} {value}\n'
                                   for name, value in self.spec.items()).encode()
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s"
                                 % (len(text), text))
                    await writer.drain()
                    continue
                if method == "GET" and path == "/v1/models":
                    listing = json.dumps({"object": "list", "data": [{"id": self.served_model, "object": "model"}]})
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                                 % (len(listing), listing.encode()))
                    await writer.drain()
                    continue
                if method == "GET" and (path.startswith("/v2/health") or path.endswith("/ready") or path == "/health"):
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                    await writer.drain()
                    continue
                if method == "POST" and path.endswith("/generate"):
                    payload = json.dumps({"model_name": "fake", "text_output": " tok", "num_output_tokens": 1}).encode()
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                                 % (len(payload), payload))
                    await writer.drain()
                    continue
                if method == "POST" and path in _OPENAI_PATHS:
                    self.openai_requests += 1
                    if self.refuse_every and self.openai_requests % self.refuse_every == 0:
                        writer.write(b"HTTP/1.1 %d Refused\r\nContent-Type: application/json\r\nContent-Length: %d"
                                     b"\r\n\r\n%s" % (self.refuse_status, len(self.refuse_body), self.refuse_body))
                        await writer.drain()
                        continue
                    await self._stream(writer, json.loads(body or b"{}"), _OPENAI_PATHS[path])
                    continue
                match = _PATH.match(path)
                if method != "POST" or not match:
                    writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                    await writer.drain()
                    continue
                await self._stream(writer, json.loads(body or b"{}"))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def _stream(self, writer: asyncio.StreamWriter, request: dict, api: str | None = None) -> None:
        t_arrival = time.monotonic()
        if self.stall is None and self.stall_at_s is not None:
            self.stall = (t_arrival + self.stall_at_s, t_arrival + self.stall_at_s + self.stall_s)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        await writer.drain()
        plan = self._chunk_plan(int(request.get("max_tokens", 16)))
        thinking = min(self.reasoning_tokens, len(plan) - 1) if api == "chat" else 0  # chunks of reasoning
        deadline = t_arrival + self.ttft
        drafted = accepted = 0
        for i, ntok in enumerate(plan):
            await self._sleep_until(deadline)
            last = i == len(plan) - 1
            if api is not None and self.bad_stream == "malformed" and i == 1:
                writer.write(b"%x\r\n%s\r\n" % (len(b"data: {not json\n\n"), b"data: {not json\n\n"))
                break
            if api is not None:
                reasoning = ("think" * ntok) if i < thinking else None
                finish = "length" if last and self.bad_stream != "no-finish" else None
                event = _openai_chunk(api, None if reasoning else " tok" * ntok, finish, reasoning, self.reasoning_style)
            else:
                event = {"model_name": "fake", "model_version": "1", "text_output": " tok" * ntok, "num_output_tokens": ntok}
            if i > 0:
                drafted += self.k
                accepted += ntok - 1
                if api is not None:
                    self.spec["drafts"] += 1
                    self.spec["draft_tokens"] += self.k
                    self.spec["accepted_tokens"] += ntok - 1
            if last and api is None:
                rate = accepted / drafted if drafted else 0.0
                event.update({"acceptance_rate": rate, "total_draft_tokens": drafted,
                              "total_accepted_draft_tokens": accepted})
            _write_event(writer, event)
            await writer.drain()
            if i + 1 < len(plan):
                deadline += self.tpot * plan[i + 1]
        if api is not None:
            if self.usage and self.bad_stream is None and (request.get("stream_options") or {}).get("include_usage"):
                _write_event(writer, {"id": "fake", "object": "text_completion", "choices": [],
                                      "usage": {"prompt_tokens": 1, "completion_tokens": sum(plan),
                                                "total_tokens": 1 + sum(plan)}})
            _write_event(writer, "[DONE]")
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        self.served += 1


def _openai_chunk(api: str, text: str | None, finish_reason: str | None, reasoning: str | None = None,
                  style: str = "reasoning_content") -> dict:
    if api == "chat":  # upstream's DeltaMessage: the reasoning field set, content null, or the other way round
        delta = {"content": text, style: reasoning} if reasoning else {"content": text}
        if reasoning and style == "both":  # trtllm-serve's DeltaMessage has both fields
            delta = {"content": None, "reasoning_content": reasoning, "reasoning": None}
        choice = {"index": 0, "delta": delta, "finish_reason": finish_reason}
    else:
        choice = {"index": 0, "text": text, "finish_reason": finish_reason}
    return {"id": "fake", "object": "chat.completion.chunk" if api == "chat" else "text_completion",
            "model": "fake", "choices": [choice]}


def _write_event(writer: asyncio.StreamWriter, event: dict | str) -> None:
    """One SSE event as one HTTP chunk."""
    payload = event.encode() if isinstance(event, str) else json.dumps(event).encode()
    data = b"data: " + payload + b"\n\n"
    writer.write(b"%x\r\n%s\r\n" % (len(data), data))


async def serve(args: argparse.Namespace) -> None:
    fake = FakeStreamServer(args.ttft_ms, args.tpot_ms, args.tokens_per_chunk, args.max_tokens_cap,
                            args.stall_at_s, args.stall_s, usage=not args.no_usage, served_model=args.served_model,
                            refuse_every=args.refuse_every, refuse_status=args.refuse_status,
                            refuse_body=args.refuse_body, reasoning_tokens=args.reasoning_tokens,
                            reasoning_style=args.reasoning_style)
    fake.bad_stream = args.bad_stream
    fake.api_key, fake.request_log = args.api_key, args.request_log
    server = await asyncio.start_server(fake.handle, "127.0.0.1", args.port, backlog=1024)
    port = server.sockets[0].getsockname()[1]
    print(f"PORT {port}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--ttft-ms", type=float, default=100.0)
    parser.add_argument("--tpot-ms", type=float, default=10.0)
    parser.add_argument("--tokens-per-chunk", type=int, default=1)
    parser.add_argument("--max-tokens-cap", type=int, default=16)
    parser.add_argument("--stall-at-s", type=float, default=None)
    parser.add_argument("--stall-s", type=float, default=0.0)
    parser.add_argument("--no-usage", action="store_true", help="OpenAI mode: never send a usage chunk")
    parser.add_argument("--served-model", default="fake", help="OpenAI mode: the name GET /v1/models lists")
    parser.add_argument("--refuse-every", type=int, default=0, help="OpenAI mode: refuse every N-th request")
    parser.add_argument("--refuse-status", type=int, default=422)
    parser.add_argument("--refuse-body", default=json.dumps({"detail": "Unexpected fields in the request: {'top_k'}"}))
    parser.add_argument("--reasoning-tokens", type=int, default=0, help="chat: chunks of reasoning before the answer")
    parser.add_argument("--bad-stream", choices=("malformed", "no-finish"), default=None)
    parser.add_argument("--api-key", default=None, help="401 to requests without Authorization: Bearer KEY")
    parser.add_argument("--request-log", default=None, help="append each request (headers, body) to this JSONL file")
    parser.add_argument("--reasoning-style", default="reasoning_content",
                        choices=("reasoning_content", "reasoning", "both"))
    try:
        asyncio.run(serve(parser.parse_args()))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
