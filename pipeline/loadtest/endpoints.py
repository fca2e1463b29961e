"""The two arms' endpoints: servers started here as ``render`` placed them, or URLs the user gives.

:class:`ManagedEndpoints` starts both arms' Triton servers once on distinct ports, or one at a
time with restarts when they cannot share the GPUs; :func:`remote_endpoint` wraps a given URL.
Reads each arm's deployment descriptor, as ``render`` wrote it beside the repository (which model
the arm calls, its extra inputs, its placement: :func:`arm_deployments`), and the servers'
``/metrics`` (the backend's reported KV-cache capacity); writes the servers' logs through
``pipeline.serve.server``.
"""

from __future__ import annotations

import json
import re
import urllib.request
from dataclasses import dataclass
from typing import Any, Callable

from pipeline.artefacts.deployment import ArmDeployment, descriptor_path, load_arm, load_descriptor
from pipeline.config import DeploymentConfig
from pipeline.infra.readiness import model_ready, server_live
from pipeline.loadtest.inputs import LoadTestError
from pipeline.loadtest.server_metrics import metrics_text
from pipeline.paths import model_repo_dir
from pipeline.render.arms import decide_arm
from pipeline.serve.kv_capacity import arm_engine_models, await_reported, planned_kv_tokens

# ------------------------------------------------------------------------------------------------
# Endpoints


@dataclass
class ArmEndpoint:
    arm: str
    url: str  # grpc host:port, or http://host:port
    model_name: str
    extra_inputs: dict[str, Any]
    metrics_url: str | None = None
    pid: int | None = None
    alive: Callable[[], bool] | None = None
    log_tail: Callable[[int], str] | None = None
    client_cpus: tuple[int, ...] | None = None  # the server's CPU plan keeps Locust off the engines' cores
    deployment: ArmDeployment | None = None  # what the arm is (None: a server with no deployment config)


class ManagedEndpoints:
    """Both arms' servers for one load test, placed as ``render`` recorded (``pipeline.plan.gpu_layout``):
    started once and kept up for the whole sweep (split or shared GPUs, the CPU engine), or — when
    only one arm fits at a time (``sequential``) — one at a time, restarted whenever the next run
    needs the other arm, on the same ports, so the A B A B interleaving survives. Indexing by arm
    returns that arm's running endpoint. Every server is stopped on exit."""

    def __init__(self, cfg: DeploymentConfig, arms: tuple[str, ...]):
        from pipeline.infra.processes import free_ports  # noqa: PLC0415 - start-up: psutil (pipeline.infra.processes; only a run that starts its own servers needs it)

        self.cfg, self.arms = cfg, arms
        self.deployments = {arm: load_arm(cfg, arm)[1] for arm in arms}  # as render described them
        self.placements = {arm: d.placement for arm, d in self.deployments.items()}
        self.sequential = any((p or {}).get("strategy") == "sequential" for p in self.placements.values())
        ports = iter(free_ports(3 * len(arms)))
        self.ports = {arm: (next(ports), next(ports), next(ports)) for arm in arms}
        self.starts = {arm: 0 for arm in arms}
        self.kv_reported: dict[str, dict[str, int] | None] = {}
        self._servers: dict[str, Any] = {}
        self._endpoints: dict[str, ArmEndpoint] = {}

    def __enter__(self) -> "ManagedEndpoints":
        try:
            for arm in ([] if self.sequential else self.arms):
                self._start(arm)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __getitem__(self, arm: str) -> ArmEndpoint:
        if arm not in self._servers:
            for other in [a for a in self._servers if a != arm]:
                self._servers.pop(other).stop()
            self._start(arm)
        return self._endpoints[arm]

    def close(self) -> None:
        while self._servers:
            self._servers.popitem()[1].stop()

    def _start(self, arm: str) -> None:
        from pipeline.serve.server import start_deployment  # noqa: PLC0415 - start-up: psutil (pipeline.serve.server; only a run that starts its own servers needs it)

        http, grpc, metrics = self.ports[arm]
        server = start_deployment(self.cfg, arm, http_port=http, grpc_port=grpc, metrics_port=metrics)
        self._servers[arm] = server
        self.starts[arm] += 1
        target = self.deployments[arm]
        self._endpoints[arm] = ArmEndpoint(
            arm=arm, url=server.grpc_url if self.cfg.loadtest.transport == "grpc" else server.http_url,
            model_name=target.model_name, extra_inputs=target.extra_inputs,
            metrics_url=server.metrics_url, pid=server.pid,
            alive=_managed_alive(server, target.model_name, target.extra_inputs, target.contract),
            log_tail=getattr(server, "log_tail", None),
            client_cpus=server.cpu_plan.other_cpus if getattr(server, "cpu_plan", None) else None,
            deployment=target,
        )
        self.kv_reported[arm] = await_reported(lambda: kv_capacity_reported(server.metrics_url))

    def provenance(self) -> dict[str, dict[str, Any]]:
        """Per arm: where it was served, its GPUs, KV fraction and capacity, and how it was started."""
        host, out = self.cfg.triton.host, {}
        for arm in self.arms:
            http, grpc, metrics = self.ports[arm]
            target = self.deployments[arm]
            out[arm] = {
                "url": f"{host}:{grpc}" if self.cfg.loadtest.transport == "grpc" else f"http://{host}:{http}",
                "model": target.model_name, "extra_inputs": target.extra_inputs,
                "metrics_url": f"http://{host}:{metrics}/metrics", "placement": self.placements[arm],
                "served": ("one arm at a time, restarted between runs" if self.sequential
                           else "both arms up for the whole sweep"),
                "server_starts": self.starts[arm], "kv_cache_tokens_reported": self.kv_reported.get(arm),
                "kv_cache_tokens_planned": planned_kv_tokens(self.cfg, self.placements[arm], arm_engine_models(target.method, target.drafts)),
            }
        return out


def managed_endpoints(cfg: DeploymentConfig, arms: tuple[str, ...]) -> ManagedEndpoints:
    """The arms' servers for the whole sweep (see :class:`ManagedEndpoints`)."""
    try:
        import pipeline.serve.server  # noqa: F401, PLC0415 - optional: psutil (pipeline.serve.server needs the serving extras; without them the message says to pass endpoints)
    except ImportError as exc:
        raise LoadTestError(f"serving is not available ({exc}); pass --endpoint-baseline/--endpoint-speculative") from None
    return ManagedEndpoints(cfg, arms)


def kv_capacity_reported(metrics_url: str | None, timeout_s: float = 5.0) -> dict[str, int] | None:
    """KV-cache capacity in tokens per TensorRT-LLM model, from the backend's
    ``nv_trt_llm_kv_cache_block_metrics`` (max blocks × tokens per block); None when the server
    exports none (the CPU engine)."""
    text = metrics_text(metrics_url, timeout_s)
    return None if text is None else kv_capacity_from_text(text)


def kv_capacity_from_text(text: str) -> dict[str, int] | None:
    from prometheus_client.parser import text_string_to_metric_families  # noqa: PLC0415 - start-up: prometheus_client (loaded when a metrics page is parsed)

    found: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        if family.name != "nv_trt_llm_kv_cache_block_metrics":
            continue
        for sample in family.samples:
            block_type = sample.labels.get("kv_cache_block_type", "")
            found.setdefault(sample.labels.get("model", ""), {})[block_type] = float(sample.value)
    tokens = {m: int(v["max"] * v["tokens_per"]) for m, v in found.items() if "max" in v and "tokens_per" in v}
    return tokens or None


def arm_deployments(cfg: DeploymentConfig, arms: tuple[str, ...], remote: bool) -> dict[str, ArmDeployment]:
    """What each arm is, as ``render`` decided it: read before anything is measured, so a missing or
    stale descriptor stops the load test with the stage to run. Servers started here need the
    rendered repository and its descriptor; ``remote`` servers (``--endpoint-*``) see
    :func:`remote_deployment`."""
    return {arm: remote_deployment(cfg, arm) if remote else load_arm(cfg, arm)[1] for arm in arms}


def remote_deployment(cfg: DeploymentConfig, arm: str) -> ArmDeployment:
    """A server started elsewhere: the descriptor ``render`` wrote here when this machine rendered
    the deployment (refused when stale, like any later stage's); when nothing was rendered here (the
    repository was rendered and is served on another host), ``render``'s own decision for this config,
    which is what its render wrote there."""
    if descriptor_path(model_repo_dir(cfg, arm)).is_file():
        return load_descriptor(cfg, arm)
    return decide_arm(cfg, arm)


def remote_endpoint(cfg: DeploymentConfig, arm: str, url: str, metrics_url: str | None = None,
                    target: ArmDeployment | None = None) -> ArmEndpoint:
    """A server somebody else started, ``target`` the arm it serves (default:
    :func:`remote_deployment`)."""
    target = target or remote_deployment(cfg, arm)
    transport = cfg.loadtest.transport
    if transport == "http" and not url.startswith(("http://", "https://")):
        url = "http://" + url
    if transport == "grpc":
        url = re.sub(r"^(grpc|http)s?://", "", url)
    def alive() -> bool:
        if not endpoint_alive(url, transport, target.model_name):
            return False
        return transport != "http" or probe_generate(url, target.model_name, target.extra_inputs,
                                                     contract=target.contract)

    return ArmEndpoint(arm, url, target.model_name, dict(target.extra_inputs), metrics_url, alive=alive,
                       deployment=target)


def require_reachable(endpoints: dict[str, ArmEndpoint]) -> None:
    """Before the first cell: every user-given endpoint serves its model and answers a probe.
    Unreachable is the environment's failure (exit 5, docs/ci.md); measured, it would be a cell
    with a dead server and read as NO-GO."""
    for arm, endpoint in endpoints.items():
        if endpoint.alive is not None and not endpoint.alive():
            raise LoadTestError(f"--endpoint-{arm} {endpoint.url}: model '{endpoint.model_name}' is not ready or does "
                                "not answer a one-token request (is the server up at that address, serving that model?)")


def _managed_alive(server, model_name: str, extra_inputs: dict[str, Any], contract: str = "ensemble") -> Callable[[], bool]:
    """The server process runs, the model the client calls is ready AND answers a one-token probe
    (measured: a crashed Python stub leaves tritonserver running with the model still 'ready')."""
    return lambda: (server.alive() and endpoint_alive(server.http_url, "http", model_name)
                    and probe_generate(server.http_url, model_name, extra_inputs, contract=contract))


def _probe_inputs(contract: str) -> dict[str, Any]:
    if contract == "llmapi":  # upstream's llmapi model: sampling_param_* names, streaming
        return {"text_input": "probe", "sampling_param_max_tokens": 1, "streaming": False}
    return {"text_input": "probe", "max_tokens": 1, "stream": False}


def probe_generate(http_url: str, model_name: str, extra_inputs: dict[str, Any], timeout_s: float = 30.0,
                   contract: str = "ensemble") -> bool:
    """One non-streaming ``/generate`` request for one token; True when it answers without error."""
    body = json.dumps({**_probe_inputs(contract), **extra_inputs}).encode()
    request = urllib.request.Request(f"{http_url.rstrip('/')}/v2/models/{model_name}/generate", data=body,  # noqa: S310 - an http URL built from the endpoint's own address
                                     headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:  # noqa: S310 - loopback/user URL
            payload = json.loads(resp.read() or b"{}")
            return resp.status == 200 and "error" not in payload
    except (OSError, ValueError):
        return False


def endpoint_alive(url: str, transport: str, model_name: str | None = None, timeout_s: float = 5.0) -> bool:
    """The model is ready (or, without a model, the server is live)."""
    if model_name:
        return model_ready(url, model_name, transport, timeout_s)
    return server_live(url, transport, timeout_s)
