"""Pure-Python pieces of the Locust load generator (no gevent, no Locust imports).

Reads the run settings JSON the orchestrator writes (path in ``SPECDEPLOY_LOADTEST_CONFIG``),
builds the fixed, seeded prompt order shared by both arms, the request payload, and turns a
finished (or abandoned) request into one raw JSONL record (schema: pipeline/artefacts/records.py). Times are
``time.perf_counter_ns()`` values relative to the start of the process's run (``t0``); a duration
is only ever taken between two timestamps of one process.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.artefacts.records import RawRecordFields  # the record's one definition (stdlib only)

CONFIG_ENV = "SPECDEPLOY_LOADTEST_CONFIG"
HEADERS_ENV = "SPECDEPLOY_LOADTEST_HEADERS"  # the header values (pipeline/loadtest/reach.py), never in a file


@dataclass
class RunSettings:
    """What one Locust run does: one arm × one concurrency (or rate) × one repeat."""

    run_id: str
    arm: str  # "baseline" | "speculative"
    repeat: int
    endpoint: str  # grpc: host:port ; http: http://host:port
    model_name: str
    transport: str = "grpc"
    contract: str = "ensemble"  # ensemble | bls | llmapi (the deployment descriptor's)
    mode: str = "closed"  # closed | open
    concurrency: int = 1
    target_rate: float | None = None  # open loop: requests/s
    arrival: str = "poisson"  # open loop: poisson | fixed
    prompts: list[dict[str, Any]] = field(default_factory=list)
    max_tokens: int = 64
    sampling: dict[str, Any] = field(default_factory=dict)
    extra_inputs: dict[str, Any] = field(default_factory=dict)
    seed: int = 1234
    output_prefix: str = "raw/run"
    warmup_s: float = 0.0
    duration_s: float = 20.0
    request_timeout_s: float = 120.0
    stop_timeout_s: float = 30.0
    num_workers: int = 1
    draft_len: int | None = None
    tokenizer_dir: str | None = None  # optional re-tokenized OSL cross-check
    openai_api: str = "completions"  # transport openai: completions | chat
    openai_top_k: bool | None = None  # transport openai: send top_k; None = only when sampling sets it (not greedy)
    fail_fast_error_rate: float | None = 0.5  # stop the run when errors / finished pass this in the first window
    fail_fast_window_s: float = 5.0  # seconds from the run's start the fail-fast check covers
    # arrivals and reach (docs/arrivals-and-goodput.md)
    burstiness: float = 1.0  # arrival gamma: the gamma shape (1 = Poisson)
    max_concurrency: int | None = None  # open loop: at most this many requests in flight
    ramp: list[dict[str, Any]] = field(default_factory=list)  # [{duration_s, rate | users}] within one run
    headers: dict[str, str] = field(default_factory=dict)  # sent with every request
    api_key_env: str | None = None  # the NAME of the variable holding the key; the key itself is never in a file
    extra_body: dict[str, Any] = field(default_factory=dict)  # merged into every request body
    ignore_eos: bool = False  # force each output to its max_tokens (min_tokens; OpenAI also ignore_eos)

    @classmethod
    def from_file(cls, path: str | Path) -> "RunSettings":
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        settings = cls(**known)
        if not settings.prompts and data.get("prompts_file"):
            settings.prompts = load_prompts_file(Path(data["prompts_file"]))
        if not settings.prompts:
            raise ValueError(f"{path}: no prompts")
        return settings

    @classmethod
    def from_env(cls) -> "RunSettings":
        path = os.environ.get(CONFIG_ENV)
        if not path:
            raise RuntimeError(f"{CONFIG_ENV} is not set: the orchestrator passes the run settings file")
        return cls.from_file(path)


def load_prompts_file(path: Path) -> list[dict[str, Any]]:
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            rows.append(json.loads(line))
    return rows


def ordered_prompts(prompts: list[dict[str, Any]], seed: int) -> list[dict[str, Any]]:
    """The fixed, seeded iteration order: sorted by id, then shuffled with ``seed``.
    Identical for both arms because it depends only on the prompt set and the seed."""
    rows = sorted(prompts, key=lambda p: str(p["id"]))
    random.Random(seed).shuffle(rows)
    return rows


class PromptCursor:
    """Hands out prompts in the fixed order; worker ``w`` of ``n`` takes positions w, w+n, …"""

    def __init__(self, prompts: list[dict[str, Any]], seed: int, worker_index: int = 0, num_workers: int = 1):
        self._rows = ordered_prompts(prompts, seed)
        self._position = worker_index
        self._stride = max(1, num_workers)

    def next(self) -> tuple[int, dict[str, Any]]:
        index = self._position % len(self._rows)
        self._position += self._stride
        return index, self._rows[index]


def max_tokens_of(settings: RunSettings, prompt: dict[str, Any] | None) -> int:
    """The request's output length: the prompt's own (drawn, or the dataset's), else the run's."""
    own = (prompt or {}).get("max_tokens")
    return int(own) if own else int(settings.max_tokens)


def request_inputs(settings: RunSettings, prompt_text: str, prompt_index: int,
                   prompt: dict[str, Any] | None = None) -> dict[str, Any]:
    """The request shape, identical in both arms except ``extra_inputs`` (e.g. num_draft_tokens).
    ``prompt``: its ``max_tokens`` (per request) and, for the OpenAI chat API, its ``messages``."""
    if settings.contract == "llmapi":
        from llmapi_contract import llmapi_inputs  # noqa: PLC0415 - only this path needs it

        return llmapi_inputs(settings, prompt_text, prompt_index, max_tokens_of(settings, prompt))
    sampling = dict(settings.sampling)
    max_tokens = max_tokens_of(settings, prompt)
    inputs: dict[str, Any] = {
        "text_input": prompt_text,
        "max_tokens": max_tokens,
        "stream": True,
        "exclude_input_in_output": True,
        "return_perf_metrics": True,
        "return_num_output_tokens": True,
    }
    if "top_k" in sampling:
        inputs["top_k"] = int(sampling["top_k"])
    if "top_p" in sampling:
        inputs["top_p"] = float(sampling["top_p"])
    if "temperature" in sampling:
        inputs["temperature"] = float(sampling["temperature"])
        if inputs["temperature"] == 0 and settings.transport != "openai":
            # greedy as TensorRT-LLM's samplers read it (top_k 1); a temperature of 0 is not sent to Triton
            inputs["top_k"] = 1
            inputs.pop("temperature")
    if "seed" in sampling:
        inputs["seed"] = int(sampling["seed"]) + prompt_index  # same prompt → same seed in both arms
    if settings.ignore_eos:
        # TensorRT-LLM has no ignore_eos: min_tokens = max_tokens suppresses end_id until the length
        # (the inflight-batcher ensemble's and BLS's optional min_tokens input); vLLM takes both fields
        inputs["min_tokens"] = max_tokens
        if settings.transport == "openai":
            inputs["ignore_eos"] = True
    if settings.transport == "openai" and (prompt or {}).get("messages"):
        inputs["messages"] = prompt["messages"]  # a whole conversation (chat API; openai_user)
    inputs.update(settings.extra_inputs)
    if settings.transport != "openai":  # the OpenAI session merges it into its own body, last
        inputs.update(settings.extra_body)
    return inputs


class MissingApiKey(RuntimeError):
    """``api_key_env`` names a variable that is not set."""


def request_headers(settings: RunSettings, environ: dict[str, str] | None = None) -> dict[str, str]:
    """The headers every request carries besides the transport's own: ``headers``, then the API key
    read from the environment variable ``api_key_env`` as ``Authorization: Bearer`` (vLLM's and
    OpenAI's convention). The key is read here, in the load generator, and never stored."""
    environ = os.environ if environ is None else environ
    # the values come from the environment the orchestrator gives this process (its settings file names
    # them only, pipeline/loadtest/reach.py); a settings file written by hand may carry them itself
    given = environ.get(HEADERS_ENV)
    out = json.loads(given) if given else dict(settings.headers)
    if settings.api_key_env:
        key = environ.get(settings.api_key_env)
        if not key:
            raise MissingApiKey(f"api_key_env: the environment variable {settings.api_key_env} is not set")
        out["Authorization"] = f"Bearer {key}"
    return out


# draft_fallbacks: our BLS output, 1 when a draft failure made the request go on target-only
PERF_FIELDS_INT = ("total_draft_tokens", "total_accepted_draft_tokens", "draft_fallbacks")
PERF_FIELDS_TIME = ("arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns", "last_token_time_ns")


@dataclass
class RequestState:
    """One request's measurements while in flight (all times relative to the process t0)."""

    request_id: str
    prompt_id: str
    category: str
    prompt_index: int
    prompt_text: str
    t_scheduled: int | None
    t_sent: int = 0
    chunk_times: list[int] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    empty_chunks: int = 0
    text_parts: list[str] = field(default_factory=list)
    osl_server: int | None = None
    perf: dict[str, Any] = field(default_factory=dict)
    t_last: int | None = None
    status: str = "pending"
    error: str | None = None
    http_status: int | None = None  # the server's status line when it refused the request
    finished: bool = False
    osl_source: str | None = None  # set by a transport that knows better than "server"/"chunks"
    stream_text: Any = None  # llmapi contract: llmapi_contract.CumulativeText of this request
    reasoning_parts: list[str] = field(default_factory=list)  # a reasoning model's thinking, kept apart
    t_first_answer: int | None = None  # first answer (non-reasoning) text; t_first_token counts both
    ramp_step: int | None = None  # the ramp step the request was sent in (None without a ramp)
    max_tokens: int | None = None  # this request's max_tokens when it differs per request (drawn lengths)

    def add_chunk(self, t_ns: int, text: str | None, num_tokens: int | None, reasoning: str | None = None) -> None:
        """Record one response. ``num_tokens`` is the server's count for this response; ``reasoning`` is
        the reasoning text it carries (an output token like any other, kept out of the answer text)."""
        text, reasoning = text or "", reasoning or ""
        if num_tokens is None:
            ntok = 1 if (text or reasoning) else 0  # no server count: one chunk ≈ ≥1 token, flagged via osl_source
        else:
            ntok = int(num_tokens)
            self.osl_server = (self.osl_server or 0) + ntok
        if ntok > 0 or text or reasoning:
            self.chunk_times.append(t_ns)
            self.chunk_tokens.append(ntok)
            self.text_parts.append(text)
            if reasoning:
                self.reasoning_parts.append(reasoning)
            if text and self.t_first_answer is None:
                self.t_first_answer = t_ns
        else:
            self.empty_chunks += 1
        self.t_last = t_ns

    def update_perf(self, values: dict[str, Any]) -> None:
        for key, value in values.items():
            if value is not None:
                self.perf[key] = value


class Clock:
    """perf_counter_ns relative to the process's run start."""

    current: "Clock | None" = None  # the run's clock, for a load shape that must step on the records' time

    def __init__(self) -> None:
        self.t0 = time.perf_counter_ns()
        self.t0_unix = time.time()
        Clock.current = self

    def now(self) -> int:
        return time.perf_counter_ns() - self.t0


def build_record(settings: RunSettings, state: RequestState, *, worker_pid: int, retokenize=None) -> dict[str, Any]:
    """The raw per-request record: a :class:`RawRecordFields` (pipeline/artefacts/records.py, its
    one definition) as the JSON line's object."""
    text = "".join(state.text_parts)
    reasoning = "".join(state.reasoning_parts)
    osl = state.osl_server if state.osl_server is not None else sum(state.chunk_tokens)
    t_first = state.chunk_times[0] if state.chunk_times else None
    warm_ref = state.t_scheduled if state.t_scheduled is not None else state.t_sent
    record = RawRecordFields(
        run_id=settings.run_id,
        arm=settings.arm,
        repeat=settings.repeat,
        concurrency=settings.concurrency if settings.mode == "closed" else None,
        target_rate=settings.target_rate if settings.mode == "open" else None,
        mode=settings.mode,
        transport=settings.transport,
        draft_len=settings.draft_len,
        stage="warmup" if warm_ref < settings.warmup_s * 1e9 else "measure",
        request_id=state.request_id,
        prompt_id=state.prompt_id,
        category=state.category,
        prompt_index=state.prompt_index,
        worker_pid=worker_pid,
        t_scheduled=state.t_scheduled,
        ramp_step=state.ramp_step,
        t_sent=state.t_sent,
        t_first_token=t_first,
        t_first_answer=state.t_first_answer if reasoning else t_first,
        t_last=state.t_last if state.chunk_times or state.t_last else None,
        chunk_times=state.chunk_times,
        tokens_per_chunk=state.chunk_tokens,
        n_chunks=len(state.chunk_times),
        empty_chunks=state.empty_chunks,
        osl=osl,
        osl_source=state.osl_source or ("server" if state.osl_server is not None else "chunks"),
        osl_retok=None,
        isl_chars=len(state.prompt_text),
        isl=None,
        prompt_echoed=bool(text) and text.startswith(state.prompt_text) and len(state.prompt_text) > 0,
        hit_max_tokens=osl >= (state.max_tokens or settings.max_tokens),
        max_tokens=state.max_tokens or settings.max_tokens,
        output_text=text,
        reasoning_text=reasoning or None,
        # greedy-equivalence compares the whole output: reasoning, a NUL, the answer (the answer alone without one)
        output_sha256=hashlib.sha256((f"{reasoning}\0{text}" if reasoning else text).encode("utf-8")).hexdigest(),
        draft_tokens=state.perf.get("total_draft_tokens"),
        accepted_tokens=state.perf.get("total_accepted_draft_tokens"),
        acceptance_rate=state.perf.get("acceptance_rate"),
        draft_fallbacks=state.perf.get("draft_fallbacks"),
        server_times_ns={k: state.perf[k] for k in PERF_FIELDS_TIME if k in state.perf},
        status=state.status,
        error=state.error,
        http_status=state.http_status,
    )
    if retokenize is not None and state.prompt_text:
        try:  # the prompt's tokens as the client's tokenizer counts them (special tokens not added)
            record.isl = int(retokenize(state.prompt_text))
        except Exception:  # noqa: BLE001 - a count for the report's forecast must never fail a request
            record.isl = None
    if retokenize is not None and (text or reasoning):
        try:  # both parts: the server's usage counts reasoning tokens as completion tokens
            record.osl_retok = int(retokenize(text) if text else 0) + int(retokenize(reasoning) if reasoning else 0)
        except Exception:  # noqa: BLE001 - a cross-check must never fail a request
            record.osl_retok = None
    return record.as_record()


class RecordWriter:
    """Appends JSON lines to ``<prefix>.<pid>.jsonl``; one file per process (workers never share)."""

    def __init__(self, prefix: str):
        self.pid = os.getpid()
        self.path = Path(f"{prefix}.{self.pid}.jsonl")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # line-buffered: each record reaches the file when written (a killed Locust loses none)
        self._fh = open(self.path, "a", encoding="utf-8", buffering=1)

    def write(self, record: dict[str, Any]) -> None:
        self._fh.write(json.dumps(record, separators=(",", ":")) + "\n")

    def flush(self) -> None:
        self._fh.flush()

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.flush()
            self._fh.close()


def parse_sse_line(line: bytes) -> dict[str, Any] | None:
    """One Server-Sent-Events line → the JSON payload of a ``data:`` line, else None."""
    line = line.strip()
    if not line.startswith(b"data:"):
        return None
    payload = line[5:].strip()
    if not payload:
        return None
    return json.loads(payload)


def arrival_offsets(rate: float, count: int, seed: int, kind: str = "poisson", burstiness: float = 1.0) -> list[float]:
    """Intended send times (s from the start) of an open-loop schedule at a mean of ``rate`` requests/s:
    ``poisson`` exponential gaps; ``constant`` (or ``fixed``) 1/rate apart; ``gamma`` gaps drawn from a
    gamma distribution of shape ``burstiness`` and scale 1/(rate·burstiness), vLLM's meaning of
    ``--burstiness`` (1 is Poisson, smaller is burstier; the gaps' coefficient of variation is
    1/√burstiness)."""
    rng = random.Random(seed)
    t = 0.0
    out = []
    for _ in range(count):
        if kind == "poisson":
            t += rng.expovariate(rate)
        elif kind == "gamma":
            t += rng.gammavariate(burstiness, 1.0 / (rate * burstiness))
        elif kind in ("constant", "fixed"):
            t += 1.0 / rate
        else:
            raise ValueError(f"arrival: unknown kind '{kind}' (poisson, constant, gamma, trace)")
        out.append(t)
    return out


@dataclass(frozen=True)
class Arrival:
    """One planned open-loop request: when (s from the run's start), which prompt (None: the next in the
    seeded order) and which ramp step it belongs to (None without a ramp)."""

    offset_s: float
    prompt_index: int | None = None
    step: int | None = None


def arrival_schedule(settings: RunSettings, horizon_s: float) -> list[Arrival]:
    """Every arrival of an open-loop run up to ``horizon_s``: one rate (``target_rate``), a ramp of rates
    (each step its own rate, for its own seconds, the steps back to back) or a trace (each prompt's own
    ``arrival_s``, in file order, as the dataset loader gives it)."""
    if settings.arrival == "trace":
        timed = [(float(p["arrival_s"]), i) for i, p in enumerate(settings.prompts) if p.get("arrival_s") is not None]
        if not timed:
            raise ValueError("arrival trace: no prompt carries an arrival_s")
        start = min(t for t, _ in timed)
        return [Arrival(t - start, i) for t, i in sorted(timed) if t - start <= horizon_s]
    steps = settings.ramp or [{"duration_s": horizon_s, "rate": settings.target_rate}]
    out: list[Arrival] = []
    begin = 0.0
    for n, step in enumerate(steps):
        length = float(step["duration_s"]) if settings.ramp else horizon_s
        rate = float(step["rate"])
        count = int(rate * length * 2) + 10  # enough draws to pass the step's end
        seed = settings.seed + 7919 * n  # each step its own stream, the same in both arms
        for t in arrival_offsets(rate, count, seed, settings.arrival, settings.burstiness):
            if t > length:
                break
            out.append(Arrival(begin + t, None, n if settings.ramp else None))
        begin += length
    return [a for a in out if a.offset_s <= horizon_s]


def ramp_step_at(settings: RunSettings, t_s: float) -> int | None:
    """The ramp step running at ``t_s`` seconds from the start (the last one past the end); None without a ramp."""
    if not settings.ramp:
        return None
    end = 0.0
    for n, step in enumerate(settings.ramp):
        end += float(step["duration_s"])
        if t_s < end:
            return n
    return len(settings.ramp) - 1
