"""Locust users that stream from Triton and write one raw JSONL record per request.

Run by ``pipeline.loadtest.runner`` as a subprocess (never imported by the CLI process: gevent patches
the whole process). Settings come from the JSON file named by ``SPECDEPLOY_LOADTEST_CONFIG``
(see ``lt_common.RunSettings``); records go to ``<output_prefix>.<pid>.jsonl`` and a per-process
``<output_prefix>.<pid>.meta.json`` (clock origin, stop signal time, counts).

User classes (pick one on the locust command line):
  * ``GrpcStreamUser`` – closed loop over ``tritonclient.grpc`` bidirectional streaming, one
    stream per user, responses matched by request id.
  * ``HttpStreamUser`` – closed loop over ``POST /v2/models/M/generate_stream`` (SSE), one
    keep-alive connection per user, timed by hand (never at headers).
  * ``OpenAIStreamUser`` – closed loop over an OpenAI-compatible server's streaming
    ``/v1/completions`` or ``/v1/chat/completions`` (``openai_user.py``).
  * ``GrpcOpenLoopUser`` / ``HttpOpenLoopUser`` / ``OpenAIOpenLoopUser`` – run with ``-u 1``: a dispatcher that issues
    requests at precomputed Poisson (or fixed) times, each in its own greenlet; latency is also
    counted from the intended send time ``t_scheduled`` (no coordinated omission).
Requests still in flight when the run stops are written with status ``incomplete_at_stop``.

Fail fast: when, among the requests sent in the first ``fail_fast_window_s`` seconds, errors pass
``fail_fast_error_rate`` of those finished (at least ``FAIL_FAST_MIN_REQUESTS``), the process writes
``<output_prefix>.<pid>.abort.json`` (the first error verbatim, its HTTP status, the counts) and
quits: the orchestrator then stops the sweep instead of loading a server that refuses everything.
"""

from __future__ import annotations

# isort: off
import locust  # must come first: it monkey-patches with gevent
from locust import User, events, task
from locust.exception import StopUser

import grpc.experimental.gevent as grpc_gevent

grpc_gevent.init_gevent()  # before any channel exists
# isort: on

import http.client
import json
import os
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import gevent
from gevent.event import Event
from gevent.lock import BoundedSemaphore

sys.path.insert(0, str(Path(__file__).resolve().parent))
import llmapi_contract
from openai_user import OpenAIStreamSession

from lt_common import (
    PERF_FIELDS_INT,
    PERF_FIELDS_TIME,
    Clock,
    PromptCursor,
    RecordWriter,
    RequestState,
    RunSettings,
    arrival_schedule,
    build_record,
    parse_sse_line,
    ramp_step_at,
    request_headers,
    request_inputs,
)

_ = locust.__version__

import faulthandler
import signal as _signal

faulthandler.register(_signal.SIGUSR1, all_threads=True)  # `kill -USR1 PID` dumps stacks of a stuck run


class _Run:
    """Per-process run state: settings, clock, writer, in-flight table."""

    settings: RunSettings | None = None
    clock: Clock | None = None
    writer: RecordWriter | None = None
    cursor: PromptCursor | None = None
    inflight: dict[str, RequestState] = {}
    counts = {"sent": 0, "written": 0}
    t_stop_signal: int | None = None
    retokenize = None
    early = {"finished": 0, "errors": 0}  # requests sent inside the fail-fast window
    first_error: dict | None = None
    aborted = False
    headers: dict[str, str] = {}  # request_headers(): the API key lives only in this process's memory

    @classmethod
    def ensure(cls, environment) -> None:
        if cls.settings is not None and cls.writer is not None and cls.writer.pid == os.getpid():
            return
        cls.settings = RunSettings.from_env()
        runner = environment.runner
        worker_index = getattr(runner, "worker_index", 0) or 0
        cls.clock = Clock()
        cls.writer = RecordWriter(cls.settings.output_prefix)
        cls.cursor = PromptCursor(cls.settings.prompts, cls.settings.seed, worker_index, cls.settings.num_workers)
        cls.inflight = {}
        cls.counts = {"sent": 0, "written": 0}
        cls.retokenize = _make_retokenizer(cls.settings.tokenizer_dir)
        cls.early = {"finished": 0, "errors": 0}
        cls.first_error, cls.aborted = None, False
        cls.headers = request_headers(cls.settings)

    @classmethod
    def begin(cls, prompt_index: int, prompt: dict, t_scheduled: int | None, ramp_step: int | None = None) -> RequestState:
        state = RequestState(
            request_id=uuid.uuid4().hex[:16],
            prompt_id=str(prompt["id"]),
            category=str(prompt.get("category", "default")),
            prompt_index=prompt_index,
            prompt_text=str(prompt["prompt"]),
            t_scheduled=t_scheduled,
            ramp_step=ramp_step,
        )
        cls.inflight[state.request_id] = state
        cls.counts["sent"] += 1
        return state

    @classmethod
    def finish(cls, state: RequestState, environment) -> None:
        if state.finished:
            return
        state.finished = True
        cls.inflight.pop(state.request_id, None)
        record = build_record(cls.settings, state, worker_pid=os.getpid(), retokenize=cls.retokenize)
        cls.writer.write(record)
        cls.counts["written"] += 1
        _fire_events(environment, record)
        cls.watch_failures(record, environment)

    @classmethod
    def watch_failures(cls, record: dict, environment) -> None:
        """Fail fast (see the module docstring): count the window's outcomes, quit past the bound."""
        failed = record["status"] in ("error", "timeout")
        if failed and cls.first_error is None:
            cls.first_error = {"error": record["error"], "http_status": record.get("http_status"),
                               "status": record["status"], "request_id": record["request_id"]}
        settings = cls.settings
        if cls.aborted or settings.fail_fast_error_rate is None:
            return
        if (record["t_sent"] or 0) > settings.fail_fast_window_s * 1e9:
            return
        cls.early["finished"] += 1
        cls.early["errors"] += int(failed)
        finished, errors = cls.early["finished"], cls.early["errors"]
        if finished >= FAIL_FAST_MIN_REQUESTS and errors / finished > settings.fail_fast_error_rate:
            cls.aborted = True
            abort = {"pid": os.getpid(), "first_error": cls.first_error, "finished": finished, "errors": errors,
                     "window_s": settings.fail_fast_window_s, "bound": settings.fail_fast_error_rate,
                     "t_abort": cls.clock.now()}
            Path(f"{settings.output_prefix}.{os.getpid()}.abort.json").write_text(json.dumps(abort), encoding="utf-8")
            gevent.spawn(environment.runner.quit)  # not from this user's greenlet: quit stops the users

    @classmethod
    def flush_inflight(cls, environment) -> None:
        for state in list(cls.inflight.values()):
            state.status = "incomplete_at_stop"
            state.error = state.error or "request still in flight when the run stopped"
            cls.finish(state, environment)
        if cls.writer is not None:
            cls.writer.flush()

    @classmethod
    def write_meta(cls) -> None:
        if cls.settings is None or cls.writer is None:
            return
        meta = {
            "pid": os.getpid(),
            "t0_unix": cls.clock.t0_unix,
            "t_stop_signal": cls.t_stop_signal,
            "t_end": cls.clock.now(),
            "sent": cls.counts["sent"],
            "written": cls.counts["written"],
            "records": str(cls.writer.path),
        }
        Path(f"{cls.settings.output_prefix}.{os.getpid()}.meta.json").write_text(json.dumps(meta), encoding="utf-8")


def _make_retokenizer(tokenizer_dir: str | None):
    if not tokenizer_dir:
        return None
    try:
        from tokenizers import Tokenizer  # noqa: PLC0415 - tokenizers is loaded only when this path runs

        tok = Tokenizer.from_file(str(Path(tokenizer_dir) / "tokenizer.json"))
    except Exception:  # noqa: BLE001 - the cross-check is optional
        return None
    return lambda text: len(tok.encode(text, add_special_tokens=False).ids)


def _fire_events(environment, record: dict) -> None:
    """Live monitoring only: Locust buckets these; the report reads the raw records."""
    request_type = "spec" if record["arm"] == "speculative" else "base"
    exc = None if record["status"] == "ok" else RuntimeError(record["error"] or record["status"])
    fire = environment.events.request.fire
    if record["t_first_token"] is not None:
        fire(request_type=request_type, name="ttft", response_time=(record["t_first_token"] - record["t_sent"]) / 1e6,
             response_length=0, exception=None, context={})
        if record["osl"] > 1 and record["t_last"] is not None:
            tpot = (record["t_last"] - record["t_first_token"]) / (record["osl"] - 1) / 1e6
            fire(request_type=request_type, name="tpot", response_time=tpot, response_length=0, exception=None, context={})
    e2e = ((record["t_last"] or record["t_sent"]) - record["t_sent"]) / 1e6
    fire(request_type=request_type, name="e2e", response_time=e2e, response_length=record["osl"], exception=exc, context={})


@events.test_start.add_listener
def _on_test_start(environment, **_kw):
    _Run.ensure(environment)


@events.test_stopping.add_listener
def _on_test_stopping(environment, **_kw):
    if _Run.clock is not None:
        _Run.t_stop_signal = _Run.clock.now()


@events.test_stop.add_listener
def _on_test_stop(environment, **_kw):
    if _Run.settings is None:
        return
    # open loop: request greenlets are not Locust users; give them the stop timeout to finish
    deadline = time.monotonic() + _Run.settings.stop_timeout_s
    while _Run.inflight and time.monotonic() < deadline and _Run.settings.mode == "open":
        gevent.sleep(0.01)
    _Run.flush_inflight(environment)
    _Run.write_meta()


@events.quitting.add_listener
def _on_quitting(environment, **_kw):
    if _Run.settings is None:
        return
    _Run.flush_inflight(environment)
    _Run.write_meta()
    _Run.writer.close()


@events.quit.add_listener
def _on_quit(exit_code, **_kw):
    """Leave without interpreter shutdown, once Locust has printed its summary.

    Measured: after a server died mid-run, garbage-collecting a tritonclient gRPC client at
    interpreter exit blocked forever in ``grpc.Channel.close`` (holding the GIL), so the Locust
    process never ended. Every record is flushed by now (``quitting``)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)


# ------------------------------------------------------------------------------------------------
# Transports: each takes a RequestState, sends it, fills chunks, returns when the request is done.


class GrpcStreamSession:
    """One tritonclient gRPC client with one open stream; callbacks demultiplexed by request id."""

    def __init__(self, url: str):
        import tritonclient.grpc as grpcclient  # noqa: PLC0415 - tritonclient is loaded only when this path runs

        self._grpcclient = grpcclient
        self.url = url
        self._waiting: dict[str, tuple[RequestState, Event]] = {}
        self._broken = False
        self._open()

    _retired: list = []  # replaced clients stay referenced: their __del__ would block in close()

    def _open(self) -> None:
        if getattr(self, "client", None) is not None:
            GrpcStreamSession._retired.append(self.client)
        self.client = self._grpcclient.InferenceServerClient(url=self.url)
        # --header / the API key as gRPC metadata (lower-case keys, as gRPC requires)
        self.client.start_stream(callback=self._on_response,
                                 headers={k.lower(): v for k, v in _Run.headers.items()} or None)
        self._broken = False

    def _on_response(self, result, error) -> None:
        now = _Run.clock.now()
        try:
            if error is not None:
                self._fail_one(str(error), now)
                return
            response = result.get_response()
            entry = self._waiting.get(response.id)
            if entry is None:
                return
            state, done = entry
            text = result.as_numpy("text_output")
            if _Run.settings.contract == "llmapi":
                _llmapi_chunk(state, now, _first_text(text), lambda name: _first_value(result.as_numpy(name)))
            else:
                ntok = result.as_numpy("num_output_tokens")
                state.add_chunk(now, _first_text(text), None if ntok is None else int(ntok.reshape(-1)[0]))
                perf = {}
                for name in ("acceptance_rate",) + PERF_FIELDS_INT + PERF_FIELDS_TIME:
                    value = result.as_numpy(name)
                    if value is not None:
                        perf[name] = value.reshape(-1)[0].item()
                state.update_perf(perf)
            final = response.parameters.get("triton_final_response")
            if final is not None and final.bool_param:
                state.status = "ok"
                self._waiting.pop(response.id, None)
                done.set()
        except Exception as exc:  # noqa: BLE001 - a callback error must fail the request, not hang it
            self._fail_one(f"callback error: {exc!r}", now)

    def _fail_one(self, message: str, now: int) -> None:
        # Triton stream errors carry no request id; each session has at most one request in flight.
        # After an error the stream may be unusable: the next send opens a new one.
        self._broken = True
        for rid, (state, done) in list(self._waiting.items()):
            state.status = "error"
            state.error = message
            state.t_last = state.t_last or now
            self._waiting.pop(rid, None)
            done.set()

    def send(self, state: RequestState, inputs: dict, model_name: str, timeout_s: float) -> None:
        if self._broken:
            self._open()
        done = Event()
        self._waiting[state.request_id] = (state, done)
        tensors = _grpc_inputs(self._grpcclient, inputs, _Run.settings.contract)
        state.t_sent = _Run.clock.now()
        self.client.async_stream_infer(
            model_name, tensors, request_id=state.request_id, enable_empty_final_response=True
        )
        if not done.wait(timeout_s):
            self._waiting.pop(state.request_id, None)
            state.status = "timeout"
            state.error = f"no final response within {timeout_s}s"

    def close(self) -> None:
        """Deliberately nothing: the stream ends with the process.

        Measured on tritonserver 2.51 (CPU) against the tiny deployment: ``stop_stream()`` joins
        the response thread and has hung Locust at shutdown; ending the request iterator
        (half-close) hung it as well. Leaving the stream to process exit ends runs cleanly."""


def _llmapi_chunk(state: RequestState, now: int, text: str | None, get) -> None:
    """One response of the llmapi model: its text_output is cumulative (llmapi_contract)."""
    if state.stream_text is None:
        state.stream_text = llmapi_contract.CumulativeText(_Run.retokenize)
        state.osl_source = "retokenized" if state.stream_text.retokenized else None
    delta, added = state.stream_text.delta(text)
    state.add_chunk(now, delta, added)
    state.update_perf(llmapi_contract.perf_values(get))


def _first_value(array):
    if array is None:
        return None
    flat = array.reshape(-1)
    return flat[0] if flat.size else None


def _first_text(array) -> str | None:
    if array is None:
        return None
    flat = array.reshape(-1)
    if flat.size == 0:
        return ""
    value = flat[0]
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


def _grpc_inputs(grpcclient, inputs: dict, contract: str = "ensemble") -> list:
    import numpy as np  # noqa: PLC0415 - numpy is loaded only when this path runs

    if contract == "llmapi":
        return _llmapi_grpc_inputs(grpcclient, inputs)

    dtypes = {"text_input": ("BYTES", object), "max_tokens": ("INT32", np.int32), "stream": ("BOOL", bool),
              "exclude_input_in_output": ("BOOL", bool), "return_perf_metrics": ("BOOL", bool),
              "return_num_output_tokens": ("BOOL", bool), "top_k": ("INT32", np.int32),
              "top_p": ("FP32", np.float32), "temperature": ("FP32", np.float32), "seed": ("UINT64", np.uint64),
              "num_draft_tokens": ("INT32", np.int32), "min_tokens": ("INT32", np.int32),
              "end_id": ("INT32", np.int32), "pad_id": ("INT32", np.int32), "use_draft_logits": ("BOOL", bool)}
    tensors = []
    for name, value in inputs.items():
        triton_dtype, np_dtype = dtypes.get(name, _infer_dtype(value))
        if triton_dtype == "BYTES":
            data = np.array([[str(value).encode("utf-8")]], dtype=object)
        else:
            data = np.array([[value]], dtype=np_dtype)
        tensor = grpcclient.InferInput(name, list(data.shape), triton_dtype)
        tensor.set_data_from_numpy(data)
        tensors.append(tensor)
    return tensors


def _llmapi_grpc_inputs(grpcclient, inputs: dict) -> list:
    """The llmapi model takes unbatched tensors (max_batch_size 0): shape [1] each."""
    import numpy as np  # noqa: PLC0415 - numpy is loaded only when this path runs

    tensors = []
    for name, value in inputs.items():
        triton_dtype, np_dtype = llmapi_contract.input_dtype(name) or _infer_dtype(value)
        if triton_dtype == "BYTES":
            data = np.array([str(value).encode("utf-8")], dtype=object)
        else:
            data = np.array([value], dtype=np.dtype(np_dtype))
        tensor = grpcclient.InferInput(name, list(data.shape), triton_dtype)
        tensor.set_data_from_numpy(data)
        tensors.append(tensor)
    return tensors


def _infer_dtype(value):
    import numpy as np  # noqa: PLC0415 - numpy is loaded only when this path runs

    if isinstance(value, bool):
        return ("BOOL", bool)
    if isinstance(value, int):
        return ("INT32", np.int32)
    if isinstance(value, float):
        return ("FP32", np.float32)
    return ("BYTES", object)


class HttpStreamSession:
    """One keep-alive HTTP/1.1 connection; ``generate_stream`` SSE read line by line."""

    def __init__(self, base_url: str):
        parts = urlsplit(base_url if "://" in base_url else f"http://{base_url}")
        self.host, self.port = parts.hostname, parts.port or 80
        self.conn: http.client.HTTPConnection | None = None

    def _connection(self, timeout_s: float) -> http.client.HTTPConnection:
        if self.conn is None:
            self.conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout_s)
        return self.conn

    def send(self, state: RequestState, inputs: dict, model_name: str, timeout_s: float) -> None:
        body = json.dumps(inputs).encode("utf-8")
        deadline = time.monotonic() + timeout_s
        conn = self._connection(timeout_s)
        try:
            state.t_sent = _Run.clock.now()
            conn.request("POST", f"/v2/models/{model_name}/generate_stream", body=body,
                         headers={**_Run.headers, "Content-Type": "application/json", "Accept": "text/event-stream"})
            response = conn.getresponse()
            if response.status != 200:
                state.status, state.http_status = "error", int(response.status)
                state.error = f"HTTP {response.status}: {response.read()[:500].decode('utf-8', 'replace')}"
                state.t_last = _Run.clock.now()
                return
            self._read_events(state, response, deadline)
            if response.will_close:
                self.close()
        except (TimeoutError, OSError, http.client.HTTPException) as exc:
            self.close()
            if state.status == "pending":
                state.status = "timeout" if isinstance(exc, TimeoutError) else "error"
                state.error = f"{type(exc).__name__}: {exc}"
                state.t_last = state.t_last or _Run.clock.now()

    def _read_events(self, state: RequestState, response, deadline: float) -> None:
        while True:
            line = response.readline()
            if not line:
                break
            event = parse_sse_line(line)
            if event is None:
                continue
            now = _Run.clock.now()
            if "error" in event:
                state.status = "error"
                state.error = str(event["error"])
                state.t_last = now
                response.read()
                return
            if _Run.settings.contract == "llmapi":
                _llmapi_chunk(state, now, _scalar(event.get("text_output")), lambda name, e=event: _scalar(e.get(name)))
            else:
                ntok = event.get("num_output_tokens")
                state.add_chunk(now, event.get("text_output"), None if ntok is None else int(_scalar(ntok)))
                state.update_perf({k: _scalar(event.get(k)) for k in ("acceptance_rate",) + PERF_FIELDS_INT + PERF_FIELDS_TIME})
            if time.monotonic() > deadline:
                raise TimeoutError("request exceeded request_timeout_s")
        state.status = "ok"

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def _scalar(value):
    if isinstance(value, list):
        return value[0] if value else None
    return value


def _new_session(settings: RunSettings):
    if settings.transport == "grpc":
        return GrpcStreamSession(settings.endpoint)
    if settings.transport == "openai":
        return OpenAIStreamSession(settings.endpoint, _Run.clock.now, settings.openai_api, settings.openai_top_k,
                                   _Run.retokenize, headers=_Run.headers, extra_body=settings.extra_body)
    return HttpStreamSession(settings.endpoint)


ERROR_BACKOFF_S = 0.05  # a failing server must not turn a closed-loop user into a busy loop
FAIL_FAST_MIN_REQUESTS = 4  # fewer finished requests say too little to stop a run on


def _do_request(environment, session, t_scheduled: int | None = None, prompt_index: int | None = None,
                ramp_step: int | None = None) -> RequestState:
    settings = _Run.settings
    if prompt_index is None:
        index, prompt = _Run.cursor.next()
    else:  # a trace names its prompt per arrival
        index, prompt = prompt_index, settings.prompts[prompt_index]
    state = _Run.begin(index, prompt, t_scheduled, ramp_step)
    inputs = request_inputs(settings, state.prompt_text, index, prompt)
    state.max_tokens = int(inputs.get("max_tokens") or inputs.get("sampling_param_max_tokens") or settings.max_tokens)
    try:
        session.send(state, inputs, settings.model_name, settings.request_timeout_s)
    except gevent.GreenletExit:
        raise  # left in flight: flushed as incomplete_at_stop
    except Exception as exc:  # noqa: BLE001 - any transport failure is a recorded error
        state.status = "error"
        state.error = f"{type(exc).__name__}: {exc}"
        state.t_last = state.t_last or _Run.clock.now()
    if state.status == "pending":
        state.status = "error"
        state.error = state.error or "stream ended without a final response"
    _Run.finish(state, environment)
    return state


# ------------------------------------------------------------------------------------------------
# Closed loop: users = concurrency, no wait time.


class _ClosedLoopUser(User):
    abstract = True
    wait_time = locust.constant(0)
    transport = "grpc"

    def on_start(self) -> None:
        _Run.ensure(self.environment)
        self.session = _new_session(_Run.settings)

    def on_stop(self) -> None:
        session = getattr(self, "session", None)
        if session is not None:
            session.close()

    @task
    def generate(self) -> None:
        # a closed-loop ramp (ramp_shape.py sets the users): the step by the time the request is sent
        step = ramp_step_at(_Run.settings, _Run.clock.now() / 1e9)
        state = _do_request(self.environment, self.session, ramp_step=step)
        if state.status in ("error", "timeout"):
            gevent.sleep(ERROR_BACKOFF_S)


class GrpcStreamUser(_ClosedLoopUser):
    transport = "grpc"


class HttpStreamUser(_ClosedLoopUser):
    transport = "http"


class OpenAIStreamUser(_ClosedLoopUser):
    transport = "openai"


# ------------------------------------------------------------------------------------------------
# Open loop: one dispatcher user issues arrivals at precomputed times, each in its own greenlet.


class _OpenLoopUser(User):
    """The dispatcher: sends each planned arrival (:func:`lt_common.arrival_schedule`: one rate, a ramp of
    rates, or a trace) at its time in a greenlet of its own. With ``max_concurrency`` an arrival waits
    for a free slot (vLLM's semaphore): ``t_scheduled`` stays the arrival, ``t_sent`` is when it left."""

    abstract = True
    wait_time = locust.constant(0)

    def on_start(self) -> None:
        _Run.ensure(self.environment)
        settings = _Run.settings
        if not settings.target_rate and not settings.ramp and settings.arrival != "trace":
            raise StopUser()
        # a ramp or a trace ends with the run (the orchestrator gives Locust's timer a margin past it)
        patterned = bool(settings.ramp) or settings.arrival == "trace"
        self.schedule = arrival_schedule(settings, settings.duration_s + (0 if patterned else 5))
        self.next_arrival = 0
        self.idle_sessions: list = []
        self.slots = BoundedSemaphore(settings.max_concurrency) if settings.max_concurrency else None
        self.origin = _Run.clock.now()

    def _run_one(self, t_scheduled: int, prompt_index: int | None, step: int | None) -> None:
        if self.slots is not None:
            self.slots.acquire()
        session = self.idle_sessions.pop() if self.idle_sessions else _new_session(_Run.settings)
        try:
            _do_request(self.environment, session, t_scheduled=t_scheduled, prompt_index=prompt_index, ramp_step=step)
        finally:
            self.idle_sessions.append(session)  # one request per session at a time
            if self.slots is not None:
                self.slots.release()

    @task
    def dispatch(self) -> None:
        if self.next_arrival >= len(self.schedule):
            gevent.sleep(0.1)
            return
        arrival = self.schedule[self.next_arrival]
        t_scheduled = self.origin + int(arrival.offset_s * 1e9)
        self.next_arrival += 1
        delay = (t_scheduled - _Run.clock.now()) / 1e9
        if delay > 0:
            gevent.sleep(delay)
        gevent.spawn(self._run_one, t_scheduled, arrival.prompt_index, arrival.step)


class GrpcOpenLoopUser(_OpenLoopUser):
    transport = "grpc"


class HttpOpenLoopUser(_OpenLoopUser):
    transport = "http"


class OpenAIOpenLoopUser(_OpenLoopUser):
    transport = "openai"
