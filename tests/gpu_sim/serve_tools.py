"""Serve-side GPU-host simulation: stand-ins for ``nvidia-smi``, ``mpirun`` and ``tritonserver``
(with the ``tensorrtllm`` backend), and a fake build (engines + manifest) to serve.

Nothing here stands in for the project's own code: these replace only the tools that need GPUs.
Each stand-in appends what it was run with (argv and environment) to the JSONL log named by
``SIM_LOG`` and behaves as the real tool does at the points ``specdeploy serve`` depends on:

- ``nvidia-smi`` lists ``SIM_GPUS`` ("COUNT:MiB:NAME") for ``--query-gpu=index,memory.total`` and
  ``--list-gpus`` (what upstream's launcher counts).
- ``mpirun`` refuses root without ``--allow-run-as-root``, starts each ``-n N prog …`` segment with
  ``OMPI_COMM_WORLD_RANK``/``_SIZE`` (and the job's segments, so a rank can see its peers), forwards
  SIGTERM and aborts the job when a rank fails.
- ``tritonserver`` parses its flags (an unknown one is fatal), loads the repository (every model, or
  ``--load-model`` in explicit mode) with the checks the real server and backend make before a
  model is ready: config parse and name, ``1/model.py`` for Python models (and that what it imports
  is inside the repository), ``gpt_model_path`` present, the executor's MPI rules (leader mode: the
  MPI world equals the engine's TP×PP; orchestrator mode: world 1, ``gpu_device_ids`` one per
  rank), GPU memory (weights = the rank files' size, then the KV cache: the smaller of
  ``max_tokens_in_paged_kv_cache`` and the KV fraction of what is free *on that GPU at that
  moment*, across every simulated process through the ``SIM_LEDGER`` file; running out is fatal).
  Rank 0 then serves ``/v2/health/ready``, ``/v2/models/<m>/ready``, a one-token ``generate`` and
  ``nv_trt_llm_kv_cache_block_metrics``; ranks > 0 block, as the real ones do, until SIGTERM.
  ``SIM_MOUNTS`` (a JSON list) simulates a container: a path outside every mount does not exist.
"""

from __future__ import annotations

import ast
import contextlib
import fcntl
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# engine-runtime configs: serving the llmapi repository is not simulated yet (issue 18 item 5)
GPU_CONFIGS = sorted(p.stem for p in (ROOT / "configs").glob("*.yaml") if p.stem.endswith(("-h100", "-a100"))
                     and "trtllm_runtime: llm_api" not in p.read_text())
GIB = 1024**3
RUNTIME_BYTES = int(1.5 * GIB)  # CUDA context + workspaces of one executor
CONTAINER_PATHS = ("/opt/tritonserver",)
TOOLS = ("nvidia-smi", "mpirun", "tritonserver")


# ----------------------------------------------------------------------------------------------
# Shared plumbing


def record(tool: str, **extra) -> None:
    entry = {"tool": tool, "argv": sys.argv[1:], "env": dict(os.environ), "pid": os.getpid(), "time": time.time(), **extra}
    with open(os.environ["SIM_LOG"], "a", encoding="utf-8") as log:
        fcntl.flock(log, fcntl.LOCK_EX)
        log.write(json.dumps(entry) + "\n")


def fail(tool: str, message: str, code: int = 1) -> None:
    record(tool, error=message)
    print(f"E {tool}: {message}", file=sys.stderr, flush=True)
    sys.exit(code)


def sim_gpus() -> list[tuple[int, int, str]]:
    count, mib, name = (os.environ.get("SIM_GPUS") or "1:81559:NVIDIA H100 80GB HBM3").split(":", 2)
    return [(i, int(mib), name) for i in range(int(count))]


def install(bin_dir: Path) -> Path:
    """Write the three stand-ins into ``bin_dir`` (put it first on PATH)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    for tool in TOOLS:
        script = bin_dir / tool
        script.write_text(f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {str(Path(__file__).parent)!r})\n"
                          f"import serve_tools\nserve_tools.main({tool!r})\n")
        script.chmod(0o755)
    return bin_dir


def main(tool: str) -> None:
    {"nvidia-smi": nvidia_smi_main, "mpirun": mpirun_main, "tritonserver": tritonserver_main}[tool]()


# ----------------------------------------------------------------------------------------------
# nvidia-smi


def nvidia_smi_main() -> None:
    record("nvidia-smi")
    args = sys.argv[1:]
    gpus = sim_gpus()
    if args in (["--list-gpus"], ["-L"]):
        for index, _, name in gpus:
            print(f"GPU {index}: {name} (UUID: GPU-sim-{index})")
    elif args == ["--query-gpu=index,memory.total", "--format=csv,noheader,nounits"]:
        for index, mib, _ in gpus:
            print(f"{index}, {mib}")
    else:
        fail("nvidia-smi", f"the simulation does not know {args}", 2)


# ----------------------------------------------------------------------------------------------
# mpirun


def _mpi_segments(args: list[str]) -> tuple[list[str], list[tuple[int, list[str]]]]:
    options, segments, i = [], [], 0
    while i < len(args) and args[i] != "-n":
        if args[i] not in ("--allow-run-as-root", "--oversubscribe"):
            fail("mpirun", f"unknown option {args[i]}")
        options.append(args[i])
        i += 1
    for part in " ".join(args[i:]).split(" : ") if i < len(args) else []:
        words = part.split(" ")
        if words[0] != "-n" or len(words) < 3:
            fail("mpirun", f"bad app context {part!r}")
        segments.append((int(words[1]), words[2:]))
    return options, segments


def mpirun_main() -> None:
    record("mpirun")
    options, segments = _mpi_segments(sys.argv[1:])
    if os.geteuid() == 0 and "--allow-run-as-root" not in options:
        fail("mpirun", "running as root needs --allow-run-as-root")
    ranks = [argv for count, argv in segments for _ in range(count)]
    children = []
    for rank, argv in enumerate(ranks):
        env = {**os.environ, "OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_SIZE": str(len(ranks)),
               "SIM_MPI_JOB": json.dumps(ranks)}
        children.append(subprocess.Popen(argv, env=env))
    signal.signal(signal.SIGTERM, lambda *_: [c.send_signal(signal.SIGTERM) for c in children if c.poll() is None])
    status = 0
    while any(c.poll() is None for c in children):
        failed = [c for c in children if c.poll() not in (None, 0)]
        if failed:
            status = failed[0].returncode
            for child in children:
                if child.poll() is None:
                    child.kill()
        time.sleep(0.05)
    sys.exit(status or max((c.returncode for c in children), default=0))


# ----------------------------------------------------------------------------------------------
# GPU memory shared by every simulated process


@contextlib.contextmanager
def _ledger():
    path = Path(os.environ["SIM_LEDGER"])
    with open(path, "a+", encoding="utf-8") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        handle.seek(0)
        data = json.loads(handle.read() or "{}")
        alive = {k: v for k, v in data.items() if _pid_alive(int(k.split(":")[0]))}  # the dead free theirs
        yield alive
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps(alive))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = Path(f"/proc/{pid}/stat")
    return stat.is_file() and stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"


def allocate(device: int, weights: int, kv_per_token: int, fraction: float, max_tokens: int | None,
             what: str) -> int:
    """Weights + runtime on ``device``, then the KV pool as TensorRT-LLM sizes it; returns its tokens."""
    total = next(mib for index, mib, _ in sim_gpus() if index == device) * 2**20
    with _ledger() as ledger:
        used = sum(v for k, v in ledger.items() if int(k.split(":")[1]) == device)
        free = total - used - weights - RUNTIME_BYTES
        if free < 0:
            raise MemoryError(f"CUDA out of memory loading {what} on GPU {device}: {(weights + RUNTIME_BYTES) / GIB:.1f} GiB "
                              f"needed, {(total - used) / GIB:.1f} GiB free")
        pool = int(fraction * free)
        if max_tokens is not None:
            pool = min(pool, max_tokens * kv_per_token)
        key = f"{os.getpid()}:{device}"
        ledger[key] = ledger.get(key, 0) + weights + RUNTIME_BYTES + pool
    return pool // kv_per_token


# ----------------------------------------------------------------------------------------------
# tritonserver: flags and paths

VALUE_FLAGS = {"model-repository", "http-address", "http-port", "grpc-address", "grpc-port", "allow-metrics",
               "metrics-address", "metrics-port", "exit-timeout-secs", "backend-directory", "enable-peer-access",
               "pinned-memory-pool-byte-size", "model-control-mode", "log-verbose", "log-file"}
REPEATED_FLAGS = {"cuda-memory-pool-byte-size", "backend-config", "load-model"}
SWITCHES = {"disable-auto-complete-config"}


def parse_flags(args: list[str]) -> dict:
    """tritonserver's command line (``--name=value`` or ``--name value``); unknown flags are fatal."""
    opts: dict = {name: [] for name in REPEATED_FLAGS}
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--"):
            fail("tritonserver", f"unexpected argument {arg!r}")
        name, has_value, value = arg[2:].partition("=")
        if name in SWITCHES:
            opts[name] = True
        elif name in VALUE_FLAGS | REPEATED_FLAGS:
            if not has_value:
                i += 1
                value = args[i] if i < len(args) else fail("tritonserver", f"--{name} needs a value")
            if name in REPEATED_FLAGS:
                opts[name].append(value)
            else:
                opts[name] = value
        else:
            fail("tritonserver", f"unrecognized option '--{name}'")
        i += 1
    if "model-repository" not in opts:
        fail("tritonserver", "--model-repository is required")
    return opts


def mounts() -> list[Path] | None:
    raw = os.environ.get("SIM_MOUNTS")
    return [Path(p) for p in json.loads(raw)] if raw else None


def exists(path: str | Path) -> bool:
    """Whether the server can see ``path`` (inside a simulated container: only under a mount)."""
    path = Path(path)
    inside = mounts()
    if inside is not None and str(path).startswith(CONTAINER_PATHS):
        return True  # shipped in the image
    if inside is not None and not any(path == m or m in path.parents for m in inside):
        return False
    return path.exists()


def visible_gpus() -> list[int]:
    raw = os.environ.get("CUDA_VISIBLE_DEVICES")
    indexes = [g[0] for g in sim_gpus()]
    if raw is None:
        return indexes
    picked = []
    for part in filter(None, raw.split(",")):  # CUDA stops at the first id it does not know
        if not part.strip().isdigit() or int(part) not in indexes:
            break
        picked.append(int(part))
    return picked


# ----------------------------------------------------------------------------------------------
# tritonserver: loading models


def _model_config_pb2():
    """tritonclient's generated ``model_config_pb2`` loaded from its file: importing it as
    ``tritonclient.grpc.model_config_pb2`` runs the package's ``__init__`` (grpc, numpy, ml_dtypes),
    ~0.15 CPU s in every stand-in tritonserver that parses a config, for a module that needs only
    protobuf."""
    import importlib.util  # here: only a stand-in server that loads configs needs it

    if "tritonclient.grpc.model_config_pb2" in sys.modules:  # already paid for (a test process)
        return sys.modules["tritonclient.grpc.model_config_pb2"]
    if "model_config_pb2" not in sys.modules:
        package = importlib.util.find_spec("tritonclient")  # its __init__ is empty
        path = Path(package.submodule_search_locations[0]) / "grpc" / "model_config_pb2.py"
        spec = importlib.util.spec_from_file_location("model_config_pb2", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules["model_config_pb2"] = module
    return sys.modules["model_config_pb2"]


def read_config(config_path: Path):
    from google.protobuf import text_format

    config = _model_config_pb2().ModelConfig()
    text_format.Parse(config_path.read_text(), config)
    return config


def check_python_model(name: str, model_dir: Path, params: dict) -> None:
    """What the Python backend needs: ``1/model.py`` importable inside the container."""
    model_py = model_dir / "1" / "model.py"
    if not exists(model_py):
        raise RuntimeError(f"{name}: {model_py} not found")
    tree = ast.parse(model_py.read_text())
    literals = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
                and n.value.startswith("/")]
    for literal in literals:
        if not exists(literal):
            raise RuntimeError(f"{name}: model.py refers to {literal}, which does not exist in the server's view")
    roots = [model_dir / "1" / "_specdeploy", *map(Path, literals)]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pipeline"):
            rel = Path(*node.module.split(".")).with_suffix(".py")
            if not any(exists(root / rel) for root in roots):
                raise RuntimeError(f"{name}: model.py cannot import {node.module}")
    check_llmapi_startup(name, model_dir, tree)
    tokenizer = params.get("tokenizer_dir")
    if tokenizer and name in ("preprocessing", "postprocessing") and not exists(Path(tokenizer)):
        raise RuntimeError(f"{name}: tokenizer_dir {tokenizer} does not exist")


# Start-up of TensorRT-LLM's llmapi model (triton_backend/all_models/llmapi/tensorrt_llm/1/model.py,
# v1.2.1): it imports its helpers from beside it (``from helpers import ...``) and, at load, reads
# ``triton_config`` (decoupled, max_batch_size) from the YAML named by LLM_CONFIG_PATH, default
# model.yaml, in the model's version directory; a missing file is an assertion at load.
LLMAPI_TRITON_KEYS = ("decoupled", "max_batch_size")


def check_llmapi_startup(name: str, model_dir: Path, tree: ast.AST) -> None:
    imports = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    if "helpers" in imports and not exists(model_dir / "1" / "helpers.py"):
        raise RuntimeError(f"{name}: model.py imports helpers, and 1/helpers.py is not there")
    literals = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    if "model.yaml" not in literals:
        return
    config_file = model_dir / "1" / os.environ.get("LLM_CONFIG_PATH", "model.yaml")
    if not exists(config_file):
        raise RuntimeError(f"{name}: '{config_file.name}' containing TRT-LLM engine args not found")
    import yaml

    triton_config = (yaml.safe_load(config_file.read_text()) or {}).get("triton_config") or {}
    missing = [key for key in LLMAPI_TRITON_KEYS if key not in triton_config]
    if missing:
        raise RuntimeError(f"{name}: {config_file.name} triton_config lacks {missing}")


def engine_facts(engine: Path) -> dict:
    data = json.loads((engine / "config.json").read_text())
    pre = data["pretrained_config"]
    mapping = pre.get("mapping", {})
    tp, pp = int(mapping.get("tp_size", 1)), int(mapping.get("pp_size", 1))
    kv_algo = (pre.get("quantization") or {}).get("kv_cache_quant_algo")
    kv_bytes = 1 if kv_algo in ("FP8", "INT8") else {"float32": 4}.get(pre.get("dtype"), 2)
    layers = -(-int(pre["num_hidden_layers"]) // pp)
    per_token = 2 * layers * max(1, int(pre["num_key_value_heads"]) // tp) * int(pre["head_size"]) * kv_bytes
    tokens_per_block = int(data["build_config"].get("plugin_config", {}).get("tokens_per_block", 64))
    return {"world": tp * pp, "kv_per_token": per_token, "tokens_per_block": tokens_per_block}


def _devices(name: str, params: dict, facts: dict, rank: int, world: int, orchestrator: bool) -> list[tuple[int, int]]:
    """(CUDA ordinal, engine rank) pairs this process holds for one TensorRT-LLM model, after the
    executor's parallelism checks."""
    ids = [int(x) for x in params.get("gpu_device_ids", "").split(",") if x.strip()]
    if orchestrator:
        if world != 1:
            raise RuntimeError("orchestrator mode: MPI world size must be 1, the workers are spawned per model")
        ids = ids or list(range(facts["world"]))
        if len(ids) != facts["world"]:
            raise RuntimeError(f"{name}: gpu_device_ids {ids} name {len(ids)} device(s), the engine has "
                               f"tp*pp = {facts['world']} ranks")
        return list(zip(ids, range(facts["world"])))
    if world != facts["world"]:
        raise RuntimeError(f"{name}: With communicationMode kLEADER, MPI worldSize is expected to be equal to "
                           f"tp*pp*cp when participantIds are not specified (world {world}, tp*pp {facts['world']})")
    return [(ids[rank] if ids else rank, rank)]


def peers_load(name: str) -> bool:
    """Every other rank of the MPI job loads ``name`` too (else its collective init never returns)."""
    for argv in json.loads(os.environ.get("SIM_MPI_JOB", "[]")):
        opts = parse_flags(argv[1:])
        if opts.get("model-control-mode") == "explicit" and name not in opts["load-model"]:
            return False
    return True


def load_trtllm(name: str, params: dict, rank: int, world: int) -> int:
    """Load one TensorRT-LLM model's ranks held by this process; returns its KV capacity in tokens."""
    engine = Path(params.get("gpt_model_path", ""))
    if not exists(engine / "config.json"):
        raise RuntimeError(f"{name}: Decoder (GPT) model path at {engine} does not exist.")
    facts = engine_facts(engine)
    orchestrator = os.environ.get("TRTLLM_ORCHESTRATOR", "0") not in ("", "0")
    visible = visible_gpus()
    tokens = []
    for ordinal, engine_rank in _devices(name, params, facts, rank, world, orchestrator):
        if ordinal >= len(visible):
            raise RuntimeError(f"{name}: CUDA error: invalid device ordinal {ordinal} ({len(visible)} visible)")
        rank_file = engine / f"rank{engine_rank}.engine"
        if not exists(rank_file):
            raise RuntimeError(f"{name}: {rank_file} not found")
        fraction = float(params.get("kv_cache_free_gpu_mem_fraction") or 0.9)
        max_tokens = int(params["max_tokens_in_paged_kv_cache"]) if params.get("max_tokens_in_paged_kv_cache") else None
        tokens.append(allocate(visible[ordinal], rank_file.stat().st_size, facts["kv_per_token"], fraction,
                               max_tokens, f"{name} rank {engine_rank}"))
    return min(tokens) // facts["tokens_per_block"] * facts["tokens_per_block"]


def load_repository(opts: dict, rank: int, world: int) -> tuple[list[str], dict[str, int], list[str]]:
    """Load the models; returns (ready models, KV tokens per TensorRT-LLM model, models whose peers
    never join)."""
    repo = Path(opts["model-repository"])
    if not exists(repo):
        raise RuntimeError(f"failed to stat file {repo}")
    dirs = sorted(p.parent for p in repo.glob("*/config.pbtxt"))
    if opts.get("model-control-mode") == "explicit":
        dirs = [repo / name for name in opts["load-model"]]
    ready, kv, waiting = [], {}, []
    for model_dir in dirs:
        config = read_config(model_dir / "config.pbtxt")
        if config.name != model_dir.name:
            raise RuntimeError(f"{model_dir}: model name {config.name!r} does not match its directory")
        params = {k: v.string_value for k, v in config.parameters.items()}
        if config.backend == "python":
            check_python_model(config.name, model_dir, params)
        elif config.backend == "tensorrtllm":
            kv[config.name] = load_trtllm(config.name, params, rank, world)
            if world > 1 and not orchestrator_env() and not peers_load(config.name):
                waiting.append(config.name)
        ready.append(config.name)
    return ready, kv, waiting


def orchestrator_env() -> bool:
    return os.environ.get("TRTLLM_ORCHESTRATOR", "0") not in ("", "0")


# ----------------------------------------------------------------------------------------------
# tritonserver: serving


def metrics_text(kv: dict[str, int], tokens_per_block: int = 64) -> str:
    lines = ["# TYPE nv_trt_llm_kv_cache_block_metrics gauge"]
    for model, tokens in sorted(kv.items()):
        for kind, value in (("max", tokens // tokens_per_block), ("tokens_per", tokens_per_block)):
            lines.append(f'nv_trt_llm_kv_cache_block_metrics{{kv_cache_block_type="{kind}",model="{model}",version="1"}} {value}')
    return "\n".join(lines) + "\n"


def _handler(ready: list[str], kv: dict[str, int]):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _send(self, code: int, body: bytes = b"", kind: str = "application/json") -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            match = re.fullmatch(r"/v2/models/([^/]+)(?:/versions/\d+)?/ready", self.path)
            if self.path in ("/v2/health/ready", "/v2/health/live"):
                self._send(200)
            elif match:
                self._send(200 if match[1] in ready else 400)
            elif self.path == "/metrics":
                self._send(200, metrics_text(kv).encode(), "text/plain")
            else:
                self._send(404)

        def do_POST(self):
            match = re.fullmatch(r"/v2/models/([^/]+)(?:/versions/\d+)?/generate", self.path)
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if not match or match[1] not in ready:
                self._send(400, b'{"error": "unknown model"}')
                return
            self._send(200, json.dumps({"model_name": match[1], "model_version": "1", "text_output": " sim"}).encode())

    return Handler


def serve_until_sigterm(opts: dict, ready: list[str], kv: dict[str, int], event: str) -> None:
    """Rank 0 answers on its ports; other ranks (and a rank whose peers never come) only block."""
    serve_ports = event == "ready"
    servers = []
    if serve_ports:
        handler = _handler(ready, kv)
        for address, port in ((opts.get("http-address", "0.0.0.0"), opts.get("http-port", "8000")),
                              (opts.get("metrics-address", "0.0.0.0"), opts.get("metrics-port", "8002"))):
            server = ThreadingHTTPServer((address, int(port)), handler)
            # polling at 50 ms, not socketserver's 0.5 s: shutdown() below waits for a poll to end, and
            # at 0.5 s each of the two servers added up to half a second to every stop
            threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
            servers.append(server)
        grpc = socket.socket()
        grpc.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        grpc.bind((opts.get("grpc-address", "0.0.0.0"), int(opts.get("grpc-port", "8001"))))
        grpc.listen()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    record("tritonserver", event=event, models=ready, kv_tokens=kv)
    while not stop.wait(0.2):
        pass
    for server in servers:
        server.shutdown()
    record("tritonserver", event="exit")


def tritonserver_main() -> None:
    record("tritonserver", event="start")
    opts = parse_flags(sys.argv[1:])
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    world = int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
    for pool in opts["cuda-memory-pool-byte-size"]:
        device = int(pool.split(":")[0])
        if device >= len(visible_gpus()):
            fail("tritonserver", f"--cuda-memory-pool-byte-size={pool}: no CUDA device {device}")
    try:
        ready, kv, waiting = load_repository(opts, rank, world)
    except (RuntimeError, MemoryError, OSError, ValueError) as exc:
        fail("tritonserver", f"failed to load the model repository: {exc}")
    if waiting:
        print(f"rank {rank}: {waiting} wait for peer ranks that never load them", file=sys.stderr, flush=True)
    serve_until_sigterm(opts, ready, kv, "waiting" if waiting else "ready" if rank == 0 else "rank-up")


# ----------------------------------------------------------------------------------------------
# A fake build to serve: engines (config.json + sparse rank files) and the manifest


def _engine_config(cfg, expect, shape) -> dict:
    from pipeline.trtllm.engine_config import SPEC_MODE_BITS

    spec = cfg.draft if expect.role == "draft" else cfg.target
    return {
        "version": expect.version,
        "pretrained_config": {
            "architecture": expect.architecture or "LlamaForCausalLM", "dtype": spec.dtype,
            "num_hidden_layers": shape.num_layers, "num_attention_heads": shape.num_heads,
            "num_key_value_heads": shape.num_kv_heads, "hidden_size": shape.hidden_size,
            "head_size": shape.head_dim, "vocab_size": shape.vocab_size, "intermediate_size": shape.intermediate_size,
            "mapping": {"world_size": expect.tp * expect.pp, "tp_size": expect.tp, "pp_size": expect.pp},
            "quantization": {"quant_algo": expect.quant_algo, "kv_cache_quant_algo": expect.kv_cache_quant_algo,
                             "group_size": spec.quantization.awq_block_size if "AWQ" in (expect.quant_algo or "") else None},
        },
        "build_config": {
            "max_batch_size": expect.max_batch_size, "max_input_len": expect.max_input_len,
            "max_seq_len": expect.max_seq_len, "max_draft_len": expect.max_draft_len,
            "speculative_decoding_mode": SPEC_MODE_BITS[expect.speculative_decoding_mode],
            "plugin_config": {"use_paged_context_fmha": expect.paged_context_fmha, "tokens_per_block": 64},
        },
    }


def _engine_heads(cfg) -> dict | None:
    spec = cfg.speculation
    if cfg.method == "medusa":
        return {"medusa": (spec.num_heads, 1)}  # one residual layer per head, as the Vicuna heads ship
    if cfg.method == "eagle":
        return {"eagle": spec.num_layers}
    return None


def fake_build(cfg) -> dict:
    """Engines and ``engines/NAME/manifest.json`` as ``specdeploy build`` leaves them (cwd-relative)."""
    from rank_weights import rank_weight_bytes  # beside this file, on the tests' path

    from pipeline.build.builder import MANIFEST_FORMAT
    from pipeline.config import config_hash
    from pipeline.facts.model_shapes import read_config_json, shape_from_config
    from pipeline.paths import manifest_path
    from pipeline.plan.planner import make_plan

    plan = make_plan(cfg)
    target_shape = shape_from_config(read_config_json(Path(cfg.target.checkpoint)))
    draft_shape = shape_from_config(read_config_json(Path(cfg.draft.checkpoint))) if cfg.draft else None
    for step in plan.steps:
        if step.kind != "build":
            continue
        expect, out = step.expect, Path(step.outputs[0])
        shape = draft_shape if expect.role == "draft" else target_shape
        out.mkdir(parents=True, exist_ok=True)
        engine_config = _engine_config(cfg, expect, shape)
        (out / "config.json").write_text(json.dumps(engine_config, indent=1))
        heads = _engine_heads(cfg) if expect.role == "speculative" else None
        for rank in range(expect.tp * expect.pp):
            # sparse: the size this rank's weights take (counted tensor by tensor, rank_weights.py), no disk used
            size = rank_weight_bytes(engine_config["pretrained_config"], rank, heads)
            with open(out / f"rank{rank}.engine", "wb") as handle:
                handle.truncate(size)
    manifest = {"format": MANIFEST_FORMAT, "name": cfg.name, "config_hash": config_hash(cfg), "backend": cfg.backend,
                "method": cfg.method, "trtllm_version": plan.trtllm_version, "created": "sim",
                "engines": {role: str(Path(path).absolute()) for role, path in plan.engines.items()},
                "tokenizer_dir": str(Path(plan.tokenizer_dir).absolute()), "max_draft_len": plan.max_draft_len,
                "num_draft_tokens": plan.num_draft_tokens, "steps": []}
    manifest_path(cfg).parent.mkdir(parents=True, exist_ok=True)
    manifest_path(cfg).write_text(json.dumps(manifest, indent=1))
    return manifest


def write_checkpoint(directory: Path, shape) -> Path:
    """An HF checkpoint directory with the files serving reads (config.json, tokenizer.json)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps({
        "architectures": [shape.architecture], "hidden_size": shape.hidden_size, "num_hidden_layers": shape.num_layers,
        "num_attention_heads": shape.num_heads, "num_key_value_heads": shape.num_kv_heads,
        "intermediate_size": shape.intermediate_size, "vocab_size": shape.vocab_size,
        "tie_word_embeddings": shape.tie_word_embeddings, "max_position_embeddings": shape.max_position_embeddings}))
    (directory / "tokenizer.json").write_text("{}")
    return directory


def read_log(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# ----------------------------------------------------------------------------------------------
# Shipped configs on the simulated host


def shipped_config(name: str, root: Path, **triton):
    """``configs/NAME.yaml`` with every ``/models/…`` directory moved under ``root/models`` (same
    names, so the known-model shapes still apply) and those checkpoints written there."""
    import yaml

    from pipeline.config import parse_config
    from pipeline.facts.model_shapes import known_shape

    text = (ROOT / "configs" / f"{name}.yaml").read_text().replace("/models/", f"{root}/models/")
    data = yaml.safe_load(text)
    data.setdefault("triton", {}).update(triton)
    cfg = parse_config(data, name)
    for spec in filter(None, (cfg.target, cfg.draft)):
        write_checkpoint(Path(spec.checkpoint), known_shape(spec.checkpoint))
    for heads in (getattr(cfg.speculation, "heads_dir", None), getattr(cfg.speculation, "head_dir", None)):
        if heads:
            Path(heads).mkdir(parents=True, exist_ok=True)
    return cfg


def built_and_rendered(cfg):
    from pipeline.render.renderer import render

    fake_build(cfg)
    return render(cfg)


@contextlib.contextmanager
def served(cfg, *arms: str, ports: dict | None = None):
    """Start the arms' servers (as ``loadtest`` does: all up together); stop them at the end."""
    from pipeline.serve.server import start_deployment

    servers = {}
    try:
        for arm in arms:
            servers[arm] = start_deployment(cfg, arm, **(ports or {}).get(arm, {}))
        yield servers
    finally:
        for server in servers.values():
            server.stop()
