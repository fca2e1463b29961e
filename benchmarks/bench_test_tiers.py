"""Test-tier time: the README's test command (``./run-tests``) for one tier at several worker
counts, run alternately in one session so each count sees the same machine (docs/testing.md,
"Running in parallel" and the tier budgets: quick <= 60 s, full <= 480 s on two cores).

Per run: the wall time, the CPU time of pytest and everything it started (its workers, servers,
Locust, subprocesses: ``RUSAGE_CHILDREN``), CPU/wall (how many cores the tier kept busy) and
whether every test passed. Per worker count: the medians; then the ratio of each count's median
wall to the first count's. Before the first round a short fixed Python loop is timed, and again
after every run: a shared machine's speed moves, and the loop says by how much.

Writes benchmarks/results/test-tiers-quick.json or test-tiers-full.json, with the failing tests'
lines of a run that did not pass. Run from the checkout (it needs .venv, as
``./run-tests`` does)::

    .venv/bin/python benchmarks/bench_test_tiers.py --tier quick --workers 2,3 --rounds 3
    .venv/bin/python benchmarks/bench_test_tiers.py --tier full --workers 3,4 --rounds 1
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
TIERS = {"quick": ["-m", "not slow"], "full": []}
BUDGET_S = {"quick": 60, "full": 480}  # docs/testing.md
# pytest's last line, "N passed, M failed in S s", framed by "=" unless -q
SUMMARY = re.compile(r"^=* ?([^=\n]*\b(?:passed|failed|error)\b[^=\n]* in [0-9.]+s[^=\n]*?) ?=*$", re.MULTILINE)


def loop_seconds() -> float:
    """A fixed pure-Python loop, in a fresh interpreter: the machine's speed now."""
    code = "import time\nt = time.perf_counter()\ns = 0\nfor i in range(20_000_000):\n    s += i\nprint(time.perf_counter() - t)"
    return round(float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout), 2)


def one_run(tier: str, workers: int) -> dict:
    env = {**os.environ, "CI": "true", "SPECDEPLOY_TEST_WORKERS": str(workers)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as .ci/run: the rewritten test modules are cached
    argv = ["./run-tests", "-q", "-p", "no:cacheprovider", *TIERS[tier]]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    found = SUMMARY.findall(proc.stdout)
    summary = found[-1] if found else proc.stdout.strip()[-200:]
    failing = [line for line in proc.stdout.splitlines() if line.startswith(("FAILED ", "ERROR "))]
    return {"workers": workers, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "cores_busy": round(cpu / wall, 2),
            "passed": proc.returncode == 0, "summary": summary, "failing": failing[:20], "loop_after_s": loop_seconds()}


def summarise(runs: list[dict], counts: list[int]) -> dict:
    out = {}
    for n in counts:
        mine = [r for r in runs if r["workers"] == n]
        out[str(n)] = {"runs": len(mine), "median_wall_s": round(statistics.median(r["wall_s"] for r in mine), 1),
                       "median_cpu_s": round(statistics.median(r["cpu_s"] for r in mine), 1),
                       "median_cores_busy": round(statistics.median(r["cores_busy"] for r in mine), 2),
                       "all_passed": all(r["passed"] for r in mine)}
    first = out[str(counts[0])]["median_wall_s"]
    for n in counts:
        out[str(n)]["wall_ratio_to_first"] = round(out[str(n)]["median_wall_s"] / first, 3)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tier", choices=sorted(TIERS), default="quick")
    parser.add_argument("--workers", default="2,3", help="worker counts, comma-separated, run alternately")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    counts = [int(n) for n in args.workers.split(",")]
    out = args.out or RESULTS / f"test-tiers-{args.tier}.json"
    sys.path.insert(0, str(ROOT))
    from pipeline.infra.provenance import result_provenance

    loop_before = loop_seconds()
    runs = []
    for round_no in range(args.rounds):
        order = counts if round_no % 2 == 0 else counts[::-1]  # alternate which count goes first
        for n in order:
            runs.append({"round": round_no + 1, **one_run(args.tier, n)})
            print(json.dumps(runs[-1]), file=sys.stderr)
    result = {
        "benchmark": "test-tiers",
        "what": f"the {args.tier} tier through ./run-tests at {args.workers} workers, alternated in one session",
        "tier": args.tier, "budget_s": BUDGET_S[args.tier], "loop_before_s": loop_before,
        "by_workers": summarise(runs, counts), "runs": runs, "provenance": result_provenance(),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}", file=sys.stderr)
    return 0 if all(r["passed"] for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
