"""Reference-engine benchmark: runs ``specdeploy bench`` on the three tiny CPU configs (those that
exist) and writes ``benchmarks/results/engine.json`` — {config: bench report}. Speed is measured
here, never in tests. Usage: ``python benchmarks/bench_engine.py [--prompts N] [--max-tokens N]
[--only NAME ...]`` (``--only``: re-measure those configs, keep the file's other entries).

The speedups here depend on the machine (a faster core makes a verify pass relatively dearer), so
they are not the engine's goal: its goal is its efficiency — measured speedup ÷ the forecast from
its own calibrated forward and drafting costs and its measured acceptance — of at least 0.9, which
``benchmarks/bench_forecast_cpu.py`` measures and prints (docs/forecast.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from pipeline.infra.provenance import result_provenance  # noqa: E402 - after the path set-up above

CONFIGS = ("tiny-cpu-draft-target", "tiny-cpu-medusa", "tiny-cpu-eagle")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--int8", action="store_true", help="also measure the int8 weight-only target")
    parser.add_argument("--draft-int8", action="store_true", help="also measure int8 draft-side weights")
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "engine.json")
    parser.add_argument("--only", action="append", choices=CONFIGS, metavar="NAME",
                        help="re-measure only this config (repeatable); the output file's other entries are kept")
    args = parser.parse_args()

    from pipeline.engine_bench import run_bench

    reports = {}
    if args.only and args.output.is_file():
        reports = json.loads(args.output.read_text(encoding="utf-8"))
    for name in args.only or CONFIGS:
        path = ROOT / "configs" / f"{name}.yaml"
        if not path.is_file():
            print(f"skip {name}: no {path}", file=sys.stderr)
            continue
        peer = "hf" if name.endswith("draft-target") else None
        reports[name] = run_bench(path, prompts_per_category=args.prompts, max_tokens=args.max_tokens,
                                  peer=peer, int8=args.int8, draft_int8=args.draft_int8)
        for row in reports[name]["summary"]:
            print(f"{name}: {row['method']} batch {row['batch']} {row['scope']}: {row['speedup']:.2f}x "
                  f"({row['tokens_per_s']:.0f} vs {row['baseline_tokens_per_s']:.0f} tok/s)", file=sys.stderr)
        scaling = reports[name].get("baseline_scaling")
        if scaling:
            print(f"{name}: baseline batch {scaling['batch']} / batch 1, side by side: {scaling['ratio']:.2f}x "
                  f"(rounds {scaling['per_round']})", file=sys.stderr)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    reports["provenance"] = result_provenance()
    args.output.write_text(json.dumps(reports, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
