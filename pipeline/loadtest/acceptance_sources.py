"""Speculative-decoding acceptance as the server behind an endpoint reports it, before and after a run.

Reads one metrics URL per arm (the load-test file's ``metrics_*`` or the served deployment's) and
recognises whose text it is: ours (specdeploy's Triton ``/metrics``), vLLM's, trtllm-serve's
Prometheus ``/prometheus/metrics`` or its JSON ``/metrics`` iteration stats, SGLang's; anything
else is ``not reported``. :func:`run_delta` turns the scrapes before and after one run into that
run's figures, each carrying its source and kind. Writes nothing (the runner stores the scrapes).

Where the names and shapes come from (upstream wins over any note here):

- specdeploy: ``pipeline/triton_models/metrics.py`` (counters; accepted and drafted per draft
  position, label ``position`` from 0).
- vLLM: ``vllm/v1/spec_decode/metrics.py`` (``SpecDecodingProm``): counters
  ``vllm:spec_decode_num_drafts``, ``_num_draft_tokens``, ``_num_accepted_tokens`` and
  ``_num_accepted_tokens_per_pos{position=}``; one draft is one verify step.
- trtllm-serve Prometheus: ``tensorrt_llm/metrics/collector.py`` (``MetricsCollector``), mounted
  only with ``return_perf_metrics`` (``tensorrt_llm/serve/openai_server.py``). Per finished
  request: ``trtllm_spec_decode_drafted_tokens_total`` / ``_accepted_tokens_total`` with a
  ``token_position`` label. Per iteration: ``trtllm_spec_decode_num_draft_tokens_total`` /
  ``_num_accepted_tokens_total`` and the gauge ``trtllm_spec_decode_acceptance_length``; the
  server's collector logs only the latest of the iterations it drains, so those iteration
  counters undercount and the per-request ones are preferred.
- trtllm-serve JSON ``/metrics``: ``get_iteration_stats`` returns the iteration stats queued since
  the last read and **drains the queue** (``get_stats_async``); each item's ``specDecodingStats``
  has ``numDraftTokens``, ``numAcceptedTokens``, ``numRequestsWithDraftTokens`` (requests with a
  draft in that iteration, so one verify step each) and ``acceptanceLength``
  (``cpp/include/tensorrt_llm/executor/types.h``). Needs ``enable_iter_perf_stats``. The read
  after a run therefore holds that run's iterations only (the read before emptied the queue).
- SGLang: ``python/sglang/srt/metrics/collector.py`` (``SchedulerMetricsCollector``): gauges
  ``sglang:spec_accept_length`` and ``sglang:spec_accept_rate`` (the last logging interval), no
  counters; needs ``--enable-metrics``. Each scheduler process sets them under its own labels
  (``dp_rank`` with data parallelism, ``tp_rank``/``pp_rank`` and others as the release has them;
  ``multiprocess_mode="mostrecent"``), beside ``sglang:num_running_reqs`` with the same labels. The
  ranks are kept (``per_rank``, with their labels) and aggregated as the gauges mean: a mean over
  verify steps, so weighted by each rank's running requests (its sequences per step) where that gauge
  is exported, a plain mean over ranks where it is not (``rank_aggregation`` says which).
"""

from __future__ import annotations

import json
from typing import Any

from pipeline.artefacts.runs import NOT_REPORTED
from pipeline.loadtest.server_metrics import COUNTERS, metrics_text

SPECDEPLOY, VLLM, TRTLLM_PROM, TRTLLM_ITER, SGLANG = (
    "specdeploy", "vllm", "trtllm-serve (prometheus)", "trtllm-serve (iteration stats)", "sglang")
COUNTER_DELTA, DRAINED_WINDOW, GAUGE_WINDOW = "counter delta", "drained window", "gauge window"

# Prometheus sample name -> (figure, source); sample names as prometheus_client's parser gives them
_COUNTER_SAMPLES: dict[str, tuple[str, str]] = {
    "specdeploy_spec_decode_draft_tokens_total": ("draft_tokens", SPECDEPLOY),
    "specdeploy_spec_decode_accepted_tokens_total": ("accepted_tokens", SPECDEPLOY),
    "specdeploy_spec_decode_verify_steps_total": ("verify_steps", SPECDEPLOY),
    "vllm:spec_decode_num_draft_tokens_total": ("draft_tokens", VLLM),
    "vllm:spec_decode_num_accepted_tokens_total": ("accepted_tokens", VLLM),
    "vllm:spec_decode_num_drafts_total": ("verify_steps", VLLM),
    "trtllm_spec_decode_drafted_tokens_total": ("draft_tokens", TRTLLM_PROM),
    "trtllm_spec_decode_accepted_tokens_total": ("accepted_tokens", TRTLLM_PROM),
}
# name -> (label, figure); per draft position, position numbered from 0
_PER_POSITION = {"vllm:spec_decode_num_accepted_tokens_per_pos_total": ("position", "per_position"),
                 "specdeploy_spec_decode_accepted_tokens_per_pos_total": ("position", "per_position"),
                 "specdeploy_spec_decode_draft_tokens_per_pos_total": ("position", "drafted_per_position")}
# trtllm-serve's iteration-level counters: a fallback when the per-request ones are absent (older releases)
_TRTLLM_ITER_COUNTERS = {"trtllm_spec_decode_num_draft_tokens_total": "draft_tokens",
                         "trtllm_spec_decode_num_accepted_tokens_total": "accepted_tokens"}
_GAUGES: dict[str, tuple[str, str]] = {
    "trtllm_spec_decode_acceptance_length": ("mean_acceptance_length", TRTLLM_PROM),
    "sglang:spec_accept_length": ("mean_acceptance_length", SGLANG),
    "sglang:spec_accept_rate": ("acceptance_rate", SGLANG),
}
_SGLANG_RANK_WEIGHT = "sglang:num_running_reqs"


# ------------------------------------------------------------------------------------------------
# One scrape


def scrape(metrics_url: str | None, timeout_s: float = 5.0) -> dict[str, Any] | None:
    """What the server reports now (see :func:`parse`); None when there is no URL or no answer."""
    text = metrics_text(metrics_url, timeout_s)
    return None if text is None else parse(text)


def parse(text: str) -> dict[str, Any]:
    """``{"source", "counters", "gauges", "per_position"}`` (or ``"drained"`` for trtllm-serve's
    JSON iteration stats); ``source`` is ``not reported`` when the text carries no acceptance."""
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            return parse_iteration_stats(json.loads(stripped))
        except ValueError:
            pass
    return parse_prometheus(text)


def parse_prometheus(text: str) -> dict[str, Any]:
    from prometheus_client.parser import text_string_to_metric_families  # noqa: PLC0415 - start-up: prometheus_client (loaded when a counter page is parsed; pipeline.report.acceptance imports this module)

    counters: dict[str, dict[str, float]] = {}
    iter_counters: dict[str, float] = {}
    gauges: dict[str, dict[str, float]] = {}
    positions: dict[str, dict[str, float]] = {"per_position": {}, "drafted_per_position": {}}
    sglang_ranks: dict[tuple, dict[str, Any]] = {}  # label set -> {"labels", figures, "weight"}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name, value = sample.name, float(sample.value)
            if name in _COUNTER_SAMPLES:
                figure, source = _COUNTER_SAMPLES[name]
                by_source = counters.setdefault(source, {})
                by_source[figure] = by_source.get(figure, 0.0) + value  # summed over label sets
            elif name in _TRTLLM_ITER_COUNTERS:
                figure = _TRTLLM_ITER_COUNTERS[name]
                iter_counters[figure] = iter_counters.get(figure, 0.0) + value
            elif name in _PER_POSITION:
                label, figure = _PER_POSITION[name]
                pos = sample.labels.get(label, "?")
                positions[figure][pos] = positions[figure].get(pos, 0.0) + value
            elif name in _GAUGES and family.type in ("gauge", "unknown"):  # "unknown": text without # TYPE
                figure, source = _GAUGES[name]
                if source == SGLANG:
                    _rank(sglang_ranks, sample.labels)[figure] = value
                else:
                    gauges.setdefault(source, {})[figure] = value  # one engine: the last label set read
            elif name == _SGLANG_RANK_WEIGHT and family.type in ("gauge", "unknown"):
                _rank(sglang_ranks, sample.labels)["weight"] = value
    ranks = [r for r in sglang_ranks.values() if any(f in r for f, _ in _GAUGES.values())]
    if ranks:
        gauges[SGLANG], aggregation = aggregate_ranks(ranks)
    if iter_counters and TRTLLM_PROM not in counters:
        counters[TRTLLM_PROM] = iter_counters
    source = next((s for s in (SPECDEPLOY, VLLM, TRTLLM_PROM, SGLANG) if s in counters or s in gauges), NOT_REPORTED)
    out = {"source": source, "counters": counters.get(source, {}), "gauges": gauges.get(source, {}),
           **{figure: by_pos if source in (VLLM, SPECDEPLOY) else {} for figure, by_pos in positions.items()}}
    if source == SGLANG:
        out["per_rank"], out["rank_aggregation"] = ranks, aggregation
    return out


def _rank(ranks: dict[tuple, dict[str, Any]], labels: dict[str, str]) -> dict[str, Any]:
    key = tuple(sorted(labels.items()))
    return ranks.setdefault(key, {"labels": dict(labels)})


def aggregate_ranks(ranks: list[dict[str, Any]]) -> tuple[dict[str, float], str]:
    """SGLang's per-rank gauges as one figure each: weighted by running requests where every rank
    exports a positive count, else the plain mean; and which of the two (or one rank) it was."""
    figures = sorted({f for r in ranks for f in r if f not in ("labels", "weight")})
    weights = [r.get("weight") for r in ranks]
    weighted = len(ranks) > 1 and all(w is not None for w in weights) and sum(weights) > 0
    out = {}
    for figure in figures:
        pairs = [(r[figure], r.get("weight") or 0.0) for r in ranks if figure in r]
        if weighted and sum(w for _, w in pairs) > 0:
            out[figure] = sum(v * w for v, w in pairs) / sum(w for _, w in pairs)
        else:
            out[figure] = sum(v for v, _ in pairs) / len(pairs)
    how = ("one label set" if len(ranks) == 1 else
           f"weighted by {_SGLANG_RANK_WEIGHT}" if weighted else "mean over ranks (no running-request weight)")
    return out, how


def parse_iteration_stats(stats: Any) -> dict[str, Any]:
    """trtllm-serve's JSON ``/metrics``: the iterations drained by this read, summed."""
    totals = {"draft_tokens": 0.0, "accepted_tokens": 0.0, "verify_steps": 0.0}
    iterations = 0
    for item in stats if isinstance(stats, list) else []:
        if isinstance(item, str):  # some releases queue each iteration as a JSON string
            try:
                item = json.loads(item)
            except ValueError:
                continue
        spec = item.get("specDecodingStats") if isinstance(item, dict) else None
        if not isinstance(spec, dict):
            continue
        iterations += 1
        totals["draft_tokens"] += float(spec.get("numDraftTokens") or 0)
        totals["accepted_tokens"] += float(spec.get("numAcceptedTokens") or 0)
        totals["verify_steps"] += float(spec.get("numRequestsWithDraftTokens") or 0)
    if not iterations:
        return {"source": NOT_REPORTED, "counters": {}, "gauges": {}, "per_position": {}}
    return {"source": TRTLLM_ITER, "drained": {**totals, "iterations": iterations}, "counters": {}, "gauges": {},
            "per_position": {}}


# ------------------------------------------------------------------------------------------------
# One run


def run_delta(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, Any] | None:
    """A run's acceptance from the scrapes around it: counters as after − before, trtllm-serve's
    drained iteration stats as read after the run, gauges as the window (before, after) with the
    value at the end of the run. None when a scrape is missing; ``source: not reported`` when the
    server reports none. ``acceptance_rate`` and ``mean_acceptance_length`` are None, never 0,
    when the figures do not give them."""
    if before is None or after is None:
        return None
    source = after.get("source", NOT_REPORTED)
    out: dict[str, Any] = {"source": source, "kind": None, "draft_tokens": None, "accepted_tokens": None,
                           "verify_steps": None, "acceptance_rate": None, "mean_acceptance_length": None}
    if source == NOT_REPORTED:
        return out
    if "drained" in after:
        figures = {k: after["drained"][k] for k in ("draft_tokens", "accepted_tokens", "verify_steps")}
        out.update(kind=DRAINED_WINDOW, iterations=after["drained"]["iterations"], **figures)
    elif after.get("counters"):
        start = before.get("counters", {}) if before.get("source") == source else {}
        figures = {k: v - start.get(k, 0.0) for k, v in after["counters"].items()}
        out.update(kind=COUNTER_DELTA, **figures)
        for figure, name in (("per_position", "accepted_per_position"), ("drafted_per_position", "drafted_per_position")):
            if after.get(figure):
                start_pos = before.get(figure, {}) if before.get("source") == source else {}
                out[name] = {p: v - start_pos.get(p, 0.0) for p, v in sorted(after[figure].items())}
    _rates(out)
    gauges = after.get("gauges") or {}
    if gauges:
        start_g = before.get("gauges", {}) if before.get("source") == source else {}
        out["gauge_window"] = {k: {"before": start_g.get(k), "after": v} for k, v in gauges.items()}
        if out["kind"] is None:
            out["kind"] = GAUGE_WINDOW
        for figure, value in gauges.items():
            if out.get(figure) is None:
                out[figure] = value
    if after.get("per_rank"):
        out["per_rank"], out["rank_aggregation"] = after["per_rank"], after.get("rank_aggregation")
    return out


def _rates(out: dict[str, Any]) -> None:
    drafted, accepted, steps = out.get("draft_tokens"), out.get("accepted_tokens"), out.get("verify_steps")
    if drafted and accepted is not None:
        out["acceptance_rate"] = accepted / drafted
    if steps and accepted is not None:
        out["mean_acceptance_length"] = 1 + accepted / steps


def legacy_delta(delta: dict[str, Any] | None) -> dict[str, float | str] | None:
    """``runs.json``'s older ``metrics_delta`` (counter deltas and their source) from a run delta;
    None unless the figures are counts (counter deltas or drained iteration stats)."""
    if delta is None:
        return None
    if delta.get("kind") not in (COUNTER_DELTA, DRAINED_WINDOW):
        return {**{k: 0.0 for k in COUNTERS}, "source": delta.get("source", NOT_REPORTED)} \
            if delta.get("source") == NOT_REPORTED else None
    return {**{k: float(delta.get(k) or 0.0) for k in COUNTERS}, "source": delta["source"]}
