"""Served vs in-process speed on CPU: for the baseline and each speculation method, tokens/s of
greedy generation at concurrency 1 through Triton (gRPC streaming, the model the load tester
calls: ``ensemble`` or ``tensorrt_llm_bls``) divided by tokens/s of the same engine in-process
(target ≥ 0.9), and the speculative speedup measured through Triton (streaming, concurrency 1),
side by side in one run. Writes ``benchmarks/results/served.json``.

The served client keeps one gRPC channel and stream open per arm (as a service or a Locust user
does), so channel setup is not counted. Draft-target is measured twice: ``draft_target`` drafts in
the engine (``orchestration: engine``, ensemble) and ``draft_target_bls`` is upstream's BLS flow
(two model calls per round); both are compared with the same in-process speculative engine. As a
diagnostic, ``served_direct`` calls ``tensorrt_llm`` itself with token ids (no ensemble hop).

Models: ``--source random`` (default) uses the tiny random checkpoints of the serving tests (the
draft is a perturbed target, so draft-target accepts often; random Medusa/EAGLE heads accept
almost nothing — their speedup is the overhead of speculating); ``--source demo`` uses the
built-in demo models (``pipeline.demo``; trains them on first use).

Usage: ``python benchmarks/bench_served.py [--source random|demo] [--prompts N] [--max-tokens N]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "integration"))
from pipeline.infra.provenance import result_provenance  # noqa: E402 - after the path set-up above

os.environ.setdefault("OMP_NUM_THREADS", "1")

PROMPTS = [
    "def add(a, b):", "The quick brown fox", "1 + 2 = 3, 2 + 3 =", "name: tiny\nvalue:",
    "Speculative decoding drafts", "items: [a, b,",
]
METHODS = ("draft_target", "draft_target_bls", "medusa", "eagle")
SWITCH_INTERVAL_S = 0.0005  # = pipeline.triton_models.llm.SWITCH_INTERVAL_S (stub-only module)


def models_for(source: str, workdir: Path) -> tuple[dict, int]:
    if source == "demo":
        from pipeline.demo import resolve_builtin

        return {name: resolve_builtin(f"tiny-{name}") for name in ("target", "draft", "medusa", "eagle")}, 4
    import tiny_deploy

    return tiny_deploy.make_models(workdir / "models"), tiny_deploy.K


class InProcess:
    """The same engine loaded in this process (the control)."""

    def __init__(self, engine_dir: Path, end_id, cpus=None):
        import torch

        from pipeline.reference.engine import load_engine

        torch.set_num_threads(1)
        sys.setswitchinterval(SWITCH_INTERVAL_S)  # as in the served model: a fair, not a handicapped, control
        self.engine = load_engine(engine_dir, cpus=cpus)  # on the core the served engine gets
        self.end_id = end_id

    def run(self, ids: list[int], max_tokens: int) -> int:
        from pipeline.reference.api import GenerationRequest, SamplingParams

        result = self.engine.generate(GenerationRequest(input_ids=ids, max_new_tokens=max_tokens, end_id=self.end_id,
                                                        sampling=SamplingParams(top_k=1)))
        return len(result.output_ids)


def served_run(session, target, prompt: str, max_tokens: int) -> int:
    from triton_clients import text_inputs

    responses = session.generate(target.model_name, text_inputs(
        prompt, max_tokens, stream=True, top_k=1, return_num_output_tokens=True, **target.extra_inputs))
    return sum(int(r["num_output_tokens"].reshape(-1)[0]) for r in responses if "num_output_tokens" in r)


def direct_run(session, ids: list[int], max_tokens: int, end_id) -> int:
    """``tensorrt_llm`` itself, streaming token ids (the ensemble's pre/post hops left out)."""
    import numpy as np

    inputs = {
        "input_ids": np.array([ids], dtype=np.int32), "input_lengths": np.array([[len(ids)]], dtype=np.int32),
        "request_output_len": np.array([[max_tokens]], dtype=np.int32), "streaming": np.array([[True]]),
        "runtime_top_k": np.array([[1]], dtype=np.int32), "exclude_input_in_output": np.array([[True]]),
        "return_num_output_tokens": np.array([[True]]),
    }
    if end_id is not None:
        inputs["end_id"] = np.array([[end_id]], dtype=np.int32)
    responses = session.generate("tensorrt_llm", inputs)
    return sum(int(r["num_output_tokens"].reshape(-1)[0]) for r in responses if "num_output_tokens" in r)


def interleaved(runners: dict, prompts: list[str], prompt_ids, rounds: int) -> dict:
    """Alternate the ways of generating prompt by prompt (order reversed every round), so all
    see the same machine load (these CPUs are shared and noisy). Besides the totals, each way
    gets the per-generation speed of every (round, prompt) pair, for paired ratios."""
    for _ in range(2):  # warm-up (first generations pay one-off allocation costs)
        for run in runners.values():
            run(prompts[0], prompt_ids[0])
    totals = {side: [0, 0.0] for side in runners}
    pairs: dict[str, list[float]] = {side: [] for side in runners}
    for round_index in range(rounds):
        order = list(runners) if round_index % 2 == 0 else list(reversed(runners))
        for prompt, ids in zip(prompts, prompt_ids):
            for side in order:
                start = time.perf_counter()
                tokens = runners[side](prompt, ids)
                seconds = time.perf_counter() - start
                totals[side][0] += tokens
                totals[side][1] += seconds
                pairs[side].append(tokens / seconds)
    return {side: {"tokens": n, "seconds": sec, "tokens_per_s": n / sec, "per_generation_tokens_per_s": pairs[side]}
            for side, (n, sec) in totals.items()}


def paired_ratio(sides: dict, side: str) -> dict:
    """Median and quartiles of served ÷ in-process over generations of the same prompt run back to
    back (robust to load spikes from other tenants of the machine)."""
    import statistics

    ratios = sorted(a / b for a, b in zip(sides[side]["per_generation_tokens_per_s"],
                                          sides["in_process"]["per_generation_tokens_per_s"]))
    q1, median, q3 = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
    return {"median": median, "q1": q1, "q3": q3, "n": len(ratios)}


def measure_method(workdir: Path, models: dict, method: str, k: int, prompts: list[str], max_tokens: int,
                   rounds: int, cpu_pinning: str = "auto", engine_process: str = "own") -> dict:
    import tiny_deploy
    from pipeline.config import load_config
    from pipeline.infra.cpu_pinning import spawn_on
    from pipeline.render.renderer import client_target, drafts_in_engine, load_manifest, render
    from pipeline.serve.server import serve_deployment
    from pipeline.triton_models.tokenizer import TextTokenizer
    from triton_clients import StreamSession

    previous = Path.cwd()
    os.chdir(workdir)
    try:
        options = {}
        if method.startswith("draft_target"):
            options = {"orchestration": "bls" if method == "draft_target_bls" else "engine",
                       "name": method.replace("_", "-")}
        cfg = load_config(tiny_deploy.make_deployment(workdir, models, method.removesuffix("_bls"), k=k,
                                                      reference={"cpu_pinning": cpu_pinning,
                                                                 "engine_process": engine_process}, **options))
        render(cfg)
        manifest = load_manifest(cfg)
        tokenizer = TextTokenizer(manifest["tokenizer_dir"])
        prompt_ids = [tokenizer.encode(p) for p in prompts]
        result = {}
        for variant in ("baseline", "speculative"):
            target = client_target(cfg, variant)
            with serve_deployment(cfg, variant) as server, spawn_on(server.cpu_plan.other_cpus if server.cpu_plan else None):
                # the server's CPU plan (reference.cpu_pinning) holds for both sides: the in-process
                # engine decodes on the core the served one gets; this client (and the gRPC threads
                # it starts) runs on the others
                plan = server.cpu_plan
                local = InProcess(Path(manifest["engines"][variant]), tokenizer.end_id,
                                  plan.engine_cpus.get("tensorrt_llm") if plan else None)
                session = StreamSession(server.grpc_url)
                runners = {"in_process": lambda p, ids: local.run(ids, max_tokens),  # noqa: B023 - used only inside this iteration
                           "served": lambda p, ids: served_run(session, target, p, max_tokens)}  # noqa: B023 - used only inside this iteration
                if variant == "baseline" or method != "draft_target_bls":
                    runners["served_direct"] = lambda p, ids: direct_run(session, ids, max_tokens, tokenizer.end_id)  # noqa: B023 - used only inside this iteration
                try:
                    sides = interleaved(runners, prompts, prompt_ids, rounds)
                except Exception:
                    print(f"{method} {variant}: server alive={server.alive()}; log tail:\n{server.log_tail(30)}", file=sys.stderr)
                    raise
                finally:
                    session.close()
                    local.engine.shutdown()
            sides["served"].update(model=target.model_name, extra_inputs=target.extra_inputs)
            inproc = sides["in_process"]["tokens_per_s"]
            result[variant] = {**sides, "cpu_pinning": plan.as_dict() if plan else None,
                               "served_over_in_process": sides["served"]["tokens_per_s"] / inproc,
                               "served_over_in_process_paired": paired_ratio(sides, "served")}
            if "served_direct" in sides:
                result[variant]["served_direct_over_in_process"] = sides["served_direct"]["tokens_per_s"] / inproc
                result[variant]["served_direct_over_in_process_paired"] = paired_ratio(sides, "served_direct")
            paired = result[variant]["served_over_in_process_paired"]
            print(f"{method:16s} {variant:11s} in-process {inproc:7.1f} tok/s  served {sides['served']['tokens_per_s']:7.1f} "
                  f"tok/s  ratio {result[variant]['served_over_in_process']:.3f} (paired median {paired['median']:.3f} "
                  f"[{paired['q1']:.3f}, {paired['q3']:.3f}])  direct "
                  f"{result[variant].get('served_direct_over_in_process', float('nan')):.3f}", file=sys.stderr)
        result["orchestration"] = ("engine" if drafts_in_engine(cfg) else "bls") if cfg.method == "draft_target" else None
        result["speedup_served"] = result["speculative"]["served"]["tokens_per_s"] / result["baseline"]["served"]["tokens_per_s"]
        result["speedup_in_process"] = (result["speculative"]["in_process"]["tokens_per_s"]
                                        / result["baseline"]["in_process"]["tokens_per_s"])
        print(f"{method:16s} speculative speedup through Triton {result['speedup_served']:.2f}x "
              f"(in-process {result['speedup_in_process']:.2f}x)", file=sys.stderr)
        return result
    finally:
        os.chdir(previous)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", choices=["random", "demo"], default="random")
    parser.add_argument("--prompts", type=int, default=len(PROMPTS))
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=4, help="passes over the prompts")
    parser.add_argument("--methods", nargs="*", default=list(METHODS))
    parser.add_argument("--cpu-pinning", default="auto",
                        help="reference.cpu_pinning for the served deployments and the in-process control: "
                             "auto, off or the engine's CPU ids, comma-separated")
    parser.add_argument("--engine-process", choices=["own", "stub"], default="own",
                        help="reference.engine_process of the served deployments (the in-process control is unchanged)")
    parser.add_argument("--workdir", type=Path, help="keep deployments and server logs here (default: a temp dir)")
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "served.json")
    args = parser.parse_args()
    if args.cpu_pinning not in ("auto", "off"):
        args.cpu_pinning = [int(c) for c in args.cpu_pinning.split(",")]
    prompts = PROMPTS[: args.prompts]
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-served-") as tmp:
        workdir = args.workdir.resolve() if args.workdir else Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        models, k = models_for(args.source, workdir)
        results = {method: measure_method(workdir, models, method, k, prompts, args.max_tokens, args.rounds,
                                            args.cpu_pinning, args.engine_process) for method in args.methods}
    report = {
        "what": "greedy tokens/s at concurrency 1: served (gRPC streaming through Triton, one open stream per "
                "arm) vs in-process, per arm, measured interleaved prompt by prompt; speculative speedup through "
                "Triton; served_direct = tensorrt_llm called with token ids (diagnostic, no ensemble hop)",
        "target_served_over_in_process": 0.9,
        "statistics": "served_over_in_process = total served tokens/s ÷ total in-process tokens/s; "
                      "served_over_in_process_paired = median [q1, q3] of the per-prompt ratios of generations run "
                      "back to back (robust to load spikes on a shared machine)",
        "source": args.source, "num_draft_tokens": k, "prompts": len(prompts), "rounds": args.rounds, "max_tokens": args.max_tokens,
        "cpu_pinning": args.cpu_pinning, "engine_process": args.engine_process,
        "host": {"machine": platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version(),
                 "loadavg_before": load_before, "loadavg_after": os.getloadavg()},
        "note": "shared 2-core machine: compare ratios only within one run; a load average well above the "
                "core count makes single runs noisy (repeat the run, look at the spread)",
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "methods": results,
        "provenance": result_provenance(),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
