"""Counts the ``tritonserver`` processes a test session starts (``-p tests.launch_counter``):
a background thread lists this process's descendants and remembers every ``tritonserver`` pid,
so servers started by fixtures, by the CLI in-process and by ``specdeploy`` subprocesses all
count. Prints the count at the end and, with ``SPECDEPLOY_LAUNCH_LOG=path``, writes one
``nodeid<TAB>count`` line per test that saw a new server. Reads /proc via psutil; writes
nothing else."""

from __future__ import annotations

import os
import threading

import psutil
import pytest

_seen: set[int] = set()
_lock = threading.Lock()
_stop = threading.Event()
_per_test: list[tuple[str, int]] = []


def _poll() -> None:
    me = psutil.Process()
    while not _stop.wait(0.2):
        try:
            children = me.children(recursive=True)
        except psutil.Error:
            continue
        for child in children:
            try:
                if child.name() == "tritonserver":
                    with _lock:
                        _seen.add(child.pid)
            except psutil.Error:
                pass


def pytest_sessionstart(session):
    threading.Thread(target=_poll, name="launch-counter", daemon=True).start()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    with _lock:
        before = len(_seen)
    yield
    with _lock:
        after = len(_seen)
    if after > before:
        _per_test.append((item.nodeid, after - before))


def pytest_terminal_summary(terminalreporter):
    _stop.set()
    terminalreporter.write_line(f"tritonserver launches seen: {len(_seen)}")
    path = os.environ.get("SPECDEPLOY_LAUNCH_LOG")
    if path:
        with open(path, "w") as out:
            out.writelines(f"{nodeid}\t{count}\n" for nodeid, count in _per_test)
