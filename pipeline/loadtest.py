"""`specdeploy loadtest`: speculative vs baseline under a concurrency sweep, measured with Locust.

Reads the config (``loadtest`` and ``gate`` sections), the prompt set (``loadtest.prompts``), the
build manifest (tokenizer for the optional re-tokenized cross-check) and either starts both arms'
Triton servers as ``render`` placed them (:class:`ManagedEndpoints`: once, on distinct ports, or
one at a time with restarts when they cannot share the GPUs) or uses endpoints the user gives.
Then, for each repeat × concurrency × arm (arms interleaved A B A B), it runs Locust headless
**as a subprocess** (gevent never enters this process) and writes into RUN_DIR:
``run.json`` (provenance), ``runs.json`` (one entry per Locust run: validity, server liveness,
Prometheus counter deltas, peak server RSS, the exact command), ``raw/<arm>-c<conc>-r<rep>.jsonl``
(raw per-request records, merged from each Locust process), ``settings/`` (what each Locust run
was told), ``metrics/`` (counter scrapes before/after, and their differences) and ``logs/``. At the
end it calls ``pipeline.report.make_report``.

Load bigger than one host: run Locust workers elsewhere with
``locust -f loadtests/locustfile.py --worker --master-host H`` (same settings file via
``SPECDEPLOY_LOADTEST_CONFIG``) and a ``--master --expect-workers N`` here; every worker writes its
own raw file (PID in the name), merged afterwards — never subtract times across processes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import re
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator

from pipeline.config import DeploymentConfig, config_hash
from pipeline.cpu_pinning import spawn_on
from pipeline.errors import SpecdeployError
from pipeline.paths import PROJECT_ROOT, manifest_path, reports_root
from pipeline.processes import spawn
from pipeline.render import client_target, drafts_in_engine

LOCUSTFILE = PROJECT_ROOT / "loadtests" / "locustfile.py"
ARMS = ("baseline", "speculative")
COUNTERS = {
    "draft_tokens": "specdeploy_spec_decode_draft_tokens_total",
    "accepted_tokens": "specdeploy_spec_decode_accepted_tokens_total",
    "verify_steps": "specdeploy_spec_decode_verify_steps_total",
}
# vLLM's speculative-decoding counters (vllm/v1/spec_decode/metrics.py): one draft = one verify step
VLLM_COUNTERS = {
    "draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
    "accepted_tokens": "vllm:spec_decode_num_accepted_tokens_total",
    "verify_steps": "vllm:spec_decode_num_drafts_total",
}
LOCUST_STOP_S = 5.0  # SIGTERM → SIGKILL for a Locust run that overran or was interrupted
USER_CLASSES = {("grpc", "closed"): "GrpcStreamUser", ("http", "closed"): "HttpStreamUser",
                ("openai", "closed"): "OpenAIStreamUser", ("grpc", "open"): "GrpcOpenLoopUser",
                ("http", "open"): "HttpOpenLoopUser", ("openai", "open"): "OpenAIOpenLoopUser"}


class LoadTestError(SpecdeployError):
    """The load test could not be set up or run."""


# ------------------------------------------------------------------------------------------------
# Inputs


class PromptSetError(LoadTestError):
    """The prompt set cannot be used: ``field`` is the config field, ``detail`` what is wrong."""

    def __init__(self, field: str, detail: str):
        self.field, self.detail = field, detail
        super().__init__(f"{field}: {detail}")


def prompt_set_candidates(cfg: DeploymentConfig) -> list[Path]:
    """Where ``loadtest.prompts`` may be, in lookup order: as written when absolute; else under the
    working directory, the project root and the config file's directory."""
    base = Path(cfg.loadtest.prompts)
    candidates = [base] if base.is_absolute() else [Path.cwd() / base, PROJECT_ROOT / base]
    if cfg._source_path is not None and not base.is_absolute():
        candidates.append(cfg._source_path.parent / base)
    return list(dict.fromkeys(candidates))


def load_prompt_set(cfg: DeploymentConfig) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Prompts from ``loadtest.prompts`` (a directory of <category>.jsonl, or one file)."""
    candidates = prompt_set_candidates(cfg)
    path = next((p for p in candidates if p.exists()), None)
    if path is None:
        looked = "" if Path(cfg.loadtest.prompts).is_absolute() else (
            " (a relative path is looked up under the working directory, the project root and the config's "
            "directory: " + ", ".join(str(p) for p in candidates) + ")")
        raise PromptSetError("loadtest.prompts", f"{cfg.loadtest.prompts} does not exist{looked}")
    files = sorted(path.glob("*.jsonl")) if path.is_dir() else [path]
    if not files:
        raise PromptSetError("loadtest.prompts", f"{path} holds no <category>.jsonl prompt files")
    prompts: list[dict[str, Any]] = []
    digest = hashlib.sha256()
    for file in files:
        content = _read_prompt_file(file)
        digest.update(file.name.encode() + b"\0" + content)
        for n, line in enumerate(content.decode("utf-8").splitlines(), 1):
            if line.strip():
                prompts.append(_prompt_row(file, n, line))
    if cfg.loadtest.categories:
        unknown = sorted(set(cfg.loadtest.categories) - {p["category"] for p in prompts})
        if unknown:
            raise PromptSetError("loadtest.categories", f"{unknown} not found in {path}")
        prompts = [p for p in prompts if p["category"] in cfg.loadtest.categories]
    if not prompts:
        raise PromptSetError("loadtest.prompts", f"no prompts in {path}")
    dataset = {"path": str(path), "files": [f.name for f in files], "n_prompts": len(prompts),
               "categories": sorted({p["category"] for p in prompts}), "sha256": digest.hexdigest(),
               "synthetic": any("synthetic" in f.name for f in files)}
    return prompts, dataset


def _read_prompt_file(file: Path) -> bytes:
    try:
        content = file.read_bytes()
        content.decode("utf-8")
    except OSError as exc:
        raise PromptSetError("loadtest.prompts", f"cannot read {file}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise PromptSetError("loadtest.prompts", f"{file} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    return content


def _prompt_row(file: Path, n: int, line: str) -> dict[str, str]:
    """One JSONL line: an object with ``id`` and a text ``prompt`` (``category`` defaults to the file's stem)."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise PromptSetError("loadtest.prompts", f"{file}:{n}: not JSON ({exc.msg})") from None
    if not isinstance(row, dict) or "id" not in row or not isinstance(row.get("prompt"), str):
        raise PromptSetError("loadtest.prompts", f"{file}:{n}: not an {{id, category, prompt}} object "
                             "(needs 'id' and a text 'prompt')")
    return {"id": str(row["id"]), "category": str(row.get("category", file.stem)), "prompt": row["prompt"]}


def primary_draft_len(cfg: DeploymentConfig) -> int | None:
    if cfg.method == "draft_target":
        return cfg.speculation.num_draft_tokens
    if cfg.method in ("medusa", "eagle"):
        return cfg.speculation.engine_max_draft_len
    return None


def sends_draft_len(cfg: DeploymentConfig) -> bool:
    """Draft-target orchestrated by the BLS takes K per request (``num_draft_tokens``); drafting
    in the engine fixes K in the engine, and the ensemble has no such input."""
    return cfg.method == "draft_target" and not drafts_in_engine(cfg)


def check_sweep(cfg: DeploymentConfig, sweep: list[int]) -> None:
    if not sweep:
        return
    if drafts_in_engine(cfg):
        raise LoadTestError(
            "--sweep-draft-len: speculation.orchestration 'engine' fixes num_draft_tokens in the engine; "
            "per-request draft lengths need orchestration 'bls'"
        )
    if cfg.method != "draft_target":
        raise LoadTestError(
            f"--sweep-draft-len: method '{cfg.method}' fixes its draft length when the engine is built "
            "(Medusa heads / EAGLE tree, max_draft_len); build one deployment per length and load-test "
            "each. Per-request draft lengths exist only for draft_target (num_draft_tokens)."
        )
    limit = cfg.speculation.engine_max_draft_len
    too_long = [k for k in sweep if k > limit]
    if too_long:
        raise LoadTestError(f"--sweep-draft-len: {too_long} exceed the engine's max_draft_len {limit}")


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


class ManagedEndpoints:
    """Both arms' servers for one load test, placed as ``render`` recorded (``pipeline.gpu_layout``):
    started once and kept up for the whole sweep (split or shared GPUs, the CPU engine), or — when
    only one arm fits at a time (``sequential``) — one at a time, restarted whenever the next run
    needs the other arm, on the same ports, so the A B A B interleaving survives. Indexing by arm
    returns that arm's running endpoint. Every server is stopped on exit."""

    def __init__(self, cfg: DeploymentConfig, arms: tuple[str, ...]):
        from pipeline.render import rendered_placement  # noqa: PLC0415
        from pipeline.serve import free_ports  # noqa: PLC0415

        self.cfg, self.arms = cfg, arms
        self.placements = {arm: rendered_placement(cfg, arm) for arm in arms}
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
        from pipeline.serve import start_deployment  # noqa: PLC0415

        http, grpc, metrics = self.ports[arm]
        server = start_deployment(self.cfg, arm, http_port=http, grpc_port=grpc, metrics_port=metrics)
        self._servers[arm] = server
        self.starts[arm] += 1
        target = client_target(self.cfg, arm)
        self._endpoints[arm] = ArmEndpoint(
            arm=arm, url=server.grpc_url if self.cfg.loadtest.transport == "grpc" else server.http_url,
            model_name=target.model_name, extra_inputs=target.extra_inputs,
            metrics_url=server.metrics_url, pid=server.pid,
            alive=_managed_alive(server, target.model_name, target.extra_inputs),
            log_tail=getattr(server, "log_tail", None),
            client_cpus=server.cpu_plan.other_cpus if getattr(server, "cpu_plan", None) else None,
        )
        self.kv_reported[arm] = kv_capacity_reported(server.metrics_url)

    def provenance(self) -> dict[str, dict[str, Any]]:
        """Per arm: where it was served, its GPUs, KV fraction and capacity, and how it was started."""
        host, out = self.cfg.triton.host, {}
        for arm in self.arms:
            http, grpc, metrics = self.ports[arm]
            target = client_target(self.cfg, arm)
            out[arm] = {
                "url": f"{host}:{grpc}" if self.cfg.loadtest.transport == "grpc" else f"http://{host}:{http}",
                "model": target.model_name, "extra_inputs": target.extra_inputs,
                "metrics_url": f"http://{host}:{metrics}/metrics", "placement": self.placements[arm],
                "served": ("one arm at a time, restarted between runs" if self.sequential
                           else "both arms up for the whole sweep"),
                "server_starts": self.starts[arm], "kv_cache_tokens_reported": self.kv_reported.get(arm),
            }
        return out


def managed_endpoints(cfg: DeploymentConfig, arms: tuple[str, ...]) -> ManagedEndpoints:
    """The arms' servers for the whole sweep (see :class:`ManagedEndpoints`)."""
    try:
        import pipeline.serve  # noqa: F401, PLC0415
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
    from prometheus_client.parser import text_string_to_metric_families  # noqa: PLC0415

    found: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        if family.name != "nv_trt_llm_kv_cache_block_metrics":
            continue
        for sample in family.samples:
            block_type = sample.labels.get("kv_cache_block_type", "")
            found.setdefault(sample.labels.get("model", ""), {})[block_type] = float(sample.value)
    tokens = {m: int(v["max"] * v["tokens_per"]) for m, v in found.items() if "max" in v and "tokens_per" in v}
    return tokens or None


def remote_endpoint(cfg: DeploymentConfig, arm: str, url: str, metrics_url: str | None = None) -> ArmEndpoint:
    target = client_target(cfg, arm)
    transport = cfg.loadtest.transport
    if transport == "http" and not url.startswith(("http://", "https://")):
        url = "http://" + url
    if transport == "grpc":
        url = re.sub(r"^(grpc|http)s?://", "", url)
    def alive() -> bool:
        if not endpoint_alive(url, transport, target.model_name):
            return False
        return transport != "http" or probe_generate(url, target.model_name, target.extra_inputs)

    return ArmEndpoint(arm, url, target.model_name, target.extra_inputs, metrics_url, alive=alive)


def _managed_alive(server, model_name: str, extra_inputs: dict[str, Any]) -> Callable[[], bool]:
    """The server process runs, the model the client calls is ready AND answers a one-token probe
    (measured: a crashed Python stub leaves tritonserver running with the model still 'ready')."""
    return lambda: (server.alive() and endpoint_alive(server.http_url, "http", model_name)
                    and probe_generate(server.http_url, model_name, extra_inputs))


def probe_generate(http_url: str, model_name: str, extra_inputs: dict[str, Any], timeout_s: float = 30.0) -> bool:
    """One non-streaming ``/generate`` request for one token; True when it answers without error."""
    body = json.dumps({"text_input": "probe", "max_tokens": 1, "stream": False, **extra_inputs}).encode()
    request = urllib.request.Request(f"{http_url.rstrip('/')}/v2/models/{model_name}/generate", data=body,
                                     headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:  # noqa: S310 - loopback/user URL
            payload = json.loads(resp.read() or b"{}")
            return resp.status == 200 and "error" not in payload
    except (OSError, ValueError):
        return False


def endpoint_alive(url: str, transport: str, model_name: str | None = None, timeout_s: float = 5.0) -> bool:
    try:
        if transport == "http":
            base = url.rstrip("/")
            path = f"/v2/models/{model_name}/ready" if model_name else "/v2/health/live"
            with urllib.request.urlopen(base + path, timeout=timeout_s) as resp:  # noqa: S310 - loopback/user URL
                return resp.status == 200
        import tritonclient.grpc as grpcclient  # noqa: PLC0415

        client = grpcclient.InferenceServerClient(url=url)
        try:
            if model_name:
                return bool(client.is_model_ready(model_name, client_timeout=timeout_s))
            return bool(client.is_server_live(client_timeout=timeout_s))
        finally:
            client.close()
    except Exception:  # noqa: BLE001 - any failure means "not alive"
        return False


# ------------------------------------------------------------------------------------------------
# Metrics and memory


def scrape_counters(metrics_url: str | None, timeout_s: float = 5.0) -> dict[str, Any] | None:
    """Sum of each acceptance counter over all label sets, and ``source``: whose counters they are
    (``specdeploy``, ``vllm``, or ``not reported`` when the server exports none); None when unreachable."""
    text = metrics_text(metrics_url, timeout_s)
    return None if text is None else {**parse_counters(text), "source": counters_source(text)}


def counters_source(text: str) -> str:
    for source, table in (("specdeploy", COUNTERS), ("vllm", VLLM_COUNTERS)):
        if any(name in text for name in table.values()):
            return source
    return "not reported"


def metrics_text(metrics_url: str | None, timeout_s: float = 5.0) -> str | None:
    """The Prometheus text a server exports; None when there is no URL or it does not answer."""
    if not metrics_url:
        return None
    try:
        with urllib.request.urlopen(metrics_url, timeout=timeout_s) as resp:  # noqa: S310 - loopback/user URL
            return resp.read().decode("utf-8", errors="replace")
    except OSError:
        return None


def parse_counters(text: str) -> dict[str, float]:
    """Each acceptance counter summed over its label sets (models, versions); ours, or vLLM's
    when the server is a vLLM (``--endpoint-*`` with ``metrics_*`` in a load-test file)."""
    from prometheus_client.parser import text_string_to_metric_families  # noqa: PLC0415

    keys = {name: key for table in (COUNTERS, VLLM_COUNTERS) for key, name in table.items()}
    totals = {key: 0.0 for key in COUNTERS}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in keys:
                totals[keys[sample.name]] += sample.value
    return totals


class _ProcessTreeSampler:
    """Samples a process and its children every ``interval_s`` in a daemon thread until stopped;
    subclasses say what to record from the live processes (``_sample``)."""

    def __init__(self, pid: int | None, interval_s: float = 0.5):
        self.pid, self.interval_s = pid, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> None:
        if self.pid:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _sample(self, procs: list) -> None:
        raise NotImplementedError

    def _loop(self) -> None:
        import psutil  # noqa: PLC0415

        try:
            root = psutil.Process(self.pid)
        except psutil.Error:
            return
        while not self._stop.is_set():
            try:
                self._sample([root, *root.children(recursive=True)])
            except psutil.Error:
                pass
            self._stop.wait(self.interval_s)


class RssSampler(_ProcessTreeSampler):
    """Peak resident memory (MB) of a server process and its children (a context manager)."""

    peak_mb: float | None = None

    def __enter__(self) -> "RssSampler":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _sample(self, procs: list) -> None:
        mb = sum(p.memory_info().rss for p in procs) / 2**20
        self.peak_mb = mb if self.peak_mb is None else max(self.peak_mb, mb)


class CpuSampler(_ProcessTreeSampler):
    """CPU seconds used by a process tree (the Locust client), sampled until it exits."""

    def __init__(self, pid: int, interval_s: float = 0.5):
        super().__init__(pid, interval_s)
        self._seen: dict[int, float] = {}  # pid → user + system seconds at its last sample
        self.start()

    @property
    def cpu_s(self) -> float:
        return sum(self._seen.values())

    def _sample(self, procs: list) -> None:
        for proc in procs:
            times = proc.cpu_times()
            self._seen[proc.pid] = times.user + times.system

    def stop(self) -> float:
        super().stop()
        return self.cpu_s


# ------------------------------------------------------------------------------------------------
# The plan and one Locust run


@dataclass(frozen=True)
class RunSpec:
    arm: str
    concurrency: int  # closed loop: users; open loop: level index stands in (rate in target_rate)
    repeat: int
    draft_len: int | None
    target_rate: float | None = None

    @property
    def key(self) -> str:
        level = f"q{self.target_rate:g}" if self.target_rate is not None else f"c{self.concurrency}"
        dl = f"-k{self.draft_len}" if self.draft_len is not None and self.arm == "speculative" else ""
        return f"{self.arm}{dl}-{level}-r{self.repeat}"


def plan_runs(cfg: DeploymentConfig, arms: tuple[str, ...], concurrency: list[int], repeats: int,
              sweep: list[int]) -> list[RunSpec]:
    """Interleaved: for each repeat, for each level, baseline then speculative (each draft length)."""
    primary = primary_draft_len(cfg)
    spec_lens = sweep or [primary]
    open_loop = cfg.loadtest.mode == "open"
    levels: list[tuple[int, float | None]] = (
        [(i + 1, rate) for i, rate in enumerate(cfg.loadtest.request_rate)] if open_loop
        else [(c, None) for c in concurrency]
    )
    out = []
    for rep in range(repeats):
        for level, rate in levels:
            for arm in arms:
                for dl in (spec_lens if arm == "speculative" else [None]):
                    out.append(RunSpec(arm, level, rep, dl, rate))
    return out


def locust_command(cfg: DeploymentConfig, spec: RunSpec, duration_s: float) -> list[str]:
    lt = cfg.loadtest
    users = 1 if lt.mode == "open" else spec.concurrency
    argv = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "-u", str(users), "-r", str(users),
            "-t", f"{locust_seconds(duration_s)}s", "--stop-timeout", f"{lt.stop_timeout_s:g}", "--only-summary",
            "--loglevel", "WARNING", "--exit-code-on-error", "0"]
    if lt.processes > 1:
        argv += ["--processes", str(lt.processes)]
    argv.append(USER_CLASSES[(lt.transport, lt.mode)])
    return argv


def locust_seconds(duration_s: float) -> int:
    """Locust's --run-time takes whole seconds only."""
    return max(1, int(round(duration_s)))


def run_settings(cfg: DeploymentConfig, spec: RunSpec, endpoint: ArmEndpoint, run_dir: Path, run_id: str,
                 prompts: list[dict], duration_s: float, warmup_s: float, tokenizer_dir: str | None) -> dict[str, Any]:
    lt = cfg.loadtest
    extra = dict(endpoint.extra_inputs)
    if spec.arm == "speculative" and spec.draft_len is not None and sends_draft_len(cfg):
        extra["num_draft_tokens"] = spec.draft_len
    sampling = lt.sampling
    return {
        "run_id": run_id, "arm": spec.arm, "repeat": spec.repeat, "endpoint": endpoint.url,
        "model_name": endpoint.model_name, "transport": lt.transport, "mode": lt.mode,
        "concurrency": spec.concurrency, "target_rate": spec.target_rate, "arrival": "poisson",
        "prompts": prompts, "max_tokens": lt.max_tokens,
        "sampling": {"top_k": sampling.top_k, "top_p": sampling.top_p, "temperature": sampling.temperature,
                     "seed": sampling.seed},
        "extra_inputs": extra, "seed": lt.seed, "output_prefix": str(run_dir / "raw" / "parts" / spec.key),
        "warmup_s": warmup_s, "duration_s": duration_s, "request_timeout_s": max(60.0, lt.stop_timeout_s * 4),
        "stop_timeout_s": lt.stop_timeout_s, "num_workers": lt.processes, "draft_len": spec.draft_len,
        "tokenizer_dir": tokenizer_dir, "openai_api": lt.openai_api, "openai_top_k": lt.openai_top_k,
    }


def merge_parts(run_dir: Path, key: str) -> tuple[int, list[dict]]:
    """Concatenate every process's raw file into raw/<key>.jsonl; collect worker metas."""
    parts = sorted((run_dir / "raw" / "parts").glob(f"{key}.*.jsonl"))
    out = run_dir / "raw" / f"{key}.jsonl"
    n = 0
    with open(out, "w", encoding="utf-8") as fh:
        for part in parts:
            for line in part.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    fh.write(line + "\n")
                    n += 1
    metas = [json.loads(p.read_text()) for p in sorted((run_dir / "raw" / "parts").glob(f"{key}.*.meta.json"))]
    (run_dir / "raw" / f"{key}.workers.json").write_text(json.dumps(metas, indent=1), encoding="utf-8")
    return n, metas


def execute_run(cfg: DeploymentConfig, spec: RunSpec, endpoint: ArmEndpoint, run_dir: Path, run_id: str,
                prompts: list[dict], duration_s: float, warmup_s: float, tokenizer_dir: str | None) -> dict[str, Any]:
    settings = run_settings(cfg, spec, endpoint, run_dir, run_id, prompts, duration_s, warmup_s, tokenizer_dir)
    settings_path = run_dir / "settings" / f"{spec.key}.json"
    settings_path.write_text(json.dumps(settings, indent=1), encoding="utf-8")
    argv = locust_command(cfg, spec, duration_s)
    env = {**os.environ, "SPECDEPLOY_LOADTEST_CONFIG": str(settings_path), "OMP_NUM_THREADS": "1",
           "PYTHONUNBUFFERED": "1"}
    before = scrape_counters(endpoint.metrics_url)
    log_path = run_dir / "logs" / f"{spec.key}.log"
    timeout_s = duration_s + cfg.loadtest.stop_timeout_s + 90
    started = time.time()
    timed_out = False
    with RssSampler(endpoint.pid) as rss, open(log_path, "w", encoding="utf-8") as log:
        with spawn_on(endpoint.client_cpus):
            # under a keeper: Locust and its worker processes end with this process at the latest
            proc = spawn(argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=str(PROJECT_ROOT),
                         grace_s=LOCUST_STOP_S)
        cpu = CpuSampler(proc.pid)
        try:
            exit_code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            proc.stop(LOCUST_STOP_S)
            exit_code = proc.wait()
        except BaseException:  # Ctrl-C: stop Locust now rather than when this process ends
            proc.stop(LOCUST_STOP_S)
            raise
        client_cpu_s = cpu.stop()
    after = scrape_counters(endpoint.metrics_url)
    alive = endpoint.alive() if endpoint.alive else True
    n_records, metas = merge_parts(run_dir, spec.key)
    delta = ({**{k: after[k] - before[k] for k in COUNTERS}, "source": after["source"]}
             if before is not None and after is not None else None)
    (run_dir / "metrics" / f"{spec.key}.json").write_text(
        json.dumps({"before": before, "after": after, "delta": delta}, indent=1), encoding="utf-8")
    reasons = []
    if not alive:
        reasons.append("server not alive (or the model not ready) after the run")
    if timed_out:
        reasons.append(f"locust did not finish within {timeout_s:.0f}s (killed)")
    if exit_code not in (0, 1) and not timed_out:
        reasons.append(f"locust exited with {exit_code}")
    if n_records == 0:
        reasons.append("no raw records")
    return {
        "key": spec.key, "arm": spec.arm, "concurrency": spec.concurrency, "target_rate": spec.target_rate,
        "repeat": spec.repeat, "draft_len": spec.draft_len, "raw": f"raw/{spec.key}.jsonl",
        "workers": f"raw/{spec.key}.workers.json", "settings": f"settings/{spec.key}.json",
        "log": f"logs/{spec.key}.log", "metrics": f"metrics/{spec.key}.json", "metrics_delta": delta,
        "server_alive": alive, "valid": not reasons, "invalid_reasons": reasons, "locust_exit_code": exit_code,
        "n_records": n_records, "sent": sum(m.get("sent", 0) for m in metas), "peak_rss_mb": rss.peak_mb,
        "started_unix": started, "seconds": time.time() - started, "command": argv,
        "client_cpu_s": client_cpu_s, "client_cpus": list(endpoint.client_cpus) if endpoint.client_cpus else None,
        "client_cpu_fraction": client_cpu_s / max(1e-9, (time.time() - started) * cfg.loadtest.processes),
        "server_log_tail": endpoint.log_tail(30) if (not alive and endpoint.log_tail) else None,
    }


# ------------------------------------------------------------------------------------------------
# Provenance


def _git_sha() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=str(PROJECT_ROOT), capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _versions() -> dict[str, str | None]:
    from importlib import metadata  # noqa: PLC0415

    out: dict[str, str | None] = {"python": platform.python_version()}
    for dist in ("specdeploy", "locust", "tritonclient", "nvidia-pytriton", "scipy", "numpy", "torch", "gevent", "grpcio"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def _hardware(cfg: DeploymentConfig) -> dict[str, Any]:
    import psutil  # noqa: PLC0415

    return {"declared": cfg.hardware, "backend": cfg.backend, "client_host": platform.node(),
            "cpu_count": os.cpu_count(), "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
            "platform": platform.platform()}


def _draft_model(cfg: DeploymentConfig) -> str | None:
    spec = cfg.speculation
    return getattr(getattr(spec, "draft", None), "checkpoint", None) or getattr(spec, "heads_dir", None) or getattr(spec, "head_dir", None)


def _tokenizer_dir(cfg: DeploymentConfig) -> str | None:
    path = manifest_path(cfg)
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text()).get("tokenizer_dir")
    except (OSError, json.JSONDecodeError):
        return None


# ------------------------------------------------------------------------------------------------
# Entry point


def _parse_duration(value: str | float | None) -> float | None:
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*", value)
    if not match:
        raise LoadTestError(f"--duration: '{value}' is not a duration like 20s, 2m or 1.5h")
    scale = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, None: 1}[match.group(2)]
    return float(match.group(1)) * scale


def run_loadtest(
    cfg: DeploymentConfig,
    *,
    out_dir: str | Path | None = None,
    concurrency: list[int] | None = None,
    duration: str | float | None = None,
    repeats: int | None = None,
    sweep_draft_len: list[int] | None = None,
    endpoint_baseline: str | None = None,
    endpoint_speculative: str | None = None,
    arm: str | None = None,
    progress: bool = True,
    report: bool = True,
    given_endpoints: dict[str, ArmEndpoint] | None = None,
    tokenizer_dir: str | None = None,
    meta_extra: dict[str, Any] | None = None,
) -> Path:
    """Run the whole load test; returns RUN_DIR (then the report is in it when ``report``).
    ``given_endpoints`` (with ``tokenizer_dir`` and ``meta_extra`` for run.json): arms served by
    someone else, as :mod:`pipeline.endpoints` builds them."""
    lt = cfg.loadtest
    concurrency = sorted(set(concurrency)) if concurrency else list(lt.concurrency)
    duration_s = float(locust_seconds(_parse_duration(duration) or lt.duration_s))
    warmup_s = min(lt.warmup_s, duration_s / 2)
    repeats = repeats or lt.repeats
    sweep = sorted(set(sweep_draft_len)) if sweep_draft_len else list(lt.sweep_draft_len)
    check_sweep(cfg, sweep)
    if arm is not None and arm not in ARMS:
        raise LoadTestError(f"--arm: expected one of {ARMS}, got '{arm}'")
    arms: tuple[str, ...] = (arm,) if arm else ARMS
    if cfg.method == "none" and "speculative" in arms and not (endpoint_speculative or arm):
        raise LoadTestError("speculation.method is 'none': there is no speculative arm to compare")
    if endpoint_baseline or endpoint_speculative:
        missing = [a for a in arms if not {"baseline": endpoint_baseline, "speculative": endpoint_speculative}[a]]
        if missing:
            raise LoadTestError(f"no endpoint for arm(s) {missing}: pass --endpoint-{missing[0]} (or --arm)")
    prompts, dataset = load_prompt_set(cfg)
    created = datetime.now(timezone.utc)
    run_dir = Path(out_dir) if out_dir else reports_root(cfg) / created.strftime("%Y%m%dT%H%M%SZ")
    run_dir = run_dir.resolve()  # locust runs with another working directory
    if run_dir.exists() and any(run_dir.iterdir()):
        raise LoadTestError(f"--out: {run_dir} exists and is not empty")
    for sub in ("raw/parts", "settings", "metrics", "logs"):
        (run_dir / sub).mkdir(parents=True, exist_ok=True)
    run_id = f"{cfg.name}-{created.strftime('%Y%m%dT%H%M%SZ')}"
    specs = plan_runs(cfg, arms, concurrency, repeats, sweep)
    tokenizer_dir = tokenizer_dir or _tokenizer_dir(cfg)
    meta: dict[str, Any] = {
        "format": "specdeploy-run/1", "run_id": run_id, "name": cfg.name, "created": created.isoformat(),
        "config": cfg.model_dump(mode="json"), "config_hash": config_hash(cfg), "git_sha": _git_sha(),
        "versions": _versions(), "hardware": _hardware(cfg), "dataset": dataset,
        "seeds": {"prompt_order": lt.seed, "sampling": lt.sampling.seed, "bootstrap": cfg.gate.bootstrap_seed},
        "method": cfg.method, "draft_model": _draft_model(cfg), "primary_draft_len": primary_draft_len(cfg) if not sweep
        else (primary_draft_len(cfg) if primary_draft_len(cfg) in sweep else sweep[0]),
        "sweep_draft_len": sweep, "transport": lt.transport, "mode": lt.mode, "concurrency": concurrency,
        "duration_s": duration_s, "warmup_s": warmup_s, "repeats": repeats, "tokenizer_dir": tokenizer_dir,
        "endpoints": {}, "commands": [" ".join(sys.argv)], **(meta_extra or {}),
    }
    _write_json(run_dir / "run.json", meta)
    results: list[dict[str, Any]] = []
    if given_endpoints is not None:
        endpoints_cm = contextlib.nullcontext({a: e for a, e in given_endpoints.items() if a in arms})
    elif endpoint_baseline or endpoint_speculative:
        endpoints_cm = contextlib.nullcontext({
            a: remote_endpoint(cfg, a, url) for a, url in (("baseline", endpoint_baseline),
                                                          ("speculative", endpoint_speculative)) if url and a in arms
        })
    else:
        endpoints_cm = managed_endpoints(cfg, arms)
    with endpoints_cm as endpoints:
        meta["endpoints"] = _endpoints_provenance(endpoints)
        _write_json(run_dir / "run.json", meta)
        for spec, result in _iterate(specs, progress, lambda s: execute_run(
                cfg, s, endpoints[s.arm], run_dir, run_id, prompts, duration_s, warmup_s, tokenizer_dir)):
            results.append(result)
            meta["commands"].append(" ".join(result["command"]))
            _write_json(run_dir / "runs.json", {"format": "specdeploy-runs/1", "runs": results})
            if not result["server_alive"]:
                break  # a dead server invalidates the rest; the report can never be GO
        meta["endpoints"] = _endpoints_provenance(endpoints)  # restarts and reported KV capacity
    _write_json(run_dir / "run.json", meta)
    if report:
        from pipeline.report import make_report  # noqa: PLC0415

        make_report(run_dir, cfg)
    return run_dir


def _endpoints_provenance(endpoints) -> dict[str, dict[str, Any]]:
    if isinstance(endpoints, ManagedEndpoints):
        return endpoints.provenance()
    return {a: {"url": e.url, "model": e.model_name, "extra_inputs": e.extra_inputs, "metrics_url": e.metrics_url,
                "placement": None, "served": "by the user (--endpoint-*)"} for a, e in endpoints.items()}


def _iterate(specs: list[RunSpec], progress: bool, fn: Callable[[RunSpec], dict]) -> Iterator[tuple[RunSpec, dict]]:
    if not progress:
        for spec in specs:
            yield spec, fn(spec)
        return
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn  # noqa: PLC0415

    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), transient=False) as bar:
        task = bar.add_task("load test", total=len(specs))
        for spec in specs:
            bar.update(task, description=f"run {spec.key}")
            result = fn(spec)
            status = "ok" if result["valid"] else "INVALID: " + "; ".join(result["invalid_reasons"])
            bar.console.print(f"  {spec.key}: {result['n_records']} records, {status}")
            bar.advance(task)
            yield spec, result


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str), encoding="utf-8")
    tmp.replace(path)
