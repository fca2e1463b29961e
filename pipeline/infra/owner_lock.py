"""One writer per directory: a run directory is owned by the process measuring it, an engine
directory by the process building it.

Ownership is an exclusive ``fcntl.flock`` on a lock file inside the directory. The kernel drops
it when its holder ends, however it ends (exit, exception, SIGKILL, OOM kill), so whether a
directory is owned is decided by the lock alone — never by a pid that may have been reused on a
busy CI runner. The holder writes who it is into the file (pid, command line, start time, host,
what it is doing) only so that a process turned away can say whom it waits for.

- :func:`claim` takes a directory until the enclosing :func:`holding` scope ends; a scope opened
  with ``hand_up`` gives what it holds to the scope around it instead (the load test's scope hands
  its run directory to ``specdeploy run``, which keeps it while it writes the report into it).
  :func:`owned` is a claim in its own scope, for one ``with`` block.
- A claim of a directory this process already owns succeeds (the report stage of ``run``, inside
  the load test's ownership).
- :func:`owner_of` says who owns a directory now (None: nobody alive).
- A forked child that does not ``exec`` (a multiprocessing worker) closes its copy of the lock at
  fork, so the lock never outlives its owner through a child; ``exec``'d children never get it
  (the descriptor is close-on-exec).

POSIX ``flock``: local file systems, and NFS ≥ 4 clients (where it is emulated with byte-range
locks); a directory shared by two hosts over older NFS is not protected.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import socket
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterator

from pipeline.errors import EXIT_FAILURE, SpecdeployError

LOCK_NAME = ".owner.lock"
# A claim that meets the lock held retries this long before it gives up: owner_of() takes the lock
# (shared) for microseconds to look, which must not turn a claim of a free directory away.
_CLAIM_RETRY_S = 0.25


@dataclass(frozen=True)
class Owner:
    """Who holds a directory's lock, as its holder wrote it (diagnostics only)."""

    pid: int | None
    command: str
    started: str
    host: str
    doing: str

    def describe(self) -> str:
        if self.pid is None:  # caught between its lock and its record
            return "a live process (its owner record is not written yet)"
        where = f" on {self.host}" if self.host and self.host != socket.gethostname() else ""
        return f"pid {self.pid}{where} ({self.doing} since {self.started}: `{self.command}`)"


class DirectoryBusy(SpecdeployError):
    """Another live process owns the directory. A pipeline failure, not a usage error: the same
    command succeeds once the owner is gone (or run into another directory)."""

    exit_code = EXIT_FAILURE

    def __init__(self, directory: Path, owner: Owner | None, advice: str = ""):
        self.directory = directory
        self.owner = owner
        who = owner.describe() if owner else "another process (it wrote no owner record)"
        super().__init__(f"{directory} is owned by {who}" + (f": {advice}" if advice else ""))


@dataclass
class _Held:
    fd: int
    owner: Owner


_held: dict[Path, _Held] = {}  # lock file -> this process's hold on it
_scopes: list[list[Path]] = []  # the lock files each open holding() scope releases at its end


def _lock_path(directory: Path, name: str) -> Path:
    return Path(os.path.abspath(directory)) / name


def _this_owner(doing: str) -> Owner:
    argv = getattr(sys, "orig_argv", sys.argv)  # the interpreter's own argv: `python -m pipeline run …`
    command = shlex.join(argv).replace("\n", "\\n")  # one line, whatever the arguments hold
    return Owner(pid=os.getpid(), command=command if len(command) <= 300 else command[:300] + " …",
                 started=datetime.now(timezone.utc).isoformat(timespec="seconds"), host=socket.gethostname(),
                 doing=doing)


def _read_owner(path: Path) -> Owner | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return Owner(pid=data.get("pid"), command=str(data.get("command", "")), started=str(data.get("started", "")),
                     host=str(data.get("host", "")), doing=str(data.get("doing", "")))
    except (OSError, ValueError, AttributeError):
        return None


def owner_of(directory: str | Path, name: str = LOCK_NAME) -> Owner | None:
    """The live owner of ``directory`` (this process included), or None when nobody holds it."""
    path = _lock_path(Path(directory), name)
    if path in _held:
        return _held[path].owner
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # shared: two lookers never turn each other away
        except BlockingIOError:
            return _read_owner(path) or Owner(None, "", "", "", "")
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


@contextlib.contextmanager
def holding(hand_up: bool = False) -> Iterator[None]:
    """A scope: every directory :func:`claim`-ed inside it is released when it ends — or, with
    ``hand_up`` and a scope around this one, kept and released when that one ends. Also a
    decorator."""
    mine: list[Path] = []
    _scopes.append(mine)
    try:
        yield
    finally:
        if any(scope is mine for scope in _scopes):  # else: a forked child, which owns nothing
            del _scopes[next(i for i, scope in enumerate(_scopes) if scope is mine):]
        if hand_up and _scopes:
            _scopes[-1].extend(mine)
        else:
            for path in reversed(mine):
                _release(path)


def claim(directory: str | Path, doing: str, *, name: str = LOCK_NAME, wait: bool = False,
          on_wait: Callable[[Owner | None], None] | None = None, advice: str = "") -> None:
    """Own ``directory`` until the enclosing :func:`holding` scope ends. When another live process
    owns it: :class:`DirectoryBusy` (naming the owner, then ``advice``), or with ``wait`` block
    until the owner is gone (``on_wait`` is told whom it waits for, once)."""
    if not _scopes:
        raise RuntimeError("owner_lock.claim outside a holding() scope")
    path = _lock_path(Path(directory), name)
    if path in _held:
        return  # this process owns it already (an enclosing stage)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        if not _try_lock(fd):
            owner = _read_owner(path)
            if not wait:
                raise DirectoryBusy(Path(directory), owner, advice)
            if on_wait is not None:
                on_wait(owner)
            fcntl.flock(fd, fcntl.LOCK_EX)
    except BaseException:
        os.close(fd)
        raise
    me = _this_owner(doing)
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(me.__dict__) + "\n").encode(), 0)
    _held[path] = _Held(fd, me)
    _scopes[-1].append(path)


@contextlib.contextmanager
def owned(directory: str | Path, doing: str, **kwargs) -> Iterator[None]:
    """Own ``directory`` for a ``with`` block (:func:`claim` inside its own :func:`holding`)."""
    with holding():
        claim(directory, doing, **kwargs)
        yield


def _try_lock(fd: int) -> bool:
    """The exclusive lock without blocking; False when a live process holds it."""
    deadline = time.monotonic() + _CLAIM_RETRY_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)


def _release(path: Path) -> None:
    held = _held.pop(path, None)
    if held is None:
        return
    try:
        os.ftruncate(held.fd, 0)  # the record named a live owner; nobody owns it now
    except OSError:
        pass  # a full or read-only disk: the lock, not the record, says who owns it
    fcntl.flock(held.fd, fcntl.LOCK_UN)
    os.close(held.fd)


def _forget_in_child() -> None:
    """After fork without exec: the child owns nothing, and its copy of each lock descriptor must
    not keep the parent's lock alive once the parent is gone."""
    for held in _held.values():
        with contextlib.suppress(OSError):
            os.close(held.fd)
    _held.clear()
    _scopes.clear()


os.register_at_fork(after_in_child=_forget_in_child)
