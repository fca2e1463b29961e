"""What outlives a dead server (not a CI test): a detached ``specdeploy serve`` of the speculative
arm of a tiny draft-target deployment (``orchestration: engine``: the ``tensorrt_llm`` and
``tensorrt_llm_draft`` models each host a CPU engine in a worker process), then one part of its
tree killed with SIGKILL, then every process of the deployment polled until none is left and
the ports are free, or ``--wait-s`` passed.

Scenarios (``--scenarios``): ``keeper+server`` (the process keeper and ``tritonserver`` together,
as a supervisor or ``kill -9`` on a process list does), ``server`` (``tritonserver`` alone),
``engine-stub`` (the Python-backend stub that hosts the ``tensorrt_llm`` engine), ``worker`` (its
engine worker). After the kill of a stub or a worker the server stays up (Triton restarts
neither: the model fails its requests, the worker is restarted by the model); the scenario then
stops the server the way a user does (``kill -TERM -- -PGID``, the line ``serve`` prints) and
counts from there.

Writes JSON to ``--out`` (default ``benchmarks/results/orphans.json``): per scenario the
processes of the deployment before the kill, those left after ``--wait-s`` (command lines), the
seconds until none was left (null: some were still there), the ports still bound. Whatever is
left at the end is stopped (SIGTERM, then SIGKILL). Uses the tiny checkpoints of the serving
tests (``tests/integration/tiny_deploy.py``).

Usage (from the project root)::

    .venv/bin/python benchmarks/bench_orphans.py --out benchmarks/results/orphans.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "integration")]

from pipeline.infra.processes import free_ports, port_in_use, stop_processes  # noqa: E402 - after sys.path
from pipeline.infra.provenance import result_provenance  # noqa: E402 - after sys.path

SCENARIOS = ("keeper+server", "server", "engine-stub", "worker")
WORKER = "pipeline.reference.worker"


def alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    out = []
    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(proc)
        except psutil.Error:
            pass
    return out


def cmdline(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline())[:200]
    except psutil.Error:
        return f"pid {proc.pid}"


def start_detached(workdir: Path, cfg_name: str, ports: list[int]) -> psutil.Process:
    """``specdeploy serve CFG --variant speculative`` (detached); returns the tritonserver."""
    http, grpc, metrics = ports
    out = subprocess.run(
        [sys.executable, "-m", "pipeline", "serve", str(workdir / f"{cfg_name}.yaml"), "--variant", "speculative",
         "--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics), "--workdir", str(workdir)],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=600, check=False)
    if out.returncode != 0:
        raise SystemExit(f"serve failed:\n{out.stdout}\n{out.stderr}")
    pid = int(out.stdout.split(" pid ")[1].split()[0])
    return psutil.Process(pid)


def engine_stub(server: psutil.Process) -> psutil.Process:
    """The stub whose engine worker serves ``tensorrt_llm`` (the target model)."""
    for proc in server.children(recursive=True):
        if WORKER in proc.cmdline() and "/tensorrt_llm/" in " ".join(proc.parent().cmdline()):
            return proc.parent()
    raise SystemExit("no engine stub found")


def run_scenario(name: str, workdir: Path, cfg_name: str, wait_s: float) -> dict:
    ports = free_ports(3)
    server = start_detached(workdir, cfg_name, ports)
    keeper = server.parent()
    family = [keeper, server, *server.children(recursive=True)]
    stub = engine_stub(server)
    worker = next(p for p in stub.children() if WORKER in p.cmdline())
    victims = {"keeper+server": [keeper, server], "server": [server], "engine-stub": [stub], "worker": [worker]}[name]
    for proc in victims:
        proc.send_signal(signal.SIGKILL)
    started = time.monotonic()
    if name in ("engine-stub", "worker"):  # the server stays up: stop it as `serve` says to
        alive([server]) and os.killpg(server.pid, signal.SIGTERM)
    seconds = None
    while time.monotonic() - started < wait_s:
        if not alive(family) and not any(port_in_use(p) for p in ports):
            seconds = round(time.monotonic() - started, 2)
            break
        time.sleep(0.1)
    left = alive(family)
    result = {"killed": [cmdline(p).split()[0].rsplit("/", 1)[-1] for p in victims], "processes_before": len(family),
              "processes_left": len(left), "left": [cmdline(p) for p in left],
              "left_rss_mib": round(sum(p.memory_info().rss for p in left if p.is_running()) / 2**20, 1),
              "seconds_to_clean": seconds, "wait_s": wait_s, "ports_bound": [p for p in ports if port_in_use(p)]}
    log = workdir / "engines" / cfg_name / "logs" / "serve-speculative.log"
    text = log.read_text(errors="replace") if log.is_file() else ""
    result["stubs_killed_by_guard"] = text.count("did not exit within")  # pipeline/triton_models/parent_watch.py
    result["stubs_noticed_death"] = text.count("Non-graceful termination detected")
    stop_processes(left, 5.0)
    print(f"{name}: {result['processes_left']} of {len(family)} left, clean after {seconds} s", file=sys.stderr)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    parser.add_argument("--wait-s", type=float, default=30.0)
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--label", default="", help="recorded as is (e.g. 'before' / 'after')")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "orphans.json")
    args = parser.parse_args()
    import tiny_deploy
    from pipeline.config import load_config
    from pipeline.render.renderer import render

    with tempfile.TemporaryDirectory() as tmp:
        workdir = (args.workdir or Path(tmp)).resolve()
        workdir.mkdir(parents=True, exist_ok=True)
        models = tiny_deploy.make_models(workdir / "models")
        name = "tiny-orphans"
        cfg_path = tiny_deploy.make_deployment(workdir, models, "draft_target", name=name, orchestration="engine")
        render(load_config(cfg_path, workdir))
        results = {scenario: run_scenario(scenario, workdir, name, args.wait_s) for scenario in args.scenarios}
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False).stdout.strip()
    report = {
        "what": "processes of a detached speculative CPU deployment left after SIGKILL of part of its tree, and the "
                "seconds until none was left and the ports were free",
        "provenance": result_provenance(), "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]), "commit": commit, "label": args.label,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": {"machine": platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version(),
                 "loadavg": os.getloadavg()},
        "note": "shared 2-core machine: seconds are noisy; processes left is the finding",
        "scenarios": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
