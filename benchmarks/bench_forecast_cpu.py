"""CPU forecast check: for each tiny CPU config, calibrate the reference engine's cost model, run
`specdeploy bench` (baseline vs speculative, batch 1 and 8), calibrate again, and compare the
forecast (both calibrations averaged, the bench's measured tokens per target pass as τ) with the
measured decode speedup (TPOT ratio) at every batch. Calibration and measurement run side by side
in one process, so a machine shared with others slows both alike.

Writes ``benchmarks/results/forecast-cpu.json`` (command, commit, date, machine, per config and
batch: forecast, measured, error, the engine's efficiency = measured ÷ forecast against its goal
≥ 0.9). Usage: ``python benchmarks/bench_forecast_cpu.py [--prompts N] [--max-tokens N] [--only NAME]``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from pipeline.forecast.calibration_prompts import HELD_OUT, held_out_groups  # noqa: E402 - after the path set-up above
from pipeline.infra.provenance import result_provenance  # noqa: E402 - after the path set-up above

CONFIGS = ("tiny-cpu-draft-target", "tiny-cpu-medusa", "tiny-cpu-eagle", "tiny-cpu-eagle3", "tiny-cpu-ngram")
TOLERANCE = 0.15
EFFICIENCY_GOAL = 0.9
BATCHES = (1, 8)


def _commit() -> str:
    out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def _measured_acceptance(results: list[dict], method: str, batch: int) -> tuple[float, float, float]:
    """(tokens per target pass, τ per verify step, coverage: the fraction of passes with drafts),
    pooled over the categories: tokens per pass = f·τ + (1 − f)."""
    rows = [r for r in results if r["method"] == method and r["batch"] == batch]
    tokens = sum(r["tokens"] for r in rows)
    passes = sum(r["tokens"] / r["tokens_per_target_pass"] for r in rows if r["tokens_per_target_pass"])
    per_pass = tokens / passes
    verify_passes = sum(r["tokens"] / r["tokens_per_target_pass"] * min(1.0, (r["tokens_per_target_pass"] - 1)
                        / (r["mean_acceptance_length"] - 1)) for r in rows
                        if r["tokens_per_target_pass"] and r["mean_acceptance_length"] > 1)
    coverage = min(1.0, verify_passes / passes) if passes else 1.0
    tau = 1 + (per_pass - 1) / coverage if coverage else 1.0
    return per_pass, tau, coverage


def check_config(name: str, prompts: int, max_tokens: int) -> dict:
    from pipeline.config import load_config
    from pipeline.engine_bench import _encode, load_prompts, proposer_spec, resolve_checkpoint, run_bench
    from pipeline.forecast.cpu import average_calibrations, calibrate
    from pipeline.forecast.model import bench_forecast

    path = ROOT / "configs" / f"{name}.yaml"
    cfg = load_config(path)
    target = resolve_checkpoint(cfg.target.checkpoint)
    draft = resolve_checkpoint(cfg.draft.checkpoint) if cfg.draft is not None else None
    encode = _encode(target)
    lengths = [len(encode(p)) for ps in load_prompts(cfg, prompts).values() for p in ps]
    context = int(sum(lengths) / len(lengths) + max_tokens / 2)
    spec = proposer_spec(cfg)
    prompt_len = sum(lengths) / len(lengths)
    # calibration: held-out prompts of the same files (index HELD_OUT on, as many per category as the bench
    # measures, one category per generation as the bench batches them); the bench measures the first
    # `prompts` of each category, never these
    held = held_out_groups(load_prompts(cfg, HELD_OUT + prompts), encode, per_category=prompts, strict=True)
    # the bench measures batch 1 and 8 only, so only those are calibrated (a `run` calibrates its
    # concurrency sweep's sizes too, CALIBRATED_BATCHES)
    before = calibrate(target, draft, threads=cfg.reference.threads, reps=5, proposer=spec, prompt_groups=held,
                       batches=BATCHES)
    bench = run_bench(path, prompts_per_category=prompts, max_tokens=max_tokens, batches=BATCHES)
    after = calibrate(target, draft, threads=cfg.reference.threads, reps=5, proposer=spec, prompt_groups=held,
                      batches=BATCHES)
    calibration = average_calibrations(before, after)
    rows = []
    for summary in (s for s in bench["summary"] if s["scope"] == "all" and s["method"] == cfg.method):
        batch = summary["batch"]
        per_pass, tau, coverage = _measured_acceptance(bench["results"], cfg.method, batch)
        e2e, forecast = bench_forecast(cfg, calibration, tau, coverage, context, prompt_len, max_tokens, batch)
        measured = summary["decode_speedup"]
        measured_cpu = summary["speedup_cpu"]
        rows.append({"batch": batch, "tau_per_target_pass": round(per_pass, 3), "tau_per_verify_step": round(tau, 3),
                     "draft_coverage": round(coverage, 3),
                     # CPU-time, end to end (prefill included): what other processes on the shared
                     # cores distort least — the check's primary figure
                     "forecast_e2e_speedup": round(e2e, 3), "measured_cpu_time_speedup": measured_cpu,
                     "error": round(e2e / measured_cpu - 1, 3) if measured_cpu else None,
                     "within_15pct": bool(measured_cpu) and abs(e2e / measured_cpu - 1) <= TOLERANCE,
                     "efficiency": round(measured_cpu / e2e, 3) if e2e else None,
                     "efficiency_goal": EFFICIENCY_GOAL,
                     # wall-clock decode-only view (TPOT ratio), noisier on a shared machine
                     "forecast_decode_speedup": round(forecast, 3), "measured_decode_speedup": measured,
                     "decode_error": round(forecast / measured - 1, 3) if measured else None,
                     "measured_wall_e2e_speedup": summary["speedup"]})
        print(f"{name} batch {batch}: forecast {e2e:.2f}x, measured (CPU time) {measured_cpu:.2f}x, "
              f"efficiency {measured_cpu / e2e:.2f} (goal ≥ {EFFICIENCY_GOAL}); decode: forecast {forecast:.2f}x, "
              f"measured (wall) {measured:.2f}x", file=sys.stderr)
    return {"config": name, "method": cfg.method, "context_tokens": context, "prompt_tokens": round(prompt_len, 3),
            "max_tokens": max_tokens, "rows": rows,
            "calibration_before": {k: before[k] for k in ("forward_fits", "engine_step_s", "engine_overhead_s", "proposer_s", "spec_step_extra_s", "prompts")},
            "calibration_after": {k: after[k] for k in ("forward_fits", "engine_step_s", "engine_overhead_s", "proposer_s", "spec_step_extra_s", "prompts")}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--only", action="append", choices=CONFIGS)
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "forecast-cpu.json")
    args = parser.parse_args()
    if args.prompts > HELD_OUT:
        parser.error(f"--prompts above {HELD_OUT} would measure the calibration's held-out prompts")
    from pipeline.forecast.cpu import machine

    out = {"provenance": result_provenance(), "command": " ".join(["python", *sys.argv]), "commit": _commit(),
           "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": machine(),
           "note": ("shared machine (other helpers' jobs on the 2 cores); calibration and bench side by side in one "
                    "process; calibration data and check data are separate runs on separate prompts: the calibration "
                    "times held-out prompts (index 30 on of each category's file, one category per generation) before and after the bench, the "
                    "check measures the first --prompts of each category in `specdeploy bench`; nothing is fitted "
                    "to the bench's measurement"),
           "tolerance": TOLERANCE, "configs": []}
    for name in args.only or CONFIGS:
        out["configs"].append(check_config(name, args.prompts, args.max_tokens))
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
