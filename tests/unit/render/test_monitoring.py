"""The operations view ``render`` writes next to each repository: alerting rules that Prometheus's
own ``promtool`` accepts (``check rules``) and that fire, or stay quiet, on synthetic series
(``test rules``); thresholds taken from the config's gate; a Grafana dashboard whose queries use
only the metric names the served models and Triton export (the live check is
tests/integration/test_monitoring_served.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest
import yaml
from test_render import CASES, make_cfg, write_manifest

from pipeline.render.monitoring import (
    GPU_ONLY_METRICS,
    alert_rules,
    dashboard,
    metric_names,
    operations_paths,
    rules_text,
    sources,
)
from pipeline.render.renderer import render

PROMTOOL = shutil.which("promtool")


@pytest.fixture
def promtool() -> str:
    """promtool's path; a skip on a machine without it, a failure in CI (.ci/run installs it)."""
    if PROMTOOL:
        return PROMTOOL
    if os.environ.get("CI") == "true":
        pytest.fail("promtool is missing in CI: .ci/run installs Debian's prometheus package")
    pytest.skip("promtool not installed (Debian: apt-get install prometheus); CI installs it and runs this test")

# Every name the served CPU deployments export that the view may use (checked live by
# tests/integration/test_monitoring_served.py), plus the GPU-only backend gauges.
CPU_EXPORTED = {
    "nv_inference_request_success", "nv_inference_request_failure", "nv_inference_request_duration_us",
    "nv_inference_queue_duration_us", "nv_inference_pending_request_count",
    "specdeploy_spec_decode_accepted_tokens_total", "specdeploy_spec_decode_draft_tokens_total",
    "specdeploy_spec_decode_verify_steps_total", "specdeploy_spec_decode_fallbacks_total",
    "specdeploy_request_ttft_seconds_bucket", "specdeploy_request_tpot_seconds_bucket",
    "specdeploy_request_e2e_seconds_bucket", "specdeploy_output_tokens_total", "specdeploy_engine_worker_up",
}


@pytest.fixture(autouse=True)
def no_nvidia_smi(monkeypatch):
    monkeypatch.setattr("pipeline.plan.gpu_layout.query_gpus", lambda nvidia_smi=None: None)


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    """``rendered(backend, method)`` -> (cfg, variant -> repository), each case rendered once for
    this module, on first use: the per-case checks and the one ``promtool check rules`` run read
    the same files, and each case's render is charged to the first test that needs it."""
    cache = {}

    def get(backend: str, method: str):
        if (backend, method) not in cache:
            with pytest.MonkeyPatch.context() as patch:  # no_nvidia_smi is function-scoped
                patch.setattr("pipeline.plan.gpu_layout.query_gpus", lambda nvidia_smi=None: None)
                cfg = make_cfg(backend, method, workdir=tmp_path_factory.mktemp(f"{backend}-{method}"))
                write_manifest(cfg)
                cache[(backend, method)] = (cfg, {variant: repo for variant, (repo, _) in render(cfg).items()})
        return cache[(backend, method)]

    return get


@pytest.mark.parametrize("backend,method", CASES, ids=[f"{b}-{m}" for b, m in CASES])
def test_render_writes_rules_and_a_dashboard(rendered, backend, method):
    cfg, repos = rendered(backend, method)
    for variant, repo in repos.items():
        rules_path, dashboard_path = operations_paths(repo)
        assert rules_path.parent == repo.parent and rules_path.name == f"{variant}.alerts.yml"
        rules = yaml.safe_load(rules_path.read_text())
        assert rules == alert_rules(cfg, variant)
        names = {r["alert"] for r in rules["groups"][0]["rules"]}
        assert "SpecdeployErrorRateHigh" in names
        board = json.loads(dashboard_path.read_text())
        exprs = [t["expr"] for p in board["panels"] for t in p["targets"]]
        assert exprs and all(e.strip() for e in exprs)
        assert len({p["id"] for p in board["panels"]}) == len(board["panels"])
        used = metric_names(rules_path.read_text() + dashboard_path.read_text())
        assert used <= CPU_EXPORTED | set(GPU_ONLY_METRICS), used - CPU_EXPORTED - set(GPU_ONLY_METRICS)
        assert bool(used & set(GPU_ONLY_METRICS)) == (backend == "trtllm")


@pytest.mark.budget(4)  # run alone it renders every case itself (after the per-case tests it renders none)
def test_promtool_accepts_the_rules(rendered, promtool):
    """One ``promtool check rules`` over every case's every rules file (a run per case cost a
    promtool start each); it names each file it accepts, so the count shows none was skipped."""
    paths = [str(operations_paths(repo)[0]) for case in CASES for repo in rendered(*case)[1].values()]
    assert len(paths) > len(CASES)  # every case has at least one arm, most two
    check = subprocess.run([promtool, "check", "rules", *paths], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout.count("SUCCESS") == len(paths)


def test_thresholds_come_from_the_gate():
    cfg = make_cfg("reference", "medusa").model_copy(deep=True)
    cfg.gate.min_acceptance_rate = 0.62
    cfg.gate.slo.ttft_ms = 400.0
    cfg.gate.slo.tpot_ms = 35.0
    rules = {r["alert"]: r for r in alert_rules(cfg, "speculative")["groups"][0]["rules"]}
    assert rules["SpecdeployAcceptanceBelowFloor"]["expr"].endswith("< 0.62")
    assert rules["SpecdeployTtftP95OverSlo"]["expr"].endswith("> 0.4")
    assert rules["SpecdeployTpotP95OverSlo"]["expr"].endswith("> 0.035")
    assert "switching speculation off" in rules["SpecdeployAcceptanceBelowFloor"]["annotations"]["description"]
    floor_lines = [s for p in dashboard(cfg, "speculative")["panels"]
                   for s in p["fieldConfig"]["defaults"].get("thresholds", {}).get("steps", []) if s["value"] == 0.62]
    assert floor_lines


def test_each_arm_reads_the_model_that_sees_whole_requests():
    dt = make_cfg("reference", "draft_target")
    assert sources(dt, "speculative").acceptance == "tensorrt_llm_bls"  # the target sees one round per call
    assert sources(dt, "baseline").acceptance is None and sources(dt, "baseline").latency == "tensorrt_llm"
    medusa_gpu = make_cfg("trtllm", "medusa")
    src = sources(medusa_gpu, "speculative")
    assert src.acceptance is None and src.latency is None and src.entry == "ensemble"  # C++ model: no specdeploy_*
    names = {r["alert"] for r in alert_rules(medusa_gpu, "speculative")["groups"][0]["rules"]}
    assert names == {"SpecdeployErrorRateHigh"}
    assert sources(make_cfg("trtllm", "draft_target"), "speculative").latency == "tensorrt_llm_bls"


def _promtool_tests(promtool: str, tmp_path: Path, rules: str, groups: list[tuple[list[tuple[str, str]], list[dict]]]) -> None:
    """One ``promtool test rules`` run: each group is (input series, expected alerts) and is
    evaluated on its own series; promtool names the group, alert and time of any mismatch."""
    (tmp_path / "rules.yml").write_text(rules)
    spec = {"rule_files": ["rules.yml"], "evaluation_interval": "1m",
            "tests": [{"name": name, "interval": "1m",
                       "input_series": [{"series": s, "values": v} for s, v in series], "alert_rule_test": alerts}
                      for name, (series, alerts) in groups]}
    (tmp_path / "test.yml").write_text(yaml.safe_dump(spec, sort_keys=False))
    result = subprocess.run([promtool, "test", "rules", "test.yml"], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def _expected(cfg, variant: str, alert: str, model: str, value_text: str, **labels) -> dict:
    rule = next(r for r in alert_rules(cfg, variant)["groups"][0]["rules"] if r["alert"] == alert)
    annotations = {k: v.replace("{{ $labels.model }}", model) for k, v in rule["annotations"].items()}
    for template in ("{{ $value | humanizePercentage }}", "{{ $value | humanizeDuration }}"):
        annotations = {k: v.replace(template, value_text) for k, v in annotations.items()}
    return {"exp_labels": {**rule["labels"], "model": model, **labels}, "exp_annotations": annotations}


def test_alerts_fire_only_on_the_synthetic_series_that_should_fire_them(tmp_path, promtool):
    """The acceptance alert fires only when sustained below the floor (pending at 12 m, firing at
    40 m; quiet on healthy series); TTFT p95 over the SLO and the error rate fire, TPOT stays quiet.
    All three scenarios are groups of one promtool run (one process instead of three)."""
    cfg = make_cfg("reference", "medusa")
    job = sources(cfg, "speculative").job
    labels = f'job="{job}",model="tensorrt_llm",version="1"'
    low = [(f"specdeploy_spec_decode_accepted_tokens_total{{{labels}}}", "0+30x60"),
           (f"specdeploy_spec_decode_draft_tokens_total{{{labels}}}", "0+100x60")]
    fired = _expected(cfg, "speculative", "SpecdeployAcceptanceBelowFloor", "tensorrt_llm", "30%")
    healthy = [(low[0][0], "0+80x60"), low[1]]
    # every request's first token after 1-1.5 s: p95 interpolates inside that bucket, above the 1 s SLO
    series = [(f'specdeploy_request_ttft_seconds_bucket{{{labels},le="{le}"}}', values)
              for le, values in (("0.5", "0x60"), ("1", "0x60"), ("1.5", "0+10x60"), ("+Inf", "0+10x60"))]
    ens = f'job="{job}",model="ensemble",version="1"'
    series += [(f"nv_inference_request_success{{{ens}}}", "0+90x60"),
               (f'nv_inference_request_failure{{{ens},reason="BACKEND"}}', "0+10x60")]
    ttft = _expected(cfg, "speculative", "SpecdeployTtftP95OverSlo", "tensorrt_llm", "1.475s")
    errors = _expected(cfg, "speculative", "SpecdeployErrorRateHigh", "ensemble", "10%")
    _promtool_tests(promtool, tmp_path, rules_text(cfg, "speculative"), [
        ("acceptance low", (low, [
            {"eval_time": "12m", "alertname": "SpecdeployAcceptanceBelowFloor", "exp_alerts": []},  # pending, not yet 15 m
            {"eval_time": "40m", "alertname": "SpecdeployAcceptanceBelowFloor", "exp_alerts": [fired]}])),
        ("acceptance healthy", (healthy, [
            {"eval_time": "40m", "alertname": "SpecdeployAcceptanceBelowFloor", "exp_alerts": []}])),
        ("ttft and errors", (series, [
            {"eval_time": "30m", "alertname": "SpecdeployTtftP95OverSlo", "exp_alerts": [ttft]},
            {"eval_time": "30m", "alertname": "SpecdeployErrorRateHigh", "exp_alerts": [errors]},
            {"eval_time": "30m", "alertname": "SpecdeployTpotP95OverSlo", "exp_alerts": []}])),
    ])


def test_rules_file_says_which_job_to_scrape():
    cfg = make_cfg("reference", "draft_target")
    text = rules_text(cfg, "speculative")
    assert text.startswith("# Prometheus alerting rules for golden-reference-draft-target, speculative arm")
    assert textwrap.dedent(f'job "{sources(cfg, "speculative").job}"') in text
