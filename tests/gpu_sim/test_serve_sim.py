"""`specdeploy serve` for every shipped GPU config on a simulated GPU host (``serve_tools``): the
exact launch (argv, orchestrator environment, GPUs per arm), the KV fraction and capacity each
model is rendered with, both arms up at once without running out of GPU memory and with the same
KV capacity as the simulated runtime reports it, restarts when only one arm fits, the ``docker run``
line mounting everything the repository reads, and ``--host``."""

from __future__ import annotations

import json
import os
import shlex
import signal
from pathlib import Path

import psutil
import pytest
import serve_tools
from serve_tools import built_and_rendered, served, shipped_config

from pipeline.errors import ServeError
from pipeline.infra.processes import free_ports
from pipeline.render.renderer import rendered_placement
from pipeline.render.triton_rules import parse_config_file

H100, A100 = (81559, "NVIDIA H100 80GB HBM3"), (81920, "NVIDIA A100-SXM4-80GB")


def common_flags(repo: Path, ports: tuple[int, int, int], host: str = "127.0.0.1") -> list[str]:
    http, grpc, metrics = ports
    return [f"--model-repository={repo.resolve()}", f"--http-address={host}", f"--http-port={http}",
            f"--grpc-address={host}", f"--grpc-port={grpc}", "--allow-metrics=true", f"--metrics-address={host}",
            f"--metrics-port={metrics}", "--exit-timeout-secs=5", "--disable-auto-complete-config"]


def expected_argv(launch: str, repo: Path, ports, ranks: int = 1, gpu_count: int = 1) -> list[str]:
    flags = common_flags(repo, ports)
    prefix = "--backend-config=python,shm-region-prefix-name=prefix{}_"
    if launch == "single":
        return ["tritonserver", *flags]
    if launch == "orchestrator":  # tensorrtllm_backend@r25.05 scripts/launch_triton_server.py --multi-model
        return ["mpirun", "--allow-run-as-root", "-n", "1", "tritonserver", *flags, "--pinned-memory-pool-byte-size=0",
                "--enable-peer-access=false", *[f"--cuda-memory-pool-byte-size={j}:0" for j in range(gpu_count)],
                prefix.format(0)]
    argv = ["mpirun", "--allow-run-as-root"]
    for rank in range(ranks):
        argv += ([":"] if rank else []) + ["-n", "1", "tritonserver", *flags, prefix.format(rank)]
        argv += ["--model-control-mode=explicit", "--load-model=tensorrt_llm"] if rank else []
    return argv


# config, GPUs on the host, strategy, KV tokens per model, per arm: (launch, ranks, CUDA_VISIBLE_DEVICES,
# {model: (gpu_device_ids, kv fraction)})
CASES = [
    ("llama31-8b-baseline-h100", 1, H100, "single-arm", None,
     {"baseline": ("single", 1, "0", {"tensorrt_llm": ("", "0.9")})}),
    ("llama31-8b-draft1b-fp8-h100", 1, H100, "shared", 226048,
     {"baseline": ("single", 1, "0", {"tensorrt_llm": ("", "0.382")}),
      "speculative": ("orchestrator", 1, None, {"tensorrt_llm": ("0", "0.382"), "tensorrt_llm_draft": ("0", "0.134")})}),
    # n-gram through the BLS: the speculative arm is one engine model (the external-draft target)
    ("llama31-8b-ngram-engine-h100", 1, H100, "shared", 65568,
     {"baseline": ("single", 1, "0", {"tensorrt_llm": ("", "0.425")}),
      "speculative": ("single", 1, "0", {"tensorrt_llm": ("", "0.425")})}),
    # lookahead: the target built in lookahead mode; both arms at full capacity do not share one H100
    ("llama31-8b-lookahead-h100", 1, H100, "sequential", 267456,
     {"baseline": ("single", 1, "0", {"tensorrt_llm": ("", "0.9")}),
      "speculative": ("single", 1, "0", {"tensorrt_llm": ("", "0.9")})}),
    ("vicuna7b-medusa-fp8-h100", 1, H100, "shared", 16504,
     {"baseline": ("single", 1, "0", {"tensorrt_llm": ("", "0.45")}),
      "speculative": ("single", 1, "0", {"tensorrt_llm": ("", "0.45")})}),
    ("vicuna7b-eagle-h100", 1, H100, "sequential", 66112,
     {"baseline": ("single", 1, "0", {"tensorrt_llm": ("", "0.9")}),
      "speculative": ("single", 1, "0", {"tensorrt_llm": ("", "0.9")})}),
    ("llama31-70b-draft8b-int4awq-tp4-a100", 4, A100, "shared", 100096,
     {"baseline": ("leader", 4, "0,1,2,3", {"tensorrt_llm": ("", "0.266")}),
      "speculative": ("orchestrator", 1, None, {"tensorrt_llm": ("0,1,2,3", "0.266"), "tensorrt_llm_draft": ("0", "0.367")})}),
    ("llama31-70b-draft8b-int4awq-tp4-a100", 8, A100, "split", 131328,
     {"baseline": ("leader", 4, "0,1,2,3", {"tensorrt_llm": ("", "0.899")}),
      "speculative": ("orchestrator", 1, None, {"tensorrt_llm": ("4,5,6,7", "0.373"), "tensorrt_llm_draft": ("4", "0.526")})}),
]


def test_every_shipped_gpu_config_is_covered():
    assert {case[0] for case in CASES} == set(serve_tools.GPU_CONFIGS)


def _launch_record(host, repo: Path) -> dict:
    """The command serve ran for ``repo``: mpirun's record, else the lone tritonserver's."""
    flag = f"--model-repository={repo.resolve()}"
    top = [r for r in host.records("mpirun") if flag in r["argv"]]
    return top[-1] if top else [r for r in host.records("tritonserver", "start") if flag in r["argv"]][-1]


def _check_arm_repository(repo: Path, tokens: int | None, models: dict) -> None:
    for model, (device_ids, fraction) in models.items():
        params = {k: v.string_value for k, v in parse_config_file(repo / model / "config.pbtxt").parameters.items()}
        assert params["gpu_device_ids"] == device_ids and params["participant_ids"] == ""
        assert params["kv_cache_free_gpu_mem_fraction"] == fraction
        assert params["max_tokens_in_paged_kv_cache"] == ("" if tokens is None else str(tokens))


@pytest.mark.slow
@pytest.mark.parametrize("name,gpus,gpu,strategy,tokens,arms", CASES, ids=[f"{c[0]}-{c[1]}gpu" for c in CASES])
def test_serve_shipped_gpu_config(gpu_host, name, gpus, gpu, strategy, tokens, arms):
    host = gpu_host(gpus, *gpu)
    cfg = shipped_config(name, host.root)
    repos = {arm: repo for arm, (repo, _) in built_and_rendered(cfg).items()}
    picked = iter(free_ports(3 * len(arms)))
    ports = {arm: dict(zip(("http_port", "grpc_port", "metrics_port"), (next(picked) for _ in range(3)))) for arm in arms}
    together = [tuple(arms)] if strategy != "sequential" else [(arm,) for arm in arms]
    for group in together:  # co-resident arms up together, as the load test has them; sequential ones alone
        with served(cfg, *group, ports={arm: ports[arm] for arm in group}) as servers:
            assert all(server.alive() for server in servers.values())
    reported = {}
    for arm, (launch, ranks, visible, models) in arms.items():
        placement = rendered_placement(cfg, arm)
        assert placement["strategy"] == strategy and placement["kv_tokens"] == tokens
        assert placement["launch"] == launch and placement["cuda_visible_devices"] == visible
        _check_arm_repository(repos[arm], tokens, models)
        launched = _launch_record(host, repos[arm])
        assert launched["argv"] == expected_argv(launch, repos[arm], tuple(ports[arm].values()), ranks, gpus)[1:]
        env = launched["env"]
        assert env.get("CUDA_VISIBLE_DEVICES") == visible and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        orchestrated = {"TRTLLM_ORCHESTRATOR": "1", "TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES": "1"}
        assert {k: env.get(k) for k in orchestrated} == (orchestrated if launch == "orchestrator" else dict.fromkeys(orchestrated))
        (ready,) = [r for r in host.records("tritonserver", "ready") if f"--model-repository={repos[arm].resolve()}" in r["argv"]]
        reported[arm] = ready["kv_tokens"]
    assert [r["error"] for r in host.records() if r.get("error")] == []
    for group in together:  # what is resident on each GPU at the same time never over-commits
        per_gpu: dict[int, float] = {}
        for arm in group:
            for model in rendered_placement(cfg, arm)["models"]:
                for gpu in model["gpus"]:
                    per_gpu[gpu] = per_gpu.get(gpu, 0.0) + model["kv_cache_free_gpu_mem_fraction"]
        assert max(per_gpu.values()) <= cfg.triton.kv_cache_free_gpu_mem_fraction
    if tokens is not None:  # every model of both arms holds the same number of KV tokens
        assert {t for kv in reported.values() for t in kv.values()} == {tokens // 64 * 64}


@pytest.mark.slow
def test_symmetric_tp_draft_target_loads_in_orchestrator_mode(gpu_host):
    host = gpu_host(2, *H100)
    cfg = shipped_config("llama31-8b-draft1b-fp8-h100", host.root)
    data = cfg.model_dump(mode="json")
    data["target"]["tp"] = data["speculation"]["draft"]["tp"] = 2
    from pipeline.config import parse_config

    cfg = parse_config(data)
    built_and_rendered(cfg)
    with served(cfg, "baseline", "speculative") as servers:
        assert all(s.alive() for s in servers.values())
    spec = rendered_placement(cfg, "speculative")
    assert spec["launch"] == "orchestrator" and [m["gpus"] for m in spec["models"]] == [[0, 1], [0, 1]]
    base = rendered_placement(cfg, "baseline")
    assert base["launch"] == "leader" and base["world_size"] == 2 and base["cuda_visible_devices"] == "0,1"


@pytest.mark.slow
def test_leader_mode_cannot_serve_the_a100_draft_target(gpu_host):
    """What the launch was before: one mpirun world of 4 for a TP4 target and a TP1 draft."""
    from pipeline.serve.command import Ports, gpu_server_argv
    from pipeline.serve.server import start_server

    host = gpu_host(4, *A100)
    cfg = shipped_config("llama31-70b-draft8b-int4awq-tp4-a100", host.root)
    repo = built_and_rendered(cfg)["speculative"][0]
    http, grpc, metrics = free_ports(3)
    argv = gpu_server_argv(repo.resolve(), Ports(http, grpc, metrics), "leader", 4)
    with pytest.raises(ServeError, match="exited with status"):
        start_server(repo, argv=argv, env={**os.environ, "CUDA_VISIBLE_DEVICES": "0,1,2,3"}, http_port=http,
                     grpc_port=grpc, metrics_port=metrics, startup_timeout_s=120)
    assert any("communicationMode kLEADER" in r.get("error", "") for r in host.records("tritonserver"))


@pytest.mark.slow
def test_co_resident_arms_at_the_default_fraction_run_out_of_memory(gpu_host):
    """The simulation catches what the old rendering did: both arms at the runtime default 0.9."""
    host = gpu_host(1, *H100)
    cfg = shipped_config("vicuna7b-medusa-fp8-h100", host.root)
    repos = {arm: repo for arm, (repo, _) in built_and_rendered(cfg).items()}
    for repo in repos.values():
        path = repo / "tensorrt_llm" / "config.pbtxt"
        text = path.read_text().replace('string_value: "0.45"', 'string_value: "0.9"')
        path.write_text(text.replace('string_value: "16504"', 'string_value: ""'))
    with pytest.raises(ServeError, match="exited with status"):
        with served(cfg, "baseline", "speculative"):
            pass
    assert any("CUDA out of memory" in r.get("error", "") for r in host.records("tritonserver"))


@pytest.mark.slow
def test_arms_that_cannot_share_a_gpu_are_served_one_at_a_time(gpu_host):
    from pipeline.loadtest.endpoints import managed_endpoints

    host = gpu_host(1, 40960, "NVIDIA A100-SXM4-40GB")
    cfg = shipped_config("vicuna7b-eagle-h100", host.root)
    data = cfg.model_dump(mode="json")
    data["hardware"] = "a100-40gb"
    from pipeline.config import parse_config

    cfg = parse_config(data)
    built_and_rendered(cfg)
    assert rendered_placement(cfg, "baseline")["strategy"] == "sequential"
    with managed_endpoints(cfg, ("baseline", "speculative")) as endpoints:
        assert host.records("tritonserver", "ready") == []  # nothing up before the first run
        for arm in ("baseline", "speculative", "baseline"):
            assert endpoints[arm].alive()
        provenance = endpoints.provenance()
    events = [(r["event"], r["argv"][0].rsplit("/", 2)[-1]) for r in host.records("tritonserver") if r.get("event") in ("ready", "exit")]
    assert events == [("ready", "baseline"), ("exit", "baseline"), ("ready", "speculative"), ("exit", "speculative"),
                      ("ready", "baseline"), ("exit", "baseline")]
    assert {a: p["server_starts"] for a, p in provenance.items()} == {"baseline": 2, "speculative": 1}
    assert provenance["speculative"]["served"] == "one arm at a time, restarted between runs"
    assert provenance["baseline"]["kv_cache_tokens_reported"]["tensorrt_llm"] == \
        provenance["speculative"]["kv_cache_tokens_reported"]["tensorrt_llm"]
    assert provenance["speculative"]["placement"]["kv_tokens"] is not None


@pytest.mark.slow  # over the quick tier's CPU budget (tests/conftest.py)
def test_host_with_fewer_gpus_than_rendered_is_refused(gpu_host, monkeypatch):
    host = gpu_host(8, *A100)
    cfg = shipped_config("llama31-70b-draft8b-int4awq-tp4-a100", host.root)
    built_and_rendered(cfg)
    monkeypatch.setenv("SIM_GPUS", f"4:{A100[0]}:{A100[1]}")
    with pytest.raises(ServeError, match=r"rendered for GPUs \[4, 5, 6, 7\] but nvidia-smi lists \[0, 1, 2, 3\]"):
        with served(cfg, "speculative"):
            pass


def test_render_refuses_a_host_without_enough_gpus(gpu_host):
    from pipeline.render.triton_rules import RenderError

    host = gpu_host(1, *A100)
    cfg = shipped_config("llama31-70b-draft8b-int4awq-tp4-a100", host.root)
    with pytest.raises(RenderError, match=r"sequential: needs 4 GPU\(s\), 1 available"):
        built_and_rendered(cfg)


def _docker_line(cfg, arm: str) -> list[str]:
    from pipeline.serve.server import start_deployment

    with pytest.raises(ServeError) as info:
        start_deployment(cfg, arm)
    line = str(info.value).splitlines()[-1]
    assert line.startswith("docker run ")
    return shlex.split(line)


@pytest.mark.slow
def test_docker_line_mounts_every_path_the_repository_reads(gpu_host, monkeypatch):
    host = gpu_host(1, *H100, tritonserver=False)
    cfg = shipped_config("llama31-8b-draft1b-fp8-h100", host.root)
    repos = {arm: repo for arm, (repo, _) in built_and_rendered(cfg).items()}
    # a shell that already holds the launch's values must not drop them from the container line
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    for arm, repo in repos.items():
        argv = _docker_line(cfg, arm)
        image = argv.index(cfg.triton.container_image)
        mounts = [Path(v.split(":")[1]) for flag, v in zip(argv, argv[1:image]) if flag == "-v"]
        env = dict(v.split("=", 1) for flag, v in zip(argv, argv[1:image]) if flag == "-e")
        assert env.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID", env
        assert "PATH" not in env and "HOME" not in env, env
        for config_path in repo.glob("*/config.pbtxt"):
            for param in parse_config_file(config_path).parameters.values():
                value = param.string_value
                if value.startswith("/") and not value.startswith("/opt/tritonserver"):
                    assert any(m == Path(value) or m in Path(value).parents for m in mounts), (config_path, value)
        # run the container's command on the simulated host, seeing only the mounts
        serve_tools.install(host.bin_dir)
        monkeypatch.setenv("SIM_MOUNTS", json.dumps([str(m) for m in mounts]))
        from pipeline.serve.server import start_server

        server = start_server(repo, argv=argv[image + 1:], env={**os.environ, **env},
                              http_port=int(_flag(argv, "--http-port")), grpc_port=int(_flag(argv, "--grpc-port")),
                              metrics_port=int(_flag(argv, "--metrics-port")), startup_timeout_s=120)
        server.stop()
        monkeypatch.delenv("SIM_MOUNTS")
        (host.bin_dir / "tritonserver").unlink()
    assert [r for r in host.records() if r.get("error")] == []


def _flag(argv: list[str], name: str) -> str:
    return next(a.split("=", 1)[1] for a in argv if a.startswith(name + "="))


@pytest.mark.slow  # the serve CLI against the simulated host (about 1 CPU s): full tier
def test_serve_cli_binds_the_requested_host(gpu_host, capsys):
    import yaml

    from pipeline.cli import run

    host = gpu_host(1, *H100)
    cfg = shipped_config("llama31-8b-baseline-h100", host.root)
    built_and_rendered(cfg)
    config_file = host.root / "work" / "c.yaml"
    config_file.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    http, grpc, metrics = free_ports(3, "0.0.0.0")
    # this host simulates the serve side only (no tensorrt_llm, NVML): the live preflight is skipped,
    # which the record says (tests/gpu_sim/test_live_preflight.py runs it in a full container)
    args = ["serve", str(config_file), "--variant", "baseline", "--host", "0.0.0.0", "--skip-live",
            "--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics)]
    assert run(args) == 0
    pid = int((host.root / "work" / "engines" / cfg.name / "logs" / "serve-baseline.pid").read_text())
    try:
        (start,) = host.records("tritonserver", "start")
        assert "--http-address=0.0.0.0" in start["argv"] and "--grpc-address=0.0.0.0" in start["argv"]
        assert "--metrics-address=0.0.0.0" in start["argv"]
        assert f"http://0.0.0.0:{http}" in capsys.readouterr().out
    finally:
        os.killpg(pid, signal.SIGTERM)
        psutil.Process(pid).wait(timeout=60)
    with pytest.raises(Exception, match="not an IP address"):
        run([*args[:4], "--host", "gpu host"])
