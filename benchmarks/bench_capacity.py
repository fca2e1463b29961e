"""Capacity prediction against a measurement on the CPU default (docs/capacity.md).

One `specdeploy run` of the README's config in closed loop (concurrency 1, 2, 4, 8) gives each
arm's curves; from them `pipeline.report.capacity.predict_at_rate` predicts, for a request rate
the run did not test (half way between the baseline's measured throughput at concurrency 2 and
4), each arm's p95 TPOT and E2E, whether it meets a TPOT SLO set at the baseline's p95 TPOT at
concurrency 4, and its output tokens/s. A second `specdeploy run` then load-tests that rate open
loop (Poisson arrivals) with the same arms, and the measured figures are set beside the
prediction. Writes ``benchmarks/results/capacity-check.json`` (command, commit, date, machine,
the load average around each run).

Usage: ``python benchmarks/bench_capacity.py [--workdir DIR] [--repeats N] [--duration S]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from pipeline.infra.provenance import result_provenance  # noqa: E402 - after the path set-up above
from pipeline.report.capacity import Slo, level_slack, measured_capacity, predict_at_rate  # noqa: E402 - as above
from pipeline.report.stats import load_runs, tpot_ms  # noqa: E402 - as above

CONFIG = ROOT / "configs" / "tiny-cpu-medusa.yaml"


def _config(workdir: Path, name: str, loadtest: dict, repeats: int, duration: float, port: int) -> Path:
    cfg = yaml.safe_load(CONFIG.read_text(encoding="utf-8"))
    cfg["name"] = name
    cfg["triton"].update(http_port=port, grpc_port=port + 1, metrics_port=port + 2)
    cfg["loadtest"].update(loadtest, repeats=repeats, duration_s=duration)
    for key in ("min_repeats", "max_repeats", "max_minutes"):
        cfg["loadtest"].pop(key, None)
    cfg["loadtest"]["prompts"] = str(ROOT / cfg["loadtest"]["prompts"])
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    return path


def _run(config: Path, workdir: Path) -> tuple[Path, dict]:
    before = os.getloadavg()
    started = time.time()
    proc = subprocess.run([sys.executable, "-m", "pipeline", "run", str(config), "--workdir", str(workdir)],
                          cwd=ROOT, capture_output=True, text=True)
    name = yaml.safe_load(config.read_text())["name"]
    runs = sorted((workdir / "reports" / name).glob("2*"))
    if not runs or not (runs[-1] / "report.json").is_file():
        raise SystemExit(f"{config}: no report (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return runs[-1], {"exit_code": proc.returncode, "seconds": round(time.time() - started, 1),
                      "load_average_before": [round(x, 2) for x in before],
                      "load_average_after": [round(x, 2) for x in os.getloadavg()]}


def _measured_open(run_dir: Path, slo: Slo) -> dict:
    """Per arm, from the open-loop run: the pooled p95 of each SLO metric, the share of requests
    meeting every SLO and the mean output tokens/s over the repeats."""
    report = json.loads((run_dir / "report.json").read_text(encoding="utf-8"))
    summaries = {r["key"]: r for r in report["runs"]}
    out = {}
    for arm in ("baseline", "speculative"):
        runs = [r for r in load_runs(run_dir) if r.info["arm"] == arm]
        records = [rec for r in runs for rec in r.records]
        _, values = level_slack(records, slo)
        measured = [rec for rec in records if rec.get("stage") == "measure" and rec.get("status") == "ok"]
        meets = [all((v := fn(rec)) is not None and v <= slo.limits()[m] for m, fn in
                     (("tpot", tpot_ms),)) for rec in measured]
        tokens = [summaries[r.info["key"]]["output_tokens_per_s"] for r in runs]
        rates = [summaries[r.info["key"]]["requests_per_s"] for r in runs]
        out[arm] = {"percentiles_ms": {m: round(v, 3) for m, v in values.items()},
                    "share_meeting_slo": round(sum(meets) / len(meets), 3) if meets else None,
                    "output_tokens_per_s": round(sum(tokens) / len(tokens), 2),
                    "achieved_rps": round(sum(rates) / len(rates), 3), "requests": len(measured)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--duration", type=float, default=8.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-capacity-") as tmp:
        workdir = (args.workdir or Path(tmp)).resolve()
        workdir.mkdir(parents=True, exist_ok=True)
        closed_cfg = _config(workdir, "capacity-closed", {"mode": "closed", "concurrency": [1, 2, 4, 8]},
                             args.repeats, args.duration, 18300)
        closed_dir, closed_run = _run(closed_cfg, workdir)
        report = json.loads((closed_dir / "report.json").read_text())
        base_runs = {(r["concurrency"], r["repeat"]): r for r in report["runs"] if r["arm"] == "baseline"}
        reps = sorted({rep for _, rep in base_runs})
        c2 = sum(base_runs[(2, r)]["requests_per_s"] for r in reps) / len(reps)
        c4 = sum(base_runs[(4, r)]["requests_per_s"] for r in reps) / len(reps)
        rate = round((c2 + c4) / 2, 2)
        c4_tpot = [level_slack(r.records, Slo(tpot_ms=1.0))[1]["tpot"] for r in load_runs(closed_dir)
                   if r.info["arm"] == "baseline" and r.info["concurrency"] == 4]
        slo = Slo(tpot_ms=round(sum(c4_tpot) / len(c4_tpot), 2))
        prediction = predict_at_rate(closed_dir, rate, slo)
        capacity = measured_capacity(closed_dir, slo)
        open_cfg = _config(workdir, "capacity-open", {"mode": "open", "request_rate": [rate]},
                           args.repeats, args.duration, 18310)
        open_dir, open_run = _run(open_cfg, workdir)
        measured = _measured_open(open_dir, slo)
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    comparison = {}
    for arm in ("baseline", "speculative"):
        p, m = prediction[arm], measured[arm]
        comparison[arm] = {
            "p95_tpot_error": round(p["percentiles_ms"]["tpot"] / m["percentiles_ms"]["tpot"] - 1, 3),
            "tokens_per_s_error": (round(p["output_tokens_per_s"] / m["output_tokens_per_s"] - 1, 3)
                                   if p["output_tokens_per_s"] else None),
            "meets_slo_predicted": p["meets_slo"], "meets_slo_measured": m["percentiles_ms"]["tpot"] <= slo.tpot_ms,
        }
    out = {"what": "Capacity predicted from a closed-loop run's curves, checked by an open-loop run at a rate the first "
                   "run did not test (docs/capacity.md)",
           "provenance": result_provenance(), "command": " ".join(["python", *sys.argv]),
           "commit": commit.stdout.strip() or "unknown", "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "config": str(CONFIG.relative_to(ROOT)), "slo": slo.describe(), "rate_rps": rate,
           "runs": {"closed": closed_run, "open": open_run},
           "capacity": capacity["arms"], "capacity_ratio": capacity["capacity_ratio"],
           "predicted": prediction, "measured_open_loop": measured, "comparison": comparison}
    path = ROOT / "benchmarks" / "results" / "capacity-check.json"
    path.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(comparison, indent=2), file=sys.stderr)
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
