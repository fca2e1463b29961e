"""`specdeploy capacity RUN_DIR|CONFIG`: replicas, GPUs and cost per million output tokens at an
SLO, with and without speculation (docs/capacity.md).

Reads a run directory (its report and raw records: measured curves) or a deployment config (the
forecast: no run yet, marked as forecast with its band). Writes nothing; ``--json`` prints the
answer as JSON.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from pipeline.cli.options import workdir_option


def _slo(ttft: Optional[float], tpot: Optional[float], e2e: Optional[float], percentile: float):
    from pipeline.report.capacity import Slo

    if ttft is None and tpot is None and e2e is None:
        return None
    return Slo(ttft, tpot, e2e, percentile)


def _gpus_per_replica(config: dict) -> int:
    """A replica's GPUs: the target's TP × PP (a draft model shares them, as the plan lays it out)."""
    target = config.get("target") or {}
    if config.get("hardware") == "cpu":
        return 1
    return int(target.get("tp", 1)) * int(target.get("pp", 1))


def lines(answer: dict) -> list[str]:
    cap, fleet = answer["capacity"], answer["fleet"]
    slo = ", ".join(f"{k.removesuffix('_ms').upper()} ≤ {v:g} ms" for k, v in cap["slo"].items() if k != "percentile")
    out = [f"capacity ({cap['source']}) at p{cap['slo']['percentile']:g}: {slo}"]
    if cap["source"] == "forecast":
        out.append("  FORECAST, not a measurement: " + cap["arms"]["baseline"]["note"])
    demand = fleet["demand"]
    out.append("  demand: " + (f"{demand['rate_rps']:g} req/s" if demand.get("rate_rps") is not None
                               else f"a daily profile, peak {max(demand['hourly_rps']):g} req/s"))
    for arm in ("baseline", "speculative"):
        c, f = cap["arms"][arm], fleet["arms"][arm]
        low, high = c["rps_interval"]
        interval = f" [{low:.3g}, {high:.3g}]" if low is not None and high is not None else ""
        bound = " (at least: every level met the SLOs)" if c.get("lower_bound") else ""
        if f["gpus"] is None:
            out.append(f"  {arm:>11}: meets the SLOs at no load{bound}")
            continue
        cost = (f", ${f['cost_per_m_tokens_usd']:.4g} per M output tokens "
                f"[{_money(f['interval']['cost_per_m_tokens_usd'])}]" if f["cost_per_m_tokens_usd"] is not None else "")
        out.append(f"  {arm:>11}: {c['rps']:.3g} req/s per replica{interval}{bound}; {f['replicas']} replicas, "
                   f"{f['gpus']} GPUs [{_span(f['interval']['gpus'])}], {f['output_tokens_per_s_per_gpu']:.4g} "
                   f"output tok/s per GPU{cost}")
    ratio = cap["capacity_ratio"]
    if ratio.get("point"):
        interval = f" [{ratio['low']:.3g}, {ratio['high']:.3g}]" if ratio.get("low") is not None else ""
        out.append(f"  speculation: capacity × {ratio['point']:.3g}{interval}")
    diff = fleet.get("speculation")
    if diff:
        change = f", cost {diff['cost_change']:+.0%}" if diff.get("cost_change") is not None else ""
        out.append(f"  speculation saves {diff['gpus_saved']} GPUs{change}" if diff["gpus_saved"] >= 0
                   else f"  speculation needs {-diff['gpus_saved']} more GPUs{change}")
    return out


def _span(values) -> str:
    values = [v for v in values if v is not None]
    return "–".join(str(v) for v in sorted(set(values))) if values else "?"


def _money(values) -> str:
    values = [v for v in values if v is not None]
    return ", ".join(f"${v:.4g}" for v in sorted(values)) if values else "?"


def register(app: typer.Typer) -> None:
    @app.command("capacity", help="Replicas, GPUs and cost per million output tokens at an SLO, "
                                  "with and without speculation, from a run's curves or a config's forecast.")
    def capacity_command(
        target: str = typer.Argument(..., help="A run directory (measured) or a deployment config YAML (forecast)."),
        rate: Optional[float] = typer.Option(None, "--rate", min=0.0, help="Target request rate (req/s)."),
        daily_profile: Optional[Path] = typer.Option(None, "--daily-profile",
                                                     help="24 hourly request rates (JSON list or one per line)."),
        ttft: Optional[float] = typer.Option(None, "--ttft-ms", help="TTFT SLO (ms) at --percentile."),
        tpot: Optional[float] = typer.Option(None, "--tpot-ms", help="TPOT SLO (ms) at --percentile."),
        e2e: Optional[float] = typer.Option(None, "--e2e-ms", help="End-to-end latency SLO (ms) at --percentile."),
        percentile: float = typer.Option(95.0, "--percentile", min=50.0, max=100.0, help="SLO percentile."),
        gpu_price: Optional[float] = typer.Option(None, "--gpu-price", min=0.0, help="Price per GPU-hour (USD)."),
        gpus_per_replica: Optional[int] = typer.Option(None, "--gpus-per-replica", min=1,
                                                       help="GPUs per replica (default: the target's TP × PP)."),
        alpha: Optional[float] = typer.Option(None, "--acceptance", help="Forecast only: acceptance rate α."),
        tau: Optional[float] = typer.Option(None, "--acceptance-length", help="Forecast only: mean acceptance length τ."),
        engine: Optional[str] = typer.Option(None, "--engine", help="Forecast only: engine figures."),
        prompt_tokens: Optional[int] = typer.Option(None, "--prompt-tokens", min=1, help="Forecast only: mean prompt tokens."),
        output_tokens: Optional[int] = typer.Option(None, "--output-tokens", min=2, help="Forecast only: mean output tokens."),
        as_json: bool = typer.Option(False, "--json", help="Print the answer as JSON."),
        workdir: Optional[Path] = workdir_option(),
    ) -> None:
        from pipeline.report.capacity import Demand, Pricing, measured_capacity, plan_fleet, read_profile

        demand = Demand(rate, read_profile(daily_profile) if daily_profile else ())
        slo = _slo(ttft, tpot, e2e, percentile)
        path = Path(target)
        if path.is_dir():
            capacity = measured_capacity(path, slo)
            run = json.loads((path / "run.json").read_text(encoding="utf-8")) if (path / "run.json").is_file() else {}
            per_replica = gpus_per_replica or _gpus_per_replica(run.get("config") or {})
        else:
            from pipeline.cli.forecast_cmd import acceptance_from_options, requests_from_options
            from pipeline.config import load_config
            from pipeline.forecast.model import config_inputs
            from pipeline.report.capacity import CapacityError, Slo, forecast_capacity

            cfg = load_config(target, workdir)
            slo = slo or Slo(cfg.gate.slo.ttft_ms, cfg.gate.slo.tpot_ms)
            if slo.ttft_ms is not None and slo.tpot_ms is None and slo.e2e_ms is None:
                raise CapacityError("a forecast cannot size against TTFT alone (queueing is not modelled): "
                                    "give --tpot-ms or --e2e-ms")
            inp = config_inputs(cfg, acceptance_from_options(cfg, alpha, tau, None, None, None), engine=engine,
                                requests=requests_from_options(cfg, prompt_tokens, output_tokens))
            capacity = forecast_capacity(inp, slo)
            per_replica = gpus_per_replica or cfg.target.tp * cfg.target.pp
        answer = {"capacity": capacity, "fleet": plan_fleet(capacity, demand, Pricing(gpu_price, per_replica))}
        typer.echo(json.dumps(answer, indent=2) if as_json else "\n".join(lines(answer)))
