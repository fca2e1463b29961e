"""`specdeploy forecast CONFIG`: expected TPOT of both arms, speedup per concurrency, crossover
and best draft length, before any GPU time (docs/forecast.md).

Reads the config, its checkpoints' config.json (or known model shapes), the hardware/engine
figures and the acceptance source given; with ``--plot`` writes a PNG. ``--json`` prints the
forecast dict. No acceptance source is an error naming the ways to give one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from pipeline.cli.options import workdir_option


def acceptance_from_options(cfg, alpha: Optional[float], tau: Optional[float], report: Optional[Path],
                            bench: Optional[Path], published: Optional[str]):
    """The one acceptance source the options name (ForecastInputError when none or several)."""
    from pipeline.forecast import acceptance as acc
    from pipeline.forecast.figures import ForecastInputError
    from pipeline.forecast.proposers import plan_for

    given = [x for x in (alpha, tau, report, bench, published) if x is not None]
    if not given:
        raise ForecastInputError(acc.missing_acceptance_message(cfg.name))
    if len(given) > 1:
        raise ForecastInputError("give one acceptance source: --acceptance, --acceptance-length, --from-report, "
                                 "--from-bench or --published")
    if alpha is not None:
        return acc.from_alpha(alpha)
    if tau is not None:
        return acc.from_tau(tau, plan_for(cfg.speculation).depth, "user-given --acceptance-length (e.g. server metrics)")
    if report is not None:
        return acc.from_report(report)
    if bench is not None:
        return acc.from_bench(bench, cfg.method, plan_for(cfg.speculation).depth)
    from pipeline.forecast.published import load_cases

    cases = {c["id"]: c for c in load_cases()["cases"]}
    case = cases.get(published)
    if case is None or not case.get("acceptance_length"):
        with_tau = [k for k, c in cases.items() if c.get("acceptance_length")]
        raise ForecastInputError(f"--published {published}: no published acceptance length; cases with one: {', '.join(with_tau)}")
    return acc.from_tau(case["acceptance_length"], case["plan"]["depth"], f"published: {case['source']}")


def requests_from_options(cfg, prompt_tokens: Optional[int], output_tokens: Optional[int],
                          report: Optional[Path] = None):
    """The load test's requests: the options', else an earlier run's (``--from-report``: its measured
    means), else the config's defaults."""
    from pipeline.forecast.model import Requests, config_requests, measured_requests

    default = config_requests(cfg)
    if report is not None:
        measured = (json.loads(Path(report).read_text(encoding="utf-8")).get("forecast") or {}).get("context_measured")
        if measured:
            default = measured_requests(measured, f"{report}: that run's mean prompt and generated tokens")
    if prompt_tokens is None and output_tokens is None:
        return default
    given = " and ".join(f"--{name} {value}" for name, value in (("prompt-tokens", prompt_tokens),
                                                                 ("output-tokens", output_tokens)) if value is not None)
    return Requests(prompt_tokens or default.prompt_tokens, output_tokens or default.output_tokens,
                    f"{given}; otherwise {default.source}")


def calibrate_machine(cfg) -> tuple[Path, str]:
    """Calibrate the CPU cost model on this machine for the config's models and proposer, timed on
    its load-test prompts; store it. Returns (where it is stored, which prompts it was timed on)."""
    from pipeline.forecast.machine_calibration import calibrate_config

    path, calibration = calibrate_config(cfg)
    return path, calibration["prompts"]


def register(app: typer.Typer) -> None:
    @app.command("forecast", help="Forecast speedup, crossover and best draft length per concurrency before GPU time.")
    def forecast_command(
        config: str = typer.Argument(..., help="Deployment config YAML."),
        alpha: Optional[float] = typer.Option(None, "--acceptance", help="Acceptance rate α per draft token (i.i.d.)."),
        tau: Optional[float] = typer.Option(None, "--acceptance-length",
                                            help="Mean acceptance length τ measured elsewhere (server metrics)."),
        report: Optional[Path] = typer.Option(None, "--from-report", help="An earlier run's report.json."),
        bench: Optional[Path] = typer.Option(None, "--from-bench", help="A `specdeploy bench --output` JSON."),
        published: Optional[str] = typer.Option(None, "--published", help="A published case id (data/published.yaml)."),
        engine: Optional[str] = typer.Option(None, "--engine", help="Engine figures: trtllm (default), sglang, research."),
        context: Optional[int] = typer.Option(None, "--context", help="Context tokens per sequence (default: the "
                                              "prompt tokens + half the output tokens)."),
        prompt_tokens: Optional[int] = typer.Option(None, "--prompt-tokens", min=1,
                                                    help="Mean prompt tokens of the load test's requests: each "
                                                         "admission's prefill holds up the others' steps (default: "
                                                         "half the max input)."),
        output_tokens: Optional[int] = typer.Option(None, "--output-tokens", min=2,
                                                    help="Mean output tokens per request (default: the load "
                                                         "test's max tokens)."),
        calibrate: bool = typer.Option(False, "--calibrate", help="CPU configs: microbenchmark the reference engine "
                                       "on this machine first, on the config's load-test prompts, and store the calibration."),
        as_json: bool = typer.Option(False, "--json", help="Print the forecast as JSON."),
        plot: Optional[Path] = typer.Option(None, "--plot", help="Write the speedup-vs-concurrency plot (PNG)."),
        workdir: Optional[Path] = workdir_option(),
    ) -> None:
        from pipeline.config import load_config
        from pipeline.forecast.model import forecast_config
        from pipeline.forecast.render import summary_lines, write_plot

        cfg = load_config(config, workdir)
        if calibrate:
            path, prompts = calibrate_machine(cfg)
            typer.echo(f"calibration stored: {path} (timed on {prompts})", err=True)
        acceptance = acceptance_from_options(cfg, alpha, tau, report, bench, published)
        fc = forecast_config(cfg, acceptance, engine=engine, context=context,
                             requests=requests_from_options(cfg, prompt_tokens, output_tokens, report))
        if plot is not None:
            fc["plot"] = str(write_plot(fc, plot))
        if as_json:
            typer.echo(json.dumps(fc, indent=2))
        else:
            typer.echo("\n".join(summary_lines(fc)))
