"""Soak benchmark (not a CI test): the speculative CPU deployment under many concurrent gRPC
streams for minutes — does it stay up, answer everything, keep its memory flat and give back
every KV slot?

What it does, with the project's own library code: copies a tiny CPU config
(``configs/tiny-cpu-*.yaml``, builtin demo models) into a work directory, builds and renders it
(``pipeline.build.builder``, ``pipeline.render.renderer``), starts the real ``tritonserver`` for the speculative
arm on free loopback ports (``pipeline.serve.server.serve_deployment``) and drives the model the load
test calls (``pipeline.render.renderer.client_target``: ``ensemble`` or ``tensorrt_llm_bls``) from
``--streams`` threads, each with its own tritonclient gRPC stream, one request at a time, shaped
like the load test's (``locustfiles/lt_common.request_inputs`` over ``loadtest.prompts``). A seeded
mix: greedy and sampled requests, and some cancelled mid-stream (the stream is cancelled after a
few responses, as a client that goes away does).

What it records, written as JSON to ``--out`` (default ``benchmarks/results/soak.json``):

- server crashes: ``tritonserver`` exiting, and any process of its tree (model stubs, engine
  workers) that exits or appears while the soak runs;
- requests: sent, completed, cancelled, errors and timeouts; the error rate excludes the
  cancelled ones; distinct error messages with counts; a per-minute breakdown with latencies;
- resident memory (psutil) of every process in the server's tree, sampled over time; per
  process the growth after the warm-up and the fitted slope (``scipy.stats.linregress``); for
  ``tritonserver`` itself also anonymous vs file-backed resident memory (``/proc/PID/status``),
  threads and open files, and the growth per completed request;
- the allocator the server tree ran on (``--allocator``, ``--malloc-arena-max``; see
  ``pipeline.serve.command.malloc_env``) and the one actually mapped into ``tritonserver``;
- leaks: the engine gauges every ``tensorrt_llm`` model publishes
  (``pipeline/triton_models/engine_gauges.py``: KV slots in use per pool, prefix-cache entries
  and their bound, open requests in the model, the worker proxy and the engine) read before the
  soak and once the load has drained (waiting, bounded, for the slots and open requests to reach
  0), and again after the probes; Triton's ``nv_inference_pending_request_count`` back at 0 for
  every model; a capacity probe of ``max_batch_size`` concurrent greedy requests after the soak
  (a leaked slot makes the engine refuse one: "KV pool exhausted"); greedy outputs of a probe
  set identical before and after (a corrupt prefix-cache entry would change them); the server's
  cancelled counter against the client's cancellations.

Bounded: every stream runs at most ``--max-requests-per-stream`` requests and stops at the
deadline; every request has a timeout, every cancel a bounded wait; streams still busy after the
drain time are reported as hung and abandoned; the server is stopped on every exit path
(SIGTERM/SIGINT included). Exit code 0 when nothing crashed, nothing failed and nothing leaked.

Usage (from the project root)::

    .venv/bin/python benchmarks/bench_soak.py --minutes 10 --streams 48            # the full soak
    .venv/bin/python benchmarks/bench_soak.py --minutes 1 --streams 32 \\
        --out benchmarks/results/soak-smoke.json                                    # a smoke run

Other flags: ``--config`` (default ``configs/tiny-cpu-draft-target.yaml``), ``--warmup-minutes``,
``--cancel-fraction``, ``--sampled-fraction``, ``--max-tokens``, ``--sample-s``, ``--seed``,
``--prompts`` (use only the first N prompts: fewer distinct request shapes), ``--model`` (call
another model than the load test's), ``--stream-requests`` (reopen each stream after N requests),
``--settle-s`` (idle time before the last memory sample), ``--allocator``, ``--malloc-arena-max``,
``--workdir`` (keep the build and the server log).
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import json
import os
import platform
import queue
import random
import re
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "locustfiles"))
sys.path.insert(0, str(ROOT / "tests" / "integration"))
os.environ.setdefault("OMP_NUM_THREADS", "1")

from pipeline.infra.provenance import result_provenance  # noqa: E402 - after the path set-up above
from pipeline.serve.command import MALLOC_CHOICES, MALLOC_ENV  # noqa: E402 - after the sys.path set-up above

DEFAULT_CONFIG = ROOT / "configs" / "tiny-cpu-draft-target.yaml"
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "soak.json"
REQUEST_ID = re.compile(r"^\[request id: [^\]]*\] ")  # Triton's prefix; messages are grouped without it
METRIC_FAMILIES = ("nv_inference_request_success", "nv_inference_request_failure", "nv_inference_count",
                   "nv_inference_pending_request_count", "specdeploy_requests_cancelled_total",
                   "specdeploy_spec_decode_draft_tokens_total", "specdeploy_spec_decode_accepted_tokens_total")
ENGINE_GAUGE_PREFIX = "specdeploy_engine_"  # pipeline/triton_models/engine_gauges.py (and worker health)
IN_USE_GAUGES = ("specdeploy_engine_kv_slots_in_use/target", "specdeploy_engine_kv_slots_in_use/draft",
                 "specdeploy_engine_open_requests/engine", "specdeploy_engine_open_requests/proxy",
                 "specdeploy_engine_open_requests/model")
GAUGE_WAIT_S = 60.0  # after the drain: the gauges are refreshed every second or so


# ----------------------------------------------------------------------------------------------
# One gRPC stream, one request at a time


@dataclass
class Outcome:
    status: str  # ok | cancelled | error | timeout
    kind: str  # greedy | sampled
    t_start: float
    seconds: float
    first_token_s: float | None = None
    tokens: int = 0
    text: str = ""
    error: str | None = None
    cancel_planned: bool = False


class Stream:
    """A tritonclient gRPC client with one open stream; responses of other (earlier, cancelled)
    requests are skipped by request id."""

    def __init__(self, url: str):
        import tritonclient.grpc as grpcclient

        self._results: queue.Queue = queue.Queue()
        self.client = grpcclient.InferenceServerClient(url)
        self.client.start_stream(callback=lambda result, error: self._results.put((result, error)))

    def request(self, model: str, inputs: list, kind: str, timeout_s: float, cancel_after: int | None) -> Outcome:
        rid, start = uuid.uuid4().hex, time.monotonic()
        out = Outcome("timeout", kind, start, 0.0, cancel_planned=cancel_after is not None)
        self.client.async_stream_infer(model, inputs, request_id=rid, enable_empty_final_response=True)
        responses, parts = 0, []
        while (remaining := start + timeout_s - time.monotonic()) > 0:
            try:
                result, error = self._results.get(timeout=remaining)
            except queue.Empty:
                break
            if error is not None:
                out.status, out.error = "error", str(error)
                break
            response = result.get_response()
            if response.id != rid:
                continue
            if response.outputs:
                responses += 1
                out.first_token_s = out.first_token_s or time.monotonic() - start
                parts.append(_text_of(result))
                out.tokens += _tokens_of(result)
            if response.parameters["triton_final_response"].bool_param:
                out.status = "ok"
                break
            if cancel_after is not None and responses >= cancel_after:
                out.status = "cancelled"
                break
        out.seconds, out.text = time.monotonic() - start, "".join(parts)
        if out.status == "timeout":
            out.error = f"no final response within {timeout_s:.0f} s"
        return out

    def close(self, cancel: bool, wait_s: float = 30.0) -> bool:
        """Stop the stream (cancelling what is in flight) and close; False when that did not
        return within ``wait_s`` (the client is then abandoned on a daemon thread)."""
        def stop() -> None:
            with contextlib.suppress(Exception):
                self.client.stop_stream(cancel_requests=cancel)
                self.client.close()

        closer = threading.Thread(target=stop, daemon=True)
        closer.start()
        closer.join(wait_s)
        return not closer.is_alive()


def _text_of(result) -> str:
    array = result.as_numpy("text_output")
    if array is None or not array.size:
        return ""
    value = array.reshape(-1)[0]
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


def _tokens_of(result) -> int:
    array = result.as_numpy("num_output_tokens")
    return int(array.reshape(-1)[0]) if array is not None and array.size else 0


# ----------------------------------------------------------------------------------------------
# The load: one thread per stream


@dataclass
class Load:
    url: str
    model: str
    extra_inputs: dict
    prompts: list[dict]
    max_tokens: int
    streams: int
    deadline: float
    max_requests: int
    stream_requests: int  # reopen the stream after this many requests (0: only after a cancel)
    timeout_s: float
    cancel_fraction: float
    sampled_fraction: float
    seed: int
    datatypes: dict[str, str] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)
    outcomes: list[Outcome] = field(default_factory=list)
    hung_cancels: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


def server_version(url: str) -> str | None:
    """The serving ``tritonserver``'s version (its server metadata)."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)
    try:
        return client.get_server_metadata(as_json=True).get("version")
    except Exception:  # noqa: BLE001 - a record, not a check
        return None
    finally:
        client.close()


def input_datatypes(url: str, model: str) -> dict[str, str]:
    """{input name: Triton datatype} as the served model declares them (its metadata)."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)
    try:
        return {i["name"]: i["datatype"] for i in client.get_model_metadata(model, as_json=True)["inputs"]}
    finally:
        client.close()


def request_arrays(load: Load, prompt: str, index: int, sampled: bool, seed: int) -> list:
    """The load test's request shape (lt_common.request_inputs), typed as the model declares."""
    import numpy as np
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import triton_to_np_dtype

    from lt_common import RunSettings, request_inputs

    sampling = {"top_k": 20, "top_p": 0.9, "temperature": 0.8, "seed": seed} if sampled else {"top_k": 1}
    settings = RunSettings(run_id="soak", arm="speculative", repeat=0, endpoint=load.url, model_name=load.model,
                           max_tokens=load.max_tokens, sampling=sampling, extra_inputs=load.extra_inputs)
    inputs = request_inputs(settings, prompt, index)
    inputs.pop("return_perf_metrics", None)  # per-request perf outputs are the load test's business
    tensors = []
    for name, value in inputs.items():
        datatype = load.datatypes[name]
        value = value.encode("utf-8") if isinstance(value, str) else value
        data = np.array([[value]], dtype=object if datatype == "BYTES" else triton_to_np_dtype(datatype))
        tensor = grpcclient.InferInput(name, list(data.shape), datatype)
        tensor.set_data_from_numpy(data)
        tensors.append(tensor)
    return tensors


def stream_worker(load: Load, index: int) -> None:
    from lt_common import PromptCursor

    rng = random.Random(load.seed * 1000 + index)
    cursor = PromptCursor(load.prompts, load.seed, index, load.streams)
    stream, on_stream = None, 0
    try:
        for _ in range(load.max_requests):
            if load.stop.is_set() or time.monotonic() >= load.deadline:
                break
            position, prompt = cursor.next()
            sampled = rng.random() < load.sampled_fraction
            cancel_after = rng.randint(1, 4) if rng.random() < load.cancel_fraction else None
            arrays = request_arrays(load, prompt["prompt"], position, sampled, rng.randrange(1 << 30))
            try:
                stream = stream or Stream(load.url)
                outcome = stream.request(load.model, arrays, "sampled" if sampled else "greedy", load.timeout_s,
                                         cancel_after)
            except Exception as exc:  # noqa: BLE001 - a refused connection is an error, not a crash
                outcome = Outcome("error", "sampled" if sampled else "greedy", time.monotonic(), 0.0, error=repr(exc))
            with load.lock:
                load.outcomes.append(outcome)
            on_stream += 1
            if outcome.status == "ok" and stream is not None and on_stream == load.stream_requests:
                stream.close(cancel=False)
                stream = None
            if stream is None:
                on_stream = 0
            elif outcome.status != "ok":
                if not stream.close(cancel=True):
                    with load.lock:
                        load.hung_cancels += 1
                stream, on_stream = None, 0
    finally:
        if stream is not None:
            stream.close(cancel=False)


def run_load(load: Load, drain_s: float, server_alive) -> list[int]:
    """Run every stream until the deadline (or the server's exit); the indices of streams still
    busy ``drain_s`` after that."""
    threads = [threading.Thread(target=stream_worker, args=(load, i), name=f"soak-{i}", daemon=True)
               for i in range(load.streams)]
    for thread in threads:
        thread.start()
    try:
        while time.monotonic() < load.deadline and any(t.is_alive() for t in threads) and server_alive():
            time.sleep(0.5)
    finally:
        load.stop.set()
    give_up = time.monotonic() + drain_s
    for thread in threads:
        thread.join(max(0.0, give_up - time.monotonic()))
    return [i for i, t in enumerate(threads) if t.is_alive()]


# ----------------------------------------------------------------------------------------------
# The server's process tree and metrics


class TreeMemory:
    """RSS of every process in the server's tree every ``interval_s`` (a daemon thread), plus the
    processes that left or joined the tree after the first sample, and — to tell a slower server
    from a busier machine — the tree's CPU seconds and the host's load average at each sample."""

    def __init__(self, pid: int, interval_s: float):
        self.pid, self.interval_s, self.t0 = pid, interval_s, time.monotonic()
        self.series: dict[int, list[tuple[float, float]]] = {}
        self.labels: dict[int, str] = {}
        self.first_pids: set[int] | None = None
        self.host: list[tuple[float, float, float]] = []  # (t, tree CPU seconds so far, 1-min load average)
        self.load_end: float | None = None  # t of the last sample under load; later ones are idle
        self.root_detail: list[tuple] = []  # (t, RssAnon MB, RssFile MB, RssShmem MB, threads, open fds)
        self._cpu_s: dict[int, float] = {}
        self.server_exit: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="soak-memory", daemon=True)

    def __enter__(self) -> "TreeMemory":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)

    def sample(self) -> None:
        import psutil

        now = round(time.monotonic() - self.t0, 1)
        try:
            root = psutil.Process(self.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            self.server_exit = self.server_exit or now
            return
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                rss_mb = proc.memory_info().rss / 2**20
                times = proc.cpu_times()
                self._cpu_s[proc.pid] = times.user + times.system
                if proc.pid not in self.labels:
                    self.labels[proc.pid] = process_label(proc)
                self.series.setdefault(proc.pid, []).append((now, round(rss_mb, 2)))
        self.host.append((now, round(sum(self._cpu_s.values()), 2), round(os.getloadavg()[0], 2)))
        with contextlib.suppress(psutil.Error, OSError):
            self.root_detail.append((now, *rss_kinds_mb(self.pid), root.num_threads(), root.num_fds()))
        if self.first_pids is None:
            self.first_pids = set(self.series)

    def alive_pids(self) -> set[int]:
        import psutil

        alive = set()
        for pid in self.series:
            with contextlib.suppress(psutil.Error):
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.add(pid)
        return alive


def rss_kinds_mb(pid: int) -> tuple[float, float, float]:
    """(anonymous, file-backed, shared-memory) resident MB from ``/proc/PID/status``: heap growth
    shows in the first, mapped libraries and files in the second."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("RssAnon", "RssFile", "RssShmem"):
            fields[key] = round(int(value.split()[0]) / 1024, 2)
    return fields.get("RssAnon", 0.0), fields.get("RssFile", 0.0), fields.get("RssShmem", 0.0)


def mapped_allocator(pid: int) -> str:
    """Which allocator ``pid`` has mapped (its ``/proc/PID/maps``): jemalloc, tcmalloc or glibc."""
    from pipeline.serve.command import MALLOC_LIBRARIES

    try:
        maps = Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return "unknown"
    return next((name for name, lib in MALLOC_LIBRARIES.items() if lib.split(".so")[0] in maps), "glibc")


def process_label(proc) -> str:
    """tritonserver, ``stub <model>`` (from the model.py path) or ``worker <engine role>``."""
    cmd = proc.cmdline()
    if any(part.endswith("model.py") for part in cmd):
        model_py = next(part for part in cmd if part.endswith("model.py"))
        return f"stub {Path(model_py).parents[1].name}"
    if "pipeline.reference.worker" in cmd:
        after = cmd[cmd.index("pipeline.reference.worker") + 1:]
        return f"worker {Path(after[0]).name}" if after else "worker"
    return proc.name()


def scrape(metrics_url: str) -> dict[str, dict[str, float]]:
    """{family: {model: value}} for :data:`METRIC_FAMILIES` (``{}`` when unreachable)."""
    from prometheus_client.parser import text_string_to_metric_families

    from pipeline.loadtest.server_metrics import metrics_text

    text = metrics_text(metrics_url, timeout_s=10)
    if text is None:
        return {}
    out: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in METRIC_FAMILIES:
                model = sample.labels.get("model", "")
                out.setdefault(sample.name, {})[model] = out.get(sample.name, {}).get(model, 0.0) + sample.value
    return out


def engine_gauges(metrics_url: str) -> dict[str, dict[str, float]]:
    """{model: {gauge[/pool or where]: value}} of the engine gauges (``{}`` when unreachable)."""
    from prometheus_client.parser import text_string_to_metric_families

    from pipeline.loadtest.server_metrics import metrics_text

    text = metrics_text(metrics_url, timeout_s=10)
    if text is None:
        return {}
    out: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith(ENGINE_GAUGE_PREFIX) and "model" in sample.labels:
                extra = sample.labels.get("pool") or sample.labels.get("where")
                out.setdefault(sample.labels["model"], {})[sample.name + (f"/{extra}" if extra else "")] = sample.value
    return out


def gauges_idle(gauges: dict[str, dict[str, float]]) -> bool:
    """Every engine model shows 0 slots and 0 open requests, and prefix entries within the bound."""
    engines = {m: g for m, g in gauges.items() if "specdeploy_engine_kv_slots" in g}
    return bool(engines) and all(
        all(g.get(k, 0) == 0 for k in IN_USE_GAUGES)
        and g.get("specdeploy_engine_prefix_cache_entries", 0) <= g.get("specdeploy_engine_prefix_cache_capacity", 0)
        for g in engines.values())


def wait_gauges_idle(metrics_url: str, timeout_s: float = GAUGE_WAIT_S) -> dict:
    """Poll until :func:`gauges_idle` (or the timeout): the values and how long it took."""
    t0 = time.monotonic()
    while True:
        gauges = engine_gauges(metrics_url)
        if gauges_idle(gauges) or time.monotonic() - t0 >= timeout_s:
            return {"idle": gauges_idle(gauges), "waited_s": round(time.monotonic() - t0, 2), "values": gauges}
        time.sleep(0.25)


def metrics_delta(before: dict, after: dict) -> dict:
    return {name: {model: after[name][model] - before.get(name, {}).get(model, 0.0) for model in after[name]}
            for name in after if name != "nv_inference_pending_request_count"}


# ----------------------------------------------------------------------------------------------
# Probes before and after the soak


def greedy_texts(url: str, model: str, load: Load, prompts: list[str], timeout_s: float) -> list[str | None]:
    """Each prompt greedily, one at a time on a fresh stream (the same batch of one before and after)."""
    texts = []
    for index, prompt in enumerate(prompts):
        stream = Stream(url)
        try:
            outcome = stream.request(model, request_arrays(load, prompt, index, False, 0), "greedy", timeout_s, None)
        finally:
            stream.close(cancel=False)
        texts.append(outcome.text if outcome.status == "ok" else None)
    return texts


def capacity_probe(load: Load, count: int, timeout_s: float) -> dict:
    """``count`` greedy requests at once (the engine's whole batch): every one must complete."""
    results: list[Outcome] = []
    lock = threading.Lock()

    def one(index: int) -> None:
        prompt = load.prompts[index % len(load.prompts)]["prompt"]
        stream = Stream(load.url)
        try:
            outcome = stream.request(load.model, request_arrays(load, prompt, index, False, 0), "greedy", timeout_s, None)
        except Exception as exc:  # noqa: BLE001 - a probe failure is recorded in the result, not raised
            outcome = Outcome("error", "greedy", time.monotonic(), 0.0, error=repr(exc))
        finally:
            stream.close(cancel=False)
        with lock:
            results.append(outcome)

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout_s + 30)
    ok = sum(1 for r in results if r.status == "ok")
    return {"requests": count, "ok": ok, "passed": ok == count,
            "errors": sorted({r.error for r in results if r.error})}


# ----------------------------------------------------------------------------------------------
# Summaries


def request_summary(outcomes: list[Outcome], t0: float) -> dict:
    counts = Counter(o.status for o in outcomes)
    not_cancelled = len(outcomes) - counts["cancelled"]
    failed = counts["error"] + counts["timeout"]
    return {
        "sent": len(outcomes), "ok": counts["ok"], "cancelled": counts["cancelled"], "errors": counts["error"],
        "timeouts": counts["timeout"],
        "cancel_planned_but_finished_first": sum(1 for o in outcomes if o.cancel_planned and o.status == "ok"),
        "greedy": sum(1 for o in outcomes if o.kind == "greedy"), "sampled": sum(1 for o in outcomes if o.kind == "sampled"),
        "tokens_completed": sum(o.tokens for o in outcomes if o.status == "ok"),
        "error_rate_excluding_cancelled": failed / not_cancelled if not_cancelled else 0.0,
        "error_messages": dict(Counter(REQUEST_ID.sub("", o.error or "") for o in outcomes
                                       if o.status in ("error", "timeout")).most_common(10)),
        "per_minute": per_minute(outcomes, t0),
    }


def per_minute(outcomes: list[Outcome], t0: float) -> list[dict]:
    buckets: dict[int, list[Outcome]] = {}
    for outcome in outcomes:
        buckets.setdefault(int((outcome.t_start - t0) // 60), []).append(outcome)
    rows = []
    for minute in sorted(buckets):
        done = [o for o in buckets[minute] if o.status == "ok"]
        e2e = sorted(o.seconds for o in done)
        ttft = sorted(o.first_token_s for o in done if o.first_token_s is not None)
        rows.append({"minute": minute, "sent": len(buckets[minute]), "ok": len(done),
                     "cancelled": sum(1 for o in buckets[minute] if o.status == "cancelled"),
                     "failed": sum(1 for o in buckets[minute] if o.status in ("error", "timeout")),
                     "tokens": sum(o.tokens for o in done),
                     "e2e_s_p50": _quantile(e2e, 0.5), "e2e_s_p95": _quantile(e2e, 0.95),
                     "ttft_s_p50": _quantile(ttft, 0.5), "ttft_s_p95": _quantile(ttft, 0.95)})
    return rows


def _quantile(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:
        return None
    return round(sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))], 4)


def _slope_per_min(points: list[tuple[float, float]]) -> float:
    from scipy.stats import linregress

    return float(linregress([t for t, _ in points], [mb for _, mb in points]).slope) * 60


def _kb_per_event(series: list[tuple[float, float]], event_times: list[float]) -> tuple[float, int] | None:
    """The slope of RSS (MB) against the number of events (requests, cancellations) done by each
    sample, in KB per event, and the events counted; None with fewer than two distinct counts."""
    import bisect

    from scipy.stats import linregress

    times = sorted(event_times)
    points = [(bisect.bisect_right(times, t), mb) for t, mb in series]
    if len({n for n, _ in points}) < 2:
        return None
    fit = linregress([n for n, _ in points], [mb for _, mb in points])
    return round(float(fit.slope) * 1024, 3), points[-1][0] - points[0][0]


def root_detail_summary(memory: TreeMemory, warmup_s: float, done_at: list[float],
                        cancelled_at: list[float] | None = None) -> dict:
    """``tritonserver``'s anonymous/file-backed RSS, threads and fds after the warm-up, and its
    RSS growth per request and per cancellation (the slope of RSS against requests, and against
    cancellations, done by each sample)."""

    rows = [r for r in memory.root_detail if warmup_s <= r[0] <= (memory.load_end or r[0])]
    out: dict = {"columns": ["t_s", "rss_anon_mb", "rss_file_mb", "rss_shmem_mb", "threads", "fds"],
                 "rows": memory.root_detail}
    idle = [r for r in memory.root_detail if memory.load_end is not None and r[0] > memory.load_end]
    if idle and rows:
        out["rss_anon_mb_after_idle"] = idle[-1][1]
        out["idle_s"] = round(idle[-1][0] - rows[-1][0], 1)
        out["rss_anon_mb_given_back_when_idle"] = round(rows[-1][1] - idle[-1][1], 2)
    if len(rows) >= 2:
        out.update({f"{name}_growth": round(rows[-1][i] - rows[0][i], 2)
                    for i, name in enumerate(out["columns"][1:], 1)})
    series = [(t, mb) for t, mb in memory.series.get(memory.pid, []) if warmup_s <= t <= (memory.load_end or t)]
    for name, times in (("request", done_at or []), ("cancelled", cancelled_at or [])):
        fit = _kb_per_event(series, times)
        if fit is not None:
            out[f"rss_kb_per_{name}"], out[f"{name}_after_warmup"] = fit
    return out


def memory_summary(memory: TreeMemory, warmup_s: float, tolerance_mb: float, done_at: list[float] | None = None,
                   cancelled_at: list[float] | None = None) -> dict:
    """Per process: RSS at the first sample after the warm-up and at the last one, the growth and
    the fitted slope over the post-warm-up samples."""
    rows = []
    for pid, series in sorted(memory.series.items()):
        after = [(t, mb) for t, mb in series if warmup_s <= t <= (memory.load_end or t)]
        row = {"pid": pid, "label": memory.labels.get(pid, "?"), "samples": len(series),
               "rss_mb_first": series[0][1], "rss_mb_max": max(mb for _, mb in series)}
        idle = [mb for t, mb in series if memory.load_end is not None and t > memory.load_end]
        if idle:
            row["rss_mb_after_idle"] = idle[-1]
        if len(after) >= 2:
            late = after[len(after) // 2:] if len(after) >= 4 else after  # still growing at the end?
            row.update(rss_mb_after_warmup=after[0][1], rss_mb_end=after[-1][1],
                       growth_mb=round(after[-1][1] - after[0][1], 2),
                       slope_mb_per_min=round(_slope_per_min(after), 3),
                       slope_mb_per_min_last_half=round(_slope_per_min(late), 3))
        rows.append(row)
    measured = [r for r in rows if "growth_mb" in r]
    return {"tritonserver_detail": root_detail_summary(memory, warmup_s, done_at, cancelled_at),
            "warmup_s": warmup_s, "sample_interval_s": memory.interval_s, "tolerance_mb": tolerance_mb,
            "flat": bool(measured) and all(r["growth_mb"] <= tolerance_mb for r in measured),
            "total_growth_mb": round(sum(r["growth_mb"] for r in measured), 2), "processes": rows,
            "series": {str(pid): series for pid, series in sorted(memory.series.items())},
            "server_cpu_and_load": {"columns": ["t_s", "server_tree_cpu_s", "loadavg_1min"], "rows": memory.host}}


# ----------------------------------------------------------------------------------------------
# Orchestration


def prepare(config: Path, workdir: Path):
    """Copy the config into ``workdir`` (engines/ go there), build and render it."""
    from pipeline.build.builder import build
    from pipeline.config import load_config
    from pipeline.render.renderer import render

    workdir.mkdir(parents=True, exist_ok=True)
    local = workdir / config.name
    shutil.copyfile(config, local)
    os.chdir(workdir)
    cfg = load_config(local)
    if cfg.backend != "reference":
        raise SystemExit(f"{config}: the soak serves the CPU reference backend (backend: reference)")
    if not ipaddress.ip_address(socket.gethostbyname(cfg.triton.host)).is_loopback:
        raise SystemExit(f"{config}: triton.host {cfg.triton.host} is not a loopback address")
    build(cfg, progress=False)
    render(cfg)
    return cfg


def soak(args: argparse.Namespace, cfg) -> dict:
    from pipeline.infra.processes import free_ports
    from pipeline.loadtest.inputs import load_prompt_set
    from pipeline.render.renderer import client_target
    from pipeline.serve.server import serve_deployment

    prompts, dataset = load_prompt_set(cfg)
    prompts = prompts[: args.prompts] if args.prompts else prompts
    target = client_target(cfg, "speculative")
    batch = cfg.reference.max_batch_size or cfg.build.max_batch_size
    http, grpc, metrics = free_ports(3)
    with serve_deployment(cfg, "speculative", http_port=http, grpc_port=grpc, metrics_port=metrics) as server:
        allocator = {"requested": args.allocator, "malloc_arena_max": args.malloc_arena_max,
                     "mapped_in_tritonserver": mapped_allocator(server.pid),
                     "tritonserver_version": server_version(server.grpc_url)}
        load = Load(server.grpc_url, args.model or target.model_name, dict(target.extra_inputs), prompts,
                    args.max_tokens or cfg.loadtest.max_tokens, args.streams, 0.0, args.max_requests_per_stream,
                    args.stream_requests,
                    args.request_timeout_s, args.cancel_fraction, args.sampled_fraction, args.seed)
        load.datatypes = input_datatypes(load.url, load.model)
        probe_prompts = [p["prompt"] for p in prompts[: max(1, batch)]]
        texts_before = greedy_texts(load.url, load.model, load, probe_prompts, args.request_timeout_s)
        before = scrape(server.metrics_url)
        gauges_before = wait_gauges_idle(server.metrics_url)
        with TreeMemory(server.pid, args.sample_s) as memory:
            t0 = time.monotonic()
            load.deadline = t0 + args.minutes * 60
            hung = run_load(load, args.request_timeout_s + 30, server.alive)
            soak_s = time.monotonic() - t0
            gauges_drained = wait_gauges_idle(server.metrics_url) if server.alive() else None
            memory.sample()
            memory.load_end = round(time.monotonic() - memory.t0, 1)
            settle_until = time.monotonic() + args.settle_s  # idle: is the growth given back?
            while time.monotonic() < settle_until and server.alive():
                time.sleep(min(args.sample_s, max(0.0, settle_until - time.monotonic())))
            memory.sample()
            alive_during = server.alive()
            pids_end = memory.alive_pids()
        report = after_soak(server, load, memory, before, texts_before, probe_prompts, batch, args)
        if report["leaks"].get("checked"):
            report["leaks"]["engine_gauges"] = {
                "before_soak": gauges_before, "after_drain": gauges_drained,
                "after_probes": wait_gauges_idle(server.metrics_url),
                "idle_means": "kv_slots_in_use (target, draft) and open_requests (model, proxy, engine) 0; "
                              "prefix_cache_entries ≤ prefix_cache_capacity"}
        report.update(soak_seconds=round(soak_s, 1), hung_streams=hung, allocator=allocator,
                      requests=request_summary(load.outcomes, t0),
                      memory=memory_summary(memory, args.warmup_minutes * 60, args.rss_tolerance_mb,
                                            [o.t_start + o.seconds - memory.t0 for o in load.outcomes],
                                            [o.t_start + o.seconds - memory.t0 for o in load.outcomes
                                             if o.status == "cancelled"]),
                      processes=process_changes(memory, pids_end, alive_during),
                      model=load.model, extra_inputs=dict(target.extra_inputs), engine_max_batch_size=batch,
                      dataset={k: dataset[k] for k in ("path", "n_prompts", "categories", "sha256")},
                      cpu_plan=server.cpu_plan.as_dict() if server.cpu_plan else None)
        if not alive_during:
            report["server_log_tail"] = server.log_tail(60)
    return report


def after_soak(server, load: Load, memory: TreeMemory, before: dict, texts_before: list, probe_prompts: list,
               batch: int, args: argparse.Namespace) -> dict:
    """Leak checks once the soak's streams have drained, while the server still runs."""
    if not server.alive():
        return {"leaks": {"checked": False, "why": "the server exited during the soak"}}
    pending = scrape(server.metrics_url).get("nv_inference_pending_request_count", {})
    capacity = capacity_probe(load, batch, args.request_timeout_s)
    texts_after = greedy_texts(load.url, load.model, load, probe_prompts, args.request_timeout_s)
    after = scrape(server.metrics_url)
    delta = metrics_delta(before, after)
    cancelled_client = sum(1 for o in load.outcomes if o.status == "cancelled")
    changed = [i for i, (a, b) in enumerate(zip(texts_before, texts_after)) if a != b or a is None]
    return {
        "metrics_delta": delta,
        "leaks": {
            "checked": True,
            "pending_requests_after_soak": pending,
            "pending_all_zero": bool(pending) and all(v == 0 for v in pending.values()),
            "capacity_probe": capacity,
            "greedy_probe": {"prompts": len(probe_prompts), "unchanged": not changed, "changed_indices": changed},
            "cancelled_by_client": cancelled_client,
            "cancelled_counted_by_server": delta.get("specdeploy_requests_cancelled_total", {}),
            "hung_cancels": load.hung_cancels,
            "cancellation_note": cancellation_note(load.model, cancelled_client, delta),
        },
    }


def cancellation_note(model: str, cancelled_client: int, delta: dict) -> str | None:
    """Why the engine may count fewer cancellations than the client made."""
    counted = sum(delta.get("specdeploy_requests_cancelled_total", {}).values())
    if model != "ensemble" or not cancelled_client or counted >= cancelled_client:
        return None
    return ("the client cancelled through the ensemble: Triton checks a cancelled ensemble request between "
            "ensemble steps (triton-inference-server/server docs/user_guide/request_cancellation.md); the "
            "tensorrt_llm step already running did not see these cancellations and finished the requests, whose "
            "slots came back when they ended (the pending-request gauge and the capacity probe check that)")


def process_changes(memory: TreeMemory, pids_end: set[int], alive: bool) -> dict:
    first = memory.first_pids or set()
    exited = sorted(first - pids_end)
    started = sorted(set(memory.series) - first)
    return {"tritonserver_alive_at_end": alive, "server_crashes": 0 if alive else 1,
            "exited": [{"pid": p, "label": memory.labels.get(p)} for p in exited],
            "started": [{"pid": p, "label": memory.labels.get(p)} for p in started],
            "count_at_start": len(first), "count_at_end": len(pids_end)}


def verdict(report: dict) -> dict:
    leaks = report.get("leaks", {})
    checks = {
        "no_server_crash": report["processes"]["server_crashes"] == 0 and not report["processes"]["exited"],
        "no_errors_apart_from_cancelled": report["requests"]["errors"] + report["requests"]["timeouts"] == 0,
        "memory_flat_after_warmup": report["memory"]["flat"],
        "no_leaked_requests_or_slots": bool(leaks.get("checked")) and leaks["pending_all_zero"]
        and leaks["capacity_probe"]["passed"] and not report["hung_streams"] and not leaks["hung_cancels"]
        and all((leaks.get("engine_gauges", {}).get(k) or {}).get("idle") for k in ("before_soak", "after_drain",
                                                                                      "after_probes")),
        "greedy_outputs_unchanged": bool(leaks.get("checked")) and leaks["greedy_probe"]["unchanged"],
    }
    return {**checks, "passed": all(checks.values()), "memory_diagnosis": memory_diagnosis(report["memory"])}


def memory_diagnosis(memory: dict) -> dict:
    """Which processes grew past the tolerance and, when only ``tritonserver`` did, its growth per
    cancelled stream. Not a check: ``tritonserver`` keeps memory for every gRPC stream cancelled
    with a request in flight and does not give it back (docs/operations.md, "Memory of the CPU
    tritonserver"), so that growth fails the verdict like any other."""
    growing = [r["label"] for r in memory["processes"] if r.get("growth_mb", 0) > memory["tolerance_mb"]]
    detail = memory.get("tritonserver_detail", {})
    out = {"growing": growing,
           "tritonserver_kb_per_cancelled": detail.get("rss_kb_per_cancelled"),
           "tritonserver_kb_per_request": detail.get("rss_kb_per_request"),
           "tritonserver_anon_mb_given_back_when_idle": detail.get("rss_anon_mb_given_back_when_idle")}
    if growing == ["tritonserver"]:
        out["note"] = ("only tritonserver grew: it keeps memory per gRPC stream cancelled with a request in "
                       "flight (docs/operations.md, 'Memory of the CPU tritonserver')")
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="a tiny CPU config (configs/tiny-cpu-*.yaml)")
    parser.add_argument("--minutes", type=float, default=10.0, help="soak duration (after the probes)")
    parser.add_argument("--streams", type=int, default=48, help="concurrent gRPC streams (32-64 is the soak's range)")
    parser.add_argument("--warmup-minutes", type=float, help="memory growth is measured after this (default: a tenth, ≤ 1)")
    parser.add_argument("--cancel-fraction", type=float, default=0.15, help="requests cancelled after 1-4 responses")
    parser.add_argument("--sampled-fraction", type=float, default=0.5, help="sampled (top-k/top-p/temperature) requests")
    parser.add_argument("--max-tokens", type=int, help="tokens per request (default: loadtest.max_tokens)")
    parser.add_argument("--max-requests-per-stream", type=int, default=100_000, help="a bound on each stream's loop")
    parser.add_argument("--request-timeout-s", type=float, default=180.0)
    parser.add_argument("--sample-s", type=float, default=5.0, help="memory sampling interval")
    parser.add_argument("--rss-tolerance-mb", type=float, default=10.0, help="growth per process still called flat")
    parser.add_argument("--seed", type=int, default=20)
    parser.add_argument("--stream-requests", type=int, default=0,
                        help="reopen each gRPC stream after this many requests (default 0: only after a cancel)")
    parser.add_argument("--settle-s", type=float, default=30.0,
                        help="idle time after the load before the last memory sample (is growth given back?)")
    parser.add_argument("--model", help="the model the streams call (default: the one the load test calls)")
    parser.add_argument("--prompts", type=int, help="use only the first N prompts (fewer distinct request shapes)")
    parser.add_argument("--allocator", choices=MALLOC_CHOICES, help=f"the server's allocator (sets {MALLOC_ENV}; "
                        "default: what serve picks)")
    parser.add_argument("--malloc-arena-max", type=int, help="MALLOC_ARENA_MAX for the server tree (glibc's arenas)")
    parser.add_argument("--workdir", type=Path, help="keep the build, the model repository and the server log here")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--note", default="", help="recorded in the JSON (e.g. what else loaded the machine)")
    args = parser.parse_args(argv)
    if args.warmup_minutes is None:
        args.warmup_minutes = min(1.0, args.minutes / 10)
    if not 0 <= args.warmup_minutes < args.minutes or args.streams < 1:
        parser.error("need --streams ≥ 1 and 0 ≤ --warmup-minutes < --minutes")
    return args


def allocator_env(args: argparse.Namespace) -> dict[str, str]:
    """The environment ``--allocator`` and ``--malloc-arena-max`` give the server (it inherits ours)."""
    return {**({MALLOC_ENV: args.allocator} if args.allocator else {}),
            **({"MALLOC_ARENA_MAX": str(args.malloc_arena_max)} if args.malloc_arena_max else {})}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.update(allocator_env(args))  # read by pipeline.serve.command.cpu_server_env
    config, out = args.config.resolve(), args.out.resolve()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: the server stops in its context manager
    load_before, t_start = os.getloadavg(), time.time()
    with tempfile.TemporaryDirectory(prefix="bench-soak-") as tmp:
        previous = Path.cwd()
        try:
            cfg = prepare(config, args.workdir.resolve() if args.workdir else Path(tmp))
            report = soak(args, cfg)
        finally:
            os.chdir(previous)
    report = {"what": __doc__.split("\n\n")[0].replace("\n", " "), "command": [sys.executable, *sys.argv],
              "config": str(config.relative_to(ROOT) if config.is_relative_to(ROOT) else config),
              "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
              "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t_start)),
              "host": {"machine": platform.machine(), "cpus": os.cpu_count(), "allowed_cpus": len(os.sched_getaffinity(0)),
                       "python": platform.python_version(), "loadavg_before": load_before, "loadavg_after": os.getloadavg()},
              "notes": args.note, **report}
    report["verdict"] = verdict(report)
    report["provenance"] = result_provenance()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    print_summary(report, out)
    return 0 if report["verdict"]["passed"] else 1


def print_summary(report: dict, out: Path) -> None:
    req, mem = report["requests"], report["memory"]
    print(f"soak {report['soak_seconds']:.0f} s, {report['settings']['streams']} streams → {req['sent']} requests: "
          f"{req['ok']} ok, {req['cancelled']} cancelled, {req['errors']} errors, {req['timeouts']} timeouts "
          f"(error rate excl. cancelled {req['error_rate_excluding_cancelled']:.4f})", file=sys.stderr)
    for row in mem["processes"]:
        if "growth_mb" in row:
            print(f"  {row['pid']:>7} {row['label']:<28} rss {row['rss_mb_after_warmup']:8.1f} → {row['rss_mb_end']:8.1f} MB "
                  f"({row['growth_mb']:+.1f} MB, {row['slope_mb_per_min']:+.2f} MB/min, last half "
                  f"{row['slope_mb_per_min_last_half']:+.2f})", file=sys.stderr)
    print(f"verdict: {report['verdict']}\nwrote {out}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
