"""The processes below a server follow it without Triton: a stand-in "server" process starts a
stand-in "stub" that ignores SIGTERM (as python_backend's does) and watches its server
(pipeline.triton_models.parent_watch); the engine worker follows its stub
(pipeline.reference.worker.follow_parent). Real processes, SIGKILL, bounded polls."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from tests.polling import wait_until

ROOT = Path(__file__).resolve().parents[3]
BOUND_S = 60.0

STUB = textwrap.dedent("""
    import signal, sys, threading, time
    from pipeline.triton_models import parent_watch
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    stop = threading.Event()
    watch = parent_watch.ServerWatch("fake_model", [stop])
    print(watch.guard.pid, flush=True)
    stop.wait()
    print("server gone", flush=True)
    if sys.argv[1] == "exits":
        sys.exit(0)
    threading.Event().wait()  # held in its exit, as a stub whose metric update waits for the dead server
""")
WORKER = textwrap.dedent("""
    import os, signal, threading
    from pipeline.reference.worker import follow_parent
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    follow_parent(os.getppid())
    print("armed", flush=True)
    threading.Event().wait()
""")


def ended(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_ended(pid: int) -> float:
    started = time.monotonic()
    wait_until(lambda: ended(pid), f"pid {pid} ended after its parent was killed", BOUND_S)
    return time.monotonic() - started


def parent_of(child_code: str, *args: str, env: dict | None = None) -> subprocess.Popen:
    """A stand-in parent that starts ``child_code`` and waits; the child's stdout is ours to read."""
    launcher = ("import subprocess, sys; child = subprocess.Popen([sys.executable, '-c', sys.argv[1], *sys.argv[2:]]);"
                " print(child.pid, flush=True); child.wait()")
    return subprocess.Popen([sys.executable, "-c", launcher, child_code, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


@pytest.mark.parametrize("stub_behaviour", ["held", "exits"])
def test_a_stub_whose_server_is_killed_ends(stub_behaviour):
    server = parent_of(STUB, stub_behaviour, env={"SPECDEPLOY_STUB_EXIT_GRACE_S": "1"})
    try:
        stub_pid, guard_pid = int(server.stdout.readline()), int(server.stdout.readline())
        assert psutil.Process(guard_pid).ppid() == stub_pid
        server.send_signal(signal.SIGKILL)
        server.wait()
        assert server.stdout.readline().strip() == "server gone"  # the stub's thread saw it
        wait_ended(stub_pid)
        wait_ended(guard_pid)
        log = server.stderr.read()
        killed = "did not exit within 1 s (a metric update waits for the dead server): killing it" in log
        assert killed == (stub_behaviour == "held"), log
    finally:
        for pid in (server.pid,):
            if not ended(pid):
                os.kill(pid, signal.SIGKILL)


def test_the_guard_leaves_with_a_stub_that_ends_while_the_server_lives():
    server = parent_of(STUB, "held")
    try:
        stub_pid, guard_pid = int(server.stdout.readline()), int(server.stdout.readline())
        os.kill(stub_pid, signal.SIGKILL)  # the stub dies, the server is fine
        wait_ended(guard_pid)
        server.wait(timeout=BOUND_S)  # the stand-in server ends once its stub is gone
    finally:
        if server.poll() is None:
            server.kill()


def test_the_engine_worker_ends_with_its_stub():
    stub = parent_of(WORKER)
    try:
        worker_pid = int(stub.stdout.readline())
        assert stub.stdout.readline().strip() == "armed"
        os.kill(worker_pid, signal.SIGTERM)  # ignored, as before: it follows its stub, not signals
        stub.send_signal(signal.SIGKILL)
        stub.wait()
        wait_ended(worker_pid)
    finally:
        if stub.poll() is None:
            stub.kill()
