"""What the load test samples from the servers while Locust runs: Prometheus counters and memory/CPU.

Reads each arm's ``/metrics`` text (parsed by ``prometheus_client``) and, through psutil, the
server process tree's RSS and CPU time; writes nothing (the runner stores the samples).
"""

from __future__ import annotations

import threading
import urllib.request

COUNTERS = {
    "draft_tokens": "specdeploy_spec_decode_draft_tokens_total",
    "accepted_tokens": "specdeploy_spec_decode_accepted_tokens_total",
    "verify_steps": "specdeploy_spec_decode_verify_steps_total",
}
# vLLM's speculative-decoding counters (vllm/v1/spec_decode/metrics.py): one draft = one verify step
VLLM_COUNTERS = {
    "draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
    "accepted_tokens": "vllm:spec_decode_num_accepted_tokens_total",
    "verify_steps": "vllm:spec_decode_num_drafts_total",
}


# ------------------------------------------------------------------------------------------------
# Metrics and memory


def metrics_text(metrics_url: str | None, timeout_s: float = 5.0) -> str | None:
    """The Prometheus text a server exports; None when there is no URL or it does not answer."""
    if not metrics_url:
        return None
    try:
        with urllib.request.urlopen(metrics_url, timeout=timeout_s) as resp:  # noqa: S310 - loopback/user URL
            return resp.read().decode("utf-8", errors="replace")
    except OSError:
        return None


def parse_counters(text: str) -> dict[str, float]:
    """Each acceptance counter summed over its label sets (models, versions); ours, or vLLM's
    when the server is a vLLM (``--endpoint-*`` with ``metrics_*`` in a load-test file)."""
    from prometheus_client.parser import text_string_to_metric_families  # noqa: PLC0415 - start-up: prometheus_client (loaded when a metrics page is parsed)

    keys = {name: key for table in (COUNTERS, VLLM_COUNTERS) for key, name in table.items()}
    totals = {key: 0.0 for key in COUNTERS}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in keys:
                totals[keys[sample.name]] += sample.value
    return totals


class _ProcessTreeSampler:
    """Samples a process and its children every ``interval_s`` in a daemon thread until stopped;
    subclasses say what to record from the live processes (``_sample``)."""

    def __init__(self, pid: int | None, interval_s: float = 0.5):
        self.pid, self.interval_s = pid, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> None:
        if self.pid:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _sample(self, procs: list) -> None:
        raise NotImplementedError

    def _loop(self) -> None:
        import psutil  # noqa: PLC0415 - start-up: psutil (loaded when the server processes are sampled)

        try:
            root = psutil.Process(self.pid)
        except psutil.Error:
            return
        while not self._stop.is_set():
            try:
                self._sample([root, *root.children(recursive=True)])
            except psutil.Error:
                pass
            self._stop.wait(self.interval_s)


class RssSampler(_ProcessTreeSampler):
    """Peak resident memory (MB) of a server process and its children (a context manager)."""

    peak_mb: float | None = None

    def __enter__(self) -> "RssSampler":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _sample(self, procs: list) -> None:
        mb = sum(p.memory_info().rss for p in procs) / 2**20
        self.peak_mb = mb if self.peak_mb is None else max(self.peak_mb, mb)


class CpuSampler(_ProcessTreeSampler):
    """CPU seconds used by a process tree (the Locust client), sampled until it exits."""

    def __init__(self, pid: int, interval_s: float = 0.5):
        super().__init__(pid, interval_s)
        self._seen: dict[int, float] = {}  # pid → user + system seconds at its last sample
        self.start()

    @property
    def cpu_s(self) -> float:
        return sum(self._seen.values())

    def _sample(self, procs: list) -> None:
        for proc in procs:
            times = proc.cpu_times()
            self._seen[proc.pid] = times.user + times.system

    def stop(self) -> float:
        super().stop()
        return self.cpu_s
