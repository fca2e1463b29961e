"""`specdeploy loadtest --loadtest-file LT.yaml --endpoint-baseline URL --endpoint-speculative URL`:
an A/B between two servers someone else runs (trtllm-serve, vLLM, SGLang, our OpenAI frontend),
with no deployment config.

Reads the load-test file (:class:`EndpointLoadTestFile`: a name, the ``loadtest`` and ``gate``
sections of a deployment config, free-text provenance) and the tokenizer directory given with
``--tokenizer`` (re-tokenized output lengths when a server sends no ``usage``). Builds the
deployment config the load tester and the report take (``speculation.method: none``: nothing is
built or served here) and hands both arms to :func:`pipeline.loadtest.runner.run_loadtest` as given
endpoints; RUN_DIR is then what ``specdeploy report`` reads, as for a served deployment.

Each arm has its own model name (two servers need not name one model alike: a server that names it
by its path, a ``--served-model-name`` on one arm). Before any load, each OpenAI-compatible arm's
``GET /v1/models`` is read: a server that does not answer, or does not list the arm's name, stops
the load test there with the names it does list. Each arm's server acceptance is read from the
load-test file's ``metrics_*`` URL, else from the endpoint's own ``/metrics`` when it answers there
(what a vLLM user expects), else it is "not checked" and run.json's ``server_metrics`` says why.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, ValidationError

from pipeline.config import (
    DeploymentConfig,
    GateSettings,
    LoadTestSettings,
    format_validation_error,
    load_yaml_strict,
)
from pipeline.config_base import Section, described
from pipeline.errors import ConfigError, SpecdeployError, UsageError
from pipeline.loadtest import reach
from pipeline.loadtest.endpoints import ArmEndpoint, endpoint_alive
from pipeline.loadtest.inputs import with_loadtest_overrides
from pipeline.loadtest.overrides import apply_overrides
from pipeline.loadtest.runner import run_loadtest

TRANSPORTS = ("openai", "http", "grpc")


class EndpointLoadTestFile(Section):
    """A load test of two running endpoints: prompts, levels, gate, and what the servers are."""

    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")] = described(
        "Run name; outputs go to reports/NAME/ unless --out says otherwise."
    )
    description: str = described("Free text shown in reports (which servers, which flags).", default="")
    hardware: str = described("Free text: the servers' hardware, recorded in run.json.", default="not stated")
    loadtest: LoadTestSettings = described("Load-test settings (as in a deployment config).",
                                       default_factory=lambda: LoadTestSettings(transport="openai"))
    gate: GateSettings = described("Rollout gate thresholds.", default_factory=GateSettings)
    metrics_baseline: str | None = described(
        "Metrics URL of the baseline server (Prometheus text, or trtllm-serve's JSON /metrics), read before and "
        "after each run for its acceptance; unset: the endpoint's own /metrics when it answers there (openai "
        "transport), else not checked (docs/openai-endpoints.md).", default=None)
    metrics_speculative: str | None = described("Metrics URL of the speculative server, as metrics_baseline.",
                                            default=None)


def load_loadtest_file(path: str | Path) -> EndpointLoadTestFile:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(str(path), [f"(file): no such load-test file: {path}"])
    try:
        data = load_yaml_strict(path.read_text(encoding="utf-8"))
    except Exception as exc:  # noqa: BLE001 - YAML, duplicate keys, encoding: one clear line
        raise ConfigError(str(path), [f"(yaml): {getattr(exc, 'problem', exc)}"]) from None
    if not isinstance(data, dict):
        raise ConfigError(str(path), ["(top level): expected a mapping of fields"])
    loadtest = data.setdefault("loadtest", {}) if isinstance(data.get("loadtest", {}), dict) else data.get("loadtest")
    if isinstance(loadtest, dict):
        loadtest.setdefault("transport", "openai")  # the endpoints this file is for
    try:
        return EndpointLoadTestFile.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(str(path), format_validation_error(exc)) from None


def deployment_config(lt: EndpointLoadTestFile, model: str, transport: str, source: Path | None) -> DeploymentConfig:
    """The config snapshot the load tester and the report read: the file's loadtest and gate, the
    model name as the target, no speculation (the servers decide that, not us)."""
    loadtest = lt.loadtest.model_copy(update={"transport": transport})
    cfg = DeploymentConfig.model_validate({
        "name": lt.name, "description": lt.description, "backend": "reference", "hardware": "cpu",
        "target": {"checkpoint": model}, "loadtest": loadtest.model_dump(), "gate": lt.gate.model_dump(),
    })
    cfg.set_source_path(source.resolve() if source else None)  # relative prompt paths: beside the file too
    return cfg


def given_endpoints(transport: str, model: str | dict[str, str], urls: dict[str, str | None],
                    metrics: dict[str, str | None], headers: dict[str, str] | None = None) -> dict[str, ArmEndpoint]:
    """One :class:`ArmEndpoint` per arm with a URL; alive = the server still answers after a run.
    ``model``: one name for both arms, or one per arm; ``headers``: what the probes send (the API key:
    :mod:`pipeline.loadtest.reach`)."""
    out = {}
    for arm, url in urls.items():
        if not url:
            continue
        if transport in ("openai", "http") and not re.match(r"^https?://", url):
            url = "http://" + url
        if transport == "grpc":
            url = re.sub(r"^(grpc|http)s?://", "", url)
        name = model[arm] if isinstance(model, dict) else model
        out[arm] = ArmEndpoint(arm, url.rstrip("/"), name, {}, metrics.get(arm),
                               alive=_alive(transport, url, name, headers or {}))
    return out


def arm_models(model: str | None, model_baseline: str | None, model_speculative: str | None,
               urls: dict[str, str | None]) -> dict[str, str]:
    """The model name each arm with a URL sends: its own option, else ``--model``."""
    given = {"baseline": model_baseline or model, "speculative": model_speculative or model}
    missing = [arm for arm, url in urls.items() if url and not given[arm]]
    if missing:
        raise UsageError(f"--model-{missing[0]} (or --model for both arms): the model name the {missing[0]} "
                         "server serves is needed with --loadtest-file (GET /v1/models lists it)")
    return {arm: name for arm, name in given.items() if urls.get(arm) and name}


def listed_models(url: str, timeout_s: float = 10.0, headers: dict[str, str] | None = None, lt=None) -> list[str]:
    """The model ids ``GET /v1/models`` lists; SpecdeployError (the server's words) when it does not answer,
    ApiKeyError (exit 2) when it wants a key (401/403)."""
    base = url.rstrip("/").removesuffix("/v1")
    request = urllib.request.Request(base + "/v1/models", headers=headers or {})  # noqa: S310 - user URL
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:  # noqa: S310 - user URL
            payload = json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        body = exc.read()[:500].decode("utf-8", "replace")
        if exc.code in (401, 403) and lt is not None:
            raise reach.ApiKeyError(f"{base}/v1/models: {reach.refused_words(exc.code, lt)}; the server said: "
                                    f"{body}") from None
        raise SpecdeployError(f"{base}/v1/models answered HTTP {exc.code}: {body} (is {base} the base URL of an "
                              "OpenAI-compatible server?)") from None
    except (OSError, ValueError) as exc:
        raise SpecdeployError(f"{base}/v1/models: {type(exc).__name__}: {exc} (is the server up at {base}?)") from None
    data = payload.get("data") if isinstance(payload, dict) else None
    return [str(item.get("id")) for item in data or [] if isinstance(item, dict) and item.get("id") is not None]


def check_models_listed(endpoints: dict[str, ArmEndpoint], headers: dict[str, str] | None = None,
                        lt=None) -> dict[str, list[str]]:
    """Every arm's model name is one its server lists; returns what each listed (run.json records it)."""
    listed = {}
    for arm, endpoint in endpoints.items():
        listed[arm] = listed_models(endpoint.url, headers=headers, lt=lt)
        if endpoint.model_name not in listed[arm]:
            names = ", ".join(repr(n) for n in listed[arm]) or "none"
            raise UsageError(f"{arm}: the server at {endpoint.url} does not list the model "
                             f"'{endpoint.model_name}' at GET /v1/models; it lists {names} (pass one with "
                             f"--model-{arm}, or --model for both arms)")
    return listed


METRICS_FROM_FILE, METRICS_DEFAULT = "load-test file", "the endpoint's own /metrics"
NOT_CHECKED = "not checked"


def metrics_urls(transport: str, urls: dict[str, str | None], given: dict[str, str | None],
                 headers: dict[str, str] | None = None,
                 timeout_s: float = 5.0) -> tuple[dict[str, str | None], dict[str, dict[str, Any]]]:
    """Each arm's metrics URL and where it came from (run.json's ``server_metrics``): the load-test
    file's ``metrics_*`` when set; else, on the openai transport, ``<base URL>/metrics`` when the
    server answers it there (vLLM, SGLang with ``--enable-metrics`` and trtllm-serve serve it on the
    API port), as a vLLM user expects; else none, and the arm's server acceptance is "not checked"
    with the reason (a ``transformers serve`` or our frontend answers 404). ``headers``: what the
    probes send (an API key), as for ``GET /v1/models``."""
    out: dict[str, str | None] = {}
    notes: dict[str, dict[str, Any]] = {}
    for arm, url in urls.items():
        if not url:
            continue
        if given.get(arm):
            out[arm], notes[arm] = given[arm], {"url": given[arm], "from": METRICS_FROM_FILE}
            continue
        if transport != "openai":  # Triton's metrics have their own port: only the file can say which
            out[arm], notes[arm] = None, {"url": None, "from": NOT_CHECKED, "why": "no metrics_" + arm + " in the file"}
            continue
        base = (url if re.match(r"^https?://", url) else "http://" + url).rstrip("/").removesuffix("/v1")
        why = _metrics_unavailable(base + "/metrics", timeout_s, headers or {})
        out[arm] = None if why else base + "/metrics"
        notes[arm] = ({"url": None, "from": NOT_CHECKED, "why": why} if why
                      else {"url": base + "/metrics", "from": METRICS_DEFAULT})
    return out, notes


def _metrics_unavailable(url: str, timeout_s: float, headers: dict[str, str]) -> str | None:
    """Why ``url`` is no metrics endpoint (its HTTP status, or the error), None when it answers 200."""
    request = urllib.request.Request(url, headers=headers)  # noqa: S310 - the user's endpoint
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:  # noqa: S310 - the user's endpoint
            resp.read()
            return None if resp.status == 200 else f"GET {url} answered HTTP {resp.status}"
    except urllib.error.HTTPError as exc:
        return f"GET {url} answered HTTP {exc.code}"
    except OSError as exc:
        return f"GET {url}: {type(exc).__name__}: {exc}"


def _alive(transport: str, url: str, model: str, headers: dict[str, str]):
    if transport != "openai":
        return lambda: endpoint_alive(url, transport, model)
    return lambda: openai_alive(url, headers=headers)


def openai_alive(url: str, timeout_s: float = 5.0, headers: dict[str, str] | None = None) -> bool:
    """``GET /v1/models`` answers 200 (vLLM, SGLang, trtllm-serve and our frontend all serve it)."""
    base = url.rstrip("/").removesuffix("/v1")
    request = urllib.request.Request(base + "/v1/models", headers=headers or {})  # noqa: S310 - user URL
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:  # noqa: S310 - user URL
            return resp.status == 200
    except OSError:
        return False


def run_endpoint_loadtest(lt_path: str | Path, *, endpoint_baseline: str | None, endpoint_speculative: str | None,
                          model: str | None, transport: str = "openai", tokenizer: str | None = None,
                          model_baseline: str | None = None, model_speculative: str | None = None,
                          overrides: dict[str, Any] | None = None,
                          loadtest_overrides: dict[str, Any] | None = None,
                          **options: Any) -> tuple[Path, DeploymentConfig]:
    """Load-test two given endpoints (or one, with ``arm``); returns (RUN_DIR, the config snapshot).
    ``overrides``: the vocabulary flags (:mod:`pipeline.loadtest.overrides`); ``loadtest_overrides``:
    the dataset flags (``inputs.with_loadtest_overrides``)."""

    if transport not in TRANSPORTS:
        raise UsageError(f"--transport: expected one of {TRANSPORTS}, got '{transport}'")
    urls = {"baseline": endpoint_baseline, "speculative": endpoint_speculative}
    if options.get("aa"):  # A/A: the baseline server against itself (runner.AA_DESIGN)
        if endpoint_speculative:
            raise UsageError("--aa measures the baseline against itself: drop --endpoint-speculative")
        urls = {"baseline": endpoint_baseline}
    if options.get("arm"):
        urls = {arm: url for arm, url in urls.items() if arm == options["arm"]}
    models = arm_models(model, model_baseline, model_speculative, urls)
    if tokenizer and not (Path(tokenizer) / "tokenizer.json").is_file():
        raise UsageError(f"--tokenizer: {tokenizer} holds no tokenizer.json")
    lt = load_loadtest_file(lt_path)
    cfg = deployment_config(lt, models.get("baseline") or next(iter(models.values())), transport, Path(lt_path))
    cfg = with_loadtest_overrides(cfg, loadtest_overrides)
    if overrides:  # --request-rate, --goodput, --header, ... (pipeline/loadtest/overrides.py)

        cfg = apply_overrides(cfg, overrides)
    headers = reach.request_headers(cfg.loadtest)  # the key read from its variable, for the probes only
    metrics, metrics_notes = metrics_urls(transport, urls, {"baseline": lt.metrics_baseline,
                                                            "speculative": lt.metrics_speculative}, headers)
    endpoints = given_endpoints(transport, models, urls, metrics, headers)
    listed = check_models_listed(endpoints, headers, cfg.loadtest) if transport == "openai" else None  # before any load
    run_dir = run_loadtest(cfg, endpoint_baseline=endpoint_baseline, endpoint_speculative=endpoint_speculative,
                           given_endpoints=endpoints, tokenizer_dir=tokenizer,
                           meta_extra={"hardware": {"declared": lt.hardware, "servers": "given endpoints"},
                                       "loadtest_file": str(Path(lt_path).resolve()),
                                       "models": models, "models_listed": listed,
                                       "server_metrics": metrics_notes}, **options)
    return run_dir, cfg
