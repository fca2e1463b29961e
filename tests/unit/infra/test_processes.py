"""Process lifetime (``pipeline.infra.processes``, used by build, serve and loadtest): a command and
everything it starts end when the process that started it is killed with SIGKILL (even when it
was started from a thread that has ended, even for descendants that left its session or
double-forked), a build step ends with a killed build, a detached command outlives its owner,
the keeper reports the command's exit status, the tree stop escalates to SIGKILL, and free
ports / port holders are found. Real processes throughout; every wait polls a condition."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from pipeline.infra.processes import describe, free_ports, kept, port_holder, port_in_use, spawn, stop_tree
from tests.polling import wait_until

ROOT = Path(__file__).resolve().parents[3]
DEADLINE_S = 60.0
# a command whose tree has a child in a session of its own and a double-forked daemon (re-parented
# away from the command at once); it writes their pids to argv[1], then waits
TREE = textwrap.dedent("""
    import json, os, subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", "import os, time; os.setsid(); time.sleep(300)"])
    r, w = os.pipe()
    if os.fork() == 0:
        if os.fork() == 0:
            os.write(w, str(os.getpid()).encode())
            time.sleep(300)
        os._exit(0)
    os.close(w)
    daemon = int(os.read(r, 32))
    json.dump([child.pid, daemon], open(sys.argv[1] + ".tmp", "w"))
    os.replace(sys.argv[1] + ".tmp", sys.argv[1])
    time.sleep(300)
""")
PRELUDE = """
import json, os, sys


def report(pids):
    json.dump(pids, open(sys.argv[1] + ".tmp", "w"))
    os.replace(sys.argv[1] + ".tmp", sys.argv[1])
"""


def running(pids) -> list[int]:
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def kill_leftovers(pids) -> None:
    for pid in running(pids):
        os.kill(pid, signal.SIGKILL)


def read_pids(path: Path) -> list[int]:
    return wait_until(lambda: path.exists() and json.loads(path.read_text()), f"pids in {path}")


def driver(tmp_path: Path, body: str) -> tuple[subprocess.Popen, list[int]]:
    """Run ``body`` in a Python process that reports the pids of what it started (``report``)
    and then waits; return it and those pids."""
    script = tmp_path / "driver.py"
    script.write_text(PRELUDE + textwrap.dedent(body))
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "pids.json")], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    return proc, read_pids(tmp_path / "pids.json")


def test_the_commands_tree_ends_when_its_owner_is_killed(tmp_path):
    tree_file = tmp_path / "tree.json"
    proc, pids = driver(tmp_path, f"""
        import threading, time
        from pipeline.infra.processes import spawn

        started = {{}}
        # started from a thread that ends at once: PR_SET_PDEATHSIG would fire right there
        thread = threading.Thread(target=lambda: started.update(
            cmd=spawn([sys.executable, "-c", {TREE!r}, {str(tree_file)!r}])))
        thread.start()
        thread.join()
        report([started["cmd"].keeper.pid, started["cmd"].pid])
        time.sleep(300)
    """)
    family = [*pids, *read_pids(tree_file)]  # keeper, command, its setsid child, the daemon
    try:
        assert len(running(family)) == 4
        proc.kill()
        proc.wait()
        wait_until(lambda: not running(family), f"the command's tree {family} ended with its owner")
    finally:
        kill_leftovers(family)


def test_a_build_step_ends_when_the_build_is_killed(tmp_path):
    marker = tmp_path / "step.json"
    proc, _ = driver(tmp_path, f"""
        from pathlib import Path
        from pipeline.build.builder import SubprocessExecutor
        from pipeline.plan.planner import Step

        code = ("import json, os, subprocess, sys, time; "
                "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)']); "
                "json.dump([os.getpid(), child.pid], open({str(marker)!r} + '.tmp', 'w')); "
                "os.replace({str(marker)!r} + '.tmp', {str(marker)!r}); time.sleep(300)")
        report([os.getpid()])
        step = Step(name="slow", kind="convert", argv=[sys.executable, "-c", code], inputs=[], outputs=[])
        SubprocessExecutor().run(step, step.argv, Path(sys.argv[1]).with_name("step.log"))
    """)
    step = read_pids(marker)
    try:
        assert len(running(step)) == 2
        proc.kill()
        proc.wait()
        wait_until(lambda: not running(step), f"the step {step} ended with the build")
    finally:
        kill_leftovers(step)


def test_a_spawned_command_counts_as_kept_and_a_bare_one_does_not():
    """What the stale-server check relies on: a server we started is owned, one nobody keeps is not."""
    owned = spawn([sys.executable, "-c", "import time; time.sleep(300)"])
    bare = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        assert kept(psutil.Process(owned.pid))
        assert not kept(psutil.Process(bare.pid))
    finally:
        owned.stop()
        bare.kill()
        bare.wait()
        kill_leftovers([owned.pid])


def test_the_command_dies_with_its_keeper():
    owned = spawn([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        os.kill(owned.keeper.pid, signal.SIGKILL)  # the keeper alone (what an OOM kill could do)
        owned.keeper.wait()
        wait_until(lambda: not running([owned.pid]), "the command ended with its keeper (PR_SET_PDEATHSIG)")
    finally:
        kill_leftovers([owned.pid])


def test_a_detached_command_outlives_its_owner(tmp_path):
    proc, pids = driver(tmp_path, """
        from pipeline.infra.processes import spawn

        owned = spawn([sys.executable, "-c", "import time; time.sleep(300)"])
        owned.detach()
        report([owned.keeper.pid, owned.pid])
    """)
    keeper, command = pids
    try:
        assert proc.wait(timeout=DEADLINE_S) == 0
        assert running([keeper, command]) == [keeper, command]  # still there after its owner ended
        os.killpg(command, signal.SIGTERM)  # how `specdeploy serve` says to stop it
        wait_until(lambda: not running([keeper, command]), "the keeper left with its command")
    finally:
        kill_leftovers([keeper, command])


def test_the_keeper_exits_like_its_command():
    assert spawn([sys.executable, "-c", "import sys; sys.exit(3)"]).wait(timeout=DEADLINE_S) == 3
    killed = spawn([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"])
    assert killed.wait(timeout=DEADLINE_S) == -signal.SIGKILL
    with pytest.raises(OSError, match="cannot start /nonexistent/tool"):
        spawn(["/nonexistent/tool"])


def test_stop_tree_terminates_then_kills_what_ignores_sigterm(tmp_path):
    # The child is started before SIGTERM is ignored (an ignored signal is inherited), and the
    # command says it is ready only once it ignores SIGTERM: stopping it earlier would end it on
    # SIGTERM and the escalation would go unseen.
    ready = tmp_path / "ready"
    stubborn = ("import signal, subprocess, sys, time; "
                "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)']); "
                f"signal.signal(signal.SIGTERM, signal.SIG_IGN); open({str(ready)!r}, 'w').close(); time.sleep(300)")
    owned = spawn([sys.executable, "-c", stubborn])
    family = [owned.pid, *wait_until(lambda: [p.pid for p in psutil.Process(owned.pid).children()], "its child")]
    try:
        wait_until(ready.exists, "the command ignores SIGTERM")
        killed = owned.stop(timeout_s=0.5)
        assert killed == [owned.pid]  # its child ended on SIGTERM, it needed SIGKILL
        assert owned.returncode == -signal.SIGKILL and not running(family)
        assert stop_tree(owned.pid, 1) == []  # nothing left to stop
    finally:
        kill_leftovers(family)


def test_stop_ends_what_is_left_when_the_keeper_was_killed_with_the_command(tmp_path):
    """A supervisor kills the keeper and the command together: nothing above the command's child
    cleans up any more, so the owner stops the descendants it saw start (as a `serve` does with
    the stubs of a server killed with its keeper), SIGKILL for one that ignores SIGTERM."""
    ready = tmp_path / "ready"  # the child writes it once it ignores SIGTERM, so the stop finds it ignoring
    held = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import signal, time; "
            f"signal.signal(signal.SIGTERM, signal.SIG_IGN); open(\"{ready}\", \"w\").close(); time.sleep(300)']); "
            "time.sleep(300)")
    owned = spawn([sys.executable, "-c", held])
    child = wait_until(lambda: [p.pid for p in psutil.Process(owned.pid).children()], "its child")[0]
    assert child in [p.pid for p in owned.descendants()]  # seen, as serve sees its stubs once ready
    try:
        wait_until(ready.exists, "the child ignores SIGTERM")
        os.kill(owned.keeper.pid, signal.SIGKILL)
        os.kill(owned.pid, signal.SIGKILL)
        owned.keeper.wait()
        assert running([child]) == [child]  # orphaned, and nobody stops it
        assert owned.stop(timeout_s=0.5) == [child]
        assert not running([child])
    finally:
        kill_leftovers([owned.pid, child])


def test_free_ports_and_who_holds_a_port():
    ports = free_ports(3)
    assert len(set(ports)) == 3 and not any(port_in_use(p) for p in ports)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", ports[0]))
        listener.listen()
        assert port_in_use(ports[0])
        holder = port_holder(ports[0])
        assert holder is not None and holder.pid == os.getpid()
        assert describe(holder).startswith(f"pid {os.getpid()} (") and "started" in describe(holder)


@pytest.mark.slow  # a subprocess of its own (about 1 CPU s): full tier, the quick tier keeps the in-process checks
def test_a_finished_command_leaves_no_socket_open():
    before = len(psutil.Process().net_connections(kind="unix"))
    for _ in range(5):
        assert spawn([sys.executable, "-c", "pass"]).wait(timeout=DEADLINE_S) == 0
    assert len(psutil.Process().net_connections(kind="unix")) == before
