"""Lookahead decoding on the CPU reference engine: the demo target alone vs the same target with
the lookahead proposer (and, for scale, the n-gram proposer, the other model-free method), greedy,
batch 1, the arms alternating request by request per prompt category (a slow spell on a shared
machine hits every arm alike). Per category and arm: tokens/s (wall and per CPU-second), speedup,
τ (mean acceptance length: 1 + accepted ÷ verify steps), tokens per target pass, and whether
the outputs equal the baseline's (lossless: they must).

Reads the builtin ``tiny-target`` (``pipeline.demo.resolve_builtin``) and
``prompts/tiny/*.jsonl``; writes ``benchmarks/results/lookahead.json`` with the command,
commit, date and machine. Usage: ``python benchmarks/bench_lookahead.py [--prompts N]
[--max-tokens N] [--window W --ngram N --verification-set G]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.infra.provenance import result_provenance  # noqa: E402 - after the path set-up above


def _prompts(per_category: int) -> dict[str, list[str]]:
    prompts: dict[str, list[str]] = {}
    for path in sorted((ROOT / "prompts" / "tiny").glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                row = json.loads(line)
                prompts.setdefault(row.get("category", path.stem), []).append(row["prompt"])
    return {c: p[:per_category] for c, p in sorted(prompts.items())}


def _row(arm, base) -> dict:
    return {
        "tokens_per_s": round(arm.tokens_per_s, 2), "speedup": round(arm.tokens_per_s / base.tokens_per_s, 3),
        "speedup_cpu": round(arm.cpu_tokens_per_s / base.cpu_tokens_per_s, 3),
        "tau": round(1 + arm.accepted / arm.verify_steps, 3) if arm.verify_steps else 1.0,
        "tokens_per_target_pass": round(arm.tokens / arm.decode_steps, 3) if arm.decode_steps else 0.0,
        "acceptance_rate": round(arm.accepted / arm.drafted, 4) if arm.drafted else 0.0,
        "outputs_match": arm.outputs == base.outputs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--prompts", type=int, default=4, help="prompts per category")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--window", type=int, default=4)
    parser.add_argument("--ngram", type=int, default=3)
    parser.add_argument("--verification-set", type=int, default=4)
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "lookahead.json")
    args = parser.parse_args()

    from pipeline.engine_bench import Arm, _encode, _record, resolve_checkpoint
    from pipeline.reference.api import GenerationRequest
    from pipeline.reference.engine import create_engine, set_threads

    set_threads(1)
    target = resolve_checkpoint("builtin:tiny-target")
    encode = _encode(target)
    specs = {
        "lookahead": {"method": "lookahead", "max_window_size": args.window, "max_ngram_size": args.ngram,
                      "max_verification_set_size": args.verification_set},
        "ngram": {"method": "ngram", "max_draft_len": 4, "max_matching_ngram_size": 3},
    }
    limits = dict(max_batch_size=1, max_seq_len=512, prefix_cache_entries=0)
    engines = {"baseline": create_engine(target, **limits)}
    engines.update({name: create_engine(target, role="speculative", proposer=spec, **limits)
                    for name, spec in specs.items()})
    results = []
    try:
        for category, texts in _prompts(args.prompts).items():
            arms = {name: Arm(outputs=[]) for name in engines}
            for prompt in (encode(t) for t in texts):
                for name, engine in engines.items():  # alternating: baseline, lookahead, ngram, baseline, …
                    start, cpu_start = time.perf_counter(), time.process_time()
                    result = engine.generate(GenerationRequest(prompt, args.max_tokens))  # EOS ignored: fixed length
                    arms[name].seconds += time.perf_counter() - start
                    arms[name].cpu_seconds += time.process_time() - cpu_start
                    _record(arms[name], result)
            for name in specs:
                row = {"category": category, "method": name, **_row(arms[name], arms["baseline"])}
                results.append(row)
                print(f"{category:<11} {name:<9} τ {row['tau']:.2f}  tokens/pass {row['tokens_per_target_pass']:.2f}  "
                      f"speedup {row['speedup']:.2f}x (cpu {row['speedup_cpu']:.2f}x)  match {row['outputs_match']}",
                      file=sys.stderr)
    finally:
        for engine in engines.values():
            engine.shutdown()
    report = {
        "provenance": {**result_provenance(), "machine_note": "shared machine: compare arms within this run only"},
        "settings": {"prompts_per_category": args.prompts, "max_tokens": args.max_tokens, "greedy": True,
                     "batch": 1, "target": "builtin:tiny-target", "proposers": specs},
        "results": results,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
