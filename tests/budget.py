"""CPU spent on one-time, per-process caches (``with session_cost():``), which the quick tier's
per-test budget (tests/conftest.py) does not charge to the test that happens to fill the cache
first. Reads the process clocks; writes nothing."""

from __future__ import annotations

import contextlib
import os

_uncharged = [0.0]


def cpu_s() -> float:
    """CPU of every thread here plus the subprocesses reaped so far (servers, CLIs, workers)."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


def uncharged_cpu_s() -> float:
    return _uncharged[0]


@contextlib.contextmanager
def session_cost():
    start = cpu_s()
    try:
        yield
    finally:
        _uncharged[0] += cpu_s() - start
