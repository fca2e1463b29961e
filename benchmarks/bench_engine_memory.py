"""Engine memory benchmark (not a CI test): does the speculative CPU reference engine's resident
memory stay flat under changing batch compositions, and what makes it grow?

Drives the reference engine in-process (no Triton): the demo draft-target deployment
(``builtin:tiny-target`` + ``builtin:tiny-draft``, K=5, float32, batch 8, the soak's engine)
fed seeded batches of concurrent requests. Every phase runs in a fresh child process, so each
starts from a clean heap; each child samples its own RSS (psutil) and counts the distinct row
counts its forward passes hand the projections (batch x width: the ``M`` of every GEMM).

Phases, for two code versions (``before``: the engine of ``--before-ref``, extracted with
``git archive``; ``after``: this tree):

- ``fixed``: the same batch shape over and over (a bounded set of row counts);
- ``varied``: random batch sizes, prompt lengths and output lengths (many row counts);
- ``varied_cache_capacity`` (before only): ``varied`` with ``ONEDNN_PRIMITIVE_CACHE_CAPACITY``
  set small, a control: if oneDNN's primitive cache alone held the memory, this would be flat;
- ``varied_both_caches_capped`` (before only): ``varied`` with ideep's cache
  (``LRU_CACHE_CAPACITY``; 0 crashes it) and oneDNN's capped at 1: flat if the two caches hold
  all of it — the cause — and what that costs (its tokens/s against ``varied``'s);
- ``kernels`` (both): :func:`pipeline.reference.fast.kernels.linear` alone, per kernel mode, over
  row counts 2…399 twice — which kernel's memory grows with the number of distinct row counts;
- ``speed`` (both, interleaved, ``--speed-repeats`` each): a fixed greedy request list run once
  to warm up, then timed; the outputs of both versions are compared token for token.

The memory phases run without the prefix cache: its fill-up (bounded by
``prefix_cache_entries``) is not what they measure; the soak (``bench_soak.py``) runs the
served configuration with it. ``--before-ref`` defaults to where this branch left ``main``.

Writes JSON to ``--out`` (default ``benchmarks/results/engine-memory.json``); reads the demo
checkpoints and, for ``before``, the git object store.

Usage (from the project root)::

    .venv/bin/python benchmarks/bench_engine_memory.py                 # ~3 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import List, Optional, Union

import torch

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "engine-memory.json"
CONTROL_CAPACITY = "16"


# ----------------------------------------------------------------------------------------------
# The child: one phase in a fresh process


class RssSampler:
    def __init__(self, interval_s: float):
        import psutil

        self._proc, self.interval_s, self.samples = psutil.Process(), interval_s, []
        self._t0, self._stop = time.monotonic(), threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def rss_mb(self) -> float:
        return round(self._proc.memory_info().rss / 2**20, 2)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.samples.append((round(time.monotonic() - self._t0, 2), self.rss_mb()))

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def _record_rows(rows_seen: set) -> None:
    """Count each forward's GEMM row count (batch x width) without touching the kernels."""
    from pipeline.reference import modeling

    forward = modeling.LlamaModel.forward

    def counted(self, pool, inputs):
        rows_seen.add(len(inputs) * max(len(i.tokens) for i in inputs))
        return forward(self, pool, inputs)

    modeling.LlamaModel.forward = counted


def _engine(models: dict, prefix_cache_entries: int = 64):
    from pipeline.reference.engine import create_engine

    spec = {"method": "draft_target", "draft_dir": models["draft"], "num_draft_tokens": 5}
    return create_engine(Path(models["target"]), role="speculative", proposer=spec, max_batch_size=8,
                         max_seq_len=512, compute_dtype="float32", prefix_cache_entries=prefix_cache_entries)


def _batches(kind: str, rng: random.Random, vocab: int):
    """Endless (prompts, max_new_tokens, sampled) batches of concurrent requests."""
    while True:
        if kind == "fixed":
            yield [([rng.randrange(3, vocab) for _ in range(32)], 24, False) for _ in range(4)]
        else:
            yield [([rng.randrange(3, vocab) for _ in range(rng.randint(2, 200))], rng.randint(1, 48),
                    rng.random() < 0.5) for _ in range(rng.randint(1, 8))]


def _run_batch(engine, batch, seed: int) -> list[list[int]]:
    from pipeline.reference.api import GenerationRequest, SamplingParams

    handles = []
    for i, (prompt, new, sampled) in enumerate(batch):
        params = SamplingParams(temperature=0.8, top_k=50, top_p=0.95, seed=seed + i) if sampled else SamplingParams()
        handles.append(engine.submit(GenerationRequest(prompt, new, sampling=params)))
    return [h.result(timeout=300).output_ids for h in handles]


def child_memory(kind: str, seconds: float, warmup_s: float, models: dict, seed: int) -> dict:
    rows_seen: set = set()
    _record_rows(rows_seen)
    engine = _engine(models, prefix_cache_entries=0)  # its bounded fill-up would blur the kernels' growth
    rng, requests, tokens = random.Random(seed), 0, 0
    with RssSampler(0.5) as rss:
        start_mb, t0 = rss.rss_mb(), time.monotonic()
        warm_mb = warm_rows = None
        warm_rows_list: list = []
        for batch in _batches(kind, rng, engine.vocab_size):
            if warm_mb is None and time.monotonic() - t0 >= warmup_s:
                warm_mb, warm_rows, warm_rows_list = rss.rss_mb(), len(rows_seen), sorted(rows_seen)
            if time.monotonic() - t0 >= seconds:
                break
            tokens += sum(len(o) for o in _run_batch(engine, batch, rng.randrange(1 << 30)))
            requests += len(batch)
        end_mb = rss.rss_mb()
    engine.shutdown()
    return {"kind": kind, "seconds": round(time.monotonic() - t0, 1), "requests": requests, "tokens": tokens,
            "rss_mb_after_load": start_mb, "rss_mb_after_warmup": warm_mb, "rss_mb_end": end_mb,
            "growth_mb_after_warmup": round(end_mb - (warm_mb or start_mb), 2),
            "growth_mb_after_load": round(end_mb - start_mb, 2),
            "distinct_row_counts": len(rows_seen), "distinct_row_counts_after_warmup": len(rows_seen) - (warm_rows or 0),
            "max_row_count": max(rows_seen, default=0), "row_counts": sorted(rows_seen),
            "warm_row_counts": warm_rows_list, "rss_series": rss.samples}


def child_kernels() -> dict:
    """RSS growth of kernels.linear per mode over row counts 2..399 (each visited twice)."""
    import psutil
    import torch

    from pipeline.reference.checkpoint import quantize_weight
    from pipeline.reference.fast.linear import FastLinear as Linear

    proc, out = psutil.Process(), {}
    shapes = [(768, 256), (256, 256), (1344, 256), (256, 672)]  # the demo target's projections
    for mode in ("float", "int8", "int8_draft"):
        lins = []
        for o, i in shapes:
            w = torch.randn(o, i, generator=torch.Generator().manual_seed(o * i))
            lins.append(Linear(w) if mode == "float" else Linear(*_q(quantize_weight, w), drafting=mode == "int8_draft"))
        with torch.inference_mode():
            for lin in lins:
                lin(torch.randn(6, lin.weight_t.shape[0] if lin.int8 else lin.operands[0].shape[0]))
            base = proc.memory_info().rss
            marks = []
            for _ in range(2):
                for m in range(2, 400):
                    for lin in lins:
                        lin(torch.randn(m, lin.weight_t.shape[0] if lin.int8 else lin.operands[0].shape[0]))
                marks.append(proc.memory_info().rss)
        out[mode] = {"row_counts": "2..399", "growth_mb_first_pass": round((marks[0] - base) / 2**20, 1),
                     "growth_mb_second_pass": round((marks[1] - marks[0]) / 2**20, 1)}
    out["float_padding_cost"] = _padding_cost(lins_float(shapes))
    return out


def lins_float(shapes):
    import torch

    from pipeline.reference.fast.linear import FastLinear as Linear

    return [Linear(torch.randn(o, i, generator=torch.Generator().manual_seed(o * i))) for o, i in shapes]


def _unpadded_linear(x: torch.Tensor, blocked: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """The float several-row branch of kernels.linear as it was before bucket_rows (scripted the
    same way, so both sides pay the same call overhead)."""
    flat = x.reshape(-1, x.shape[-1])
    no_scalars: List[Optional[Union[float, int, complex]]] = []
    y = torch.ops.mkldnn._linear_pointwise(flat, blocked, bias, "none", no_scalars, "")
    return y.reshape(list(x.shape[:-1]) + [y.shape[-1]])


def _padding_cost(lins, rounds: int = 30) -> dict | None:
    """Per row count: the float projections as the engine runs them (``kernels.linear``, padded
    where this version pads) against the unpadded kernel, interleaved, best of ``rounds``."""
    import torch

    from pipeline.reference.fast import kernels

    if not hasattr(kernels, "bucket_rows"):
        return None
    unpadded = torch.jit.script(_unpadded_linear)
    out = {}
    with torch.inference_mode():
        for rows in (2, 6, 9, 12, 18, 30, 48, 65, 100, 200):
            xs = [torch.randn(rows, lin.operands[0].shape[0]) for lin in lins]
            best = {"engine": float("inf"), "unpadded": float("inf")}
            for _ in range(rounds):
                for name in best:
                    t0 = time.perf_counter()
                    for lin, x in zip(lins, xs):
                        if name == "engine":
                            kernels.linear(x, lin.mode, lin.operands, lin.bias)
                        else:
                            unpadded(x, lin.operands[1], lin.bias)
                    best[name] = min(best[name], time.perf_counter() - t0)
            out[rows] = {"padded_to": kernels.bucket_rows(rows), "engine_us": round(best["engine"] * 1e6, 1),
                         "unpadded_us": round(best["unpadded"] * 1e6, 1),
                         "engine_over_unpadded": round(best["engine"] / best["unpadded"], 3)}
    return out


def _q(quantize, w):
    q, s = quantize(w)
    return q, None, s


def child_speed(models: dict, seed: int, batches: int) -> dict:
    engine = _engine(models)
    rng = random.Random(seed)
    gen = _batches("varied", rng, engine.vocab_size)
    work = [[(p, n, False) for p, n, _ in next(gen)] for _ in range(batches)]  # greedy: deterministic
    for batch in work:
        _run_batch(engine, batch, 0)
    t0 = time.perf_counter()
    outputs = [_run_batch(engine, batch, 0) for batch in work]
    seconds = time.perf_counter() - t0
    engine.shutdown()
    tokens = sum(len(o) for b in outputs for o in b)
    digest = hashlib.sha256(json.dumps(outputs).encode()).hexdigest()
    return {"seconds": round(seconds, 3), "tokens": tokens, "tokens_per_s": round(tokens / seconds, 1),
            "outputs_sha256": digest}


def child_main(args) -> None:
    sys.path.insert(0, args.code_root)
    import torch

    torch.set_num_threads(1)
    models = json.loads(args.models)
    if args.child == "kernels":
        result = child_kernels()
    elif args.child == "speed":
        result = child_speed(models, args.seed, args.speed_batches)
    else:
        result = child_memory(args.child, args.seconds, args.warmup_s, models, args.seed)
    import pipeline

    result["code"] = str(Path(pipeline.__file__).resolve().parent)
    Path(args.result).write_text(json.dumps(result), encoding="utf-8")


# ----------------------------------------------------------------------------------------------
# The parent: phases in children, one JSON


def _run_child(code_root: Path, phase: str, args, models: dict, env_extra: dict | None = None) -> dict:
    sys.path.insert(0, str(ROOT))
    from pipeline.infra.processes import spawn

    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tmp:
        result = Path(tmp.name)
    argv = [sys.executable, str(Path(__file__).resolve()), "--child", phase, "--code-root", str(code_root),
            "--result", str(result), "--models", json.dumps(models), "--seconds", str(args.seconds),
            "--warmup-s", str(args.warmup_s), "--seed", str(args.seed), "--speed-batches", str(args.speed_batches)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env_extra or {})}
    proc = spawn(argv, env=env, cwd=str(ROOT))
    try:
        code = proc.wait(timeout=args.seconds * 4 + 300)
    finally:
        if proc.poll() is None:
            proc.stop()
    if code != 0:
        raise SystemExit(f"phase {phase} ({code_root}) exited with {code}")
    data = json.loads(result.read_text(encoding="utf-8"))
    result.unlink()
    if env_extra:
        data["env"] = env_extra
    print(f"{phase:>24} {code_root.name:>10}: " + json.dumps({k: v for k, v in data.items() if k != "rss_series"}),
          flush=True)
    return data


def _extract(ref: str, dest: Path) -> str:
    commit = subprocess.run(["git", "rev-parse", ref], cwd=ROOT, check=True, capture_output=True, text=True).stdout.strip()
    archive = subprocess.run(["git", "archive", commit, "pipeline", ":(exclude)pipeline/demo/artifacts"],
                             cwd=ROOT, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return commit


def _median(values: list[float]) -> float:
    values = sorted(values)
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def parent_main(args) -> None:
    sys.path.insert(0, str(ROOT))
    from pipeline.demo import resolve_builtin

    models = {"target": str(resolve_builtin("tiny-target")), "draft": str(resolve_builtin("tiny-draft"))}
    out: dict = {"what": __doc__.split("\n\n")[0], "command": [sys.executable, *sys.argv],
                 "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                 "host": {"machine": platform.machine(), "cpus": os.cpu_count(), "loadavg_before": os.getloadavg()},
                 "settings": {k: v for k, v in vars(args).items() if k not in ("child", "code_root", "result", "models")}}
    before_ref = args.before_ref or subprocess.run(["git", "merge-base", "HEAD", "main"], cwd=ROOT, check=True,
                                                   capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="engine-memory-before-") as before_root:
        out["before_commit"] = _extract(before_ref, Path(before_root))
        out["after_commit"] = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                                             text=True).stdout.strip()
        out["after_tree_dirty"] = bool(subprocess.run(["git", "status", "--porcelain", "pipeline"], cwd=ROOT,
                                                      capture_output=True, text=True).stdout.strip())
        arms = {"before": Path(before_root), "after": ROOT}
        phases: dict = {}
        for arm, code in arms.items():
            phases[arm] = {"kernels": _run_child(code, "kernels", args, models)}
            for kind in ("fixed", "varied"):
                phases[arm][kind] = _run_child(code, kind, args, models)
        phases["before"]["varied_cache_capacity"] = _run_child(
            arms["before"], "varied", args, models, {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": CONTROL_CAPACITY})
        phases["before"]["varied_both_caches_capped"] = _run_child(
            arms["before"], "varied", args, models, {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "1", "LRU_CACHE_CAPACITY": "1"})
        speed = {"before": [], "after": []}
        for _ in range(args.speed_repeats):
            for arm, code in arms.items():
                speed[arm].append(_run_child(code, "speed", args, models))
    _add_buckets(phases)
    out["phases"] = phases
    out["speed"] = _speed_summary(speed)
    out["host"]["loadavg_after"] = os.getloadavg()
    out["notes"] = args.note
    sys.path.insert(0, str(ROOT))
    from pipeline.infra.provenance import result_provenance

    out["provenance"] = result_provenance()
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")


def _add_buckets(phases: dict) -> None:
    """The sizes the fixed engine pads each phase's row counts to (kernels.bucket_rows of this
    tree): how many GEMM shapes each phase needs padded, against how many it needs unpadded."""
    from pipeline.reference.fast.kernels import bucket_rows

    for arm in phases.values():
        for phase in arm.values():
            if "row_counts" in phase:
                seen = {bucket_rows(r) if r > 1 else 1 for r in phase["row_counts"]}
                warm = {bucket_rows(r) if r > 1 else 1 for r in phase.pop("warm_row_counts")}
                phase["distinct_buckets"], phase["distinct_buckets_after_warmup"] = len(seen), len(seen - warm)


def _speed_summary(speed: dict) -> dict:
    med = {arm: _median([r["tokens_per_s"] for r in runs]) for arm, runs in speed.items()}
    digests = {r["outputs_sha256"] for runs in speed.values() for r in runs}
    return {"runs": speed, "median_tokens_per_s": med,
            "after_over_before": round(med["after"] / med["before"], 3),
            "greedy_outputs_identical": len(digests) == 1}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=50.0, help="duration of each memory phase")
    p.add_argument("--warmup-s", type=float, default=15.0, help="growth is measured after this")
    p.add_argument("--seed", type=int, default=20)
    p.add_argument("--speed-batches", type=int, default=24, help="request batches of each timed speed pass")
    p.add_argument("--speed-repeats", type=int, default=3)
    p.add_argument("--before-ref", help="the engine version to compare against (git ref; default: "
                                           "git merge-base HEAD main)")
    p.add_argument("--note", default="", help="recorded in the JSON (e.g. what else loads the machine)")
    p.add_argument("--out", default=str(DEFAULT_OUT))
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--code-root", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    p.add_argument("--models", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child_main(args)
    else:
        parent_main(args)


if __name__ == "__main__":
    main()
