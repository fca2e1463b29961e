"""`specdeploy render` for the LLM-API runtime: the Triton ``llmapi`` repository and the
``trtllm-serve`` alternative, per arm.

Reads the validated config, the build manifest (``engines``: model directories), the arm layout
(``pipeline.plan.gpu_layout``: GPUs, KV fraction and equal KV capacity per arm) and the templates
under ``model_repo_templates/llmapi/`` and ``model_repo_templates/trtllm_serve/``. Writes, for each
arm (``baseline``, ``speculative``):

- ``engines/NAME/model_repo/<arm>/tensorrt_llm/{config.pbtxt,1/model.yaml}`` — upstream's
  ``llmapi`` model layout (TensorRT-LLM ``triton_backend/all_models/llmapi/tensorrt_llm``). Its
  ``1/model.py`` is whatever Python model serves ``model.yaml``: upstream's (copied from this host's
  TensorRT-LLM when present, else by the launch script on the GPU host); the CPU reference
  engine behind the same layout is rendered by :mod:`pipeline.render.llmapi_cpu`;
- ``engines/NAME/model_repo/<arm>.launch.sh`` and ``<arm>.command.json`` — the exact server argv;
- ``engines/NAME/trtllm-serve/<arm>/{extra_llm_api_options.yaml,launch.sh,command.json}``.

Each repository is rendered into a temporary sibling (:func:`~pipeline.render.templating.render_atomically`), validated (the protobuf parse of
``config.pbtxt``; its tensors against the recorded upstream ones; ``model.yaml``'s LLM arguments and
``speculative_config`` against the facts of the configured version; decoupled and batch size
consistent between the two files) and only then swapped in.
"""

from __future__ import annotations

import functools
import json
import shlex
import shutil
from pathlib import Path
from typing import Any

import yaml

from pipeline.artefacts.deployment import arms_of, descriptor_path
from pipeline.config import DeploymentConfig
from pipeline.paths import engine_root, model_repo_dir
from pipeline.plan.gpu_layout import ArmPlacement
from pipeline.render.arms import decide_arm
from pipeline.render.templating import new_jinja_environment, render_atomically, render_text
from pipeline.render.triton_rules import RenderError
from pipeline.trtllm.layout import resolve_trtllm_root
from pipeline.trtllm.llmapi_args import args_problems, llm_args
from pipeline.trtllm.llmapi_facts import facts_for, load_facts, triton_llmapi

TRITONSERVER = "/opt/tritonserver/bin/tritonserver"
MODEL_NAME = "tensorrt_llm"
UPSTREAM_MODEL_FILES = ("model.py", "helpers.py")


def _to_yaml(value: Any) -> str:
    return yaml.safe_dump(value, sort_keys=False, default_flow_style=False).rstrip("\n")


def jinja_env(templates_dir: Path):
    """The LLM-API templates' environment (the shared one plus YAML/shell filters), one per
    template directory and process, like :func:`~pipeline.render.templating.jinja_environment`."""
    return _cached_jinja_env(str(Path(templates_dir).resolve()))


@functools.lru_cache(maxsize=16)
def _cached_jinja_env(templates_dir: str):
    env = new_jinja_environment(Path(templates_dir))
    env.filters["to_yaml"] = _to_yaml
    env.filters["shquote"] = lambda value: shlex.quote(str(value))
    env.filters["shjoin"] = lambda argv: shlex.join(str(a) for a in argv)
    return env


def upstream_model_dir(cfg: DeploymentConfig) -> str:
    """Where the TensorRT-LLM this deployment runs keeps the llmapi model's Python files: the NGC
    image copies ``triton_backend/all_models`` to ``/app/all_models`` (tensorrtllm_backend
    ``dockerfile/Dockerfile.triton.trt_llm_backend``); a checkout keeps them under triton_backend/."""
    root = resolve_trtllm_root(None, cfg.trtllm_root)
    base = Path(root.path)
    if root.source in ("ngc-image", "default") or (base / "all_models").is_dir():
        return str(base / "all_models" / "llmapi" / MODEL_NAME / "1")
    return str(base / "triton_backend" / "all_models" / "llmapi" / MODEL_NAME / "1")


# ----------------------------------------------------------------------------------------------
# What each arm runs


def arm_args(cfg: DeploymentConfig, manifest: dict, variant: str, placement: ArmPlacement | None) -> dict[str, Any]:
    """The arm's LLM arguments, its KV fraction and capacity taken from the layout: one LLM holds
    the target and (draft-target) the draft, so the arm's models' fractions add up."""
    fraction, tokens = None, None
    if placement is not None and placement.models:
        fraction = sum(m.kv_cache_free_gpu_mem_fraction for m in placement.models)
        tokens = placement.models[0].max_tokens_in_paged_kv_cache
    args = llm_args(cfg, manifest["engines"], variant, fraction)
    if tokens is not None and cfg.triton.max_tokens_in_paged_kv_cache is None:
        args["kv_cache_config"]["max_tokens"] = tokens  # equal KV capacity in both arms
    return args


def triton_argv(cfg: DeploymentConfig, repo: Path) -> list[str]:
    """What ``launch_triton_server.py --world_size 1`` runs (TensorRT-LLM
    triton_backend/scripts/launch_triton_server.py ``get_cmd``), bound to ``triton.host``."""
    t = cfg.triton
    return ["mpirun", "--allow-run-as-root", "-n", "1", TRITONSERVER, f"--model-repository={repo}",
            f"--grpc-port={t.grpc_port}", f"--http-port={t.http_port}", f"--metrics-port={t.metrics_port}",
            f"--http-address={t.host}", f"--grpc-address={t.host}", f"--metrics-address={t.host}",
            "--disable-auto-complete-config", "--backend-config=python,shm-region-prefix-name=prefix0_"]


def serve_options(args: dict[str, Any]) -> dict[str, Any]:
    """The ``--extra_llm_api_options`` file: every LLM argument the command line does not set, and
    ``enable_iter_perf_stats``: trtllm-serve's iteration stats (JSON ``/metrics``, and the iteration
    metrics on ``/prometheus/metrics``) stay empty without it (tensorrt_llm/metrics/collector.py,
    ``log_iteration_stats``); the load test reads acceptance from them."""
    on_cli = set(load_facts()["trtllm_serve"]["cli_llm_args"])
    return {**{k: v for k, v in args.items() if k not in on_cli}, "enable_iter_perf_stats": True}


def serve_argv(cfg: DeploymentConfig, args: dict[str, Any], options_path: Path) -> list[str]:
    argv = ["trtllm-serve", str(args["model"]), "--host", cfg.triton.host, "--port", str(cfg.triton.http_port),
            "--tp_size", str(args["tensor_parallel_size"]), "--pp_size", str(args["pipeline_parallel_size"]),
            "--max_batch_size", str(args["max_batch_size"]), "--max_num_tokens", str(args["max_num_tokens"]),
            "--max_seq_len", str(args["max_seq_len"])]
    if args.get("trust_remote_code"):
        argv.append("--trust_remote_code")
    return argv + ["--extra_llm_api_options", str(options_path)]


# ----------------------------------------------------------------------------------------------
# Rendering


def template_context(cfg: DeploymentConfig, variant: str) -> dict[str, Any]:
    facts = facts_for(cfg.trtllm_version)
    return {"config_name": cfg.name, "variant": variant, "trtllm_version": cfg.trtllm_version,
            "facts_line": facts.line if facts else "?"}


def write_template(env, templates_dir: Path, template: str, context: dict, dest: Path, executable: bool = False) -> None:

    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(render_text(env, templates_dir, template, context))
    if executable:
        dest.chmod(0o755)


def _render_repo(cfg, env, templates_dir: Path, args: dict, variant: str, placement, tmp: Path) -> None:
    tensors = triton_llmapi()
    gpu_ids = ",".join(str(g) for g in placement.gpus) if placement is not None and placement.launch == "orchestrator" else ""
    context = {**template_context(cfg, variant), "decoupled": "true" if cfg.triton.decoupled else "false",
               "inputs": tensors["inputs"], "outputs": tensors["outputs"], "gpu_device_ids": gpu_ids,
               "model_parameters": {}, "llm_args": args, "triton_config": {"max_batch_size": 0, "decoupled": cfg.triton.decoupled}}
    model_dir = tmp / MODEL_NAME
    write_template(env, templates_dir, "llmapi/tensorrt_llm/config.pbtxt.jinja", context, model_dir / "config.pbtxt")
    write_template(env, templates_dir, "llmapi/tensorrt_llm/1/model.yaml.jinja", context, model_dir / "1" / "model.yaml")
    upstream = Path(upstream_model_dir(cfg))
    for name in UPSTREAM_MODEL_FILES:  # present when rendering on the GPU host itself
        if (upstream / name).is_file():
            shutil.copy2(upstream / name, model_dir / "1" / name)


def _render_launchers(cfg, env, templates_dir: Path, args: dict, variant: str, placement) -> None:
    repo = model_repo_dir(cfg, variant).absolute()
    visible = ",".join(str(g) for g in placement.gpus) if placement is not None else ""
    argv = triton_argv(cfg, repo)
    context = {**template_context(cfg, variant), "repo": repo, "argv": argv, "cuda_visible_devices": visible,
               "upstream_model_dir": upstream_model_dir(cfg)}
    write_template(env, templates_dir, "llmapi/launch.sh.jinja", context, repo.with_name(f"{variant}.launch.sh"), True)
    repo.with_name(f"{variant}.command.json").write_text(json.dumps({"argv": argv, "cuda_visible_devices": visible}, indent=2) + "\n")
    serve_dir = (engine_root(cfg) / "trtllm-serve" / variant).absolute()
    options = serve_dir / "extra_llm_api_options.yaml"
    serve = serve_argv(cfg, args, options)
    write_template(env, templates_dir, "trtllm_serve/extra_llm_api_options.yaml.jinja",
           {**context, "options": serve_options(args)}, options)
    write_template(env, templates_dir, "trtllm_serve/launch.sh.jinja", {**context, "argv": serve}, serve_dir / "launch.sh", True)
    (serve_dir / "command.json").write_text(json.dumps({"argv": serve, "cuda_visible_devices": visible}, indent=2) + "\n")


def render_llmapi(cfg: DeploymentConfig, manifest: dict, templates_dir: Path, layout) -> dict[str, tuple[Path, list[str]]]:
    """Render, validate and swap in every arm's repository and launchers; variant → (repo, warnings)."""
    env = jinja_env(templates_dir)
    out = {}
    for variant in arms_of(cfg):
        placement = layout.arms.get(variant) if layout is not None else None
        args = arm_args(cfg, manifest, variant, placement)
        dest = model_repo_dir(cfg, variant)

        def fill(tmp: Path, args=args, variant=variant, placement=placement) -> None:
            _render_repo(cfg, env, templates_dir, args, variant, placement, tmp)
            problems = validate_llmapi_repository(cfg, tmp)
            if problems:
                raise RenderError(problems)

        render_atomically(dest, fill)
        _render_launchers(cfg, env, templates_dir, args, variant, placement)
        summary = layout.summary(variant) if layout is not None else None
        decide_arm(cfg, variant, manifest, summary).write(descriptor_path(dest))
        out[variant] = (dest, [])
    return out


# ----------------------------------------------------------------------------------------------
# Validation


def _pbtxt_problems(path: Path, decoupled: bool) -> list[str]:
    from google.protobuf import text_format  # noqa: PLC0415 - start-up: google.protobuf (loaded when a config.pbtxt is parsed)
    from tritonclient.grpc import model_config_pb2  # noqa: PLC0415 - start-up: tritonclient (its model_config_pb2; loaded when a config.pbtxt is parsed)

    config = model_config_pb2.ModelConfig()
    try:
        text_format.Parse(path.read_text(), config)
    except text_format.ParseError as exc:
        return [f"{path}: not a valid ModelConfig ({exc})"]
    dtype = model_config_pb2.DataType.Name
    facts = triton_llmapi()
    problems = []
    if config.name != MODEL_NAME or config.backend != "python":
        problems.append(f"{path}: needs name {MODEL_NAME!r} and backend 'python', got {config.name!r} / {config.backend!r}")
    if config.max_batch_size != 0:
        problems.append(f"{path}: max_batch_size must be 0 (the LLM executor batches), got {config.max_batch_size}")
    if config.model_transaction_policy.decoupled != decoupled:
        problems.append(f"{path}: decoupled {config.model_transaction_policy.decoupled} differs from model.yaml's {decoupled}")
    for kind, ours, theirs in (("input", config.input, facts["inputs"]), ("output", config.output, facts["outputs"])):
        got = [(t.name, dtype(t.data_type), list(t.dims), bool(getattr(t, "optional", False))) for t in ours]
        want = [(t["name"], t["data_type"], list(t["dims"]), bool(t.get("optional", False))) for t in theirs]
        if got != want:
            diff = sorted(set(map(str, got)) ^ set(map(str, want)))
            problems.append(f"{path}: {kind} tensors differ from upstream's llmapi model: {'; '.join(diff)}")
    return problems


def validate_llmapi_repository(cfg: DeploymentConfig, repo: Path) -> list[str]:
    """Problems of one rendered llmapi repository (empty = loadable as far as can be told here)."""
    model_yaml = repo / MODEL_NAME / "1" / "model.yaml"
    try:
        data = yaml.safe_load(model_yaml.read_text())
    except (OSError, yaml.YAMLError) as exc:
        return [f"{model_yaml}: unreadable ({exc})"]
    if not isinstance(data, dict):
        return [f"{model_yaml}: not a mapping"]
    triton_config = data.pop("triton_config", {}) or {}
    problems = [f"{model_yaml}: {p}" for p in args_problems(cfg, data)]
    allowed = set(triton_llmapi()["triton_config_keys"])
    problems += [f"{model_yaml}: triton_config.{k}: not a key the llmapi model reads" for k in triton_config if k not in allowed]
    for key, value in (("model", data.get("model")), ("speculative_config.speculative_model",
                                                        (data.get("speculative_config") or {}).get("speculative_model"))):
        if value is not None and not Path(str(value)).is_absolute():
            problems.append(f"{model_yaml}: {key} {value!r} must be an absolute path (the server's working directory differs)")
    problems += _pbtxt_problems(repo / MODEL_NAME / "config.pbtxt", bool(triton_config.get("decoupled", False)))
    return problems
