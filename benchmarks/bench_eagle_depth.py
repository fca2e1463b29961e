"""EAGLE chain depth sweep: ``specdeploy bench`` of ``configs/tiny-cpu-eagle.yaml`` with
``speculation.num_layers`` (the chain length) set to each depth, batch 1, greedy, in-domain
prompts, the depths taking turns over two rounds (a slow spell on the shared machine hits them
alike). Deeper chains accept more tokens a step (τ) but cost a draft step and a verify row each.

Reads the config and the demo models; writes ``benchmarks/results/eagle-depth.json``.
Usage: ``python benchmarks/bench_eagle_depth.py [--depths 4 5 6 7] [--rounds 2] [--prompts 8]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from pipeline.infra.provenance import result_provenance  # noqa: E402 - after the path set-up above

CONFIG = ROOT / "configs" / "tiny-cpu-eagle.yaml"


def config_with_depth(depth: int, workdir: Path) -> Path:
    data = yaml.safe_load(CONFIG.read_text())
    data["speculation"]["num_layers"] = depth
    data["loadtest"]["prompts"] = str(ROOT / data["loadtest"]["prompts"])
    path = workdir / f"eagle-depth-{depth}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def main() -> None:
    from pipeline.engine_bench import run_bench

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--depths", type=int, nargs="+", default=[4, 5, 6, 7])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=8, help="prompts per category")
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "eagle-depth.json")
    args = parser.parse_args()
    runs: dict[int, list[dict]] = {d: [] for d in args.depths}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.rounds):
            for depth in args.depths:
                report = run_bench(config_with_depth(depth, Path(tmp)), prompts_per_category=args.prompts, batches=(1,))
                row = next(s for s in report["summary"] if s["scope"] == "in_domain")
                runs[depth].append({k: row[k] for k in ("speedup", "mean_acceptance_length", "acceptance_rate",
                                                        "tokens_per_s", "baseline_tokens_per_s", "outputs_match")})
                print(f"depth {depth}: {row['speedup']:.3f}x  tau {row['mean_acceptance_length']:.2f}  "
                      f"baseline {row['baseline_tokens_per_s']:.0f} tok/s", file=sys.stderr)
    summary = {d: round(sum(r["speedup"] for r in rs) / len(rs), 3) for d, rs in runs.items()}
    args.output.write_text(json.dumps({
        "what": "EAGLE chain depth sweep, configs/tiny-cpu-eagle.yaml (int8 head) with num_layers = depth; "
                "specdeploy bench batch 1, greedy, in-domain summary; depths take turns each round",
        "config": str(CONFIG.relative_to(ROOT)), "rounds": args.rounds, "prompts_per_category": args.prompts,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "mean_speedup": summary, "runs": runs, "provenance": result_provenance(),
    }, indent=2) + "\n", encoding="utf-8")
    print(f"mean speedup per depth: {summary}; wrote {args.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
