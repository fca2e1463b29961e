"""A Python-backend stub that hosts our engine ends when its ``tritonserver`` is gone, as every
other stub does, whoever killed the server.

What held it. python_backend's stub has a thread that checks every 300 ms whether its parent
still exists; when it does not, the stub stops its queue monitors and exits (``src/pb_stub.cc``,
"Non-graceful termination detected"). Stopping the stub-to-parent monitor takes the mutex that
every stub-to-parent message holds until the parent answers. A ``pb_utils`` metric update is
such a message, and ``Metric.set`` (``src/pb_metric.cc``) waits for the answer holding that mutex
and the interpreter lock, without a timeout. Our engine models update gauges every second from a
thread (:mod:`.engine_gauges`); an update in flight when the server died waits for an answer that
never comes, and the stub's exit waits for its mutex: the stub, its engine worker and their
memory stayed, SIGTERM ignored (the stub ignores it by design). A gdb backtrace of such a stub
showed exactly that: the gauge thread in ``Stub::SendMessage`` under ``Metric::SendSetValueRequest``,
the stub's watch thread in ``TerminateStubToParentQueueMonitor`` waiting for the mutex. The other
stubs update no metric on their own, so they were never caught mid-update.

So, per model instance that hosts an engine (:func:`watch_server`):

- a thread of the stub sees the server's death (the stub's parent changed, or the server is
  exiting or a zombie: ``/proc``) within :data:`POLL_S` and sets the given events, which stop
  the gauge thread before its next update: when no update is in flight the stub exits on its
  own;
- a *guard* process, this file run as a script by the stub's Python (standard library only,
  ``-I``), covers an update that was already in flight: no lock of the stub's can hold it. Once
  the server is gone it gives the stub :data:`DEFAULT_GRACE_S` (``SPECDEPLOY_STUB_EXIT_GRACE_S``)
  to exit, then kills it (SIGKILL, the only signal a stub obeys) and says so in the server log.
  It ignores SIGINT and SIGTERM, as the stub does (a SIGTERM sent to the whole tree, by a user
  or by the process keeper, must not take it away while the stub still needs it), and exits when
  the stub does, so a server stopped cleanly leaves nothing of it either.

The engine worker follows the stub in turn (:mod:`pipeline.reference.worker`). Reads ``/proc``;
writes one line to the server log (the stub's stderr) when it has to kill a stub.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

POLL_S = 0.1
GRACE_ENV = "SPECDEPLOY_STUB_EXIT_GRACE_S"
DEFAULT_GRACE_S = 2.0  # the stub's own check runs every 300 ms; a clean exit takes well under this
GUARD = Path(__file__).resolve()


PF_EXITING = 0x4  # the kernel's task flag, set as soon as a process starts to exit (a SIGKILL too)


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state letter, parent pid, task flags) of ``pid`` from /proc, None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            data = fh.read()
    except OSError:
        return None
    fields = data[data.rindex(")") + 2:].split()
    return fields[0], int(fields[1]), int(fields[6])


def ended(pid: int) -> bool:
    """Gone, exiting, or a zombie: a SIGKILLed server answers nothing from the moment its exit
    starts, long before its pid disappears (tearing a large process down takes a while)."""
    stat = _stat(pid)
    return stat is None or stat[0] in ("Z", "X") or bool(stat[2] & PF_EXITING)


def server_gone(stub_pid: int, server_pid: int) -> bool:
    """The stub's server ended: the stub was re-parented, or the server is gone or a zombie."""
    stub = _stat(stub_pid)
    return stub is None or stub[1] != server_pid or ended(server_pid)


class ServerWatch:
    """In the stub: a thread that sets ``events`` once the server is gone, and the guard process."""

    def __init__(self, name: str, events, grace_s: float | None = None):
        self.server_pid = os.getppid()
        self.gone = threading.Event()
        self._events = list(events)
        grace_s = float(os.environ.get(GRACE_ENV) or DEFAULT_GRACE_S) if grace_s is None else grace_s
        self.guard = subprocess.Popen(
            # the stub's sys.executable is the environment's python3 (serve puts its bin first on PATH)
            [sys.executable or shutil.which("python3") or "python3", "-I", str(GUARD), str(os.getpid()), str(self.server_pid), f"{grace_s:g}", name],
            stdin=subprocess.DEVNULL, close_fds=True)
        threading.Thread(target=self._run, name="server-watch", daemon=True).start()

    def _run(self) -> None:
        while not server_gone(os.getpid(), self.server_pid):
            time.sleep(POLL_S)
        self.gone.set()
        for event in self._events:  # no metric update may start now: it would wait forever
            event.set()


def watch_server(name: str, *events: threading.Event) -> ServerWatch | None:
    """Watch the stub's server (see the module docstring); ``events`` are set when it is gone.
    None where there is no /proc to read (not Linux): the stub is then on its own."""
    if not os.path.isdir(f"/proc/{os.getpid()}"):
        return None
    return ServerWatch(name, events)


# ----------------------------------------------------------------------------------------------
# The guard (run as a script: ``python -I parent_watch.py STUB_PID SERVER_PID GRACE_S NAME``)


def guard_main(args: list[str]) -> int:
    stub_pid, server_pid, grace_s, name = int(args[0]), int(args[1]), float(args[2]), args[3]
    for sig in (signal.SIGINT, signal.SIGTERM):  # like the stub it guards: it follows the stub, not signals
        signal.signal(sig, signal.SIG_IGN)
    while not server_gone(stub_pid, server_pid):
        if os.getppid() != stub_pid:  # the stub ended (finalized, or killed): nothing to guard
            return 0
        time.sleep(POLL_S)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if os.getppid() != stub_pid or ended(stub_pid):
            return 0  # it exited on its own
        time.sleep(POLL_S)
    if os.getppid() != stub_pid:
        return 0
    print(f"specdeploy: {name}: tritonserver (pid {server_pid}) is gone and the model's stub (pid {stub_pid}) did "
          f"not exit within {grace_s:g} s (a metric update waits for the dead server): killing it",
          file=sys.stderr, flush=True)
    os.kill(stub_pid, signal.SIGKILL)
    return 0


if __name__ == "__main__":
    sys.exit(guard_main(sys.argv[1:]))
