"""The load generator's own faults are not a verdict.

Locust's master, with ``loadtest.processes`` ≥ 2, listens for its forked workers on an RPC port
that carries no authentication. Locust binds it to every interface on port 5557 by default
(locust 2.x ``argument_parser.py``: ``--master-bind-host`` ``*``, ``--master-bind-port`` 5557),
which opens it to the network and makes a second load test on the host fail to bind. Here the
master binds 127.0.0.1 on a port free at the time (:func:`master_address`) — or what the user
set in Locust's own variables ``LOCUST_MASTER_BIND_HOST`` / ``LOCUST_MASTER_BIND_PORT`` (multi-host
load: locustfiles/README.md) — and the forked workers are told the same address. A port that is
taken stops the load test before any cell with the process that holds it named.

A failure of the load harness itself — Locust exiting with an error, or recording no request
while the server is alive and answering (it failed to start, its master could not bind, its
workers never connected) — raises :class:`LoadHarnessError` (exit code 5, a pipeline failure)
with the cause from the cell's Locust log, after the cell is recorded in ``runs.json``
(``harness_fault``): the numbers of a broken load generator are never gated as NO-GO.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from pipeline.errors import EXIT_FAILURE, SpecdeployError

LOOPBACK = "127.0.0.1"
_ALL = ("*", "", "0.0.0.0", "::")  # Locust's "every interface" spellings


class LoadHarnessError(SpecdeployError):
    """The load generator (Locust) failed, not the server: a pipeline failure, never a verdict."""

    exit_code = EXIT_FAILURE


def master_address(processes: int) -> tuple[str, int] | None:
    """(bind host, port) of Locust's master RPC for ``processes`` workers; None for one process
    (no master). Checks the port is free now: LoadHarnessError naming its holder when not."""
    if processes < 2:
        return None
    from pipeline.infra.processes import free_ports  # noqa: PLC0415 - start-up: psutil (pipeline.infra.processes; the harness's fault helpers stay light)

    host = os.environ.get("LOCUST_MASTER_BIND_HOST") or LOOPBACK
    configured = os.environ.get("LOCUST_MASTER_BIND_PORT")
    if configured:
        try:
            port = int(configured)
        except ValueError:
            raise LoadHarnessError(f"LOCUST_MASTER_BIND_PORT={configured!r} is not a port number") from None
    else:
        port = free_ports(1, LOOPBACK if host in _ALL else host)[0]
    _check_free(host, port, "LOCUST_MASTER_BIND_PORT" if configured else "a free port")
    return host, port


def master_args(address: tuple[str, int] | None) -> list[str]:
    """Locust flags for the master's bind address and, for the workers ``--processes`` forks
    (they inherit the options and connect to ``--master-host``/``--master-port``), where to find it."""
    if address is None:
        return []
    host, port = address
    connect = LOOPBACK if host in _ALL else host
    return ["--master-bind-host", host, "--master-bind-port", str(port), "--master-host", connect,
            "--master-port", str(port)]


def _check_free(host: str, port: int, chosen: str) -> None:
    from pipeline.infra.processes import describe, port_holder, port_in_use  # noqa: PLC0415 - start-up: psutil (pipeline.infra.processes; the harness's fault helpers stay light)

    bind = "0.0.0.0" if host in _ALL else host
    try:
        taken = port_in_use(port, bind)
    except (OSError, OverflowError) as exc:  # a host this machine has no address for, a port > 65535
        raise LoadHarnessError(f"Locust master RPC cannot bind {host}:{port} ({exc}); check "
                               "LOCUST_MASTER_BIND_HOST / LOCUST_MASTER_BIND_PORT") from None
    if taken:
        holder = port_holder(port)
        who = describe(holder) if holder is not None else "another process"
        raise LoadHarnessError(
            f"Locust master RPC port {host}:{port} ({chosen}) is taken by {who}: a load test with "
            "loadtest.processes >= 2 needs it; unset LOCUST_MASTER_BIND_PORT (a free port is chosen) or pick another")


def fault(exit_code: int | None, timed_out: bool, n_records: int, server_alive: bool, log_path: Path) -> str | None:
    """Why this cell's numbers come from a broken load generator (None: they do not). Only with
    the server alive: a dead server is the run's dead-server outcome, not the harness's."""
    if not server_alive or timed_out:
        return None
    if exit_code not in (0, 1):
        what = f"Locust exited with code {exit_code}"
    elif n_records == 0:
        what = f"Locust recorded no request (exit code {exit_code}) while the server was alive and answering"
    else:
        return None
    cause = first_error(log_path)
    return f"{what}: {cause}" if cause else what


_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit)\b.*")
_LOGGED = re.compile(r"/(ERROR|CRITICAL)/")


def first_error(log_path: Path) -> str:
    """The line of a Locust log that says what went wrong: the exception a traceback ends with
    (the bind error: ``locust.exception.RPCError: Socket bind failure: Address already in use``),
    else the first ERROR/CRITICAL record, else the last line."""
    try:
        lines = [line.strip() for line in log_path.read_text(encoding="utf-8", errors="replace").splitlines()]
    except OSError:
        return ""
    lines = [line for line in lines if line]
    for i, line in enumerate(lines):
        if line.startswith("Traceback"):
            ends = [x for x in lines[i + 1:] if _EXCEPTION.match(x)]
            if ends:
                return ends[-1][:400]
    logged = next((line for line in lines if _LOGGED.search(line)), None)
    return (logged or (lines[-1] if lines else ""))[:400]
