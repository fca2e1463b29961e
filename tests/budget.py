"""CPU the quick tier's per-test budget (tests/conftest.py) charges to nobody: one-time,
per-process caches (``with session_cost():``), which would be charged to the test that happens to
fill the cache first, and work done beside the tests by a thread of their own
(``with background_cost():``, a server stopped in the background), which would be charged to the
test that happens to run meanwhile. Reads the process clocks; writes nothing."""

from __future__ import annotations

import contextlib
import os
import threading
import time

_uncharged = [0.0]
_lock = threading.Lock()  # background_cost adds from other threads


def cpu_s() -> float:
    """CPU of every thread here plus the subprocesses reaped so far (servers, CLIs, workers)."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


def uncharged_cpu_s() -> float:
    return _uncharged[0]


def _uncharge(seconds: float) -> None:
    with _lock:
        _uncharged[0] += seconds


def _children_s() -> float:
    times = os.times()
    return times.children_user + times.children_system


@contextlib.contextmanager
def session_cost():
    start = cpu_s()
    try:
        yield
    finally:
        _uncharge(cpu_s() - start)


@contextlib.contextmanager
def background_cost():
    """In a thread beside the tests: that thread's CPU and the subprocesses reaped meanwhile (the
    server it stops, with every stub and worker the server reaped) are charged to nobody. A
    subprocess a test reaps in the same window goes uncharged too: the budget can only err lenient,
    never fail a test for a server it did not stop."""
    thread, children = time.thread_time(), _children_s()
    try:
        yield
    finally:
        _uncharge(time.thread_time() - thread + _children_s() - children)
