"""Counts the ``tritonserver`` processes a test session starts (``-p tests.launch_counter``):
a background thread lists this process's descendants and remembers every ``tritonserver`` pid,
so servers started by fixtures, by the CLI in-process and by ``specdeploy`` subprocesses all
count. Prints the count at the end and, with ``SPECDEPLOY_LAUNCH_LOG=path``, writes one
``nodeid<TAB>count`` line per test that saw a new server. Under pytest-xdist each worker counts
its own servers and hands them to the controller (``workeroutput``), which prints the sum and
writes every worker's lines. Reads /proc via psutil; writes nothing else."""

from __future__ import annotations

import os
import threading

import psutil
import pytest

_seen: set[int] = set()
_lock = threading.Lock()
_stop = threading.Event()
_per_test: list[tuple[str, int]] = []
_from_workers: list[dict] = []  # on the xdist controller: each worker's count and lines


def _descendants(me: int, parents: dict[int, int]) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = set(), [me]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _poll() -> None:
    """Every 0.2 s: the parent of each process that appeared since the last look (read once; a
    process keeps its parent until it ends, after which it is reparented only if its parent ended
    first, and then it is no longer ours either), then the name of each of our descendants (read
    every time: a fork is named tritonserver only after its exec). ``Process.children(recursive=True)``
    reads every process's stat file on every look: 1-2 % of a core per worker."""
    me = os.getpid()
    parents: dict[int, int] = {}
    while not _stop.wait(0.2):
        try:
            pids = set(psutil.pids())
        except psutil.Error:
            continue
        for gone in parents.keys() - pids:
            del parents[gone]
        for pid in pids - parents.keys():
            try:
                parents[pid] = psutil.Process(pid).ppid()
            except psutil.Error:
                pass
        for pid in _descendants(me, parents):
            try:
                if psutil.Process(pid).name() == "tritonserver":
                    with _lock:
                        _seen.add(pid)
            except psutil.Error:
                pass


def _controller(config) -> bool:
    return config.pluginmanager.getplugin("dsession") is not None  # xdist's, with -n >= 1


def pytest_sessionstart(session):
    if _controller(session.config):  # its workers count; polling here would count them again
        return
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


def pytest_sessionfinish(session):
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker
        _stop.set()
        with _lock:
            workeroutput["tritonserver_launches"] = {"count": len(_seen), "per_test": list(_per_test)}


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    output = getattr(node, "workeroutput", {}).get("tritonserver_launches")
    if output:
        _from_workers.append(output)


def pytest_terminal_summary(terminalreporter):
    _stop.set()
    count, per_test = len(_seen), list(_per_test)
    for output in _from_workers:
        count += output["count"]
        per_test += [tuple(line) for line in output["per_test"]]
    workers = f" (over {len(_from_workers)} xdist workers)" if _from_workers else ""
    terminalreporter.write_line(f"tritonserver launches seen: {count}{workers}")
    path = os.environ.get("SPECDEPLOY_LAUNCH_LOG")
    if path:
        with open(path, "w") as out:
            out.writelines(f"{nodeid}\t{n}\n" for nodeid, n in per_test)
