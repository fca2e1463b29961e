"""The load-test flags a `vllm bench serve` or AIPerf user already types, applied over the config:
``--request-rate``, ``--arrival``, ``--burstiness``, ``--max-concurrency``, ``--goodput``,
``--header``, ``--api-key-env``, ``--extra-body`` (docs/arrivals-and-goodput.md maps every flag of
both tools to ours). Each becomes the YAML field of the same meaning (``loadtest.request_rate``,
``gate.slo``, ...), validated as if written there, so run.json's config snapshot records what ran.
Reads and writes nothing.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import ValidationError

from pipeline.config import DeploymentConfig, GateSettings, LoadTestSettings
from pipeline.config.loading import format_validation_error
from pipeline.errors import ConfigError, UsageError

GOODPUT_KEYS = {"ttft": "ttft_ms", "tpot": "tpot_ms", "e2el": "e2e_ms"}  # vLLM's --goodput names
# AIPerf's metric tags for the same three (its inter_token_latency is the per-request TPOT formula)
AIPERF_GOODPUT_KEYS = {"time_to_first_token": "ttft", "inter_token_latency": "tpot", "request_latency": "e2el"}


def parse_goodput(value: str | list[str]) -> dict[str, float | None]:
    """vLLM's ``--goodput ttft:500 tpot:50 e2el:3000`` (milliseconds; any subset, space- or comma-separated,
    in one value or repeated; AIPerf's tags time_to_first_token, inter_token_latency, request_latency too)
    → the ``gate.slo`` fields; the ones not given are no SLO (None), as in vLLM."""
    out: dict[str, float | None] = {field: None for field in GOODPUT_KEYS.values()}
    text = " ".join(value) if isinstance(value, list) else value
    items = [item for item in re.split(r"[\s,]+", text.strip()) if item]
    if not items:
        raise UsageError("--goodput: expected KEY:MS pairs like 'ttft:500 tpot:50 e2el:3000'")
    for item in items:
        key, _, ms = item.partition(":")
        key = AIPERF_GOODPUT_KEYS.get(key, key)
        if key not in GOODPUT_KEYS:
            raise UsageError(f"--goodput: '{key}' is not one of {', '.join(GOODPUT_KEYS)} (vLLM's names), in '{item}'")
        try:
            number = float(ms)
        except ValueError:
            raise UsageError(f"--goodput: '{item}' needs a number of milliseconds after the colon") from None
        if number <= 0:
            raise UsageError(f"--goodput: '{item}': the bound must be positive")
        out[GOODPUT_KEYS[key]] = number
    return out


def parse_headers(values: list[str]) -> dict[str, str]:
    """``--header`` (repeatable) → a dict: AIPerf's ``Header:Value`` or vLLM's ``KEY=VALUE`` (whichever
    separator comes first; the value may hold the other, e.g. ``Authorization: Bearer a=b``)."""
    out = {}
    for value in values:
        cuts = [i for i in (value.find(":"), value.find("=")) if i > 0]
        if not cuts:
            raise UsageError(f"--header: expected KEY:VALUE (or vLLM's KEY=VALUE), got '{value}'")
        cut = min(cuts)
        out[value[:cut].strip()] = value[cut + 1:].strip()
    return out


def parse_extra_body(value: str) -> dict[str, Any]:
    try:
        body = json.loads(value)
    except ValueError as exc:
        raise UsageError(f"--extra-body: not JSON ({exc}): {value}") from None
    if not isinstance(body, dict):
        raise UsageError(f"--extra-body: expected a JSON object like '{{\"ignore_eos\": true}}', got {value}")
    return body


def parse_rates(value: str) -> list[float]:
    try:
        rates = [float(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"--request-rate: expected comma-separated requests/s like 2,4.5, got '{value}'") from None
    if not rates or any(r <= 0 for r in rates):
        raise UsageError(f"--request-rate: expected positive rates, got '{value}'")
    return rates


def loadtest_changes(flags: dict[str, Any], mode: str = "closed") -> dict[str, Any]:
    """The ``loadtest`` fields the given flags set (None: the flag was not given) over a config of ``mode``."""
    changes: dict[str, Any] = {}
    if flags.get("request_rate") is not None:
        changes.update(mode="open", request_rate=parse_rates(flags["request_rate"]))
    if flags.get("arrival") is not None:
        changes["arrival"] = flags["arrival"]
        if flags["arrival"] != "poisson" or flags.get("request_rate") is None:
            changes["mode"] = "open"
    if flags.get("burstiness") is not None:
        changes["burstiness"] = flags["burstiness"]
        if flags["burstiness"] != 1.0 and "arrival" not in changes:
            changes["arrival"] = "gamma"  # vLLM: a burstiness is a gamma process (1 is Poisson)
    if flags.get("max_concurrency") is not None:
        if changes.get("mode", mode) == "open":
            changes["max_concurrency"] = flags["max_concurrency"]
        else:  # vLLM's --max-concurrency N without a rate (rate inf): N requests in flight, a closed loop at N
            changes["concurrency"] = [flags["max_concurrency"]]
    if flags.get("headers"):
        changes["headers"] = parse_headers(flags["headers"])
    if flags.get("api_key_env") is not None:
        changes["api_key_env"] = flags["api_key_env"]
    if flags.get("extra_body") is not None:
        changes["extra_body"] = parse_extra_body(flags["extra_body"])
    return changes


def apply_overrides(cfg: DeploymentConfig, flags: dict[str, Any]) -> DeploymentConfig:
    """``cfg`` with the flags' fields set, each section validated again (a contradiction names its field)."""
    lt_changes = loadtest_changes(flags, cfg.loadtest.mode)
    gate_changes: dict[str, Any] = {}
    if flags.get("goodput") is not None:
        slo = {**cfg.gate.slo.model_dump(), **parse_goodput(flags["goodput"]), "declared": True}
        if flags.get("slo_percentile") is not None:
            slo["percentile"] = flags["slo_percentile"]
        gate_changes["slo"] = slo
    if not lt_changes and not gate_changes:
        return cfg
    try:
        loadtest = LoadTestSettings.model_validate({**cfg.loadtest.model_dump(), **lt_changes})
        gate = GateSettings.model_validate({**cfg.gate.model_dump(), **gate_changes})
    except ValidationError as exc:
        raise ConfigError("command-line flags", format_validation_error(exc)) from None
    return cfg.model_copy(update={"loadtest": loadtest, "gate": gate})
