"""The load generator's own faults are not a verdict (pipeline/loadtest/harness.py). Real Locust
with ``loadtest.processes: 2`` (a master and two forked workers) against the fake server's OpenAI
mode: the master's RPC listens on loopback only, on a port of its own, so a second load test
holding Locust's default port 5557 changes nothing; a configured port that is taken stops the load
test before any cell, naming the process that holds it (exit 5); and a Locust that fails by itself
(its master cannot bind) ends the load test with exit 5 and the bind error in one line, never with
a verdict computed from no records."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "locustfiles"))

from test_endpoints_loadtest import write_lt_file  # noqa: E402 - after the sys.path set-up above
from test_loadtest_fake_server import FakeServer  # noqa: E402 - after the sys.path set-up above

from pipeline.errors import EXIT_FAILURE  # noqa: E402 - after the sys.path set-up above
from tests.unit.cli_inproc import specdeploy  # noqa: E402 - after the sys.path set-up above

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server():
    fake = FakeServer("--ttft-ms", "20", "--tpot-ms", "5", "--max-tokens-cap", "8")
    yield fake
    fake.close()


@contextlib.contextmanager
def listening(port: int = 0):
    """A socket listening on 127.0.0.1:``port`` (0: any free port); yields the port, or None
    when ``port`` is taken already (by someone else: taken either way)."""
    sock = socket.socket()
    try:
        sock.bind(("127.0.0.1", port))
    except OSError:
        sock.close()
        yield None
        return
    sock.listen()
    try:
        yield sock.getsockname()[1]
    finally:
        sock.close()


def loadtest_argv(lt: Path, server, out: Path) -> list[str]:
    return ["loadtest", "--loadtest-file", str(lt), "--endpoint-baseline", f"http://127.0.0.1:{server.port}",
            "--arm", "baseline", "--model", "fake", "--out", str(out), "--no-progress"]


def locust_left() -> list[psutil.Process]:
    # `-m locust` as an argument: the fake server's path (locustfiles/fake_server.py) holds the word too
    return [p for p in psutil.Process().children(recursive=True)
            if "locust" in p.cmdline() and p.status() != psutil.STATUS_ZOMBIE]


def test_master_listens_on_loopback_only_and_a_held_5557_changes_nothing(tmp_path, server):
    # 2 s: the master listens from its start, and a valid run needs records, not a long window
    lt = write_lt_file(tmp_path, processes=2, concurrency=[2], duration_s=2, warmup_s=0.5)
    out = tmp_path / "run"
    listens: set[tuple[str, int]] = set()
    with listening(5557):  # a second load test on the host, on Locust's default port
        proc = subprocess.Popen([sys.executable, "-m", "pipeline", *loadtest_argv(lt, server, out)], cwd=ROOT,
                                env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        parent = psutil.Process(proc.pid)
        while proc.poll() is None:  # every Locust process of the run, while it runs
            with contextlib.suppress(psutil.Error):
                for child in parent.children(recursive=True):
                    with contextlib.suppress(psutil.Error):
                        if "locust" in child.cmdline():
                            listens |= {(c.laddr.ip, c.laddr.port) for c in child.net_connections("tcp")
                                        if c.status == psutil.CONN_LISTEN}
            time.sleep(0.05)
        output = proc.stdout.read()
    assert proc.returncode in (0, 1, 3), output[-3000:]
    assert listens and {ip for ip, _ in listens} == {"127.0.0.1"}, listens
    assert 5557 not in {port for _, port in listens}
    runs = json.loads((out / "runs.json").read_text())["runs"]
    assert len(runs) == 1 and runs[0]["valid"] and runs[0]["n_records"] > 0, runs[0]["invalid_reasons"]
    command = runs[0]["command"]
    assert command[command.index("--master-bind-host") + 1] == "127.0.0.1"


def test_a_taken_configured_port_stops_before_any_cell(tmp_path, server, monkeypatch):
    lt = write_lt_file(tmp_path, processes=2, concurrency=[2], duration_s=3, warmup_s=0.5)
    out = tmp_path / "run"
    with listening() as port:
        monkeypatch.setenv("LOCUST_MASTER_BIND_PORT", str(port))  # Locust's own setting, as a user sets it
        proc = specdeploy(*loadtest_argv(lt, server, out))
    assert proc.returncode == EXIT_FAILURE, proc.stdout[-2000:] + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and f"127.0.0.1:{port}" in lines[0] and "taken" in lines[0], proc.stderr
    assert f"pid {os.getpid()}" in lines[0]  # who holds it
    assert not (out / "runs.json").exists() and not list((out / "logs").glob("*"))  # no cell ran
    assert not locust_left()


def test_locust_failing_by_itself_is_exit_5_with_its_cause_not_a_verdict(tmp_path, server, monkeypatch):
    from pipeline.loadtest import harness

    lt = write_lt_file(tmp_path, processes=2, concurrency=[2], duration_s=3, warmup_s=0.5)
    out = tmp_path / "run"
    with listening() as port:
        # the port is taken between the check and Locust's bind (another process won the race)
        monkeypatch.setattr(harness, "master_address", lambda processes: ("127.0.0.1", port))
        proc = specdeploy(*loadtest_argv(lt, server, out))
    assert proc.returncode == EXIT_FAILURE, proc.stdout[-2000:] + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Socket bind failure" in lines[0] and "Address already in use" in lines[0], lines
    runs = json.loads((out / "runs.json").read_text())["runs"]
    assert len(runs) == 1 and runs[0]["harness_fault"] and not runs[0]["valid"] and runs[0]["server_alive"]
    assert not (out / "report.json").exists()  # no verdict from a broken load generator
    assert not locust_left()  # the orphaned workers of the failed master were stopped too


def test_first_error_reads_the_exception_a_traceback_ends_with(tmp_path):
    from pipeline.loadtest.harness import fault, first_error

    log = tmp_path / "cell.log"
    log.write_text("Traceback (most recent call last):\n  File \"x\", line 1\nzmq.error.ZMQError: Address already in use\n\n"
                   "During handling of the above exception, another exception occurred:\n\n"
                   "Traceback (most recent call last):\n  File \"y\", line 2\n"
                   "locust.exception.RPCError: Socket bind failure: Address already in use (addr='tcp://127.0.0.1:1')\n")
    assert first_error(log).startswith("locust.exception.RPCError: Socket bind failure")
    assert fault(1, False, 0, True, log).startswith("Locust recorded no request")
    assert fault(2, False, 10, True, log).startswith("Locust exited with code 2")
    assert fault(0, False, 10, True, log) is None  # records and a clean exit: the server's numbers
    assert fault(1, False, 0, False, log) is None  # a dead server is the run's dead-server outcome
