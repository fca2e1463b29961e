"""The operations view ``render`` writes next to each repository: Prometheus alerting rules
(``<variant>.alerts.yml``) and a Grafana dashboard (``<variant>.dashboard.json``) in
``engines/NAME/model_repo/``.

Reads the config: the gate's acceptance floor (``gate.min_acceptance_rate``), its latency SLOs
(``gate.slo``), the backend and the speculation method, which decide which model exports which
metric. Both files are built from data and use only metric names the served models and Triton
export: Triton's per-model ``nv_inference_*``, ours (``specdeploy_*``, pipeline/triton_models/
metrics.py and worker_health.py), and on the TensorRT-LLM backend the C++ backend's
``nv_trt_llm_*`` gauges (GPU only; :data:`GPU_ONLY_METRICS` cites upstream). Every name a query
uses is checked against a live server's ``/metrics`` in tests/integration/test_monitoring_served.py
and the rules against ``promtool check rules`` in tests/unit/render/test_monitoring.py.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from pipeline.config import DeploymentConfig
from pipeline.render.arms import decide_arm

# A rate over a few minutes smooths a single long request; the `for` durations make an alert
# mean "sustained", not one bad scrape.
RATE_WINDOW = "5m"
ACCEPTANCE_WINDOW = "10m"
ACCEPTANCE_FOR = "15m"
LATENCY_FOR = "10m"
# No gate setting bounds the absolute error rate (the gate compares the arms), so the alert
# uses a documented default: more than 1 % of requests failing for 5 minutes (docs/operations.md).
ERROR_RATE_MAX = 0.01
ERROR_FOR = "5m"

# Exported by the TensorRT-LLM C++ backend only (GPU), so a CPU server cannot show them; the
# names and labels are the ones upstream's CI checks against a served engine:
# triton-inference-server/tensorrtllm_backend ci/L0_backend_trtllm/custom_metrics_verification_tests.py
GPU_ONLY_METRICS = {
    "nv_trt_llm_request_metrics": "tensorrtllm_backend ci/L0_backend_trtllm/custom_metrics_verification_tests.py "
                                  "(request_type = active | max | scheduled | context)",
    "nv_trt_llm_kv_cache_block_metrics": "tensorrtllm_backend ci/L0_backend_trtllm/custom_metrics_verification_tests.py "
                                         "(kv_cache_block_type = used | free | max | tokens_per)",
}
METRIC_NAME = re.compile(r"\b((?:nv|specdeploy)_[a-z0-9_]+)\b")


@dataclass(frozen=True)
class Sources:
    """Which model of one arm's repository exports what (None: nothing exports it)."""

    job: str  # the Prometheus job label the rules and panels select
    entry: str  # the model clients call: requests, failures, Triton's request duration
    engine: str  # the tensorrt_llm model: queue
    acceptance: str | None  # specdeploy_spec_decode_* counters covering whole requests
    latency: str | None  # specdeploy_request_* histograms covering whole requests
    worker: bool  # specdeploy_engine_worker_* gauges (reference engine in a worker process)
    gpu: bool  # nv_trt_llm_* gauges (TensorRT-LLM backend)


def sources(cfg: DeploymentConfig, variant: str) -> Sources:
    """The BLS of a draft-target deployment it orchestrates sees the whole request (the target
    it calls sees one verify round per call); otherwise the ``tensorrt_llm`` model does, and on
    the TensorRT-LLM backend that model is C++ and exports neither our counters nor histograms."""
    arm = decide_arm(cfg, variant)  # the facts the arm's deployment descriptor records
    entry = arm.model_name
    bls_speculates = arm.drafts == "bls"
    if bls_speculates:
        whole = "tensorrt_llm_bls"
    else:
        whole = "tensorrt_llm" if cfg.backend == "reference" else None
    return Sources(
        job=f"specdeploy-{cfg.name}-{variant}", entry=entry, engine="tensorrt_llm",
        acceptance=whole if variant == "speculative" else None, latency=whole,
        worker=cfg.backend == "reference" and cfg.reference.engine_process == "own",
        gpu=cfg.backend == "trtllm",
    )


def _sel(src: Sources, model: str, extra: str = "") -> str:
    return "{" + f'job="{src.job}",model="{model}"' + (f",{extra}" if extra else "") + "}"


def _rate(metric: str, src: Sources, model: str, window: str = RATE_WINDOW, by: str = "model") -> str:
    return f"sum by ({by}) (rate({metric}{_sel(src, model)}[{window}]))"


def _quantile(q: float, metric: str, src: Sources) -> str:
    return f"histogram_quantile({q}, {_rate(metric + '_bucket', src, src.latency, by='le, model')})"


def acceptance_expr(src: Sources, window: str = RATE_WINDOW) -> str:
    return (f"{_rate('specdeploy_spec_decode_accepted_tokens_total', src, src.acceptance, window)}\n"
            f"  / {_rate('specdeploy_spec_decode_draft_tokens_total', src, src.acceptance, window)}")


def tau_expr(src: Sources) -> str:
    """τ = 1 + accepted / verify steps: tokens per target pass while speculating."""
    return (f"1 + {_rate('specdeploy_spec_decode_accepted_tokens_total', src, src.acceptance)}\n"
            f"  / {_rate('specdeploy_spec_decode_verify_steps_total', src, src.acceptance)}")


def error_rate_expr(src: Sources) -> str:
    failures = _rate("nv_inference_request_failure", src, src.entry)
    return f"{failures}\n  / ({_rate('nv_inference_request_success', src, src.entry)} + {failures})"


# ----------------------------------------------------------------------------------------------
# Alerting rules


def _alert(name: str, expr: str, duration: str, severity: str, cfg, variant, summary: str, description: str) -> dict:
    return {"alert": name, "expr": expr, "for": duration,
            "labels": {"severity": severity, "deployment": cfg.name, "variant": variant},
            "annotations": {"summary": summary, "description": description}}


def alert_rules(cfg: DeploymentConfig, variant: str) -> dict:
    """The rule file of one arm (Prometheus rule-file format)."""
    src = sources(cfg, variant)
    gate, rules = cfg.gate, []
    where = f"{cfg.name} ({variant})"
    if src.acceptance:
        floor = gate.min_acceptance_rate
        rules.append(_alert(
            "SpecdeployAcceptanceBelowFloor", f"{acceptance_expr(src, ACCEPTANCE_WINDOW)}\n< {floor:g}",
            ACCEPTANCE_FOR, "warning", cfg, variant,
            f"{where}: draft acceptance below the gate's floor {floor:.0%}",
            f"{{{{ $labels.model }}}} accepts {{{{ $value | humanizePercentage }}}} of its draft tokens "
            f"(floor {floor:.0%}, gate.min_acceptance_rate). Traffic has drifted from what the draft "
            "was measured on: consider switching speculation off (serve the baseline repository) and "
            "re-running `specdeploy loadtest` on current prompts."))
        rules.append(_alert(
            "SpecdeploySpeculationFallingBack",
            f"{_rate('specdeploy_spec_decode_fallbacks_total', src, src.acceptance, by='model, reason')} > 0",
            ACCEPTANCE_FOR, "warning", cfg, variant,
            f"{where}: requests continue target-only after draft failures",
            "{{ $labels.model }} falls back to target-only decoding ({{ $labels.reason }}): the draft "
            "model fails or times out; the server log names the cause."))
    if src.latency:
        for metric, slo_ms, label in (("specdeploy_request_ttft_seconds", gate.slo.ttft_ms, "TTFT"),
                                      ("specdeploy_request_tpot_seconds", gate.slo.tpot_ms, "TPOT")):
            rules.append(_alert(
                f"Specdeploy{label.title()}P95OverSlo", f"{_quantile(0.95, metric, src)}\n> {slo_ms / 1000:g}",
                LATENCY_FOR, "warning", cfg, variant,
                f"{where}: p95 {label} above the SLO {slo_ms:g} ms",
                f"p95 {label} of {{{{ $labels.model }}}} is {{{{ $value | humanizeDuration }}}} "
                f"(gate.slo: {slo_ms:g} ms)."))
    rules.append(_alert(
        "SpecdeployErrorRateHigh", f"{error_rate_expr(src)}\n> {ERROR_RATE_MAX:g}", ERROR_FOR, "critical", cfg, variant,
        f"{where}: more than {ERROR_RATE_MAX:.0%} of requests fail",
        "{{ $value | humanizePercentage }} of requests to {{ $labels.model }} fail; the server log "
        "and nv_inference_request_failure's reason label say why."))
    if src.worker:
        rules.append(_alert(
            "SpecdeployEngineWorkerDown", f"min by (model) (specdeploy_engine_worker_up{{job=\"{src.job}\"}}) == 0",
            "2m", "critical", cfg, variant, f"{where}: an engine worker is down",
            "The engine worker of {{ $labels.model }} is not serving (restarting, or out of restarts)."))
    return {"groups": [{"name": src.job, "rules": rules}]}


class _RulesDumper(yaml.SafeDumper):
    """Multi-line expressions as literal blocks, so the file reads like a hand-written one."""


_RulesDumper.add_representer(str, lambda dumper, value: dumper.represent_scalar(
    "tag:yaml.org,2002:str", value, style="|" if "\n" in value else None))


def rules_text(cfg: DeploymentConfig, variant: str) -> str:
    header = (f"# Prometheus alerting rules for {cfg.name}, {variant} arm, written by `specdeploy render`.\n"
              f"# Scrape the server's metrics port as job \"{sources(cfg, variant).job}\" (docs/operations.md).\n")
    return header + yaml.dump(alert_rules(cfg, variant), Dumper=_RulesDumper, sort_keys=False, width=100,
                              allow_unicode=True)


# ----------------------------------------------------------------------------------------------
# Grafana dashboard

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def _panel(title: str, targets: list[tuple[str, str]], unit: str, description: str = "",
           thresholds: list[tuple[float, str]] | None = None) -> dict:
    panel = {
        "type": "timeseries", "title": title, "description": description, "datasource": DATASOURCE,
        "targets": [{"refId": chr(ord("A") + i), "datasource": DATASOURCE, "expr": expr, "legendFormat": legend}
                    for i, (expr, legend) in enumerate(targets)],
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}, "tooltip": {"mode": "multi"}},
    }
    if thresholds:
        steps = [{"color": "green", "value": None}] + [{"color": c, "value": v} for v, c in thresholds]
        panel["fieldConfig"]["defaults"]["thresholds"] = {"mode": "absolute", "steps": steps}
        panel["fieldConfig"]["defaults"]["custom"] = {"thresholdsStyle": {"mode": "line"}}
    return panel


def _speculation_panels(cfg: DeploymentConfig, src: Sources) -> list[dict]:
    if not src.acceptance:
        return []
    floor = cfg.gate.min_acceptance_rate
    return [
        _panel("Draft acceptance rate", [(acceptance_expr(src), "{{model}}")], "percentunit",
               f"Accepted ÷ offered draft tokens; the gate's floor is {floor:.0%} (gate.min_acceptance_rate).",
               [(floor, "red")]),
        _panel("τ (tokens per target pass)", [(tau_expr(src), "{{model}}")], "none",
               "1 + accepted draft tokens per verify step."),
        _panel("Speculation fallbacks", [(
            _rate("specdeploy_spec_decode_fallbacks_total", src, src.acceptance, by="model, reason"),
            "{{model}} {{reason}}")], "reqps", "Requests that went on target-only after a draft failure."),
    ]


def _latency_panels(cfg: DeploymentConfig, src: Sources) -> list[dict]:
    mean_e2e = (f"{_rate('nv_inference_request_duration_us', src, src.entry)}\n"
                f"  / {_rate('nv_inference_request_success', src, src.entry)} / 1e6")
    if not src.latency:  # TensorRT-LLM ensemble: Triton's mean request duration only
        return [_panel("E2E latency (mean, Triton)", [(mean_e2e, "{{model}} mean")], "s")]
    panels = []
    for metric, title, slo_ms in (("specdeploy_request_ttft_seconds", "TTFT", cfg.gate.slo.ttft_ms),
                                  ("specdeploy_request_tpot_seconds", "TPOT", cfg.gate.slo.tpot_ms),
                                  ("specdeploy_request_e2e_seconds", "E2E latency", None)):
        targets = [(_quantile(q, metric, src), f"{{{{model}}}} p{int(q * 100)}") for q in (0.5, 0.95)]
        if metric.endswith("e2e_seconds"):
            targets.append((mean_e2e, "{{model}} mean (Triton)"))
        panels.append(_panel(title, targets, "s", f"SLO {slo_ms:g} ms (gate.slo)" if slo_ms else "",
                             [(slo_ms / 1000, "red")] if slo_ms else None))
    return panels


def _traffic_panels(src: Sources) -> list[dict]:
    throughput = [(_rate("nv_inference_request_success", src, src.entry), "{{model}} requests/s")]
    if src.latency:
        throughput.append((_rate("specdeploy_output_tokens_total", src, src.latency), "{{model}} output tokens/s"))
    queue_time = (f"{_rate('nv_inference_queue_duration_us', src, src.engine)}\n"
                  f"  / {_rate('nv_inference_request_success', src, src.engine)} / 1e6")
    panels = [
        _panel("Throughput", throughput, "short"),
        _panel("Queue", [(f"sum by (model) (nv_inference_pending_request_count{_sel(src, src.engine)})",
                          "{{model}} pending")], "short", "Requests waiting in the engine model's queue."),
        _panel("Queue time (mean)", [(queue_time, "{{model}}")], "s"),
        _panel("Error rate", [(error_rate_expr(src), "{{model}}")], "percentunit",
               f"Failed ÷ all requests; the alert fires above {ERROR_RATE_MAX:.0%}.", [(ERROR_RATE_MAX, "red")]),
    ]
    if src.worker:
        panels.append(_panel("Engine worker up", [(f"min by (model) (specdeploy_engine_worker_up{{job=\"{src.job}\"}})",
                                                   "{{model}}")], "short"))
    if src.gpu:
        active = _sel(src, src.engine, 'request_type=~"active|scheduled"')
        used, most = (_sel(src, src.engine, f'kv_cache_block_type="{kind}"') for kind in ("used", "max"))
        panels.append(_panel("TensorRT-LLM requests", [
            (f"sum by (request_type) (nv_trt_llm_request_metrics{active})", "{{request_type}}")],
            "short", "GPU only (TensorRT-LLM backend)."))
        panels.append(_panel("KV cache blocks used", [(
            f"sum(nv_trt_llm_kv_cache_block_metrics{used})\n  / sum(nv_trt_llm_kv_cache_block_metrics{most})",
            "used / max")], "percentunit", "GPU only (TensorRT-LLM backend)."))
    return panels


def dashboard(cfg: DeploymentConfig, variant: str) -> dict:
    """The Grafana dashboard of one arm (import it; pick the Prometheus data source)."""
    src = sources(cfg, variant)
    panels = _speculation_panels(cfg, src) + _latency_panels(cfg, src) + _traffic_panels(src)
    for i, panel in enumerate(panels):
        panel["id"] = i + 1
        panel["gridPos"] = {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)}
    return {
        "title": f"specdeploy {cfg.name} ({variant})", "uid": src.job[:40], "tags": ["specdeploy"],
        "schemaVersion": 39, "editable": True, "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "templating": {"list": [{"name": "datasource", "type": "datasource", "query": "prometheus",
                                 "label": "Prometheus"}]},
        "panels": panels,
    }


# ----------------------------------------------------------------------------------------------
# Files and checks


def metric_names(text: str) -> set[str]:
    """Metric names (``nv_*``, ``specdeploy_*``) a rule file or dashboard queries."""
    return set(METRIC_NAME.findall(text))


def operations_paths(repo: Path) -> tuple[Path, Path]:
    """(rules, dashboard) written next to the repository ``repo``."""
    return repo.with_name(f"{repo.name}.alerts.yml"), repo.with_name(f"{repo.name}.dashboard.json")


def write_operations_view(cfg: DeploymentConfig, variant: str, repo: Path) -> tuple[Path, Path]:
    rules_path, dashboard_path = operations_paths(Path(repo))
    for path, text in ((rules_path, rules_text(cfg, variant)),
                       (dashboard_path, json.dumps(dashboard(cfg, variant), indent=2, ensure_ascii=False) + "\n")):
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(text)
        tmp.replace(path)
    return rules_path, dashboard_path
