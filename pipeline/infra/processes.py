"""Process lifetime: whatever the project starts ends when the process that started it ends.

:func:`spawn` runs a command under a *keeper*: this file, run as a script by the same Python
(standard library and psutil only, so it starts quickly). The keeper

- leaves the caller's session, so a Ctrl-C or a ``kill -- -PGID`` aimed at the caller's process
  group does not reach it (the caller stops the command itself, gracefully);
- becomes a child subreaper (``PR_SET_CHILD_SUBREAPER``): a descendant orphaned by the death of
  its parent is re-parented to the keeper instead of init, so the keeper can still find it, stop
  it and reap it (python_backend's stub checks every 300 ms whether its parent pid still exists,
  a zombie parent would keep it waiting);
- starts the command in a session of its own (its pid is its process group, so
  ``kill -TERM -- -PID`` stops it) with ``PR_SET_PDEATHSIG`` = SIGKILL: if the keeper itself is
  killed the command dies with it. The keeper is single-threaded, so the signal's known trap
  (it fires when the *thread* that forked the child exits, not the process) cannot fire early;
- holds one end of a socket pair whose other end only the caller holds. When the caller ends,
  however it ends (exit, exception, SIGKILL, the OOM killer), the socket reads end-of-file and
  the keeper stops the command's whole tree (SIGTERM, a grace period, SIGKILL) and exits. The
  caller may instead *detach* the command (``specdeploy serve`` in the background): the keeper
  then only reaps;
- exits when the command exits, after stopping any descendant it left behind, with the
  command's status (the same exit code, or killed by the same signal).

:func:`stop_tree` is the one way the project stops a process and its descendants: SIGTERM to
each, wait, SIGKILL whatever is left. :func:`free_ports` picks free TCP ports;
:func:`port_holder` and :func:`describe` name the process behind a busy port for error messages.
Reads ``/proc`` (through psutil); writes nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

KEEPER = Path(__file__).resolve()
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
DETACH = b"detach\n"
POLL_S = 0.05
KILL_WAIT_S = 10.0
_lifelines: dict[int, socket.socket] = {}  # keeper pid → the caller's end (lives until released)
_lifelines_lock = threading.Lock()


# ----------------------------------------------------------------------------------------------
# Stopping a tree


def _ended(proc: psutil.Process) -> bool:
    """Gone, or a zombie (it holds no port or memory; its parent has yet to reap it)."""
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def _family(procs: list[psutil.Process]) -> list[psutil.Process]:
    """``procs`` and every descendant of theirs that exists now, each once."""
    seen: dict[int, psutil.Process] = {}
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            for member in (proc, *proc.children(recursive=True)):
                seen.setdefault(member.pid, member)
    return list(seen.values())


def _signal_all(procs: list[psutil.Process], sig: int) -> None:
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(sig)  # psutil checks the pid still names the same process


def wait_ended(procs: list[psutil.Process], timeout_s: float, tick=None) -> list[psutil.Process]:
    """Wait up to ``timeout_s`` for every process to end; return those still running. ``tick``
    runs between checks (the keeper reaps there)."""
    deadline = time.monotonic() + timeout_s
    alive = [p for p in procs if not _ended(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(POLL_S)
        if tick is not None:
            tick()
        alive = [p for p in alive if not _ended(p)]
    return alive


def tree(pid: int) -> list[psutil.Process]:
    """The process ``pid`` and its descendants (empty when it does not exist)."""
    try:
        return _family([psutil.Process(pid)])
    except psutil.Error:
        return []


def stop_processes(procs: list[psutil.Process], timeout_s: float, tick=None) -> list[int]:
    """SIGTERM ``procs`` and their descendants, wait up to ``timeout_s`` for all of them to end,
    then SIGKILL those left and any descendant they started meanwhile. Returns the pids that
    needed SIGKILL. Never reaps: a child of the caller stays the caller's to wait for."""
    members = _family(procs)
    _signal_all(members, signal.SIGTERM)
    left = [p for p in _family(wait_ended(members, timeout_s, tick)) if not _ended(p)]
    _signal_all(left, signal.SIGKILL)
    wait_ended(left, KILL_WAIT_S, tick)
    return [p.pid for p in left]


def stop_tree(pid: int, timeout_s: float, seen: list[psutil.Process] | None = None, tick=None) -> list[int]:
    """Stop the process ``pid`` and all its descendants (:func:`stop_processes`); ``seen``: members
    found earlier, which are no longer found from ``pid`` once orphaned."""
    return stop_processes([*tree(pid), *(seen or [])], timeout_s, tick)


# ----------------------------------------------------------------------------------------------
# Ports and names


def free_ports(count: int = 3, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct free TCP ports on ``host`` (all bound at once, so never the same twice)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.bind((host, 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """Someone listens on ``port`` (SO_REUSEADDR: connections in TIME_WAIT do not count, as for
    the servers, which set it too)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def port_holder(port: int) -> psutil.Process | None:
    """The process listening on TCP ``port``, if this user may see it."""
    with contextlib.suppress(psutil.Error, OSError):
        for conn in psutil.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
                return psutil.Process(conn.pid)
    return None


def describe(proc: psutil.Process) -> str:
    """``pid N (command line), started HH:MM:SS`` for error messages."""
    try:
        cmdline = " ".join(proc.cmdline()) or proc.name()
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(proc.create_time()))
    except psutil.Error:
        return f"pid {proc.pid}"
    if len(cmdline) > 240:
        cmdline = cmdline[:240] + " …"
    return f"pid {proc.pid} ({cmdline}), started {started}"


# this file as a keeper runs it, in any checkout; and where it lived before the stage layout
KEEPER_SCRIPTS = (os.path.join("pipeline", "infra", "processes.py"), os.path.join("pipeline", "processes.py"))


def kept(proc: psutil.Process) -> bool:
    """``proc`` runs under a keeper (of any checkout): its lifetime is owned by someone."""
    with contextlib.suppress(psutil.Error):
        for parent in proc.parents():
            cmdline = parent.cmdline()
            if len(cmdline) > 2 and cmdline[1] == "-I" and cmdline[2].endswith(KEEPER_SCRIPTS):
                return True
    return False


# ----------------------------------------------------------------------------------------------
# The caller's side


class OwnedProcess:
    """A command started by :func:`spawn`: ``pid`` is the command's, ``keeper`` the Popen of the
    keeper, whose exit status is the command's."""

    def __init__(self, keeper: subprocess.Popen, pid: int, grace_s: float):
        self.keeper, self.pid, self.grace_s = keeper, pid, grace_s
        self._procs = tree(pid)

    @property
    def returncode(self) -> int | None:
        return self.keeper.returncode

    def poll(self) -> int | None:
        code = self.keeper.poll()
        if code is not None:
            _release(self.keeper.pid)
        return code

    def wait(self, timeout: float | None = None) -> int:
        code = self.keeper.wait(timeout)
        _release(self.keeper.pid)  # the keeper is gone: its socket end is of no more use
        return code

    def alive(self) -> bool:
        """The command runs (its keeper may still be stopping what it left behind)."""
        try:
            return self.keeper.poll() is None and not _ended(psutil.Process(self.pid))
        except psutil.Error:
            return False

    def descendants(self) -> list[psutil.Process]:
        """The command's tree now, plus every member seen earlier that still runs."""
        self._procs = [p for p in _family([*self._procs, *tree(self.pid)]) if not _ended(p)]
        return list(self._procs)

    def stop(self, timeout_s: float | None = None) -> list[int]:
        """Stop the command's tree (:func:`stop_tree`), then let the keeper go; returns the pids
        that needed SIGKILL."""
        timeout_s = self.grace_s if timeout_s is None else timeout_s
        if self.keeper.poll() is None:
            killed = stop_tree(self.pid, timeout_s, self.descendants())
        else:  # the keeper is gone (killed with the command?): what it left of the tree is ours to stop
            killed = stop_processes(self.descendants(), timeout_s)
        _release(self.keeper.pid)  # the keeper stops whatever is still left, then exits
        try:
            self.keeper.wait(timeout=KILL_WAIT_S + timeout_s)
        except subprocess.TimeoutExpired:
            killed += stop_tree(self.keeper.pid, 0)
            self.keeper.wait()
        return killed

    def detach(self) -> None:
        """Let the command outlive the caller (it is still reaped and cleaned up after)."""
        with _lifelines_lock:
            lifeline = _lifelines.pop(self.keeper.pid, None)
        if lifeline is not None:
            with contextlib.suppress(OSError):
                lifeline.sendall(DETACH)
            lifeline.close()


def _release(keeper_pid: int) -> None:
    with _lifelines_lock:
        lifeline = _lifelines.pop(keeper_pid, None)
    if lifeline is not None:
        lifeline.close()


def _read_line(sock: socket.socket) -> str:
    data = b""
    while not data.endswith(b"\n"):
        part = sock.recv(4096)
        if not part:
            break
        data += part
    return data.decode(errors="replace").strip()


def spawn(argv: list[str], *, env: dict | None = None, cwd: str | Path | None = None, stdin=subprocess.DEVNULL,
          stdout=None, stderr=None, grace_s: float = 10.0) -> OwnedProcess:
    """Start ``argv`` under a keeper; it ends when this process ends (see the module docstring).
    ``grace_s``: how long the keeper waits after SIGTERM before SIGKILL when this process is gone.
    Raises OSError when the command cannot be started."""
    mine, theirs = socket.socketpair()
    try:
        keeper = subprocess.Popen(
            [sys.executable, "-I", str(KEEPER), str(theirs.fileno()), f"{grace_s:g}", "--", *argv],
            pass_fds=(theirs.fileno(),), env=env, cwd=cwd, stdin=stdin, stdout=stdout, stderr=stderr)
    except BaseException:
        mine.close()
        raise
    finally:
        theirs.close()
    first = _read_line(mine)
    if not first.startswith("pid "):
        mine.close()
        keeper.wait()
        raise OSError(first.removeprefix("error ") or f"the process keeper exited with {keeper.returncode}")
    with _lifelines_lock:
        _lifelines[keeper.pid] = mine
    return OwnedProcess(keeper, int(first.split()[1]), grace_s)


# ----------------------------------------------------------------------------------------------
# The keeper (run as a script: ``python -I processes.py FD GRACE_S -- ARGV...``)


def _prctl(option: int, value: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}) failed")


def _die_with(keeper_pid: int):
    def preexec() -> None:  # in the forked child, before exec: the keeper has one thread
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != keeper_pid:  # the keeper died before the signal was armed
            os._exit(1)

    return preexec


class _Keeper:
    def __init__(self, lifeline: socket.socket, grace_s: float, command: list[str], wake_fd: int):
        self.lifeline, self.grace_s, self.command, self.wake_fd = lifeline, grace_s, command, wake_fd
        self.status: int | None = None  # the command's wait status once reaped
        self.child: subprocess.Popen | None = None

    def start(self) -> bool:
        try:
            self.child = subprocess.Popen(self.command, start_new_session=True, preexec_fn=_die_with(os.getpid()))
        except (OSError, subprocess.SubprocessError) as exc:
            self.lifeline.sendall(f"error cannot start {self.command[0]}: {exc}\n".encode())
            return False
        self.lifeline.sendall(f"pid {self.child.pid}\n".encode())
        return True

    def reap(self, block: bool = False) -> None:
        """Collect every ended child (orphans re-parented here too); keep the command's status."""
        while True:
            try:
                pid, status = os.waitpid(-1, 0 if block and self.status is None else os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.child.pid:
                self.status = status
                self.child.returncode = os.waitstatus_to_exitcode(status)  # Popen must not wait for it

    def watch(self) -> bool:
        """Until the command exits (True), or the caller is gone or a stop signal came (False)."""
        poller = select.poll()
        poller.register(self.wake_fd, select.POLLIN)
        poller.register(self.lifeline.fileno(), select.POLLIN)
        while True:
            self.reap()
            if self.status is not None:
                return True
            for fd, _ in poller.poll():
                if fd == self.wake_fd and set(os.read(fd, 64)) & {signal.SIGTERM, signal.SIGHUP, signal.SIGINT}:
                    return False
                if fd == self.lifeline.fileno() and not self._lifeline_says_stay(poller):
                    return False

    def _lifeline_says_stay(self, poller) -> bool:
        message = self.lifeline.recv(64)
        if message.startswith(DETACH):  # the caller lets the command outlive it: stop listening
            poller.unregister(self.lifeline.fileno())
        return bool(message)

    def finish(self, command_exited: bool) -> int:
        """Stop the command unless it exited, then whatever is left of its tree; its wait status."""
        if not command_exited:
            stop_tree(self.child.pid, self.grace_s, tick=self.reap)
        self.reap(block=True)
        stop_processes(psutil.Process().children(), min(self.grace_s, 5.0), tick=self.reap)
        self.reap()
        return self.status if self.status is not None else 0


def _exit_like(status: int) -> None:
    """Exit with the command's status: the same code, or killed by the same signal."""
    if os.WIFSIGNALED(status):

        sig = os.WTERMSIG(status)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # the command's core, not the keeper's
        with contextlib.suppress(ValueError, OSError):
            signal.signal(sig, signal.SIG_DFL)  # SIGKILL needs (and takes) none
        signal.set_wakeup_fd(-1)
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)


def keeper_main(args: list[str]) -> None:
    fd, grace_s, command = int(args[0]), float(args[1]), args[3:]
    os.setsid()
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, lambda *_: None)  # the signal's number on the wakeup pipe, nothing else
    keeper = _Keeper(socket.socket(fileno=fd), grace_s, command, wake_r)
    if not keeper.start():
        os._exit(127)
    _exit_like(keeper.finish(command_exited=keeper.watch()))


if __name__ == "__main__":
    keeper_main(sys.argv[1:])
