"""The forecast: expected TPOT of both arms and the speedup per concurrency, the crossover and
the best draft length per level, with a band from the inputs' uncertainty.

Reads the deployment config's checkpoints' ``config.json`` (or the known shapes of named public
models, :mod:`pipeline.facts.model_shapes`), the hardware and engine figures
(:mod:`pipeline.forecast.figures`) or, for ``hardware: cpu``, the stored CPU calibration
(:mod:`pipeline.forecast.cpu`). Writes nothing; :func:`forecast_config` returns a JSON-able dict.

Per concurrency c (closed loop: c sequences decode together, context L):

    TPOT_base = t(target; B=c, T=1, L)
    TPOT_spec = (t(target; B=c, T=w, L) + t_draft(c)) / τ

w is the verify width (K+1 for a chain, the tree's nodes + 1), t_draft the method's proposer
cost (:data:`pipeline.forecast.proposers.PROPOSER_COSTS`), τ the tokens a step gains
(:mod:`pipeline.forecast.acceptance`). A proposer that drafts on a fraction f of the steps only
(n-gram without a match) verifies 1 + f·(w − 1) tokens and gains f·τ + (1 − f) per step.
Speedup = TPOT_base / TPOT_spec; in a closed loop the throughput ratio is the same number.

A load test's closed loop also admits new requests while others decode: over one request's N
output tokens the c − 1 others each finish and start one, and every admission's prefill (P prompt
tokens; the draft's too, where there is one) holds up the step it joins, so both arms' TPOT gain
(c − 1) · t_prefill / (N − 1) (:func:`prefill_per_token`; a report counts only the others
decoding while a request decodes).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipeline.demo import resolve_builtin
from pipeline.facts.hardware import get_profile
from pipeline.facts.memory_fit import estimate_memory, kv_bytes, speculative_executors, weight_bytes_per_param
from pipeline.facts.model_shapes import KNOWN_MODELS, ModelShape, known_shape, read_config_json, shape_from_config
from pipeline.forecast import uncertainty
from pipeline.forecast.acceptance import Acceptance, alpha_for_tau
from pipeline.forecast.cpu import CpuDevice, calibration_key, stored_device
from pipeline.forecast.figures import PEAK_DTYPE, ForecastInputError, engine_figures, gpu_figures
from pipeline.forecast.proposers import PLANS, PROPOSER_COSTS, DraftPlan, StepContext, plan_for
from pipeline.forecast.roofline import GpuDevice, ModelCost, model_cost

CROSSOVER_GRID = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)
K_SWEEP = tuple(range(1, 9))
WORTH_A_LOOK = 0.25  # a measurement this far outside the band (relative) is flagged
_DTYPE_BYTES = {"float32": 4.0, "float16": 2.0, "bfloat16": 2.0, "float64": 8.0}


@dataclass(frozen=True)
class Requests:
    """The requests of a closed-loop load test: mean prompt and output tokens, and where they come from."""

    prompt_tokens: int
    output_tokens: int
    source: str

    def describe(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "output_tokens": self.output_tokens, "source": self.source}


@dataclass(frozen=True)
class Limit:
    """The most sequences the deployment decodes together, and which limit sets it."""

    sequences: int
    name: str  # e.g. "build.max_batch_size 16"

    def describe(self) -> dict:
        return {"sequences": self.sequences, "set_by": self.name}


@dataclass
class Inputs:
    """Everything one forecast rests on."""

    device: object  # GpuDevice or the CPU device
    target: ModelCost
    draft: ModelCost | None
    plan: DraftPlan
    acceptance: Acceptance
    vocab: int
    dense_bytes: float
    context: int
    band: float  # relative uncertainty of the device's efficiencies
    requests: Requests | None = None  # a closed loop's admissions (None: a static batch, no prefill mid-decode)
    proposer_scale: float = 1.0  # the proposer's modelled cost × this (the band's edges; a sensitivity check)
    limit: Limit | None = None  # no crossover, best K or level is forecast beyond it


def step_times(inp: Inputs, batch: int, plan: DraftPlan, tau: float, device=None,
               serving_s: float = 0.0, decoding: tuple[float, float] | None = None) -> tuple[float, float]:
    """(baseline TPOT, speculative TPOT) in seconds at ``batch`` sequences. ``serving_s``: a cost
    per engine step outside the engine (a served run's response path, which streams one response
    per sequence per step whatever its tokens), charged to both arms' steps. ``decoding``: how many
    of the ``batch`` sequences decode together in each arm (baseline, speculative) — fewer than
    ``batch`` where requests spend part of their life before their first token (default: all)."""
    device = device or inp.device
    base_b, spec_b = decoding or (batch, batch)
    base = (device.forward(inp.target, base_b, 1, inp.context).seconds + device.step_overhead(base_b) + serving_s
            + prefill_per_token(inp, base_b, 1, device, with_draft=False))
    # steps without drafts (coverage < 1) verify one token and gain one
    coverage = inp.acceptance.coverage
    width = 1 + coverage * (plan.verify_width - 1)
    tau = coverage * tau + (1 - coverage)
    verify = device.forward(inp.target, spec_b, width, inp.context).seconds + device.step_overhead(spec_b) + serving_s
    measured = device.proposer_seconds(plan.method, spec_b)  # CPU calibration
    if measured is not None:
        draft = measured
    else:
        ctx = StepContext(device, inp.target, inp.draft, inp.dense_bytes, inp.vocab, spec_b, inp.context, tau)
        draft = PROPOSER_COSTS[plan.method](ctx, plan) * inp.proposer_scale
    # CPU: the per-sequence work of a batched speculative step the forward does not cover
    extra = device.spec_step_extra(plan.method, spec_b)
    return base, (verify + draft + extra) / tau + prefill_per_token(inp, spec_b, width, device, with_draft=True)


def prefill_per_token(inp: Inputs, step_batch: float, width: float, device=None, with_draft: bool = False) -> float:
    """What other requests' prefills add to each output token in a closed loop where a decoding
    sequence shares its steps with ``step_batch`` − 1 others: over its output tokens − 1 each of
    those finishes and is replaced once, each admission costing a prefill beside a step of
    ``step_batch`` × ``width`` rows (the speculative arm's admissions prefill the draft model
    too). 0 without :attr:`Inputs.requests` or alone."""
    req = inp.requests
    if req is None or step_batch <= 1 or req.output_tokens <= 1:
        return 0.0
    device = device or inp.device
    models = [inp.target] + ([inp.draft] if with_draft and inp.draft is not None else [])
    prefill = sum(device.prefill_seconds(m, req.prompt_tokens, step_batch, width, inp.context) for m in models)
    return (step_batch - 1) * prefill / (req.output_tokens - 1)


def speedup_at(inp: Inputs, batch: int, plan: DraftPlan | None = None, edge: str = "point") -> float:
    plan = plan or inp.plan
    tau = inp.acceptance.tau_at(plan.depth, edge, plan.tree, batch)
    base, spec = step_times(inp, batch, plan, tau)
    return base / spec


def speedup_of(batch: int, plan: DraftPlan | None = None):
    """speedup(inputs, acceptance edge) at ``batch`` — what the band evaluates at each corner."""
    def speedup(moved: Inputs, edge: str) -> float:
        p = plan or moved.plan
        tau = moved.acceptance.tau_at(p.depth, edge, p.tree, batch)
        base, spec = step_times(moved, batch, p, tau)
        return base / spec
    return speedup


@dataclass
class Band:
    """What a band is made of: the corners of the inputs' ranges and the model's error."""

    corners: list
    error: uncertainty.ModelError | None
    misses: list[dict]

    @classmethod
    def of(cls, inp: Inputs) -> Band:
        kind = getattr(inp.device, "kind", "gpu")
        hardware = getattr(getattr(inp.device, "gpu", None), "name", None)
        return cls(uncertainty.corner_inputs(inp), uncertainty.model_error(kind), uncertainty.known_misses(hardware))

    def misses_at(self, batch: int) -> list[dict]:
        return [m for m in self.misses if batch >= m["from_batch"]]

    def at(self, batch: int, plan: DraftPlan | None = None) -> tuple[float, float]:
        low, high = uncertainty.with_model_error(*uncertainty.speedup_range(speedup_of(batch, plan), self.corners),
                                                 self.error)
        for miss in self.misses_at(batch):  # a regime where the model is known to miss: its miss too
            low /= 1 + max(miss["error"][1], 0.0)
            high /= 1 + min(miss["error"][0], 0.0)
        return low, high


def _grid(inp: Inputs) -> tuple[int, ...]:
    limit = inp.limit.sequences if inp.limit else None
    grid = tuple(c for c in CROSSOVER_GRID if limit is None or c <= limit)
    return grid + ((limit,) if limit is not None and limit not in grid else ())


def best_depth(inp: Inputs, batch: int, band: Band | None = None) -> dict:
    """The draft length with the highest forecast speedup at ``batch`` (chains only; trees keep
    theirs), and the range of K that is best somewhere in the band (its low and high edges)."""
    if inp.plan.tree or inp.acceptance.alpha is None:
        return {"draft_len": inp.plan.depth, "speedup": round(speedup_at(inp, batch), 3), "swept": False}
    scored = [(speedup_at(inp, batch, inp.plan.with_depth(k)), k) for k in K_SWEEP]
    best, k = max(scored)
    out = {"draft_len": k if best > 1.0 else None, "speedup": round(best, 3), "swept": True,
           "speculation": "on" if best > 1.0 else "off"}
    if band is not None:
        edges = [band.at(batch, inp.plan.with_depth(depth)) for depth in K_SWEEP]
        at_low = max(range(len(K_SWEEP)), key=lambda i: edges[i][0])
        at_high = max(range(len(K_SWEEP)), key=lambda i: edges[i][1])
        ks = [K_SWEEP[at_low], K_SWEEP[at_high], k]
        out["draft_len_range"] = [min(ks), max(ks)]
        out["off_somewhere_in_band"] = edges[at_low][0] < 1.0
    return out


def crossover(inp: Inputs) -> int | None:
    """The lowest concurrency on the grid (up to the deployment's limit) where the forecast
    speedup drops below 1 (None: never within it)."""
    for c in _grid(inp):
        if speedup_at(inp, c) < 1.0:
            return c
    return None


def crossover_band(inp: Inputs, band: Band) -> dict:
    """The crossover with its interval: the earliest concurrency where the band's low edge drops
    below 1, and the latest — where even its high edge does (None: not within the grid and limit)."""
    point, earliest, latest = crossover(inp), None, None
    for c in _grid(inp):
        low, high = band.at(c)
        if earliest is None and low < 1.0:
            earliest = c
        if high < 1.0:
            latest = c
            break
    grid = _grid(inp)
    beyond = f"none up to {grid[-1]}" + (f" ({inp.limit.name})" if inp.limit and grid[-1] == inp.limit.sequences else "")
    return {"point": point, "earliest": earliest, "latest": latest, "searched_up_to": grid[-1],
            "limit": inp.limit.describe() if inp.limit else None, "when_none": beyond}


def _warnings(inp: Inputs, c: int, band: Band) -> list[str]:
    out = []
    for miss in band.misses_at(c):
        out.append(f"known miss: the model erred by {miss['error'][0]:+.0%} to {miss['error'][1]:+.0%} from batch "
                   f"{miss['from_batch']} on this GPU (published case {miss['case']}, {miss['method']} on "
                   f"{miss['engine']}); the band is widened by it")
    hardware = getattr(getattr(inp.device, "gpu", None), "name", None)
    validated = uncertainty.validated_batches(hardware) if hardware else None
    if validated is not None and c > validated:
        out.append(f"extrapolating: the published cases check the model on {hardware} up to batch {validated}")
    return out


def _overall_warnings(inp: Inputs) -> list[str]:
    hardware = getattr(getattr(inp.device, "gpu", None), "name", None)
    if hardware and uncertainty.validated_batches(hardware) is None:
        return [f"extrapolating: no published case the model reproduces runs on {hardware} "
                f"(benchmarks/results/forecast-published.json)"]
    return []


def _acceptance_range(acc: Acceptance) -> dict:
    if acc.alpha_low is not None and acc.alpha_high is not None and acc.tau is None:
        return {"input": "acceptance α", "range": [round(acc.alpha_low, 3), round(acc.alpha_high, 3)],
                "why": "the acceptance source's own band"}
    low, high = acc.tau_low or acc.tau, acc.tau_high or acc.tau
    return {"input": "acceptance τ", "range": [round(low, 3), round(high, 3)] if low is not None else None,
            "why": "the acceptance source's own band"}


BAND_METHOD = ("a box, not a probability: the lowest and highest speedup over every corner of the inputs' ranges "
               "(acceptance, efficiency, per-step overhead, proposer cost, request shape), each end then divided by "
               "(1 + the model's largest over- and under-forecast on its recorded checks), and at a known miss by that "
               "miss too")


def forecast(inp: Inputs, levels: list[int]) -> dict:
    band = Band.of(inp)
    rows = []
    for c in levels:
        if inp.limit is not None and c > inp.limit.sequences:
            rows.append({"concurrency": c, "refused": f"beyond {inp.limit.name}: the deployment decodes at most "
                                                      f"{inp.limit.sequences} sequences together; the rest queue"})
            continue
        tau = inp.acceptance.tau_at(inp.plan.depth, "point", inp.plan.tree, c)
        base, spec = step_times(inp, c, inp.plan, tau)
        low, high = band.at(c)
        fwd = inp.device.forward(inp.target, c, inp.plan.verify_width, inp.context)
        rows.append({
            "concurrency": c, "tau": round(tau, 3),
            "baseline_tpot_ms": round(base * 1e3, 4), "speculative_tpot_ms": round(spec * 1e3, 4),
            "prefill_per_token_ms": [round(prefill_per_token(inp, c, 1) * 1e3, 4),
                                     round(prefill_per_token(inp, c, inp.plan.verify_width, with_draft=True) * 1e3, 4)],
            "speedup": round(base / spec, 3), "band": [round(low, 3), round(high, 3)],
            "throughput_ratio": round(base / spec, 3), "verify_regime": fwd.regime,
            "best": best_depth(inp, c, band), "warnings": _warnings(inp, c, band),
        })
    cross = crossover_band(inp, band)
    return {
        "method": inp.plan.method, "draft_len": inp.plan.depth, "verify_width": inp.plan.verify_width,
        "tree": inp.plan.tree, "context_tokens": inp.context, "device": inp.device.describe(),
        "requests": inp.requests.describe() if inp.requests else None,
        "acceptance": inp.acceptance.describe(), "efficiency_band": inp.band,
        "band_method": BAND_METHOD,
        "band_inputs": [_acceptance_range(inp.acceptance)]
        + [r.describe() for r in uncertainty.input_ranges(inp)],
        "model_error": band.error.describe() if band.error else None,
        "limit": inp.limit.describe() if inp.limit else None,
        "levels": rows, "crossover_concurrency": cross["point"], "crossover": cross, "warnings": _overall_warnings(inp),
        "formula": "speedup = (t(target;B,1,L) + p) / ((t(target;B,w,L) + t_draft(B)) / τ + p'); "
                   "p = (B − 1)·t_prefill(P)/(N − 1), the closed loop's admissions per output token; "
                   "t = max(bytes/(BW·η_mem), FLOPs/(peak·η_comp)) + overhead + all-reduce",
    }


# ------------------------------------------------------------------------------------------------
# From a deployment config


def checkpoint_shape(checkpoint: str) -> ModelShape:
    """Shapes from the checkpoint's config.json (``builtin:`` names resolved), else a known
    public model's; ForecastInputError naming what to provide otherwise."""
    directory = Path(checkpoint).expanduser()
    if checkpoint.startswith("builtin:"):

        directory = Path(resolve_builtin(checkpoint))
    if (directory / "config.json").is_file():
        try:
            return shape_from_config(read_config_json(directory), f"{directory}/config.json")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ForecastInputError(f"{directory}/config.json: cannot read the model's shapes ({exc!r}); it needs "
                                     f"hidden_size, num_hidden_layers, num_attention_heads, intermediate_size, "
                                     f"vocab_size") from None
    shape = known_shape(checkpoint)
    if shape is None:
        raise ForecastInputError(
            f"checkpoint {checkpoint!r}: no config.json there and not a known public model "
            f"({', '.join(KNOWN_MODELS)}); point the config at the HF checkpoint directory (its config.json is enough)")
    return shape


def measured_requests(measured: dict, source: str) -> Requests:
    """Requests from a run's measured means (a report's ``context_measured``)."""
    return Requests(round(measured["prompt_tokens_mean"]), round(measured["generated_tokens_mean"]), source)


CONFIG_REQUESTS = "the config's default: half build.max_input_len prompt tokens, loadtest.max_tokens output tokens"


def config_requests(cfg) -> Requests:
    return Requests(cfg.build.max_input_len // 2, cfg.loadtest.max_tokens, CONFIG_REQUESTS)


def config_inputs(cfg, acceptance: Acceptance, engine: str | None = None, context: int | None = None,
                  device=None, requests: Requests | None | str = "config") -> Inputs:
    """Forecast inputs of a deployment config (speculation method ≠ none). ``requests``: the load
    test's requests (``"config"``: the config's defaults; None: a static batch, as ``bench`` runs)."""

    try:
        plan = plan_for(cfg.speculation)
    except (KeyError, AttributeError):
        raise ForecastInputError(f"{cfg.name}: no forecast for speculation method {cfg.method!r} "
                                 f"(forecast methods: {', '.join(PLANS)}; 'none' has nothing to forecast)") from None
    compute = cfg.reference.compute_dtype
    t = cfg.target
    dense = _DTYPE_BYTES[compute if cfg.backend == "reference" else t.dtype]
    peak_dtype = PEAK_DTYPE.get(t.quantization.format) or t.dtype
    shape = checkpoint_shape(t.checkpoint)
    draft_shape = checkpoint_shape(cfg.draft.checkpoint) if cfg.draft is not None else None
    target = model_cost("target", shape, weight_bytes_per_param(t, cfg.backend, compute), dense,
                        kv_bytes(t, cfg.backend, compute), t.tp, peak_dtype)
    draft = None
    if cfg.draft is not None:
        d = cfg.draft
        draft = model_cost("draft", draft_shape, weight_bytes_per_param(d, cfg.backend, compute),
                           dense, kv_bytes(d, cfg.backend, compute), d.tp, PEAK_DTYPE.get(d.quantization.format) or d.dtype)
    if device is None:
        if cfg.hardware == "cpu":
            device = stored_device(target, calibration_key(cfg))
        else:
            device = GpuDevice(gpu_figures(cfg.hardware), engine_figures(engine or "trtllm"))
    if requests == "config":
        requests = config_requests(cfg)
    if context is None:  # a request's mean context over its decode
        context = (requests.prompt_tokens + requests.output_tokens // 2 if requests is not None
                   else cfg.build.max_input_len // 2 + cfg.loadtest.max_tokens // 2)
    band = getattr(getattr(device, "engine", None), "band", None) or getattr(device, "band", 0.1)
    limit = concurrency_limit(cfg, shape, draft_shape, context + plan.verify_width)
    return Inputs(device, target, draft, plan, acceptance, shape.vocab_size, dense, context, band, requests, limit=limit)


def concurrency_limit(cfg, target_shape: ModelShape, draft_shape: ModelShape | None, tokens: int) -> Limit:
    """The most sequences of ``tokens`` (context + verified tokens) the deployment decodes together:
    ``build.max_batch_size``, and on a GPU the KV pool the memory estimate leaves (the speculative
    arm's engines, KV fraction of what their weights, activations and margins leave)."""

    batch = cfg.build.max_batch_size
    limits = [Limit(batch, f"build.max_batch_size {batch}")]
    profile = get_profile(cfg.hardware)
    if profile.is_gpu:
        per_token = sum(e.kv_per_token_gib for e in speculative_executors(cfg, profile, target_shape, draft_shape))
        pool = estimate_memory(cfg, profile, target_shape, draft_shape).kv_pool_gib
        if per_token > 0:
            fit = int(pool / per_token) // max(tokens, 1)
            limits.append(Limit(fit, f"the KV capacity ({fit} sequences of {tokens} tokens in the "
                                     f"{pool:.1f} GiB KV pool per GPU of the memory estimate)"))
    return min(limits, key=lambda limit: limit.sequences)


def forecast_config(cfg, acceptance: Acceptance, levels: list[int] | None = None, **kw) -> dict:
    inp = config_inputs(cfg, acceptance, **kw)
    out = forecast(inp, levels or list(cfg.loadtest.concurrency))
    out["config"] = cfg.name
    out["hardware"] = cfg.hardware
    return out


def break_even(inp: Inputs, batch: int) -> dict:
    """The τ (and, for a chain, the i.i.d. α) at which speculation exactly pays at ``batch``: no
    acceptance input needed. τ above the verify width means it cannot pay at all."""
    def gain(tau: float) -> float:
        base, spec = step_times(inp, batch, inp.plan, tau)
        return base / spec

    low, high = 1.0, float(inp.plan.depth + 1)
    if gain(high) < 1.0:
        return {"concurrency": batch, "tau": None, "alpha": None, "pays": False}
    for _ in range(50):
        mid = (low + high) / 2
        low, high = (mid, high) if gain(mid) < 1.0 else (low, mid)
    tau = (low + high) / 2
    alpha = None if inp.plan.tree else round(alpha_for_tau(tau, inp.plan.depth), 3)
    return {"concurrency": batch, "tau": round(tau, 3), "alpha": alpha, "pays": True}


def section_lines(cfg) -> list[str]:
    """The short forecast section of ``plan`` and ``validate``: the acceptance at which
    speculation pays at each concurrency of the config (needs no acceptance source), or why no
    forecast can be made."""
    if cfg.method not in PLANS:
        return []
    try:
        inp = config_inputs(cfg, Acceptance("break-even probe", tau=1.0, tau_low=1.0, tau_high=1.0))
        rows = [break_even(inp, c) for c in cfg.loadtest.concurrency]
    except ForecastInputError as exc:
        return [f"forecast: not available — {exc}"]
    parts = []
    for row in rows:
        if not row["pays"]:
            parts.append(f"c={row['concurrency']}: cannot pay (even every draft accepted)")
        else:
            parts.append(f"c={row['concurrency']}: τ ≥ {row['tau']:.2f}" + (f" (α ≥ {row['alpha']:.2f})" if row["alpha"] is not None else ""))
    return [f"forecast ({inp.plan.method}, K={inp.plan.depth}): speculation pays when " + "; ".join(parts),
            f"  then: specdeploy forecast {cfg.source_path or cfg.name} --acceptance A (or --from-report / --from-bench)"]


def bench_forecast(cfg, calibration: dict, tau: float, coverage: float, context: int, prompt_len: float,
                   max_tokens: int, batch: int) -> tuple[float, float]:
    """(end-to-end, decode-only) forecast speedup of a CPU ``bench`` run of ``cfg`` at ``batch``
    from a calibration and the measured acceptance: per request one prefill of ``prompt_len``
    tokens (both arms alike) and ``max_tokens − 1`` decode steps. What
    ``benchmarks/bench_forecast_cpu.py`` compares with the measurement, and what the result
    file's test recomputes from the calibrations it stores."""
    depth = config_inputs(cfg, Acceptance("probe", tau=tau), device=CpuDevice(calibration)).plan.depth
    acceptance = Acceptance("bench, same run (τ per verify step, draft coverage)", tau=tau, tau_low=tau,
                            tau_high=tau, at_depth=depth, coverage=coverage)
    inp = config_inputs(cfg, acceptance, context=context, device=CpuDevice(calibration), requests=None)  # static batches
    inp.device = CpuDevice(calibration, inp.target)
    base_s, spec_s = step_times(inp, batch, inp.plan, tau)
    fit = calibration["forward_fits"]["target"]
    prefill = fit["a"] + (fit["b"] + fit["c"] * prompt_len / 2) * prompt_len
    e2e = (prefill + (max_tokens - 1) * base_s) / (prefill + (max_tokens - 1) * spec_s)
    return e2e, speedup_at(inp, batch)
