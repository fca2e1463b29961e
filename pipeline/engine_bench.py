"""``specdeploy bench``: offline, in-process benchmark of the reference engine — target-only
decoding vs the config's speculation method, side by side in one process, at batch 1 and 8, per
prompt category.

Reads the deployment config (``pipeline.config.load_config``), resolves its checkpoints
(``builtin:`` names via ``pipeline.demo.resolve_builtin``, directories as they are; no
``specdeploy build`` needed), and the prompt set ``prompts/tiny/<category>.jsonl``
(config ``loadtest.prompts``; a few built-in prompts if absent). Returns a JSON-able dict
``{"results": [...], "peer": {...}, ...}``; writes nothing (the CLI prints or saves it).

At batch 1 the two arms alternate request by request (each request timed on its own), so a
slow spell on a shared machine hits both arms alike; at batch 8 each arm runs its batch whole.
Per row: tokens/s of both arms (wall clock; and per CPU-second of this process, ``*_cpu``, which
other processes sharing the cores distort less), speedup, acceptance rate, mean acceptance length τ, and
``efficiency`` = speedup ÷ τ (τ is the speedup bound the measured acceptance implies if drafting
and verification cost nothing extra). ``speedup`` is end-to-end (tokens ÷ request wall time,
prefill included); ``tpot_ms`` / ``decode_speedup`` are the decode-only view, TPOT =
(E2E − TTFT) / (tokens − 1) per arm, from each request's first- and last-token times. ``--peer hf`` adds Hugging Face assisted generation on the
same checkpoints (draft-target only; batch 1; constant draft-length schedule, same K).
``baseline_scaling``: the baseline's batch-8 ÷ batch-1 aggregate tokens/s, the two sizes
alternating over a few rounds on the same in-domain prompts (the batch-8 rows above come minutes
after the batch-1 ones, which a drifting machine skews).
"""

from __future__ import annotations

import json
import platform
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from pipeline.config import BUILTIN_PREFIX, DeploymentConfig, load_config
from pipeline.errors import UsageError

FALLBACK_PROMPTS = {
    "builtin": [
        "The quick brown fox jumps over the lazy dog and",
        "def add(a, b):\n    return",
        "1 + 2 = 3\n2 + 3 =",
        "Once upon a time there was a",
    ]
}


@dataclass
class Arm:
    tokens: int = 0
    seconds: float = 0.0
    cpu_seconds: float = 0.0  # process CPU time: robust to other processes sharing the cores
    drafted: int = 0
    accepted: int = 0
    verify_steps: int = 0
    decode_steps: int = 0  # target passes after prefill, with or without drafts
    decode_seconds: float = 0.0  # Σ per request: last token − first token (TTFT excluded)
    decode_tokens: int = 0  # Σ per request: tokens − 1
    outputs: list | None = None

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def cpu_tokens_per_s(self) -> float:
        return self.tokens / self.cpu_seconds if self.cpu_seconds else 0.0

    @property
    def tpot_ms(self) -> float:
        """Decode latency, TPOT = (E2E − TTFT) / (tokens − 1), pooled over the arm's requests."""
        return 1e3 * self.decode_seconds / self.decode_tokens if self.decode_tokens else 0.0


def resolve_checkpoint(value: str) -> Path:
    if value.startswith(BUILTIN_PREFIX):
        from pipeline.demo import resolve_builtin

        return Path(resolve_builtin(value))
    path = Path(value).expanduser()
    if not path.is_dir():
        raise UsageError(f"checkpoint {value!r} is not a directory")
    return path.resolve()


def proposer_spec(cfg: DeploymentConfig) -> dict:
    spec = _method_spec(cfg)
    if cfg.reference.draft_weights == "int8":
        spec["draft_int8"] = True
    return spec


def _method_spec(cfg: DeploymentConfig) -> dict:
    spec, method = cfg.speculation, cfg.method_info
    if method.proposer is None:
        raise UsageError(f"{cfg.name}: speculation.method is {cfg.method!r}; nothing to compare with "
                         "(the CPU engine has no proposer for it)")
    fields = {"method": method.proposer, **method.proposer_fields(spec)}
    if cfg.draft is not None:
        fields["draft_dir"] = str(resolve_checkpoint(cfg.draft.checkpoint))
    if method.head_field:
        fields[method.head_field] = str(resolve_checkpoint(getattr(spec, method.head_field)))
    return fields


def load_prompts(cfg: DeploymentConfig, per_category: int) -> dict[str, list[str]]:
    candidates = [Path(cfg.loadtest.prompts)]
    if cfg.source_path is not None and not candidates[0].is_absolute():
        candidates += [parent / cfg.loadtest.prompts for parent in cfg.source_path.parents]
    candidates.append(Path("prompts/tiny"))
    for root in candidates:
        files = sorted(root.glob("*.jsonl")) if root.is_dir() else ([root] if root.is_file() else [])
        if files:
            break
    else:
        return {k: v[:per_category] for k, v in FALLBACK_PROMPTS.items()}
    prompts: dict[str, list[str]] = {}
    for path in files:
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                row = json.loads(line)
                prompts.setdefault(row.get("category", path.stem), []).append(row["prompt"])
    wanted = set(cfg.loadtest.categories)
    return {c: p[:per_category] for c, p in sorted(prompts.items()) if not wanted or c in wanted}


def _encode(tokenizer_dir: Path):
    from tokenizers import Tokenizer

    path = tokenizer_dir / "tokenizer.json"
    if not path.is_file():
        raise UsageError(f"{tokenizer_dir}: no tokenizer.json")
    tokenizer = Tokenizer.from_file(str(path))
    return lambda text: tokenizer.encode(text).ids


def run_arm(engine, prompts: list[list[int]], batch: int, max_tokens: int, end_id: int | None) -> Arm:
    from pipeline.reference.api import GenerationRequest

    arm = Arm(outputs=[])
    start, cpu_start = time.perf_counter(), time.process_time()
    if batch == 1:
        results = [engine.generate(GenerationRequest(p, max_tokens, end_id=end_id)) for p in prompts]
    else:  # all at once: the engine keeps max_batch_size (= batch) in flight, the rest queue
        handles = [engine.submit(GenerationRequest(p, max_tokens, end_id=end_id)) for p in prompts]
        results = [h.result(timeout=600) for h in handles]
    for r in results:
        _record(arm, r)
    arm.seconds = time.perf_counter() - start
    arm.cpu_seconds = time.process_time() - cpu_start
    return arm


def run_arms_interleaved(base_engine, spec_engine, prompts: list[list[int]], max_tokens: int,
                         end_id: int | None) -> tuple[Arm, Arm]:
    """Batch 1, the two arms alternating request by request (base, spec, base, spec, …), each
    request timed on its own: a slow spell on a shared machine hits both arms alike instead of
    whichever arm happened to run during it."""
    from pipeline.reference.api import GenerationRequest

    arms = (Arm(outputs=[]), Arm(outputs=[]))
    for prompt in prompts:
        for engine, arm in zip((base_engine, spec_engine), arms):
            start, cpu_start = time.perf_counter(), time.process_time()
            result = engine.generate(GenerationRequest(prompt, max_tokens, end_id=end_id))
            arm.seconds += time.perf_counter() - start
            arm.cpu_seconds += time.process_time() - cpu_start
            _record(arm, result)
    return arms


def _record(arm: Arm, result) -> None:
    arm.tokens += len(result.output_ids)
    arm.drafted += result.stats.draft_tokens
    arm.accepted += result.stats.accepted_tokens
    arm.verify_steps += result.stats.verify_steps
    arm.decode_steps += result.stats.decode_steps
    if len(result.output_ids) > 1:
        arm.decode_seconds += (result.stats.last_token_time_ns - result.stats.first_token_time_ns) / 1e9
        arm.decode_tokens += len(result.output_ids) - 1
    arm.outputs.append(result.output_ids)


SCALING_ROUNDS = 3


def baseline_scaling(engine, prompts: list[list[int]], batch: int, max_tokens: int, end_id: int | None,
                     rounds: int = SCALING_ROUNDS) -> dict:
    """The baseline's aggregate tokens/s at ``batch`` ÷ at batch 1, measured side by side: each
    round runs the same prompts one by one, then ``batch`` at a time (2 × batch requests), so a
    slow spell on a shared machine hits both sizes alike. Pooled ratio and the per-round ones."""
    single, batched, per_round = Arm(outputs=[]), Arm(outputs=[]), []
    for _ in range(rounds):
        one = run_arm(engine, prompts, 1, max_tokens, end_id)
        many = run_arm(engine, _fill(prompts, 2 * batch), batch, max_tokens, end_id)
        per_round.append(round(many.tokens_per_s / one.tokens_per_s, 3) if one.tokens_per_s else 0.0)
        for total, arm in ((single, one), (batched, many)):
            total.tokens += arm.tokens
            total.seconds += arm.seconds
    return {"batch": batch, "prompts": len(prompts), "rounds": rounds,
            "batch1_tokens_per_s": round(single.tokens_per_s, 2),
            "batch_tokens_per_s": round(batched.tokens_per_s, 2),
            "ratio": round(batched.tokens_per_s / single.tokens_per_s, 3) if single.tokens_per_s else 0.0,
            "per_round": per_round}


def _fill(prompts: list, count: int) -> list:
    """At batch > 1, cycle the prompts to keep the batch full for most of the run."""
    return [prompts[i % len(prompts)] for i in range(max(count, len(prompts)))]


def _row(method: str, batch: int, category: str, base: Arm, spec: Arm) -> dict:
    tau = 1.0 + spec.accepted / spec.verify_steps if spec.verify_steps else 1.0
    speedup = spec.tokens_per_s / base.tokens_per_s if base.tokens_per_s else 0.0
    return {
        "method": method, "batch": batch, "category": category,
        "tokens_per_s": round(spec.tokens_per_s, 2), "baseline_tokens_per_s": round(base.tokens_per_s, 2),
        "speedup": round(speedup, 3),
        "acceptance_rate": round(spec.accepted / spec.drafted, 4) if spec.drafted else 0.0,
        "mean_acceptance_length": round(tau, 3),
        # τ counts passes that verified drafts; a proposer that sometimes has none (n-gram) also
        # spends passes without: tokens per target pass is the figure that bounds its speedup
        "tokens_per_target_pass": round(spec.tokens / spec.decode_steps, 3) if spec.decode_steps else 0.0,
        "efficiency": round(speedup / tau, 3),
        "cpu_tokens_per_s": round(spec.cpu_tokens_per_s, 2),
        "baseline_cpu_tokens_per_s": round(base.cpu_tokens_per_s, 2),
        "speedup_cpu": round(spec.cpu_tokens_per_s / base.cpu_tokens_per_s, 3) if base.cpu_tokens_per_s else 0.0,
        "tpot_ms": round(spec.tpot_ms, 4), "baseline_tpot_ms": round(base.tpot_ms, 4),
        "decode_speedup": round(base.tpot_ms / spec.tpot_ms, 3) if spec.tpot_ms else 0.0,
        "tokens": spec.tokens, "baseline_tokens": base.tokens,
        "decode_tokens": spec.decode_tokens, "baseline_decode_tokens": base.decode_tokens,
        "outputs_match": spec.outputs == base.outputs,
    }


def _int8_dir(target: Path, workdir: Path) -> Path:
    from pipeline.reference.quantize import quantize_checkpoint

    out = workdir / "target-int8_wo"
    quantize_checkpoint(target, out, "int8_wo")
    return out


def run_bench(config_path: str | Path, prompts_per_category: int = 8, max_tokens: int = 64,
              batches: tuple[int, ...] = (1, 8), peer: str | None = None, int8: bool = False,
              draft_int8: bool = False, stop_at_eos: bool = False, versus: str | Path | None = None) -> dict:
    """``int8``: add rows for an int8 weight-only target (both arms); ``draft_int8``: add rows
    with the draft-side weights quantized at load (target float32) — or, when the config's
    ``reference.draft_weights`` is int8 already, rows with float ones (``+draft_float``). EOS is ignored unless
    ``stop_at_eos`` (every request decodes ``max_tokens``; the tiny models end lines with EOS
    after a dozen tokens, which would make prefill dominate both arms). ``versus``: another config
    on the same target whose method gets its own rows in this run (EAGLE-3 against EAGLE-1)."""
    from pipeline.reference.engine import set_threads

    cfg = load_config(config_path)
    set_threads(cfg.reference.threads)
    target = resolve_checkpoint(cfg.target.checkpoint)
    spec = proposer_spec(cfg)
    encode = _encode(target)
    categories = {c: [encode(p) for p in ps] for c, ps in load_prompts(cfg, prompts_per_category).items()}
    if any(b not in (1, max(batches)) for b in batches):
        raise UsageError(f"batches {batches}: only 1 and one larger size are supported")
    limits = dict(max_batch_size=max(batches), max_seq_len=cfg.build.max_seq_len,
                  compute_dtype=cfg.reference.compute_dtype, prefix_cache_entries=0,
                  fast_paths=cfg.reference.fast_paths)
    workdir = tempfile.TemporaryDirectory(prefix="specdeploy-bench-")
    results, scaling = [], None
    variants = [(cfg.method + suffix, *rest) for suffix, *rest in
                _variants(cfg, target, spec, int8, draft_int8, Path(workdir.name))]
    if versus is not None:
        variants.append(_versus_variant(cfg, target, versus))
    try:
        for index, (method, model_dir, spec_variant) in enumerate(variants):
            found = _bench_variant(method, index == 0, model_dir, spec_variant, categories, batches, limits,
                                   max_tokens, stop_at_eos, results)
            scaling = found if found is not None else scaling
    finally:
        workdir.cleanup()
    report = {
        "config": cfg.name, "method": cfg.method, "max_tokens": max_tokens,
        "prompts_per_category": prompts_per_category, "greedy": True, "stop_at_eos": stop_at_eos,
        "draft_weights": cfg.reference.draft_weights,
        "machine": {"python": platform.python_version(), "processor": platform.processor() or platform.machine(),
                    "threads": cfg.reference.threads},
        "results": results, "summary": summarize(results),
    }
    if scaling is not None:
        report["baseline_scaling"] = scaling
    if peer == "hf":
        report["peer"] = hf_peer(cfg, target, spec, categories, max_tokens, results, stop_at_eos)
    elif peer is not None:
        raise UsageError(f"--peer {peer!r}: only 'hf' is supported")
    return report


def _variants(cfg, target: Path, spec: dict, int8: bool, draft_int8: bool, workdir: Path) -> list[tuple]:
    """(row suffix, model dir, proposer spec) of each engine pair the bench runs."""
    variants = [("", target, spec)]
    if draft_int8 and spec.get("draft_int8"):  # the config's rows are int8: add float for the comparison
        variants.append(("+draft_float", target, {k: v for k, v in spec.items() if k != "draft_int8"}))
    elif draft_int8:
        variants.append(("+draft_int8", target, {**spec, "draft_int8": True}))
    if int8 or cfg.target.quantization.format == "int8_wo":
        variants.append(("+int8_wo", _int8_dir(target, workdir), spec))
    return variants


def _versus_variant(cfg: DeploymentConfig, target: Path, versus: str | Path) -> tuple[str, Path, dict]:
    """(rows' method, model dir, proposer spec) of the ``--versus`` config: same target required."""
    other = load_config(versus)
    if resolve_checkpoint(other.target.checkpoint) != target:
        raise UsageError(f"--versus {versus}: target {other.target.checkpoint} is not {cfg.target.checkpoint}")
    if other.method == cfg.method:
        raise UsageError(f"--versus {versus}: same method {cfg.method!r}; its rows would mix with the config's")
    return other.method, target, proposer_spec(other)


def _bench_variant(method: str, first: bool, model_dir: Path, spec_variant: dict, categories: dict,
                   batches: tuple[int, ...], limits: dict, max_tokens: int, stop_at_eos: bool,
                   results: list) -> dict | None:
    """Baseline and speculative engines of one variant, every batch × category row appended to
    ``results``; returns the baseline's batch scaling for the config's own variant, else None."""
    from pipeline.reference.engine import create_engine

    scaling = None
    base_engine = create_engine(model_dir, **limits)
    spec_engine = create_engine(model_dir, role="speculative", proposer=spec_variant, **limits)
    end_id = base_engine.eos_token_id if stop_at_eos else None
    try:
        warm = next(iter(categories.values()))[:1]
        run_arm(base_engine, warm, 1, 8, end_id)
        run_arm(spec_engine, warm, 1, 8, end_id)
        for batch in batches:
            for category, prompts in categories.items():
                if batch == 1:
                    base, fast = run_arms_interleaved(base_engine, spec_engine, prompts, max_tokens, end_id)
                else:
                    prompts = _fill(prompts, 2 * batch)
                    base = run_arm(base_engine, prompts, batch, max_tokens, end_id)
                    fast = run_arm(spec_engine, prompts, batch, max_tokens, end_id)
                results.append(_row(method, batch, category, base, fast))
        if first and max(batches) > 1:
            scaling = baseline_scaling(base_engine, _in_domain_sample(categories), max(batches), max_tokens, end_id)
    finally:
        base_engine.shutdown()
        spec_engine.shutdown()
    return scaling


OUT_OF_DOMAIN = ("ood",)  # the demo corpus's deliberately unpredictable category


def _in_domain_sample(categories: dict[str, list], per_category: int = 4) -> list:
    """A few prompts of each in-domain category (all categories when none is in-domain)."""
    chosen = {c: p for c, p in categories.items() if c not in OUT_OF_DOMAIN} or categories
    return [prompt for prompts in chosen.values() for prompt in prompts[:per_category]]


def summarize(results: list[dict]) -> list[dict]:
    """Per (method, batch) and scope: tokens/s pooled over categories (total tokens ÷ total
    time); acceptance rate and τ as the unweighted mean over categories. Scope ``all`` pools every
    category; ``in_domain`` leaves out :data:`OUT_OF_DOMAIN` (the speed targets are stated for
    in-domain prompts) and is only given when the prompt set has such a category."""
    out = []
    for key in sorted({(r["method"], r["batch"]) for r in results}):
        rows = [r for r in results if (r["method"], r["batch"]) == key]
        scopes = [("all", rows)]
        in_domain = [r for r in rows if r["category"] not in OUT_OF_DOMAIN]
        if in_domain and len(in_domain) < len(rows):
            scopes.append(("in_domain", in_domain))
        out += [_summary_row(key, scope, scoped) for scope, scoped in scopes]
    return out


def _summary_row(key: tuple[str, int], scope: str, rows: list[dict]) -> dict:
    tps = _pooled(rows, "tokens", "tokens_per_s")
    btps = _pooled(rows, "baseline_tokens", "baseline_tokens_per_s")
    cpu, bcpu = _pooled(rows, "tokens", "cpu_tokens_per_s"), _pooled(rows, "baseline_tokens", "baseline_cpu_tokens_per_s")
    tpot, btpot = _pooled_tpot(rows, "decode_tokens", "tpot_ms"), _pooled_tpot(rows, "baseline_decode_tokens", "baseline_tpot_ms")
    return {"method": key[0], "batch": key[1], "scope": scope,
            "categories": [r["category"] for r in rows], "tokens_per_s": round(tps, 2),
            "baseline_tokens_per_s": round(btps, 2), "speedup": round(tps / btps, 3),
            "cpu_tokens_per_s": round(cpu, 2), "baseline_cpu_tokens_per_s": round(bcpu, 2),
            "speedup_cpu": round(cpu / bcpu, 3),
            "tpot_ms": round(tpot, 4), "baseline_tpot_ms": round(btpot, 4),
            "decode_speedup": round(btpot / tpot, 3) if tpot else 0.0,
            "acceptance_rate": round(sum(r["acceptance_rate"] for r in rows) / len(rows), 4),
            "mean_acceptance_length": round(sum(r["mean_acceptance_length"] for r in rows) / len(rows), 3),
            "outputs_match": all(r["outputs_match"] for r in rows)}


def _pooled(rows: list[dict], tokens_key: str, rate_key: str) -> float:
    seconds = sum(r[tokens_key] / r[rate_key] for r in rows if r[rate_key])
    return sum(r[tokens_key] for r in rows) / seconds if seconds else 0.0


def _pooled_tpot(rows: list[dict], tokens_key: str, tpot_key: str) -> float:
    """TPOT over several rows: total decode time ÷ total decode tokens (ms per token)."""
    tokens = sum(r[tokens_key] for r in rows)
    return sum(r[tokens_key] * r[tpot_key] for r in rows) / tokens if tokens else 0.0


def hf_peer(cfg: DeploymentConfig, target: Path, spec: dict, categories: dict, max_tokens: int,
            results: list[dict], stop_at_eos: bool = False) -> dict:
    """Hugging Face assisted generation (batch 1) on the same checkpoints and prompts."""
    if not cfg.method_info.draft_model:  # its proposer then has the draft_dir and num_draft_tokens read below
        return {"skipped": "Hugging Face assisted generation needs a draft model (draft_target only)"}
    import torch
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(str(target), dtype=torch.float32).eval()
    draft = LlamaForCausalLM.from_pretrained(spec["draft_dir"], dtype=torch.float32).eval()
    model.generation_config.num_assistant_tokens_schedule = "constant"
    k = spec["num_draft_tokens"]

    def timed(**kw) -> tuple[int, float]:
        tokens, start = 0, time.perf_counter()
        with torch.inference_mode():
            for prompts in categories.values():
                for p in prompts:
                    out = model.generate(torch.tensor([p]), max_new_tokens=max_tokens, do_sample=False,
                                         **({} if stop_at_eos else {"min_new_tokens": max_tokens}), **kw)
                    tokens += out.shape[1] - len(p)
        return tokens, time.perf_counter() - start

    plain_tokens, plain_s = timed()
    assisted_tokens, assisted_s = timed(assistant_model=draft, num_assistant_tokens=k)
    ours = [s for s in summarize(results) if s["batch"] == 1 and s["method"] == cfg.method and s["scope"] == "all"][0]
    hf_tps = assisted_tokens / assisted_s
    return {
        "name": "hf_assisted_generation", "batch": 1, "num_assistant_tokens": k, "schedule": "constant",
        "hf_greedy_tokens_per_s": round(plain_tokens / plain_s, 2),
        "hf_assisted_tokens_per_s": round(hf_tps, 2),
        "hf_speedup": round(hf_tps / (plain_tokens / plain_s), 3),
        "engine_tokens_per_s": ours["tokens_per_s"],
        "engine_vs_hf_assisted": round(ours["tokens_per_s"] / hf_tps, 3),
    }
