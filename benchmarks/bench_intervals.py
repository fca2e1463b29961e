"""Coverage and false-GO rates of the report's intervals and gate, by simulation (issue 42).

Runs the simulation of ``tests/unit/interval_simulation.py`` (A/A and A/B with known effects at
2, 3, 5 and 10 repeat pairs, run-level log-normal noise CV 5–30 %, a 10 % linear drift over the
run) for the report's paired t interval and, side by side, the unpaired percentile bootstrap the
report used before issue 42; drives the real gate at fixed repeats for both, and with
``repeats: auto``'s stopping rule with and without Bonferroni alpha spending.

Writes ``benchmarks/results/intervals.json`` (provenance; ``coverage`` rows per method, n, CV and
true ratio; ``gate`` rows: GO / NO-GO / INCONCLUSIVE rates per method at fixed n; ``auto`` rows:
the same with stopping, and the median repeats it took). Deterministic (fixed seeds); no timing.
Usage: ``python benchmarks/bench_intervals.py [--trials N]``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from pipeline.infra.provenance import result_provenance  # noqa: E402 - after the path set-up above
from tests.unit import interval_simulation as sim  # noqa: E402 - as above


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=4000, help="trials per coverage setting (new method)")
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "intervals.json")
    args = parser.parse_args()
    trials_old = max(200, args.trials // 4)  # the bootstrap is a thousand times the work per trial
    gate_trials = max(200, args.trials // 4)

    coverage = ([{"method": "paired t (report)", **r} for r in sim.coverage(sim.new_interval, trials=args.trials)]
                + [{"method": "unpaired percentile bootstrap (before issue 42)", **r}
                   for r in sim.coverage(sim.old_bootstrap, trials=trials_old)])
    gate = []
    for method in ("new", "old"):
        for n in sim.N_PAIRS:
            for cv in sim.CVS:
                for effect in (1.0, 0.9, 0.8, 0.5):
                    gate.append(sim.gate_rates(n, cv, effect, trials=gate_trials, method=method))
    auto = []
    for spend in (True, False):
        for cv in sim.CVS:
            for effect in (1.0, 0.9, 0.8, 0.5):
                auto.append(sim.auto_rates(cv, effect, min_repeats=3, max_repeats=8, trials=gate_trials, spend=spend))
        for cv in (0.1, 0.2):  # the tiny CPU configs' caps
            for effect in (1.0, 0.9, 0.5):
                auto.append(sim.auto_rates(cv, effect, min_repeats=3, max_repeats=5, trials=gate_trials, spend=spend))

    def worst(rows, key, pick):
        return pick(r[key] for r in rows)

    summary = {
        "min_coverage": {m: worst([r for r in coverage if r["method"] == m], "coverage", min)
                         for m in sorted({r["method"] for r in coverage})},
        "max_false_go_fixed": {m: max(r["go"] for r in gate if r["method"] == m and r["effect"] >= 0.9)
                               for m in ("new", "old")},
        "max_aa_no_go_fixed": {m: max(r["no_go"] for r in gate if r["method"] == m and r["effect"] == 1.0)
                               for m in ("new", "old")},
        "max_false_go_auto": {("alpha spent over looks" if s else "every look at 95 %"):
                              max(r["go"] for r in auto if r["spend"] is s and r["effect"] >= 0.9) for s in (True, False)},
    }
    out = {"what": "coverage of the 95 % run-level interval and false-GO rates of the gate, simulated (issue 42)",
           "provenance": result_provenance(),
           "simulation": {"n_pairs": list(sim.N_PAIRS), "cv": list(sim.CVS), "drift_total": sim.DRIFT,
                          "order": "counterbalanced A B, B A", "trials_coverage_new": args.trials,
                          "trials_coverage_old": trials_old, "trials_gate": gate_trials,
                          "gate": "pipeline.config.GateSettings() defaults (tpot/e2e ratio max 0.9, alpha 0.05)",
                          "false_go": "GO while the true TPOT/E2E ratio is 0.9 (the threshold) or 1 (A/A)"},
           "summary": summary, "coverage": coverage, "gate": gate, "auto": auto}
    args.output.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(summary, indent=1), file=sys.stderr)
    print(f"wrote {args.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
