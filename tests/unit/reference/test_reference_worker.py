"""The engine in a worker process (``pipeline.reference.worker``): same greedy outputs and
chunks as the engine in this process, requests validated synchronously in front of it,
cancellation; a worker that dies ends every open stream with an error, requests are refused
while it is down, it is restarted, and one that keeps dying is given up on; a broken engine dir
fails at start, shutdown leaves no process."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from pathlib import Path

import pytest

from pipeline.errors import SpecdeployError
from pipeline.reference.api import ENGINE_DESCRIPTOR, ENGINE_FORMAT, DraftTooLongError, GenerationRequest
from pipeline.reference.engine import load_engine
from pipeline.reference.worker import EngineProcess, EngineUnavailable, RestartPolicy, WorkerHealth
from tests.reference_fixtures import one_thread, random_prompts, shared_checkpoints

PROMPTS = random_prompts(6, seed=11)


@pytest.fixture(scope="module")
def engine_dir(tmp_path_factory) -> Path:
    one_thread()
    ckpt = shared_checkpoints()
    root = tmp_path_factory.mktemp("worker-engine")
    descriptor = {
        "format": ENGINE_FORMAT, "role": "speculative", "model_dir": str(ckpt["target"]),
        "proposer": {"method": "medusa", "heads_dir": str(ckpt["medusa"]), "num_heads": 4},
        "max_draft_len": 0, "max_batch_size": 4, "max_seq_len": 96, "compute_dtype": "float32",
        "prefix_cache_entries": 8, "threads": 1,
    }
    (root / ENGINE_DESCRIPTOR).write_text(json.dumps(descriptor))
    return root


@pytest.fixture(scope="module")
def worker(engine_dir):
    engine = EngineProcess(engine_dir)
    yield engine
    engine.shutdown()


@pytest.mark.slow  # starts an engine worker process (its torch import: about 3.5 CPU s a module): full tier
def test_worker_outputs_and_chunks_equal_the_engine_in_this_process(engine_dir, worker):
    local = load_engine(engine_dir)
    try:
        for prompt in PROMPTS:
            mine = local.submit(GenerationRequest(prompt, 24))
            theirs = worker.submit(GenerationRequest(prompt, 24))
            mine_chunks, their_chunks = list(mine.chunks(timeout=60)), list(theirs.chunks(timeout=60))
            assert [c.tokens for c in their_chunks] == [c.tokens for c in mine_chunks]  # same steps, same deltas
            final = their_chunks[-1]
            assert final.finished and final.finish_reason == mine_chunks[-1].finish_reason
            assert final.stats.verify_steps == mine_chunks[-1].stats.verify_steps > 0
            assert final.stats.accepted_per_position == mine_chunks[-1].stats.accepted_per_position
    finally:
        local.shutdown()
    batched = [worker.submit(GenerationRequest(p, 16)) for p in PROMPTS]  # in flight together
    assert [h.result(timeout=60).output_ids for h in batched] == [worker.generate(GenerationRequest(p, 16)).output_ids
                                                                  for p in PROMPTS]


@pytest.mark.slow  # starts an engine worker process (its torch import: about 3.5 CPU s a module): full tier
def test_on_chunk_payloads_are_built_for_every_chunk(worker):
    seen = []
    handle = worker.submit(GenerationRequest(PROMPTS[0], 12), on_chunk=lambda chunk: seen.append(chunk) or len(chunk.tokens))
    chunks = list(handle.chunks(timeout=60))
    assert [c.payload for c in chunks] == [len(c.tokens) for c in chunks] and seen == chunks


@pytest.mark.slow  # starts an engine worker process (its torch import: about 3.5 CPU s a module): full tier
def test_bad_requests_fail_at_submit_as_in_process(worker):
    with pytest.raises(ValueError, match="exceed max_seq_len"):
        worker.submit(GenerationRequest(list(range(1, 90)), 20))
    with pytest.raises(ValueError, match="input_ids is empty"):
        worker.submit(GenerationRequest([], 4))
    with pytest.raises(DraftTooLongError):
        worker.submit(GenerationRequest([1, 2, 3], 4, draft_input_ids=list(range(1, 30))))
    assert len(worker.generate(GenerationRequest(PROMPTS[1], 4)).output_ids) == 4  # still serving


@pytest.mark.slow  # starts an engine worker process (its torch import: about 3.5 CPU s a module): full tier
def test_cancel_ends_the_stream(worker):
    handle = worker.submit(GenerationRequest(PROMPTS[2], 80))
    chunks = handle.chunks(timeout=60)
    next(chunks)
    handle.cancel()
    final = list(chunks)[-1]
    assert final.finished and final.finish_reason == "cancelled" and len(handle._tokens) < 80


class HealthLog:
    """``on_health`` for the tests: records every report; ``hold_when_down`` keeps the
    supervisor in its first "down" report until ``release`` (a window that stays open as long as
    the test needs, on any machine)."""

    def __init__(self, hold_when_down: bool = False):
        self.reports: list[WorkerHealth] = []
        self.changed = threading.Condition()
        self._release = threading.Event()
        self._hold = hold_when_down

    def __call__(self, health: WorkerHealth) -> None:
        with self.changed:
            self.reports.append(health)
            self.changed.notify_all()
        if self._hold and not health.up:
            self._hold = False
            self._release.wait(120)

    def release(self) -> None:
        self._release.set()

    def wait_for(self, predicate, timeout: float = 120) -> WorkerHealth:
        with self.changed:
            assert self.changed.wait_for(lambda: any(predicate(h) for h in self.reports), timeout), self.reports
            return next(h for h in self.reports if predicate(h))


@pytest.mark.slow
def test_a_dead_worker_ends_open_streams_refuses_while_down_and_is_restarted(engine_dir):
    health = HealthLog(hold_when_down=True)
    engine = EngineProcess(engine_dir, name="tensorrt_llm", policy=RestartPolicy(backoff_s=0.01), on_health=health)
    try:
        first_pid = engine.pid
        handle = engine.submit(GenerationRequest(PROMPTS[3], 80))
        next(handle.chunks(timeout=60))
        os.kill(first_pid, signal.SIGKILL)
        final = list(handle.chunks(timeout=60))[-1]
        assert final.finish_reason == "error"
        assert f"engine worker (pid {first_pid}) died: killed by SIGKILL" in final.error and "restarting" in final.error
        health.wait_for(lambda h: not h.up)  # the supervisor is held there: the worker stays down
        with pytest.raises(EngineUnavailable, match="died: killed by SIGKILL; restarting it"):
            engine.submit(GenerationRequest(PROMPTS[3], 4))
        health.release()
        assert health.wait_for(lambda h: h.up).crashes == 1
        assert engine.pid != first_pid
        assert len(engine.generate(GenerationRequest(PROMPTS[1], 4)).output_ids) == 4  # serving again
    finally:
        engine.shutdown()
    assert engine._process.returncode == 0  # shutdown stops the (restarted) worker cleanly


@pytest.mark.slow
def test_a_worker_that_keeps_dying_is_not_restarted_forever(engine_dir, tmp_path, capfd):
    broken = tmp_path / "engine"
    broken.mkdir()
    (broken / ENGINE_DESCRIPTOR).write_text((engine_dir / ENGINE_DESCRIPTOR).read_text())
    health = HealthLog()
    engine = EngineProcess(broken, name="tensorrt_llm", policy=RestartPolicy(max_restarts=2, backoff_s=0.01),
                           on_health=health)
    try:
        (broken / ENGINE_DESCRIPTOR).write_text(json.dumps({"format": "something-else/9"}))  # every restart fails
        os.kill(engine.pid, signal.SIGKILL)
        last = health.wait_for(lambda h: h.given_up)
        assert not last.up and last.crashes == 3  # the kill, then two restarts that failed to start
        with pytest.raises(EngineUnavailable, match="crashed 3 times in a row, so it is not restarted again"):
            engine.submit(GenerationRequest(PROMPTS[3], 4))
    finally:
        engine.shutdown()
    log = capfd.readouterr().err
    assert "tensorrt_llm: the restarted engine worker failed to start" in log and "not restarted again" in log


def test_restart_policy_backs_off_and_reads_the_environment():
    policy = RestartPolicy(backoff_s=0.5, max_backoff_s=3)
    assert [policy.delay(n) for n in (1, 2, 3, 4)] == [0.5, 1.0, 2.0, 3.0]
    env = RestartPolicy.from_env({"SPECDEPLOY_WORKER_MAX_RESTARTS": "1", "SPECDEPLOY_WORKER_RESTART_BACKOFF_S": "2"})
    assert (env.max_restarts, env.backoff_s) == (1, 2.0)


@pytest.mark.slow  # over the quick tier's CPU budget (tests/conftest.py)
def test_shutdown_while_down_does_not_restart(engine_dir):
    engine = EngineProcess(engine_dir, policy=RestartPolicy(backoff_s=60))
    os.kill(engine.pid, signal.SIGKILL)
    engine.shutdown()  # wakes the supervisor out of its back-off
    assert not engine._supervisor.is_alive()


@pytest.mark.slow  # over the quick tier's CPU budget (tests/conftest.py)
def test_a_broken_engine_dir_fails_at_start(tmp_path):
    (tmp_path / ENGINE_DESCRIPTOR).write_text(json.dumps({"format": "something-else/9"}))
    with pytest.raises(SpecdeployError, match="engine worker for .*format 'something-else/9'"):
        EngineProcess(tmp_path)


@pytest.mark.slow
def test_stray_output_in_the_worker_lands_on_stderr_not_in_the_protocol():
    """A library printing to stdout inside the worker (Python or C level) must not corrupt the
    JSON lines the proxy reads: main() keeps the protocol on a private copy of fd 1."""
    import subprocess

    script = (
        "import os, sys\n"
        "import pipeline.reference.worker as w\n"
        "def noisy(engine_dir, cpus, inbox, outbox):\n"
        "    print('python-level noise', flush=True)\n"
        "    os.write(1, b'fd-level noise\\n')\n"
        "    outbox.write(b'{\"op\":\"ready\"}\\n'); outbox.flush()\n"
        "w.serve_engine = noisy\n"
        "w.main(['unused'])\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout == b'{"op":"ready"}\n'
    assert b"python-level noise" in proc.stderr and b"fd-level noise" in proc.stderr
