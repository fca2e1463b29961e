"""The CPU engine worker behind a served ``tensorrt_llm`` dies (kill -9), on a real tritonserver:
the open stream ends with an error naming the death, a request that arrives while it is down
gets a clear error at once, the model restarts its worker and the next request succeeds; a
worker that keeps dying is reported in the server log and on /metrics and is given up on, with
a clear error for every request, while the server stays up.

A deployment of its own (its engine descriptor is broken on purpose by the second test)."""

from __future__ import annotations

import os
import queue
import signal
import threading
import uuid

import numpy as np
import psutil
import pytest

import tiny_deploy
from tests.polling import wait_until
from triton_clients import _infer_input, http_generate, metric_values

pytestmark = [pytest.mark.triton, pytest.mark.slow]
MAX_RESTARTS = 2
# the first restart waits this long: the request sent right after the crash (a new gRPC stream,
# well under a second) must land in it, on a loaded machine too; the worker is down for this plus
# its new worker's start (torch's import). Both tests sit through it in the passing path (the
# crash loop's restarts wait twice as long, capped at the policy's 8 s), so it is not longer.
BACKOFF_S = 5.0
NAME = "tiny-worker-restart"


@pytest.fixture(scope="module")
def restart_server(serving_workdir, tiny_models):
    from pipeline.config import load_config
    from pipeline.render.renderer import render
    from pipeline.serve.server import start_deployment

    # one BLS instance (not one per batch slot): the tests send one request at a time
    cfg_path = tiny_deploy.make_deployment(serving_workdir, tiny_models, "draft_target", name=NAME,
                                           triton={"bls_instance_count": 1})
    saved = {k: os.environ.get(k) for k in ("SPECDEPLOY_WORKER_MAX_RESTARTS", "SPECDEPLOY_WORKER_RESTART_BACKOFF_S")}
    os.environ.update(SPECDEPLOY_WORKER_MAX_RESTARTS=str(MAX_RESTARTS), SPECDEPLOY_WORKER_RESTART_BACKOFF_S=str(BACKOFF_S))
    try:
        cfg = load_config(cfg_path, serving_workdir)
        render(cfg)
        server = start_deployment(cfg, "baseline")
    finally:
        for key, value in saved.items():
            os.environ.pop(key) if value is None else os.environ.__setitem__(key, value)
    engine_json = serving_workdir / "engines" / NAME / "engine" / "baseline" / "engine.json"
    original = engine_json.read_text()
    yield server, engine_json
    server.stop()
    engine_json.write_text(original)


def the_worker(server) -> psutil.Process:
    workers = [p for p in psutil.Process(server.pid).children(recursive=True)
               if "pipeline.reference.worker" in p.cmdline()]
    assert len(workers) == 1, workers  # the baseline arm: one engine model
    return workers[0]


class Stream:
    """One streaming ``tensorrt_llm`` request on a gRPC stream of its own; ``on_first`` runs in
    the client's callback thread as the first response arrives."""

    def __init__(self, url: str, max_tokens: int, on_first=None):
        import tritonclient.grpc as grpcclient

        self.events: "queue.Queue" = queue.Queue()
        self.answered = threading.Event()  # a first response or an error came
        self.responses, self.error = 0, None
        self._on_first = on_first
        self._client = grpcclient.InferenceServerClient(url)
        self._client.start_stream(callback=self._callback)
        inputs = {"input_ids": np.array([[1, 40, 41, 42]], dtype=np.int32),
                  "input_lengths": np.array([[4]], dtype=np.int32),
                  "request_output_len": np.array([[max_tokens]], dtype=np.int32), "streaming": np.array([[True]])}
        self._client.async_stream_infer("tensorrt_llm", [_infer_input(k, v) for k, v in inputs.items()],
                                        request_id=uuid.uuid4().hex, enable_empty_final_response=True)

    def _callback(self, result, error) -> None:
        if error is None and result.get_response().outputs:
            self.responses += 1
            if self.responses == 1 and self._on_first is not None:
                self._on_first()
        self.events.put((result, error))
        self.answered.set()

    def end(self, timeout: float = 120) -> "Stream":
        """Wait for the final response or the error; the stream is closed after."""
        try:
            while True:
                result, error = self.events.get(timeout=timeout)
                if error is not None:
                    self.error = str(error)
                    return self
                if result.get_response().parameters["triton_final_response"].bool_param:
                    return self
        finally:
            self._client.close()


def metric(server, family: str) -> float:
    return metric_values(server.metrics_url, family).get("tensorrt_llm", float("nan"))


def wait_metric(server, family: str, predicate, timeout: float = 180) -> float:
    last = None

    def satisfied() -> tuple[float] | None:
        nonlocal last
        last = metric(server, family)
        return (last,) if predicate(last) else None  # a tuple: a value of 0 may satisfy it

    return wait_until(satisfied, f"{family} satisfies the condition", timeout, interval=0.1,
                      detail=lambda: f"last {last}; log:\n{server.log_tail(60)}")[0]


def test_killed_worker_ends_the_stream_refuses_while_down_and_comes_back(restart_server):
    server, _ = restart_server
    for _attempt in range(3):
        worker = the_worker(server)
        # frozen at the first chunk, so the stream is certainly still open when it dies
        stream = Stream(server.grpc_url, 200, on_first=lambda w=worker: os.kill(w.pid, signal.SIGSTOP))
        assert stream.answered.wait(120), "no response from tensorrt_llm"
        worker.kill()
        stream.end()
        if stream.error is not None:
            break
        # the whole request was out before the worker froze: wait for the new worker, try again
        wait_metric(server, "specdeploy_engine_worker_up", lambda v: v == 1)
    else:
        pytest.fail("the request finished before its worker could be frozen, three times")
    assert stream.responses >= 1  # mid-stream: tokens first, then the error
    assert f"the engine worker (pid {worker.pid}) died: killed by SIGKILL" in stream.error, stream.error

    down = Stream(server.grpc_url, 4).end()  # while the new worker waits out its back-off
    assert down.error is not None and "EngineUnavailable" in down.error and "restarting it in" in down.error, down.error
    assert down.responses == 0

    assert wait_metric(server, "specdeploy_engine_worker_up", lambda v: v == 1) == 1
    assert the_worker(server).pid != worker.pid
    status, body = http_generate(server.http_url, "ensemble", {"text_input": "The quick brown", "max_tokens": 8})
    assert status == 200 and body["text_output"].startswith("The quick brown"), body
    assert metric(server, "specdeploy_engine_worker_crashes_total") >= 1
    assert "specdeploy: tensorrt_llm: engine worker restarted" in server.log_tail(400)


def test_a_worker_that_keeps_dying_is_given_up_on_and_reported(restart_server):
    server, engine_json = restart_server
    engine_json.write_text('{"format": "something-else/9"}')  # from now on every restart fails to load
    the_worker(server).kill()
    assert wait_metric(server, "specdeploy_engine_worker_restarts_exhausted", lambda v: v == 1) == 1
    assert metric(server, "specdeploy_engine_worker_up") == 0
    assert metric(server, "specdeploy_engine_worker_crashes_total") >= MAX_RESTARTS + 1
    log = server.log_tail(400)
    assert "the restarted engine worker failed to start" in log and "so it is not restarted again" in log

    refused = Stream(server.grpc_url, 4).end()
    assert refused.error is not None and "is not restarted again" in refused.error, refused.error
    status, body = http_generate(server.http_url, "ensemble", {"text_input": "hi", "max_tokens": 2})
    assert status != 200 and "not restarted again" in body.get("error", ""), body
    assert server.alive()  # only that model is out of service
    assert not [p for p in psutil.Process(server.pid).children(recursive=True)
                if "pipeline.reference.worker" in p.cmdline()]  # and nothing keeps retrying
