"""The CPU reference engine's cost model: the roofline's form with coefficients fitted to a
short microbenchmark of the engine's own models, stored with the machine's description.

``calibrate`` times the engine's target (and draft) forward over B sequences × T new tokens at
context L (logits included, as a step computes them; thread CPU time, which other processes on
shared cores distort less than wall time), fits ``t = a + b·rows + c·rows·L`` per model
(non-negative least squares, scipy), and times the baseline and speculative engines side by side
per batch size (:func:`_side_by_side_steps`): the engine's own per-step cost beyond the forward
(scheduling, sampling, streaming), the drafting calls (the proposer's cost is measured: the
engine's fused one-row drafting paths do not follow the batched forward's fit) and the
per-sequence work of a speculative step; without a proposer, the baseline's step alone. Without a
measured proposer, drafting heads are scaled from the target's fit: their fixed part by their
layer share, their per-row part by their FLOPs share. Writes
``$SPECDEPLOY_FORECAST_HOME`` (default ``~/.cache/specdeploy/forecast``)``/cpu-<machine>.json``;
reads it back in :func:`stored_device`. No calibration for this machine is a
:class:`ForecastInputError` saying how to make one.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import statistics
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from pipeline.forecast.figures import ForecastInputError
from pipeline.forecast.roofline import ForwardTime, ModelCost
from pipeline.infra.atomic import write_json_atomic
from pipeline.reference.api import GenerationRequest

# the calibration method's version: a stored calibration made by another one is not reused
CALIBRATION_SCHEMA = "specdeploy-cpu-calibration/2"  # 2: baseline and speculative steps timed side by side
# one sequence takes the engine's one-row fast path, two or more the batched one: the step cost
# jumps between 1 and 2, so both are calibrated, and the sizes a load test sweeps up to the limit
CALIBRATED_BATCHES = (1, 2, 4, 8)
ROWS_GRID = ((1, 1), (2, 1), (4, 1), (8, 1), (1, 4), (1, 6), (2, 4), (4, 4), (8, 4), (8, 6))
CONTEXTS = (16, 96)


def machine() -> dict:
    """This machine as a calibration records it; the int8 kernel because int8 draft weights' cost
    depends on it (:mod:`pipeline.reference.int8_gemm`)."""
    from pipeline.reference.int8_gemm import kernel  # noqa: PLC0415 - start-up: torch (pipeline.reference.int8_gemm; pipeline.forecast.model imports this module)

    return {**_identity(), "int8_gemm": kernel()}


def _identity() -> dict:
    return {"processor": platform.processor() or platform.machine(), "machine": platform.machine(),
            "cpus": os.cpu_count(), "node": platform.node(), "python": platform.python_version(),
            "torch": _installed("torch")}


def _installed(package: str) -> str | None:

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


SOFTWARE = ("python", "torch")  # a calibration made under other versions of these times other code


def stale_reason(calibration: dict) -> str | None:
    """Why a stored calibration no longer times this machine's engine (None: it still does): the
    Python or torch it was made under differs from this one's. Only what it recorded is compared."""
    then, now = calibration.get("machine") or {}, _identity()
    changed = [f"{k} {then[k]} (now {now[k]})" for k in SOFTWARE if then.get(k) is not None and then[k] != now[k]]
    return "made under " + ", ".join(changed) if changed else None


def machine_key(desc: dict | None = None) -> str:
    desc = desc or _identity()  # no torch: reading a calibration must not import it
    text = "|".join(str(desc[k]) for k in ("processor", "machine", "cpus", "node"))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def calibration_path() -> Path:
    home = Path(os.environ.get("SPECDEPLOY_FORECAST_HOME", "~/.cache/specdeploy/forecast")).expanduser()
    return home / f"cpu-{machine_key()}.json"


def _time_forward(model, batch: int, tokens: int, context: int, reps: int) -> float:
    from pipeline.reference.modeling import StepInput, one_sequence  # noqa: PLC0415 - start-up: torch (pipeline.reference.modeling; pipeline.forecast.model imports this module)

    pool = model.new_pool(batch, context + tokens + 2)
    caches = [pool.allocate() for _ in range(batch)]
    for cache in caches:
        model.forward(pool, one_sequence(cache, [1] * context))
    times = []
    for _ in range(reps):
        inputs = [StepInput(c, [1] * tokens, list(range(context, context + tokens))) for c in caches]
        start = time.thread_time()  # CPU time of this thread: other processes on shared cores do not inflate it
        model.logits(model.forward(pool, inputs))
        times.append(time.thread_time() - start)
        for cache in caches:
            cache.rollback(context)
    return statistics.median(times)


def fit_forward(points: list[tuple[int, int, float]]) -> dict:
    """(rows, context, seconds) → {a, b, c} of ``t = a + b·rows + c·rows·L`` (non-negative)."""
    import numpy as np  # noqa: PLC0415 - start-up: numpy (loaded when a calibration is fitted; pipeline.forecast.model imports this module)
    from scipy.optimize import nnls  # noqa: PLC0415 - start-up: scipy (loaded when a calibration is fitted; pipeline.forecast.model imports this module)

    x = np.array([[1.0, rows, rows * ctx] for rows, ctx, _ in points])
    y = np.array([s for _, _, s in points])
    coef, _ = nnls(x, y)
    return {"a": float(coef[0]), "b": float(coef[1]), "c": float(coef[2])}


def _model_points(model, reps: int) -> list[tuple[int, int, float]]:
    return [(b * t, ctx, _time_forward(model, b, t, ctx, reps)) for ctx in CONTEXTS for b, t in ROWS_GRID]


def _engine_step(engine, batch: int, tokens: int, rounds: int = 5) -> float:
    """Baseline engine CPU seconds per step with ``batch`` requests in flight (process CPU time:
    the engine's thread included, other processes on shared cores not)."""
    per_step = []
    for round_ in range(rounds + 1):
        start = time.process_time()
        handles = [engine.submit(GenerationRequest([1, 2, 3, 4, 5, 6, 7, 8], tokens)) for _ in range(batch)]
        for handle in handles:
            handle.result(timeout=600)
        if round_:  # the first generation at a batch size pays one-time costs (allocations, first calls)
            per_step.append((time.process_time() - start) / tokens)
    return statistics.median(per_step)


def _synthetic_prompt(i: int, length: int, base: int = 5) -> list[int]:
    """A synthetic prompt of ``length`` token ids (``base + i, 6, 7, …``): calibration never sees a
    benchmark's prompts, only their length."""
    return [base + i] + [6 + (k % 64) for k in range(length - 1)]


class _Instrumented:
    """One engine whose steps, target forwards, admissions and drafting calls are timed, so a
    generation can be split into what the engine spends per full-batch step (see
    :func:`_side_by_side_steps`). The engine's own methods are restored by :meth:`close`."""

    def __init__(self, engine, fit: dict, tokens: int):
        self.engine, self.fit, self.tokens = engine, fit, tokens
        self.sched = sched = engine.scheduler
        self.records: list[dict] = []
        self.admitted: list[float] = []
        self.current: dict = {}
        self.inner = (sched.step, sched.target.forward_capture, sched.admit)
        self.proposer = sched.proposer
        self.inner_propose = self.proposer.propose if self.proposer is not None else None
        sched.step, sched.target.forward_capture, sched.admit = self._step, self._forward_capture, self._admit
        if self.proposer is not None:
            self.proposer.propose = self._propose

    def close(self) -> None:
        self.sched.step, self.sched.target.forward_capture, self.sched.admit = self.inner
        if self.proposer is not None:
            self.proposer.propose = self.inner_propose

    def _step(self, seqs):  # the engine's thread
        self.current.clear()
        self.current.update(propose=0.0, rows=0.0, ctx=0.0)
        self.inner[0](seqs)
        self.records.append({**self.current, "batch": len(seqs)})

    def _admit(self, seq):
        start = time.thread_time()
        try:
            return self.inner[2](seq)
        finally:
            self.admitted.append(time.thread_time() - start)

    def _forward_capture(self, pool, inputs, capture=()):
        self.current["rows"] = float(sum(len(i.tokens) for i in inputs))
        self.current["ctx"] = sum(i.positions[0] for i in inputs) / max(len(inputs), 1)
        return self.inner[1](pool, inputs, capture)

    def _propose(self, seqs, budgets):
        start = time.thread_time()
        out = self.inner_propose(seqs, budgets)
        self.current["propose"] = self.current.get("propose", 0.0) + time.thread_time() - start
        return out

    def generate(self, group: list[list[int]], batch: int, per_slot: int = 2) -> dict[str, float]:
        """A closed loop of ``batch`` slots: ``per_slot × batch`` requests (prompts cycling through
        ``group``) submitted at once to the engine with its admission limit set to ``batch``, so
        ``batch`` sequences stay in flight — finished ones replaced, as in a closed-loop load
        test — and only the end drains. No thread of ours waits on a stream meanwhile (one waking
        per chunk would add a per-step cost the engine does not have). Returns CPU seconds spent
        (admission and prefill excluded), drafting seconds, the fitted forward's seconds and the
        full-batch steps."""
        self.records.clear()
        self.admitted.clear()
        limit, self.engine.max_batch_size = self.engine.max_batch_size, batch
        try:
            start = time.process_time()
            handles = [self.engine.submit(GenerationRequest(list(group[k % len(group)]), self.tokens))
                       for k in range(batch * per_slot)]
            for handle in handles:
                handle.result(timeout=600)
        finally:
            self.engine.max_batch_size = limit
        spent = time.process_time() - start - sum(self.admitted)
        recs, fit = list(self.records), self.fit
        # full-batch-equivalent steps: Σ sequences per step ÷ B. A speculative batch runs until its
        # slowest sequence is done, its last steps with fewer rows
        seq_steps = sum(r["batch"] for r in recs) or 1
        width = sum(r["rows"] for r in recs) / seq_steps
        ctx = sum(r["ctx"] * r["batch"] for r in recs) / seq_steps
        full = seq_steps / batch
        return {"spent": spent, "propose": sum(r["propose"] for r in recs), "full_steps": full, "steps": len(recs),
                "forward": full * (fit["a"] + (fit["b"] + fit["c"] * ctx) * batch * width)}


def _side_by_side_steps(engines: dict, batches: tuple[int, ...], fit: dict, tokens: int = 48,
                        prompt_len: int = 8, rounds: int = 3, repeats: int = 3,
                        prompt_groups: list[list[list[int]]] | None = None) -> dict[str, dict[str, dict[str, float]]]:
    """Per engine (``{"baseline": engine, "speculative": engine}``) and batch size, what the engine
    spends per full-batch step: ``step`` (the process's CPU time over the generation, admission
    and prefill excluded, ÷ the full-batch-equivalent steps Σ sequences per step ÷ B),
    ``propose`` (the proposer's drafting, 0 without one, per the same steps) and ``residual`` =
    step − propose − the fitted forward ``a + (b + c·L)·B·w`` at the mean tokens per
    sequence-step w and mean context.

    Counting full-batch steps charges the drain: a speculative batch runs until its slowest
    sequence is done; each generation is a closed loop of B slots running two requests each
    (:meth:`_Instrumented.generate`), so finished sequences are replaced and only the end drains. The residual is the
    per-sequence work beyond forward and drafting: ragged verify inputs, the verify itself, KV
    roll-back or compaction, the proposer's ``accept`` (catch-up of its own cache), emitting and
    streaming the tokens. Process CPU time (all the engine's threads, other processes on shared
    cores not); the proposer's and admission's share by ``thread_time`` on the engine's thread.

    The engines run side by side, generation by generation: the CPU time of the same code drifts
    by ±10 % over seconds on a shared host, and alternating puts the same drift into both arms, so
    their ratio — what a forecast is made of — holds. Each batch size first runs one unmeasured
    generation per engine (one-time costs), then ``repeats`` passes over the prompt groups.
    Prompts: ``prompt_groups`` (a caller's held-out prompts per category, so the acceptance — how
    many tokens each step accepts, rolls back, catches up — is a deployment's), else ``rounds``
    groups of synthetic token ids (:func:`_synthetic_prompt`); never the prompts a check
    against ``bench`` measures, so that check is not fitted to its own data."""
    groups = prompt_groups or [[_synthetic_prompt(k + 100 * g, prompt_len) for k in range(8)] for g in range(rounds)]
    timed = {name: _Instrumented(engine, fit, tokens) for name, engine in engines.items()}
    out: dict[str, dict[str, dict[str, float]]] = {name: {} for name in engines}
    try:
        for batch in batches:
            # one group (a prompt category) per generation: a bench batches a category's prompts
            # together, and mixing categories of very different acceptance would make the slowest
            # sequence's drain look longer than it is
            for engine in timed.values():
                engine.generate(groups[0], batch)
            sums = {name: dict.fromkeys(("spent", "propose", "forward", "full_steps", "steps"), 0.0) for name in timed}
            # one-sequence generations are short and their per-step time the noisiest: more of them
            for group in groups * (repeats * 3 if batch == 1 else repeats):
                for name, engine in timed.items():
                    for key, value in engine.generate(group, batch).items():
                        sums[name][key] += value
            # pooled over the groups and repeats, as the bench pools its categories
            for name, t in sums.items():
                full = t["full_steps"]
                out[name][str(batch)] = {"step": t["spent"] / full, "propose": t["propose"] / full,
                                         "residual": (t["spent"] - t["propose"] - t["forward"]) / full,
                                         "steps": int(t["steps"]), "full_batch_steps": full}
    finally:
        for engine in timed.values():
            engine.close()
    return out


def calibrate(target_dir: Path, draft_dir: Path | None = None, threads: int = 1, reps: int = 5,
              batches: tuple[int, ...] = CALIBRATED_BATCHES, fast_paths: bool = True, proposer: dict | None = None,
              prompt_len: int = 8, prompt_groups: list[list[list[int]]] | None = None) -> dict:
    """Microbenchmark the engine's models on this machine → the calibration dict (not yet stored).
    ``prompt_len``: the length of the synthetic prompts the engine steps are timed with (a
    deployment's typical prompt length; the per-sequence work grows with the context);
    ``prompt_groups``: token-id prompts per category to time them with instead (held out from
    any check)."""
    from pipeline.reference.engine import create_engine, set_threads  # noqa: PLC0415 - start-up: torch (pipeline.reference.engine; pipeline.forecast.model imports this module)

    set_threads(threads)
    limits = dict(max_batch_size=max(batches), max_seq_len=512, prefix_cache_entries=0, fast_paths=fast_paths)
    if draft_dir is not None:
        draft = create_engine(Path(draft_dir), **limits)
        try:
            draft_fit = fit_forward(_model_points(draft.scheduler.target, reps))
        finally:
            draft.shutdown()
    engines = {"baseline": create_engine(Path(target_dir), **limits)}
    try:
        fits = {"target": fit_forward(_model_points(engines["baseline"].scheduler.target, reps))}
        if draft_dir is not None:
            fits["draft"] = draft_fit
        tokens = 32
        measured = {}
        if proposer is not None:
            engines["speculative"] = create_engine(Path(target_dir), role="speculative", proposer=proposer, **limits)
            measured = _side_by_side_steps(engines, batches, fits["target"], prompt_len=prompt_len,
                                           prompt_groups=prompt_groups)
        else:  # no speculative arm to time it beside: the baseline's own step
            steps = {str(b): _engine_step(engines["baseline"], b, tokens) for b in batches}
    finally:
        for engine in engines.values():
            engine.shutdown()
    proposer_s, spec_extra = {}, {}
    if not measured:
        ctx = 8 + tokens // 2
        t = fits["target"]
        # the engine's step beyond the fitted forward (may be negative where the engine's one-row path
        # beats the batched forward the fit describes): baseline steps then equal the measured ones
        overhead = {b: steps[b] - (t["a"] + t["b"] * int(b) + t["c"] * int(b) * ctx) for b in steps}
    else:
        base, spec = measured["baseline"], measured["speculative"]
        steps = {b: v["step"] for b, v in base.items()}
        proposer_s[proposer["method"]] = {b: v["propose"] for b, v in spec.items()}
        # what a speculative step costs beyond its forward, its drafting and the baseline step's own
        # work beyond its forward: the per-sequence work of a batched speculative step
        spec_extra[proposer["method"]] = {b: v["residual"] - base[b]["residual"] for b, v in spec.items()}
        # the same side-by-side measurement as the speculative residual, on the same prompts: the two
        # arms' steps then differ only by what the speculative step does, not by two timings' noise
        overhead = {b: v["residual"] for b, v in base.items()}
    return {"schema": CALIBRATION_SCHEMA, "machine": machine(), "threads": threads,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "models": {"target": str(target_dir), "draft": str(draft_dir) if draft_dir else None},
            "forward_fits": fits, "engine_step_s": steps,
            "engine_overhead_s": overhead, "proposer_s": proposer_s, "spec_step_extra_s": spec_extra,
            "prompts": (f"held-out prompts given by the caller, {len(prompt_groups)} categories" if prompt_groups else
                        f"synthetic token ids, {prompt_len} per prompt") + ", never the prompts a check measures",
            "form": "forward t = a + b·rows + c·rows·L (s); engine step = forward + overhead(B); "
                    "speculative step = forward(B·w) + proposer(B) + overhead(B) + spec_step_extra(B); "
                    "baseline and speculative steps timed side by side, generation by generation"}


def calibration_key(cfg) -> str:
    """What a calibration is valid for: the config's target, draft and method."""
    draft = cfg.draft.checkpoint if cfg.draft is not None else "-"
    return f"{cfg.target.checkpoint}|{draft}|{cfg.method}|threads={cfg.reference.threads}"


def store(calibration: dict, key: str, path: Path | None = None) -> Path:
    """Add ``calibration`` under ``key`` to this machine's calibration file (other keys kept)."""
    path = path or calibration_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    stored = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {"entries": {}}
    stored.setdefault("entries", {})[key] = calibration
    stored["machine"] = machine()
    write_json_atomic(path, stored)
    return path


@dataclass
class CpuDevice:
    """The CPU form: fitted forwards; heads scaled from the target's fit."""

    calibration: dict
    target_cost: ModelCost | None = None
    factor: float = 1.0
    band: float = 0.10
    kind: str = "cpu"
    _fits: dict = field(default_factory=dict)

    def describe(self) -> dict:
        c = self.calibration
        return {"kind": "cpu", "machine": c["machine"], "threads": c.get("threads"), "calibrated": c.get("created"),
                "forward_fits": c["forward_fits"], "engine_overhead_s": c["engine_overhead_s"],
                "stale": stale_reason(c)}

    def scaled(self, factor: float) -> CpuDevice:
        return CpuDevice(self.calibration, self.target_cost, self.factor * factor, self.band)

    def _fit_for(self, model: ModelCost) -> tuple[dict, float, float]:
        fits = self.calibration["forward_fits"]
        if model.name in fits:
            return fits[model.name], 1.0, 1.0
        target, tc = fits["target"], self.target_cost
        flops_share = model.flops_per_token / tc.flops_per_token if tc else 0.1
        return target, model.overhead_share, flops_share

    def forward(self, model: ModelCost, batch: int, tokens: int, context: int) -> ForwardTime:
        fit, fixed_share, row_share = self._fit_for(model)
        rows = batch * tokens
        seconds = (fit["a"] * fixed_share + (fit["b"] + fit["c"] * context) * rows * row_share) / self.factor
        return ForwardTime(seconds, 0.0, seconds, 0.0, fit["a"] * fixed_share / self.factor)

    def prefill_seconds(self, model: ModelCost, prompt_tokens: int, batch: int, width: float, context: int) -> float:
        """One admission's prefill: the reference engine runs it as a forward of its own (the
        admitted sequence alone, over its prompt), between two steps of the others."""
        return self.forward(model, 1, prompt_tokens, prompt_tokens // 2).seconds

    def step_overhead(self, batch: int) -> float:
        """The engine's per-step cost beyond the forward, interpolated over the calibrated batches."""
        return _linear(sorted((int(b), s) for b, s in self.calibration["engine_overhead_s"].items()), batch)

    def spec_step_extra(self, method: str, batch: int) -> float:
        """The per-sequence work of a batched speculative step beyond its forward, its drafting and
        the baseline step's own (ragged verify, roll-back, the proposer's catch-up in ``accept``),
        measured per batch size by :func:`calibrate`: linear in the batch between (and beyond) the
        calibrated sizes, 0 for a calibration without it."""
        table = self.calibration.get("spec_step_extra_s", {}).get(method)
        if not table:
            return 0.0
        return _linear(sorted((int(b), s) for b, s in table.items()), batch) / self.factor

    def round_trip_s(self, orchestration: str | None) -> float:
        return 0.0  # the BLS's extra Triton call is not part of `bench`'s in-process engine

    def proposer_seconds(self, method: str, batch: int) -> float | None:
        """The measured CPU cost of drafting per full-batch step at ``batch`` (piecewise linear in the
        batch, as the other calibrated terms), or None when this method was not calibrated."""
        table = self.calibration.get("proposer_s", {}).get(method)
        if not table:
            return None
        return _linear(sorted((int(b), s) for b, s in table.items()), batch) / self.factor


def _linear(points: list[tuple[int, float]], batch: int) -> float:
    """Piecewise-linear in the batch through ``points``, extended past the last two."""
    if len(points) == 1 or batch <= points[0][0]:
        return points[0][1]
    for (b0, s0), (b1, s1) in zip(points, points[1:]):
        if batch <= b1:
            return s0 + (s1 - s0) * (batch - b0) / (b1 - b0)
    (b0, s0), (b1, s1) = points[-2], points[-1]
    return s1 + (s1 - s0) * (batch - b1) / (b1 - b0)


def average_calibrations(a: dict, b: dict) -> dict:
    """Two calibrations (before and after a benchmark) averaged term by term."""
    def mean(x: dict, y: dict) -> dict:
        return {k: (x[k] + y[k]) / 2 for k in x}

    return {**a, "forward_fits": {m: mean(a["forward_fits"][m], b["forward_fits"][m]) for m in a["forward_fits"]},
            "engine_overhead_s": mean(a["engine_overhead_s"], b["engine_overhead_s"]),
            "proposer_s": {m: mean(a["proposer_s"][m], b["proposer_s"][m]) for m in a.get("proposer_s", {})},
            "spec_step_extra_s": {m: mean(a["spec_step_extra_s"][m], b["spec_step_extra_s"][m])
                                  for m in a.get("spec_step_extra_s", {})}}


def stored_device(target_cost: ModelCost | None = None, key: str = "") -> CpuDevice:
    """The stored calibration of this machine for ``key`` (:func:`calibration_key`)."""
    path = calibration_path()
    entries = json.loads(path.read_text(encoding="utf-8")).get("entries", {}) if path.is_file() else {}
    if key not in entries:
        raise ForecastInputError(
            f"no CPU calibration for {key or 'these models'} on this machine ({path}); run "
            f"`specdeploy forecast CONFIG --calibrate` (a minute or two of microbenchmarks of the reference engine) first")
    schema = entries[key].get("schema")
    if schema != CALIBRATION_SCHEMA:
        raise ForecastInputError(
            f"the CPU calibration for {key} on this machine ({path}) was made by another calibration method "
            f"({schema or 'no schema'}, this specdeploy makes {CALIBRATION_SCHEMA}); run "
            f"`specdeploy forecast CONFIG --calibrate` or `specdeploy run CONFIG --recalibrate` to make a new one")
    return CpuDevice(entries[key], target_cost)
