"""The engine gauges on /metrics (pipeline/triton_models/engine_gauges.py), on a real tritonserver
serving draft-target with ``orchestration: engine`` (tensorrt_llm drafts in its own engine, so
it has a target and a draft KV pool): idle values at start; while a stream is held open (its
worker frozen at the first chunk) the model's open requests show it; after requests — one of
them a stream cancelled mid-way — every slot and open request is back at 0 and the prefix cache
holds at most its bound. A deployment of its own (a short gauge period)."""

from __future__ import annotations

import os
import queue
import signal
import uuid
from pathlib import Path

import numpy as np
import psutil
import pytest
from server_stops import stop_later

import tiny_deploy
from tests.polling import wait_until
from triton_clients import _infer_input, http_generate

pytestmark = [pytest.mark.triton, pytest.mark.slow]
NAME = "tiny-engine-gauges"
PERIOD_S = 0.2
SLOTS = 4  # tiny_deploy's max_batch_size


@pytest.fixture(scope="module")
def gauges_server(serving_workdir, tiny_models):
    from pipeline.config import load_config
    from pipeline.render.renderer import render
    from pipeline.serve.server import start_deployment

    cfg_path = tiny_deploy.make_deployment(serving_workdir, tiny_models, "draft_target", name=NAME,
                                           orchestration="engine")
    saved = os.environ.get("SPECDEPLOY_ENGINE_STATS_PERIOD_S")
    os.environ["SPECDEPLOY_ENGINE_STATS_PERIOD_S"] = str(PERIOD_S)
    try:
        cfg = load_config(cfg_path, serving_workdir)
        render(cfg)
        server = start_deployment(cfg, "speculative")
    finally:
        os.environ.pop("SPECDEPLOY_ENGINE_STATS_PERIOD_S") if saved is None else \
            os.environ.__setitem__("SPECDEPLOY_ENGINE_STATS_PERIOD_S", saved)
    yield server
    stop_later(server)


def gauges(server) -> dict[str, float]:
    """tensorrt_llm's engine gauges, one key per family and distinguishing label."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(server.metrics_url, timeout=10).read().decode()  # noqa: S310 - loopback http URL of the server under test
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("specdeploy_engine_") and sample.labels.get("model") == "tensorrt_llm":
                extra = sample.labels.get("pool") or sample.labels.get("where")
                out[sample.name + (f"/{extra}" if extra else "")] = sample.value
    return out


def wait_gauges(server, predicate, what: str, timeout: float = 120) -> dict[str, float]:
    seen: dict[str, float] = {}

    def showing() -> dict[str, float] | None:
        nonlocal seen
        seen = gauges(server)
        return seen if predicate(seen) else None

    return wait_until(showing, f"the gauges show {what}", timeout, interval=PERIOD_S / 2,
                      detail=lambda: f"last {seen}; log:\n{server.log_tail(60)}")


IN_USE = ("specdeploy_engine_kv_slots_in_use/target", "specdeploy_engine_kv_slots_in_use/draft",
          "specdeploy_engine_open_requests/engine", "specdeploy_engine_open_requests/proxy",
          "specdeploy_engine_open_requests/model")


def idle(g: dict) -> bool:
    return all(g.get(k) == 0 for k in IN_USE) and "specdeploy_engine_kv_slots" in g


def the_worker(server) -> psutil.Process:
    """tensorrt_llm's worker (its engine dir is the ``speculative`` one; tensorrt_llm_draft, in
    the repository for the bls flow, has a worker of its own)."""
    workers = []
    for proc in psutil.Process(server.pid).children(recursive=True):
        cmd = proc.cmdline()
        if "pipeline.reference.worker" in cmd and Path(cmd[cmd.index("pipeline.reference.worker") + 1]).name == "speculative":
            workers.append(proc)
    assert len(workers) == 1, workers
    return workers[0]


class HeldStream:
    """A streaming tensorrt_llm request whose worker is frozen (SIGSTOP) at the first response."""

    def __init__(self, url: str, worker: psutil.Process, max_tokens: int = 240):
        import tritonclient.grpc as grpcclient

        self.events: "queue.Queue" = queue.Queue()
        self.frozen = False
        self._worker = worker
        self.client = grpcclient.InferenceServerClient(url)
        self.client.start_stream(callback=self._callback)
        inputs = {"input_ids": np.array([[1, 40, 41, 42]], dtype=np.int32),
                  "input_lengths": np.array([[4]], dtype=np.int32),
                  "request_output_len": np.array([[max_tokens]], dtype=np.int32), "streaming": np.array([[True]])}
        self.client.async_stream_infer("tensorrt_llm", [_infer_input(k, v) for k, v in inputs.items()],
                                       request_id=uuid.uuid4().hex, enable_empty_final_response=True)

    def _callback(self, result, error) -> None:
        if not self.frozen and error is None and result.get_response().outputs:
            os.kill(self._worker.pid, signal.SIGSTOP)
            self.frozen = True
        self.events.put((result, error))

    def first(self, timeout: float = 120) -> None:
        result, error = self.events.get(timeout=timeout)
        assert error is None and self.frozen, error


def counter(server, family: str) -> float:
    from triton_clients import metric_values

    return metric_values(server.metrics_url, family).get("tensorrt_llm", 0.0)


def test_gauges_show_a_held_stream_and_return_to_idle_after_requests_and_a_cancelled_stream(gauges_server):
    server = gauges_server
    start = wait_gauges(server, idle, "idle values at start")
    assert start["specdeploy_engine_kv_slots"] == SLOTS
    assert start["specdeploy_engine_prefix_cache_entries"] == 0
    capacity = start["specdeploy_engine_prefix_cache_capacity"]
    assert capacity >= 1

    cancelled_before = counter(server, "specdeploy_requests_cancelled_total")
    for _attempt in range(3):
        worker = the_worker(server)
        held = HeldStream(server.grpc_url, worker)
        try:
            held.first()
            # frozen mid-stream: the model's own count shows the stream (the engine's read waits)
            wait_gauges(server, lambda g: g.get("specdeploy_engine_open_requests/model") == 1, "the held stream")
            held.client.stop_stream(cancel_requests=True)
        finally:
            os.kill(worker.pid, signal.SIGCONT)
            held.client.close()
        # the stub notices the cancellation at the next chunk and cancels the engine's request
        wait_gauges(server, idle, "idle after the cancelled stream")
        if counter(server, "specdeploy_requests_cancelled_total") > cancelled_before:
            break
    else:
        pytest.fail("the stream finished before its cancellation reached the engine, three times")

    for prompt in ("The quick brown", "Once upon a time", "The quick brown fox"):
        status, body = http_generate(server.http_url, "ensemble", {"text_input": prompt, "max_tokens": 12})
        assert status == 200, body
    after = wait_gauges(server, lambda g: idle(g) and g["specdeploy_engine_prefix_cache_entries"] >= 1,
                        "idle with the prefix cache in use")
    assert 1 <= after["specdeploy_engine_prefix_cache_entries"] <= capacity
    assert server.alive()

