"""Tiers and the quick tier's time budget (docs/testing.md).

- ``e2e`` tests (whole load-test runs beyond the one ``specdeploy run`` the full tier keeps) are
  deselected unless ``-m`` is given: ``./run-tests`` is the full tier, ``./run-tests -m e2e`` the
  end-to-end tier, and CI (``.ci/run``) runs both.
- A test not marked ``slow`` (nor ``e2e``) must stay within a budget, or it fails with a message
  saying so: CPU seconds of this process and of the subprocesses it reaped (what the test costs,
  which a loaded machine does not inflate much) over setup + call, and a wall-clock ceiling
  several times larger (a test that waits, sleeps or hangs). ``@pytest.mark.budget(cpu_s)`` gives
  one test its own CPU budget (the real-Triton smoke test); ``SPECDEPLOY_TEST_BUDGET_S`` changes
  the default, ``0`` turns the check off. One-time per-process caches (the shared random
  checkpoints) are not charged to the test that fills them (tests/budget.py).

Reads the markers, the environment and the process clocks; writes nothing.
"""

from __future__ import annotations

import os
import time

import pytest

from tests.budget import cpu_s, uncharged_cpu_s

DEFAULT_BUDGET_CPU_S = 2.0
WALL_FACTOR = 20.0  # the wall ceiling, as a multiple of the CPU budget: a loaded machine stays green
_START = pytest.StashKey[tuple]()


def _budget_cpu_s(item) -> float | None:
    if item.get_closest_marker("slow") or item.get_closest_marker("e2e"):
        return None
    marker = item.get_closest_marker("budget")
    default = float(os.environ.get("SPECDEPLOY_TEST_BUDGET_S", DEFAULT_BUDGET_CPU_S))
    if default <= 0:
        return None
    return float(marker.args[0]) if marker else default


def _cpu_s() -> float:
    """The process's CPU (tests/budget.py) less what one-time caches took (``session_cost``)."""
    return cpu_s() - uncharged_cpu_s()


def pytest_collection_modifyitems(config, items):
    if config.option.markexpr:  # -m chooses the tier
        return
    e2e = [item for item in items if item.get_closest_marker("e2e")]
    if e2e:
        config.hook.pytest_deselected(items=e2e)
        items[:] = [item for item in items if not item.get_closest_marker("e2e")]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    item.stash[_START] = (time.perf_counter(), _cpu_s())
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if call.when != "call" or not report.passed or _START not in item.stash:
        return
    budget = _budget_cpu_s(item)
    if budget is None:
        return
    wall0, cpu0 = item.stash[_START]
    wall, cpu = time.perf_counter() - wall0, _cpu_s() - cpu0
    if cpu > budget or wall > budget * WALL_FACTOR:
        report.outcome = "failed"
        report.longrepr = (f"over the quick tier's per-test budget: {cpu:.1f} CPU s (budget {budget:g}), "
                           f"{wall:.1f} s wall (ceiling {budget * WALL_FACTOR:g}) over setup + call; "
                           "make it cheaper or mark it @pytest.mark.slow (docs/testing.md)")


