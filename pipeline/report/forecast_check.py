"""Forecast vs measured, per concurrency, in every report.

Reads the report's headline rows (both arms' TPOT and output tokens/s, the speculative arm's
measured τ per concurrency), the run's raw records (prompt and generated tokens, for the context)
and config; for a CPU run the stored CPU calibration (:mod:`pipeline.forecast.cpu`) and the
outcome of the calibration ``specdeploy run`` made (``run.json``'s ``forecast_calibration``, in
the report's provenance), for a GPU run the hardware and engine figures. Writes nothing: returns
the ``forecast`` section of ``report.json``.

The context the forecast reads is the run's own when its records carry the prompt token counts
(``isl``): mean prompt tokens + half the mean generated tokens over the measured requests; else the
config's default (half the max input + half the max tokens). ``context_source`` names which.

The measured acceptance is fed back (τ per concurrency of this run), so the error isolates the
cost model: forecast TPOT ratio (base ÷ spec) and throughput ratio against the measured ones,
error = measured ÷ forecast − 1. A level whose measurement falls more than
:data:`~pipeline.forecast.model.WORTH_A_LOOK` outside the forecast band is flagged "worth a look"
(a misconfigured engine, a wrong KV pool, a noisy host) — never a gate failure. Any reason the
forecast cannot be made (no calibration, unknown shapes, no figures) gives ``available: false``
and the reason; it never fails the report.

Where the responses carry the server's token times, each level also gives the TPOT ratio of the
engines themselves and each arm's delivery lag (the client's TPOT over the engine's); a level where
the baseline's lag exceeds the speculative arm's by :data:`DELIVERY_LOOK` is "delivery-bound": its
measured speedup includes how far the serving path and the load generator fell behind.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Iterable

from pipeline.errors import SpecdeployError
from pipeline.report.view.tables import table

DELIVERY_LOOK = 0.10  # baseline delivery lag beyond the speculative arm's that marks a level delivery-bound
CONFIG_CONTEXT = "the config's default, half build.max_input_len + half loadtest.max_tokens"


def _headline(items: list[dict], arm: str, primary, length_key: str) -> list[dict]:
    """The arm's entries the forecast is checked against: the baseline's, or the speculative
    arm's at the report's primary draft length (all of them when none is at it)."""
    mine = [item for item in items if item.get("arm") == arm]
    if arm == "baseline" or primary is None:
        return mine
    return [item for item in mine if item.get(length_key) in (None, primary)] or mine


def primary_rows(data: dict, arm: str) -> list[dict]:
    """The arm's headline rows (one per concurrency) the forecast is checked against."""
    return _headline(data.get("rows", []), arm, data.get("primary_draft_len"), "speculation_length")


def primary_cells(data: dict, arm: str) -> list[dict]:
    """The arm's cells (per concurrency: TPOT, TTFT and output-length statistics, acceptance
    counters) at the same draft length as :func:`primary_rows`."""
    return _headline(data.get("cells", []), arm, data.get("primary_draft_len"), "draft_len")


def _arm_rows(data: dict, arm: str) -> dict[int, dict]:
    return {r["concurrency"]: r for r in primary_rows(data, arm)}


def _ratio(a, b) -> float | None:
    return a / b if a and b else None


def _measured_acceptance(spec_rows: dict[int, dict], depth: int):
    from pipeline.forecast.acceptance import Acceptance  # noqa: PLC0415 - start-up: yaml (pipeline.forecast reads its tables; pipeline.report.view.render imports this module without it)

    per_level = {c: r["mean_acceptance_length"] for c, r in spec_rows.items() if r.get("mean_acceptance_length")}
    if not per_level:
        return None
    tau = sum(per_level.values()) / len(per_level)
    return Acceptance("this run's measured τ per concurrency (fed back)", tau=tau, tau_low=tau, tau_high=tau,
                      at_depth=depth, per_level=per_level)


def run_context(records: Iterable[dict]) -> dict[str, Any] | None:
    """The context the run's requests decoded at, from its measured successful records that carry
    the prompt's token count: mean prompt tokens + half the mean generated tokens (a request's mean
    context over its decode). None when no record carries a prompt token count."""
    counted = [r for r in records
               if r.get("stage") == "measure" and r.get("status") == "ok" and r.get("isl") is not None]
    if not counted:
        return None
    prompt = sum(r["isl"] for r in counted) / len(counted)
    generated = sum(r.get("osl") or 0 for r in counted) / len(counted)
    return {"tokens": round(prompt + generated / 2), "prompt_tokens_mean": round(prompt, 2),
            "generated_tokens_mean": round(generated, 2), "requests": len(counted)}


def _context(measured: dict | None) -> tuple[int | None, str]:
    """(the context to forecast at, None for the config's default; where it comes from)."""
    if measured is None:
        return None, f"{CONFIG_CONTEXT} (the run's records carry no prompt token counts)"
    return measured["tokens"], (f"this run's records: mean prompt tokens {measured['prompt_tokens_mean']} + half the "
                                f"mean generated tokens {measured['generated_tokens_mean']} over "
                                f"{measured['requests']} requests")


def _requests(measured: dict | None, cfg):
    """The closed loop's requests the forecast charges admissions for: this run's mean prompt and
    output tokens when its records carry them, else the config's defaults."""
    from pipeline.forecast.model import config_requests, measured_requests  # noqa: PLC0415 - start-up: yaml (pipeline.forecast reads its tables; pipeline.report.view.render imports this module without it)

    if measured is None:
        return config_requests(cfg)
    return measured_requests(measured, f"this run's records: mean prompt and generated tokens over "
                                       f"{measured['requests']} requests")


def forecast_section(data: dict, cfg, measured_context: dict | None = None) -> dict[str, Any]:
    """The report's forecast-vs-measured section (``available: false`` with a reason when it
    cannot be made), at the run's measured context (:func:`run_context`) when given."""
    from pipeline.forecast.model import config_inputs, crossover  # noqa: PLC0415 - start-up: yaml (pipeline.forecast reads its tables; pipeline.report.view.render imports this module without it)
    from pipeline.forecast.proposers import PLANS  # noqa: PLC0415 - start-up: yaml (pipeline.forecast reads its tables; pipeline.report.view.render imports this module without it)

    if cfg.method not in PLANS:
        return {"available": False, "reason": f"no forecast for speculation method {cfg.method!r}"}
    base_rows, spec_rows = _arm_rows(data, "baseline"), _arm_rows(data, "speculative")
    try:
        from pipeline.forecast.proposers import plan_for  # noqa: PLC0415 - start-up: yaml (pipeline.forecast reads its tables; pipeline.report.view.render imports this module without it)

        depth = plan_for(cfg.speculation).depth
        acceptance = _measured_acceptance(spec_rows, depth)
        if acceptance is None:
            return {"available": False, "reason": "the run measured no acceptance length, so there is nothing to feed back"}
        context, context_source = _context(measured_context)
        inp = config_inputs(cfg, acceptance, context=context, requests=_requests(measured_context, cfg))
    except (SpecdeployError, KeyError, ValueError, OSError) as exc:
        return {"available": False, "reason": f"forecast not available: {exc}"}
    levels, flagged = [], []
    for c in sorted(set(base_rows) & set(spec_rows)):
        tau = acceptance.per_level.get(c, acceptance.tau)
        spec = _measured(data, spec_rows[c], "speculative", c)
        level = _level(_with_coverage(inp, spec["coverage"]), c, tau, _measured(data, base_rows[c], "baseline", c), spec)
        if level["worth_a_look"]:
            flagged.append(c)
        levels.append(level)
    errors = [abs(lv["tpot_error"]) for lv in levels if lv["tpot_error"] is not None]
    # crossover: where the forecast puts it, also beyond the measured levels (the schedule quotes it)
    return {"available": True, "crossover": crossover(inp), "device": inp.device.describe(), "acceptance": acceptance.source,
            "method": inp.plan.method, "draft_len": inp.plan.depth, "context_tokens": inp.context,
            "context_source": context_source, "context_measured": measured_context,
            "requests": inp.requests.describe() if inp.requests else None,
            "calibration_prompts": getattr(inp.device, "calibration", {}).get("prompts"),
            "levels": levels, "mean_abs_tpot_error": _round(sum(errors) / len(errors) if errors else None),
            "worth_a_look": flagged, "delivery_bound": [lv["concurrency"] for lv in levels if lv["delivery_bound"]],
            "note": "forecast with this run's measured acceptance, against the mean TPOT per request; a level far "
                    "outside the band is worth a look (engine settings, KV pool, a noisy host), not a failed gate"}


def _measured(data: dict, row: dict, arm: str, concurrency: int) -> dict:
    """One arm's measured TPOT, TTFT and output length at a level: the cell's means where the
    report has cells (the forecast is a mean over steps, so it is compared with the mean per
    request, not the median), else the headline row's median TPOT."""
    for cell in primary_cells(data, arm):
        if cell.get("concurrency") == concurrency:
            mean = (cell.get("tpot_ms") or {}).get("mean")
            if mean:
                return {"tpot_ms": mean, "statistic": "mean", "ttft_ms": (cell.get("ttft_ms") or {}).get("mean"),
                        "osl": (cell.get("osl") or {}).get("mean"), "tokens_per_s": row.get("output_tokens_per_s"),
                        "coverage": _coverage(cell.get("acceptance") or {}),
                        "engine_tpot_ms": (cell.get("engine_tpot_ms") or {}).get("mean"),
                        "delivery_lag": cell.get("delivery_lag"), "e2e_ms": (cell.get("e2e_ms") or {}).get("mean")}
    return {"tpot_ms": row.get("tpot_ms"), "statistic": "median", "ttft_ms": None, "osl": None,
            "tokens_per_s": row.get("output_tokens_per_s"), "coverage": None, "engine_tpot_ms": None,
            "delivery_lag": None, "e2e_ms": None}


def _decoding(arm: dict, concurrency: int) -> float:
    """How many sequences a decoding sequence of the arm shares its steps with, itself included:
    each of the ``concurrency`` requests spends TTFT of its E2E before its first token (waiting
    for admission, prefilling, reaching the client) and a closed loop refills its slot only after
    its last, so each of the others decodes a fraction (E2E − TTFT) / E2E of the time. All of them
    without the cell's means."""
    ttft, e2e = arm.get("ttft_ms"), arm.get("e2e_ms")
    if not (ttft is not None and e2e and 0 <= ttft < e2e):
        return float(concurrency)
    return 1 + (concurrency - 1) * (e2e - ttft) / e2e


def _coverage(acceptance: dict) -> float | None:
    """The fraction of target passes that verified drafts: tokens gained per pass (accepted ÷ all
    decode passes, from the requests' chunks) over τ per verify step (the server's counters). None
    when the cell has not both."""
    accepted, passes, tau = (acceptance.get(k) for k in ("accepted_tokens", "decode_steps", "mean_acceptance_length"))
    if not (accepted and passes and tau and tau > 1):
        return None
    return min(1.0, accepted / passes / (tau - 1))


def _with_coverage(inp, coverage: float | None):
    """``inp`` with the measured draft coverage (passes without drafts verify one token, gain one)."""
    if coverage is None:
        return inp
    return replace(inp, acceptance=replace(inp.acceptance, coverage=coverage))


def _level(inp, c: int, tau: float, base: dict, spec: dict) -> dict[str, Any]:
    """Forecast vs measured at concurrency ``c``: the cost model's TPOT ratio with this run's τ,
    against the measured one. Beside it, a diagnostic: what the served baseline spends per step
    beyond the model (serving — one response per sequence per step, Triton, the client — and the
    calibration's own error, which a single run cannot tell apart), and the ratio if all of it were
    a cost per step that the speculative step pays too."""
    from pipeline.forecast.model import WORTH_A_LOOK, step_times  # noqa: PLC0415 - start-up: yaml (pipeline.forecast reads its tables; pipeline.report.view.render imports this module without it)

    decoding = (_decoding(base, c), _decoding(spec, c))
    base_s, spec_s = step_times(inp, c, inp.plan, tau, decoding=decoding)
    edges = [step_times(inp, c, inp.plan, tau, inp.device.scaled(f), decoding=decoding) for f in (1 - inp.band, 1 + inp.band)]
    band = [min(b / s for b, s in edges), max(b / s for b, s in edges)]
    forecast = base_s / spec_s
    measured_tpot = _ratio(base["tpot_ms"], spec["tpot_ms"])
    measured_tput = _ratio(spec["tokens_per_s"], base["tokens_per_s"])
    forecast_tput = _throughput_ratio(base, spec, forecast) or forecast
    beyond = (base["tpot_ms"] / 1e3 - base_s) if base["tpot_ms"] else 0.0
    with_serving = _ratio(*step_times(inp, c, inp.plan, tau, serving_s=beyond, decoding=decoding))
    outside = None
    if measured_tpot is not None:
        outside = max(band[0] / measured_tpot - 1, measured_tpot / band[1] - 1, 0.0)
    lag = {"baseline": _round(base["delivery_lag"]), "speculative": _round(spec["delivery_lag"])}
    engine_ratio = _ratio(base["engine_tpot_ms"], spec["engine_tpot_ms"])
    return {
        "concurrency": c, "tau_measured": round(tau, 3), "draft_coverage": round(inp.acceptance.coverage, 3),
        "decoding_sequences": [round(d, 3) for d in decoding],
        "forecast_tpot_ratio": round(forecast, 3), "band": [round(band[0], 3), round(band[1], 3)],
        "measured_tpot_ratio": _round(measured_tpot), "tpot_statistic": base["statistic"],
        "tpot_error": _round(measured_tpot / forecast - 1 if measured_tpot else None),
        "forecast_throughput_ratio": round(forecast_tput, 3), "measured_throughput_ratio": _round(measured_tput),
        "throughput_error": _round(measured_tput / forecast_tput - 1 if measured_tput else None),
        "forecast_baseline_tpot_ms": round(base_s * 1e3, 4), "forecast_speculative_tpot_ms": round(spec_s * 1e3, 4),
        "measured_engine_tpot_ms": [_round(base["engine_tpot_ms"]), _round(spec["engine_tpot_ms"])],
        "baseline_beyond_model_ms": round(beyond * 1e3, 4),
        "serving_fed_back_tpot_ratio": _round(with_serving),
        "serving_fed_back_error": _round(measured_tpot / with_serving - 1 if measured_tpot and with_serving else None),
        "worth_a_look": outside is not None and outside > WORTH_A_LOOK,
        "measured_engine_tpot_ratio": _round(engine_ratio),
        "engine_tpot_error": _round(engine_ratio / forecast - 1 if engine_ratio else None),
        "delivery_lag": lag, "delivery_bound": delivery_bound(lag),
    }


def delivery_bound(lag: dict) -> bool:
    """The baseline's tokens reached the client :data:`DELIVERY_LOOK` (relative) later than the
    speculative arm's, against the engines' own token times: the serving path or the load
    generator, not the engine, set the baseline's TPOT there. It streams one response per token,
    the speculative arm one per step, so a path that cannot keep up slows the baseline more, and
    the measured speedup then includes delivery."""
    base, spec = lag.get("baseline"), lag.get("speculative")
    return base is not None and spec is not None and base - spec > DELIVERY_LOOK


def _throughput_ratio(base: dict, spec: dict, tpot_ratio: float) -> float | None:
    """Output tokens/s, speculative ÷ baseline, of a closed loop: per request its measured TTFT and
    output length, and (length − 1) × the TPOT — the baseline's measured, the speculative's that
    divided by the forecast TPOT ratio. None without the cells' TTFT and length."""
    if not (base["ttft_ms"] and spec["ttft_ms"] and base["osl"] and spec["osl"]):
        return None

    def rate(arm: dict, tpot_ms: float) -> float:
        return arm["osl"] / (arm["ttft_ms"] + (arm["osl"] - 1) * tpot_ms)

    return rate(spec, base["tpot_ms"] / tpot_ratio) / rate(base, base["tpot_ms"])


def _round(value):
    return round(value, 3) if isinstance(value, float) else value


def safe_forecast_section(data: dict, cfg, measured_context: dict | None = None) -> dict[str, Any]:
    """:func:`forecast_section`, never raising: a report must not fail for its forecast. When it
    is not available and the calibration ``specdeploy run`` tried failed, the reason says so first."""
    try:
        section = forecast_section(data, cfg, measured_context)
    except Exception as exc:  # noqa: BLE001 - the forecast is advice; the report stands without it
        section = {"available": False, "reason": f"forecast failed: {type(exc).__name__}: {exc}"}
    calibration = (data.get("provenance") or {}).get("forecast_calibration") or {}
    if not section["available"] and calibration.get("status") == "failed":
        section["reason"] = (f"the CPU calibration `specdeploy run` made before the load test failed "
                             f"({calibration.get('reason')}); {section['reason']}")
    return section


def forecast_table(data: dict) -> dict | None:
    """The report view's table (None when the report has no forecast)."""

    fc = data.get("forecast") or {}
    if not fc.get("available"):
        return None
    rows, classes = [], []
    for lv in fc["levels"]:
        rows.append([str(lv["concurrency"]), f"{lv['tau_measured']:.2f}",
                     f"{lv['forecast_tpot_ratio']:.2f} [{lv['band'][0]:.2f}, {lv['band'][1]:.2f}]",
                     _fmt(lv["measured_tpot_ratio"]), _pct(lv["tpot_error"]),
                     _fmt(lv.get("baseline_beyond_model_ms")), _fmt(lv.get("serving_fed_back_tpot_ratio")),
                     _fmt(lv["measured_throughput_ratio"]), _pct(lv["throughput_error"]), _lag(lv.get("delivery_lag")),
                     "; ".join(flag for flag, on in (("worth a look", lv["worth_a_look"]),
                                                      ("delivery-bound", lv.get("delivery_bound"))) if on)])
        classes.append([""] * 10 + ["bad" if lv["worth_a_look"] or lv.get("delivery_bound") else ""])
    return table(["concurrency", "τ measured", "forecast speedup [band]", "measured TPOT ratio", "error",
                  "baseline beyond the model (ms/step)", "forecast if that is serving", "measured throughput ratio",
                  "error", "delivery lag (baseline / speculative)", ""], rows, classes)


def _lag(lag: dict | None) -> str:
    if not lag or (lag.get("baseline") is None and lag.get("speculative") is None):
        return "–"
    return f"{_pct(lag.get('baseline'))} / {_pct(lag.get('speculative'))}"


def forecast_note(data: dict) -> str:
    fc = data.get("forecast") or {}
    if not fc.get("available"):
        return fc.get("reason") or "no forecast in this report"
    dev = fc["device"]
    where = dev.get("hardware") or "CPU calibration of " + str(dev.get("calibrated"))
    context = f" at context {fc['context_tokens']} tokens ({fc['context_source']})" if fc.get("context_source") else ""
    bound = fc.get("delivery_bound") or []
    delivery = (f" Delivery-bound at concurrency {', '.join(map(str, bound))}: the baseline's tokens reached the client "
                f"over {DELIVERY_LOOK:.0%} later than the speculative arm's, against the engines' own token times, so "
                "the measured speedup there includes the serving path and load generator falling behind." if bound else "")
    return (f"Forecast on {where} ({dev.get('engine', 'reference engine')}) with {fc['acceptance']}{context}; "
            f"mean |TPOT error| {_pct(fc['mean_abs_tpot_error'])}. {fc['note']}.{delivery}")


def compare_line(data_a: dict, data_b: dict) -> str:
    """One line for ``report --compare``: both runs' mean forecast error."""
    def err(data):
        fc = data.get("forecast") or {}
        return _pct(fc.get("mean_abs_tpot_error")) if fc.get("available") else "n/a"

    return f"Forecast mean |TPOT error|: A {err(data_a)} → B {err(data_b)}"


def _fmt(value) -> str:
    return "–" if value is None else f"{value:.2f}"


def _pct(value) -> str:
    return "–" if value is None else f"{value * 100:+.0f}%"
