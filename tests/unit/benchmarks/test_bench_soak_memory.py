"""bench_soak's memory accounting (benchmarks/bench_soak.py): growth per event fitted from RSS
samples, the verdict's memory diagnosis, and the allocator environment its flags give the server."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def soak():
    spec = importlib.util.spec_from_file_location("bench_soak", ROOT / "benchmarks" / "bench_soak.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def test_kb_per_event_is_the_slope_against_events_done(soak):
    # 1 MB more after every 4 events, one event a second
    series = [(float(t), 50.0 + t // 4) for t in range(0, 40, 4)]
    events = [t + 0.5 for t in range(40)]
    kb, counted = soak._kb_per_event(series, events)
    assert kb == pytest.approx(256.0, rel=1e-6) and counted == 36
    assert soak._kb_per_event(series, []) is None  # no events: nothing to fit


def _memory(growths: dict[str, float], detail: dict | None = None) -> dict:
    return {"tolerance_mb": 10.0, "tritonserver_detail": detail or {},
            "processes": [{"label": label, "growth_mb": g} for label, g in growths.items()]}


def test_diagnosis_names_growers_and_does_not_excuse_tritonserver(soak):
    only_server = _memory({"tritonserver": 16.0, "stub ensemble": 0.0},
                          {"rss_kb_per_cancelled": 25.0, "rss_kb_per_request": 3.0})
    diagnosis = soak.memory_diagnosis(only_server)
    assert diagnosis["growing"] == ["tritonserver"] and diagnosis["tritonserver_kb_per_cancelled"] == 25.0
    assert "Memory of the CPU tritonserver" in diagnosis["note"]  # where the explanation is
    both = soak.memory_diagnosis(_memory({"tritonserver": 16.0, "worker speculative": 12.0}))
    assert both["growing"] == ["tritonserver", "worker speculative"] and "note" not in both


def test_allocator_flags_become_the_server_env(soak):
    args = argparse.Namespace(allocator="jemalloc", malloc_arena_max=2)
    assert soak.allocator_env(args) == {"SPECDEPLOY_TRITON_MALLOC": "jemalloc", "MALLOC_ARENA_MAX": "2"}
    assert soak.allocator_env(argparse.Namespace(allocator=None, malloc_arena_max=None)) == {}
