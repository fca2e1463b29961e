"""The operations view against a live server: after a few requests, every metric name the
rendered alerting rules and dashboard query, with the model label they select, is a series the
served CPU deployment's ``/metrics`` actually exposes (Medusa through the ensemble, draft-target
through the BLS). The GPU-only ``nv_trt_llm_*`` gauges cannot appear on CPU; they are listed
apart with their upstream citation (``pipeline.render.monitoring.GPU_ONLY_METRICS``)."""

from __future__ import annotations

import json
import re
import urllib.request

import pytest

import triton_clients
from conftest import PROMPTS
from pipeline.render.monitoring import GPU_ONLY_METRICS, alert_rules, dashboard, operations_paths
from pipeline.render.renderer import client_target, model_repo_dir

pytestmark = [pytest.mark.triton, pytest.mark.slow]

SELECTED = re.compile(r"\b((?:nv|specdeploy)_[a-z0-9_]+)\{[^}]*model=\"([^\"]+)\"")
UNSELECTED = re.compile(r"\b((?:nv|specdeploy)_[a-z0-9_]+)\{job=\"[^\"]+\"\}")


def _queries(cfg, variant: str) -> str:
    rules = [r["expr"] for r in alert_rules(cfg, variant)["groups"][0]["rules"]]
    panels = [t["expr"] for p in dashboard(cfg, variant)["panels"] for t in p["targets"]]
    return "\n".join(rules + panels)


SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s")
MODEL_LABEL = re.compile(r'model="([^"]*)"')


def _exposed(metrics_url: str) -> set[tuple[str, str]]:
    """(series name, model label) as Prometheus ingests them: the exposition's own names
    (prometheus_client's parser would rename Triton's counters to ``*_total``)."""
    text = urllib.request.urlopen(metrics_url, timeout=30).read().decode()  # noqa: S310 - a loopback http URL
    out = set()
    for line in text.splitlines():
        match = SAMPLE.match(line)
        if match:
            model = MODEL_LABEL.search(match.group(2) or "")
            out.add((match.group(1), model.group(1) if model else ""))
    return out


def _check_served(workdir, cfg, server, variant: str = "speculative") -> None:
    target = client_target(cfg, variant)
    for prompt in PROMPTS:
        inputs = triton_clients.text_inputs(prompt, 12, stream=True, **target.extra_inputs)
        assert triton_clients.grpc_stream(server.grpc_url, target.model_name, inputs)
    rules_path, dashboard_path = operations_paths(model_repo_dir(cfg, variant))
    assert json.loads(dashboard_path.read_text()) == dashboard(cfg, variant)
    assert rules_path.is_file()
    exposed = _exposed(server.metrics_url)
    names = {name for name, _ in exposed}
    queries = _queries(cfg, variant)
    wanted = set(SELECTED.findall(queries))
    assert wanted, "the view queries no model-labelled series"
    gpu_only = {pair for pair in wanted if pair[0] in GPU_ONLY_METRICS}
    assert not gpu_only, f"GPU-only metrics in a reference deployment's view: {gpu_only}"
    missing = sorted(pair for pair in wanted if pair not in exposed)
    assert not missing, f"queried but not exposed (name, model): {missing}"
    unlabelled = set(UNSELECTED.findall(queries))
    assert unlabelled <= names, unlabelled - names


def test_medusa_view_uses_only_exposed_series(serving_workdir, medusa_cfg, medusa_server):
    _check_served(serving_workdir, medusa_cfg, medusa_server)


def test_draft_target_view_uses_only_exposed_series(serving_workdir, dt_cfg, dt_server):
    _check_served(serving_workdir, dt_cfg, dt_server)
