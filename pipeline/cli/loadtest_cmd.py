"""`specdeploy loadtest CONFIG`: speculative vs baseline under a concurrency sweep (Locust).

Reads the config, starts both arms' servers (or uses ``--endpoint-*``), runs Locust headless as a
subprocess per arm × concurrency × repeat (interleaved), writes RUN_DIR (raw records, runs.json,
run.json, metrics) and then the report; exits with the verdict's code (0 GO, 1 NO-GO,
3 INCONCLUSIVE; 2 a usage error, 5 an unreachable endpoint or a load-harness failure), or 4 when it stopped early because the requests failed
from the start (pipeline/loadtest/fail_fast.py: the first error verbatim and a likely fix).
Exit 5 when the load generator itself failed (pipeline/loadtest/harness.py) or ``--resume`` /
``--out`` names a run another live process is measuring (pipeline/loadtest/ownership.py).
``--aa`` measures the baseline against itself (pipeline/report/aa.py): exit 0 NO DIFFERENCE, 1
DIFFERENCE (the rig shows one between identical arms), 3 INCONCLUSIVE; it writes the rig's noise to
aa.json, which later A/B reports of the config quote.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from pipeline.cli.options import workdir_option
from pipeline.errors import UsageError


def _int_list(value: Optional[str], option: str) -> Optional[list[int]]:

    if value is None:
        return None
    try:
        items = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"{option}: expected comma-separated integers like 1,4,16, got '{value}'") from None
    if not items or any(v < 1 for v in items):
        raise UsageError(f"{option}: expected positive integers, got '{value}'")
    return items


def _repeats(value: Optional[str]) -> int | str | None:
    """--repeats: a positive integer or ``auto``."""
    if value is None or value == "auto":
        return value
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise UsageError(f"--repeats: expected a positive integer or auto, got '{value}'")
    return number


def register(app: typer.Typer) -> None:
    @app.command("loadtest", help="Load-test speculative vs baseline under a concurrency sweep (Locust); "
                                  "exit code = verdict (0 GO, 1 NO-GO, 3 INCONCLUSIVE); 4 = stopped early, "
                                  "requests failing from the start.")
    def loadtest_command(
        config: Optional[str] = typer.Argument(None, help="Deployment config YAML (or --loadtest-file)."),
        out: Optional[str] = typer.Option(None, "--out", help="Run directory (default reports/NAME/<UTC timestamp>/)."),
        resume: Optional[str] = typer.Option(
            None, "--resume", help="Finish the interrupted RUN_DIR of this config: keep its complete cells, measure "
            "the others (its own levels, repeats and durations; the same --arm / --endpoint-* options)."),
        concurrency: Optional[str] = typer.Option(None, "--concurrency", help="Override levels, e.g. 1,4,16."),
        duration: Optional[str] = typer.Option(None, "--duration", help="Seconds per run, e.g. 20s or 2m."),
        repeats_option: Optional[str] = typer.Option(
            None, "--repeats", help="Runs per cell, or auto: until every gated check is decided, within the config's "
            "loadtest.min_repeats / max_repeats / max_minutes (docs/report.md)."),
        sweep_draft_len: Optional[str] = typer.Option(
            None, "--sweep-draft-len",
            help="Repeat the speculative arm per draft length, e.g. 2,4,6,8 (draft_target only: per-request "
                 "num_draft_tokens; Medusa/EAGLE fix the length at build time — build one deployment per length)."),
        endpoint_baseline: Optional[str] = typer.Option(None, "--endpoint-baseline", help="Use a running baseline server (grpc host:port or http URL)."),
        endpoint_speculative: Optional[str] = typer.Option(None, "--endpoint-speculative", help="Use a running speculative server."),
        endpoint: Optional[str] = typer.Option(None, "--endpoint", help="One running server; needs --arm."),
        arm: Optional[str] = typer.Option(None, "--arm", help="baseline | speculative | scheduled: test only this arm."),
        arms_option: Optional[str] = typer.Option(
            None, "--arms", help="The arms to interleave, e.g. baseline,speculative,scheduled (default: the three "
            "when `render --schedule` rendered the scheduled arm from this config, else the A/B; docs/schedule.md)."),
        crossing: bool = typer.Option(
            False, "--crossing", help="A closed-loop ramp across the scheduled arm's thresholds (users just below, at "
            "and above each, up and back down) on every arm; adds the scheduled arm (docs/schedule.md)."),
        crossing_step_s: Optional[float] = typer.Option(
            None, "--crossing-step-s", min=1, help="With --crossing: seconds per ramp step (default loadtest.duration_s: a step is a level)."),
        no_progress: bool = typer.Option(False, "--no-progress", help="No progress display."),
        aa: bool = typer.Option(
            False, "--aa", help="A/A check of the rig: the baseline against itself through the same sweep and "
            "report; exit 0 NO DIFFERENCE, 1 DIFFERENCE, 3 INCONCLUSIVE; writes the noise (aa.json) the A/B reports "
            "quote."),
        workdir: Optional[Path] = workdir_option(),
        loadtest_file: Optional[str] = typer.Option(
            None, "--loadtest-file", help="Endpoints only: a load-test file (name, loadtest, gate) instead of a "
            "deployment config; needs --endpoint-* and --model (docs/openai-endpoints.md)."),
        transport: str = typer.Option("openai", "--transport", help="With --loadtest-file: openai | http | grpc."),
        model: Optional[str] = typer.Option(None, "--model", help="With --loadtest-file: the served model name "
                                            "(both arms)."),
        model_baseline: Optional[str] = typer.Option(
            None, "--model-baseline", help="With --loadtest-file: the baseline server's model name (default --model)."),
        model_speculative: Optional[str] = typer.Option(
            None, "--model-speculative", help="With --loadtest-file: the speculative server's model name "
            "(default --model)."),
        tokenizer: Optional[str] = typer.Option(
            None, "--tokenizer", help="With --loadtest-file: tokenizer directory (re-tokenized lengths when a "
            "server sends no usage)."),
        # arrivals, goodput and reach, with vLLM bench serve's / AIPerf's names (docs/arrivals-and-goodput.md)
        request_rate: Optional[str] = typer.Option(
            None, "--request-rate", help="Open loop: requests/s levels, e.g. 2,4 (loadtest.request_rate; Poisson "
            "unless --arrival/--burstiness)."),
        arrival: Optional[str] = typer.Option(
            None, "--arrival", help="Open loop: poisson | constant | gamma | trace (the dataset's arrival_s)."),
        burstiness: Optional[float] = typer.Option(
            None, "--burstiness", help="Gamma arrivals of this shape (vLLM's meaning: 1 = Poisson, < 1 burstier)."),
        max_concurrency: Optional[int] = typer.Option(
            None, "--max-concurrency", help="Open loop: at most this many requests in flight (an arrival waits)."),
        goodput: Optional[list[str]] = typer.Option(
            None, "--goodput", help="SLOs as vLLM writes them, e.g. 'ttft:500 tpot:50 e2el:3000' (ms; quoted, or "
            "--goodput repeated): goodput on the first screen and gated (gate.slo)."),
        slo_percentile: Optional[float] = typer.Option(
            None, "--slo-percentile", help="With --goodput: the percentile checked against each bound (default 95)."),
        header: Optional[list[str]] = typer.Option(
            None, "--header", help="KEY:VALUE (or vLLM's KEY=VALUE) sent with every request; repeatable (recorded: "
            "use --api-key-env for secrets)."),
        api_key_env: Optional[str] = typer.Option(
            None, "--api-key-env", help="Environment variable holding an API key (sent as Authorization: Bearer; "
            "never written). Default for OpenAI endpoints: OPENAI_API_KEY when set."),
        extra_body: Optional[str] = typer.Option(
            None, "--extra-body", help="JSON object merged into every request body, e.g. '{\"ignore_eos\": true}'."),
        dataset_name: Optional[str] = typer.Option(
            None, "--dataset-name", help="Dataset format (loadtest.dataset_name): specdeploy, sharegpt, openai_chat, "
            "hf, spec_bench, speed_bench, mooncake_trace (docs/workload.md)."),
        dataset_path: Optional[str] = typer.Option(
            None, "--dataset-path", help="Dataset file or directory, on disk (nothing is fetched; loadtest.dataset_path)."),
        num_prompts: Optional[int] = typer.Option(
            None, "--num-prompts", min=1, help="Prompts drawn from the dataset, the same in both arms (loadtest.num_prompts)."),
        input_len: Optional[str] = typer.Option(
            None, "--input-len", help="Input tokens: 128, 64:256, normal:MEAN,SD[,MIN,MAX], lognormal:…, dataset; "
            "prompts cut from the dataset's text in the target's tokenizer (loadtest.input_len)."),
        output_len: Optional[str] = typer.Option(
            None, "--output-len", help="Output tokens per request (max_tokens), written like --input-len "
            "(loadtest.output_len)."),
        ignore_eos: bool = typer.Option(
            False, "--ignore-eos", help="Force outputs to their full length (biases acceptance; the report says so)."),
    ) -> int:
        from pipeline.config import load_config
        from pipeline.infra.owner_lock import holding
        from pipeline.loadtest.inputs import with_loadtest_overrides
        from pipeline.loadtest.runner import run_loadtest
        from pipeline.report.builder import make_report

        repeats = _repeats(repeats_option)
        overrides = {"request_rate": request_rate, "arrival": arrival, "burstiness": burstiness,
                     "max_concurrency": max_concurrency, "goodput": goodput, "slo_percentile": slo_percentile,
                     "headers": header, "api_key_env": api_key_env, "extra_body": extra_body}
        if slo_percentile is not None and goodput is None:
            raise UsageError("--slo-percentile needs --goodput (or write gate.slo.percentile)")
        dataset_flags = {"dataset_name": dataset_name, "dataset_path": dataset_path, "num_prompts": num_prompts,
                     "input_len": input_len, "output_len": output_len, "ignore_eos": ignore_eos}
        if endpoint and not arm:
            raise UsageError("--endpoint needs --arm baseline|speculative (or use --endpoint-baseline/--endpoint-speculative)")
        if endpoint:
            endpoint_baseline = endpoint if arm == "baseline" else endpoint_baseline
            endpoint_speculative = endpoint if arm == "speculative" else endpoint_speculative
        if loadtest_file or config is None:
            return _endpoints_only(config, loadtest_file, out, concurrency, duration, repeats, endpoint_baseline,
                                   endpoint_speculative, arm, no_progress, transport, model, tokenizer,
                                   model_baseline, model_speculative, aa=aa, overrides=overrides,
                                   dataset_flags=dataset_flags)
        cfg = with_loadtest_overrides(load_config(config, workdir), dataset_flags)
        if resume and any(v not in (None, False) for v in dataset_flags.values()):
            raise UsageError("--resume continues the run's own data: drop --dataset-name, --dataset-path, "
                             "--num-prompts, --input-len, --output-len and --ignore-eos")
        if any(v is not None for v in overrides.values()):
            from pipeline.loadtest.overrides import apply_overrides

            cfg = apply_overrides(cfg, overrides)
        if resume and (out or concurrency or duration or repeats or sweep_draft_len or crossing):
            raise UsageError("--resume continues the run's own plan: drop --out, --concurrency, --duration, "
                             "--repeats, --sweep-draft-len and --crossing")
        chosen = tuple(a.strip() for a in arms_option.split(",") if a.strip()) if arms_option else None
        if chosen is None and not (arm or resume or aa or endpoint_baseline or endpoint_speculative):
            from pipeline.loadtest.runner import default_arms

            chosen = default_arms(cfg)  # the scheduled arm too, when `render --schedule` rendered it
            if chosen:
                print(f"arms: {', '.join(chosen)} (the scheduled arm is rendered; --arms baseline,speculative "
                      "for the A/B alone)")
        with holding():  # the run dir stays this process's until its report is written
            run_dir = run_loadtest(
                cfg, out_dir=out, concurrency=_int_list(concurrency, "--concurrency"), duration=duration,
                repeats=repeats, sweep_draft_len=_int_list(sweep_draft_len, "--sweep-draft-len"),
                endpoint_baseline=endpoint_baseline, endpoint_speculative=endpoint_speculative, arm=arm,
                progress=not no_progress, report=False, resume=resume, aa=aa,
                arms=chosen,
                crossing=crossing, crossing_step_s=crossing_step_s,
            )
            report = make_report(run_dir, cfg)
        _print_summary(report)
        return report.exit_code


def _endpoints_only(config, loadtest_file, out, concurrency, duration, repeats, endpoint_baseline,
                    endpoint_speculative, arm, no_progress, transport, model, tokenizer,
                    model_baseline=None, model_speculative=None, aa=False, overrides=None, dataset_flags=None) -> int:
    from pipeline.infra.owner_lock import holding
    from pipeline.loadtest.endpoints_only import run_endpoint_loadtest
    from pipeline.report.builder import make_report

    if config is not None:
        raise UsageError("give a deployment config or --loadtest-file, not both")
    if not loadtest_file:
        raise UsageError("a deployment config (CONFIG) or --loadtest-file is needed")
    if aa and not endpoint_baseline:
        raise UsageError("--loadtest-file --aa: pass --endpoint-baseline (the server measured against itself)")
    if not (endpoint_baseline or endpoint_speculative):
        raise UsageError("--loadtest-file: pass --endpoint-baseline and --endpoint-speculative (or one with --arm)")
    with holding():  # the run dir stays this process's until its report is written
        run_dir, cfg = run_endpoint_loadtest(
            loadtest_file, endpoint_baseline=endpoint_baseline, endpoint_speculative=endpoint_speculative,
            model=model, model_baseline=model_baseline, model_speculative=model_speculative,
            transport=transport, tokenizer=tokenizer, out_dir=out, concurrency=_int_list(concurrency, "--concurrency"),
            duration=duration, repeats=repeats, arm=arm, progress=not no_progress, report=False, aa=aa,
            overrides={k: v for k, v in (overrides or {}).items() if v is not None},
            loadtest_overrides=dataset_flags)
        report = make_report(run_dir, cfg)
    _print_summary(report)
    return report.exit_code


def _print_summary(report) -> None:
    from rich.console import Console

    console = Console()
    style = {"GO": "bold green", "NO-GO": "bold red", "INCONCLUSIVE": "bold yellow", "NO DIFFERENCE": "bold green",
             "DIFFERENCE": "bold red"}[report.verdict]
    console.print(f"verdict: [{style}]{report.verdict}[/]  (exit code {report.exit_code})")
    repeats = report.data.get("repeats") or {}
    if repeats.get("mode") == "auto":
        console.print(f"  repeats: {repeats.get('repeats')} (auto; stopped: {repeats.get('stopped')} — "
                      f"{repeats.get('detail')})", markup=False)
    noise = (report.data.get("aa") or {}).get("noise") or report.data.get("rig_noise")
    if noise:
        summary = noise.get("summary", noise)
        console.print(f"  rig noise{' (this A/A)' if report.data.get('aa') else ' (latest A/A: ' + str(noise.get('source')) + ')'}: "
                      f"run-to-run CV of median TPOT {_pct(summary.get('run_to_run_cv_tpot'))}, request-level CV of TPOT "
                      f"{_pct(summary.get('request_cv_tpot'))}, SD of paired log TPOT ratios "
                      f"{_num(summary.get('paired_log_ratio_sd_tpot'))}", markup=False)
    from pipeline.report.view.summary import goodput_line

    goodput = goodput_line(report.data)  # the user's SLOs: goodput as the report's first screen says it
    if goodput:
        console.print(f"  {goodput}", markup=False)
    for reason in report.gate.reasons:
        console.print(f"  {reason}", markup=False)
    for advice in report.gate.advice:
        console.print(f"  advice: {advice}", markup=False)
    console.print(f"report: {report.html_path}  {report.md_path}  {report.json_path}", markup=False)


def _pct(value) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def _num(value) -> str:
    return "n/a" if value is None else f"{value:.3g}"
