"""EAGLE head training variants: does a better-trained head close the EAGLE speedup gap?

For each variant of the demo recipe (:class:`pipeline.demo.train.Recipe` overrides of the
EAGLE fields), retrains only ``tiny-eagle`` against the committed target (into a temporary copy
of the demo artifacts), then runs ``specdeploy bench`` on ``configs/tiny-cpu-eagle.yaml`` with
that head at batch 1 (baseline and EAGLE interleaved request by request). Writes
``benchmarks/results/eagle-training.json``: per variant the overrides, training seconds,
held-out one-step agreement, and the in-domain / all-category batch-1 rows (speedup, τ, tokens/s).
Each variant records whether the head's files hash as the shipped ones (training is
deterministic: the variant with the committed recipe's settings must say true). Usage:
``python benchmarks/bench_eagle_training.py [--prompts N] [--variant NAME ...]`` (~2 min a variant).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from pipeline.infra.provenance import result_provenance  # noqa: E402 - after the path set-up above

VARIANTS = {  # explicit EAGLE fields, so a name means the same whatever the recipe's defaults
    "one_pass": {"eagle_unroll": 1},
    "two_passes": {"eagle_unroll": 2},
    "three_passes": {"eagle_unroll": 3},
    "one_pass_token_loss1": {"eagle_unroll": 1, "eagle_token_loss": 1.0},
    "two_passes_token_loss1": {"eagle_unroll": 2, "eagle_token_loss": 1.0},
    "one_pass_steps800": {"eagle_unroll": 1, "eagle_steps": 800},
}
CONFIG = ROOT / "configs" / "tiny-cpu-eagle.yaml"


def train_variant(overrides: dict, workdir: Path) -> tuple[Path, dict]:
    from pipeline.demo import train

    artifacts = workdir / "artifacts"
    shutil.copytree(ROOT / "pipeline" / "demo" / "artifacts", artifacts)
    for path in artifacts.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    recipe = dataclasses.replace(train.FULL, **overrides)
    report = train.train_all(artifacts, recipe, only=train.EAGLE, show_progress=False)
    return artifacts / train.EAGLE, {
        "training_seconds": report["retrained"][-1]["seconds"].get("eagle"),
        "one_step_agreement": report["quality"]["eagle_one_step_agreement"],
    }


def same_files(a: Path, b: Path) -> bool:
    from pipeline.demo.saving import sha256_file

    names = sorted(p.name for p in a.iterdir() if p.is_file())
    return names == sorted(p.name for p in b.iterdir() if p.is_file()) and all(
        sha256_file(a / n) == sha256_file(b / n) for n in names)


def bench_head(head_dir: Path, workdir: Path, prompts: int) -> list[dict]:
    from pipeline.engine_bench import run_bench

    cfg = yaml.safe_load(CONFIG.read_text(encoding="utf-8"))
    cfg["speculation"]["head_dir"] = str(head_dir)
    cfg["loadtest"]["prompts"] = str(ROOT / cfg["loadtest"]["prompts"])
    path = workdir / "eagle.yaml"
    path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    report = run_bench(path, prompts_per_category=prompts, batches=(1,))
    keys = ("scope", "speedup", "mean_acceptance_length", "acceptance_rate", "tokens_per_s", "baseline_tokens_per_s")
    return [{k: row[k] for k in keys} for row in report["summary"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--prompts", type=int, default=16, help="prompts per category")
    parser.add_argument("--variant", action="append", choices=sorted(VARIANTS), help="repeatable; default all")
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "eagle-training.json")
    args = parser.parse_args()

    from pipeline.demo import resolve_builtin

    committed = Path(resolve_builtin("builtin:tiny-eagle"))
    results = {}
    for name in args.variant or VARIANTS:
        with tempfile.TemporaryDirectory(prefix=f"eagle-{name}-") as tmp:
            workdir = Path(tmp)
            started = time.perf_counter()
            head_dir, training = train_variant(VARIANTS[name], workdir)
            row = {"overrides": VARIANTS[name], **training, "same_files_as_committed": same_files(head_dir, committed),
                   "batch1": bench_head(head_dir, workdir, args.prompts)}
            row["wall_seconds"] = round(time.perf_counter() - started, 1)
        results[name] = row
        in_domain = next(r for r in row["batch1"] if r["scope"] == "in_domain")
        print(f"{name}: trained {row['training_seconds']} s, in-domain tau {in_domain['mean_acceptance_length']:.2f}, "
              f"speedup {in_domain['speedup']:.2f}x", file=sys.stderr)
    out = {
        "what": "EAGLE head retrained with recipe variants against the committed target; batch-1 bench "
                "(configs/tiny-cpu-eagle.yaml: chain of 5, int8 head) of each, baseline interleaved",
        "prompts_per_category": args.prompts,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "variants": results,
        "provenance": result_provenance(),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
