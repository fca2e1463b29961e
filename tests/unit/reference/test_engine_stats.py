"""``stats()`` of the reference engine (in this process and behind the worker proxy): KV slots of
the target and draft pools, prefix-cache entries and open requests are counted while a request
runs and are back at their idle values after it ends — finished or cancelled (what the served
model's gauges publish and the soak benchmark checks)."""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # tests.reference_fixtures under plain `pytest`

import pytest

from pipeline.reference.api import ENGINE_DESCRIPTOR, ENGINE_FORMAT, ENGINE_STATS, GenerationRequest
from pipeline.reference.engine import create_engine
from pipeline.reference.worker import EngineProcess
from tests.polling import wait_until
from tests.reference_fixtures import one_thread, random_prompts, shared_checkpoints

PROMPTS = random_prompts(4, seed=23)
SLOTS, PREFIX_ENTRIES = 3, 2
IDLE = {"kv_slots_in_use": 0, "draft_kv_slots_in_use": 0, "open_requests": 0}


@pytest.fixture(scope="module")
def ckpt():
    one_thread()
    return shared_checkpoints()


def _spec(ckpt) -> dict:
    return {"method": "draft_target", "draft_dir": str(ckpt["draft"]), "num_draft_tokens": 3}


def _idle(stats: dict) -> bool:
    return all(stats[k] == v for k, v in IDLE.items()) and stats.get("proxy_open_requests", 0) == 0


def _wait_idle(engine, timeout: float = 60) -> dict:
    """The final chunk leaves just before the engine drops the request's handle: poll briefly."""
    return wait_until(lambda: _idle(stats := engine.stats()) and stats, "the engine back at its idle stats", timeout,
                      interval=0.01, detail=engine.stats)


class Gate:
    """``on_chunk`` that holds the engine thread at a request's first chunk until opened."""

    def __init__(self):
        self.reached, self.open = threading.Event(), threading.Event()

    def __call__(self, chunk):
        self.reached.set()
        assert self.open.wait(60)


def test_in_process_stats_count_a_running_request_and_return_to_idle(ckpt):
    engine = create_engine(ckpt["target"], role="speculative", proposer=_spec(ckpt), max_batch_size=SLOTS,
                           max_seq_len=96, prefix_cache_entries=PREFIX_ENTRIES)
    try:
        start = engine.stats()
        assert set(start) == set(ENGINE_STATS)
        assert _idle(start) and start["kv_slots"] == SLOTS and start["prefix_cache_entries"] == 0
        assert start["prefix_cache_capacity"] == PREFIX_ENTRIES
        assert start["kv_tokens_per_slot"] == 96  # slots × max_seq_len: the capacity /metrics exports

        gate = Gate()
        handle = engine.submit(GenerationRequest(PROMPTS[0], 20), on_chunk=gate)
        assert gate.reached.wait(60)
        busy = engine.stats()  # the engine thread waits inside the request's first chunk
        assert (busy["kv_slots_in_use"], busy["draft_kv_slots_in_use"], busy["open_requests"]) == (1, 1, 1)
        gate.open.set()
        assert handle.result(timeout=60).finish_reason in ("length", "stop")
        assert _wait_idle(engine)["prefix_cache_entries"] == 1

        gate = Gate()
        cancelled = engine.submit(GenerationRequest(PROMPTS[1], 80), on_chunk=gate)
        assert gate.reached.wait(60)
        cancelled.cancel()
        gate.open.set()
        assert cancelled.result(timeout=60).finish_reason == "cancelled"
        for prompt in PROMPTS[2:]:
            engine.generate(GenerationRequest(prompt, 8))
        assert _wait_idle(engine)["prefix_cache_entries"] == PREFIX_ENTRIES  # bounded
    finally:
        engine.shutdown()


@pytest.mark.slow
def test_worker_stats_travel_over_the_pipe_with_the_proxy_count(ckpt, tmp_path):
    descriptor = {
        "format": ENGINE_FORMAT, "role": "speculative", "model_dir": str(ckpt["target"]), "proposer": _spec(ckpt),
        "max_draft_len": 0, "max_batch_size": SLOTS, "max_seq_len": 96, "compute_dtype": "float32",
        "prefix_cache_entries": PREFIX_ENTRIES, "threads": 1,
    }
    (tmp_path / ENGINE_DESCRIPTOR).write_text(json.dumps(descriptor))
    engine = EngineProcess(tmp_path)
    try:
        start = engine.stats()
        assert set(start) == {*ENGINE_STATS, "proxy_open_requests"} and _idle(start)
        engine.generate(GenerationRequest(PROMPTS[0], 12))
        handle = engine.submit(GenerationRequest(PROMPTS[1], 80))
        chunks = handle.chunks(timeout=60)
        next(chunks)
        handle.cancel()  # (the in-process test above holds the engine so that the cancel lands)
        assert list(chunks)[-1].finished
        end = _wait_idle(engine)
        assert 1 <= end["prefix_cache_entries"] <= PREFIX_ENTRIES
    finally:
        engine.shutdown()
    assert engine.stats() is None  # shut down: nothing to read
