"""Before a server starts: a tritonserver of ours that nothing owns any more, and a busy port.

Every server ``specdeploy`` starts runs under a keeper (:mod:`pipeline.infra.processes`). A live
tritonserver serving the same repository (its ``--model-repository``) without a keeper above it
was left by a ``specdeploy`` from before that guarantee, or its keeper was killed alone; the pid
file ``logs/serve-<variant>.pid`` names the last one started. A port someone listens on is named
with its holder. Either way the start fails with the process (pid, command line, start time) and
the command that stops it. Reads ``/proc`` (psutil) and the pid file; writes nothing.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import psutil

from pipeline.errors import ServeError
from pipeline.infra.processes import describe, kept, port_holder, port_in_use


def _is_tritonserver(proc) -> bool:
    with contextlib.suppress(psutil.Error, IndexError):
        return Path(proc.cmdline()[0]).name == "tritonserver"
    return False


def _serves(proc, repo: Path) -> bool:
    with contextlib.suppress(psutil.Error):
        return _is_tritonserver(proc) and f"--model-repository={repo}" in proc.cmdline()
    return False


def stale_servers(repo: Path, pid_file: Path) -> list:
    """Live tritonservers of this repository that no keeper owns (left by a specdeploy that
    ended before this guarantee existed, or whose keeper was killed alone), plus the one the pid
    file names if it is such a server."""
    found = {p.pid: p for p in psutil.process_iter() if _serves(p, repo) and not kept(p)}
    with contextlib.suppress(OSError, ValueError, psutil.Error):
        proc = psutil.Process(int(pid_file.read_text().split()[0]))
        if proc.create_time() <= pid_file.stat().st_mtime + 1 and _is_tritonserver(proc) and not kept(proc):
            found.setdefault(proc.pid, proc)
    return list(found.values())


def stop_hint(proc) -> str:
    try:
        group = os.getpgid(proc.pid)
    except OSError:
        group = None
    return f"kill -TERM -- -{group}" if group == proc.pid else f"kill -TERM {proc.pid}"


def _port_problem(name: str, port: int) -> str:
    holder = port_holder(port)
    if holder is None:
        return f"{name} port {port} is in use by a process this user cannot see; pick another (--{name}-port)"
    what = "a tritonserver" if _is_tritonserver(holder) else "another process"
    return (f"{name} port {port} is held by {what}: {describe(holder)}; stop it with `{stop_hint(holder)}` "
            f"or pick another port (--{name}-port)")


def check_no_stale_server(repo: Path, ports, host: str, pid_file: Path) -> None:
    """Refuse to start beside a server of ours nobody owns, or on a busy port; name the process."""
    problems = [f"a tritonserver from an earlier run still serves {repo} and nothing owns it any more: "
                f"{describe(proc)}; stop it with `{stop_hint(proc)}`" for proc in stale_servers(repo, pid_file)]
    problems += [_port_problem(name, port) for name, port in
                 (("http", ports.http), ("grpc", ports.grpc), ("metrics", ports.metrics)) if port_in_use(port, host)]
    if problems:
        raise ServeError("cannot start tritonserver:\n  " + "\n  ".join(problems))
