"""`specdeploy render`: the build manifest + ``model_repo_templates/`` → Triton model repositories
``engines/NAME/model_repo/{baseline,speculative}/``.

Reads ``engines/NAME/manifest.json`` (refused when its config hash differs from the config) and
the Jinja templates (StrictUndefined: a missing value is an error, never a hole in the file);
writes each repository into a temporary sibling directory, validates it (protobuf parse into
``ModelConfig`` plus the load-time rules Triton applies and the parser does not: names, version
dirs, ensemble wiring and dtypes, batch sizes, decoding mode vs engine, draft-target KV reuse,
decoupled consistency) and only then swaps it in with a rename, so a broken template fails here,
never in the server. ``client_target`` tells the load tester which model each arm calls. Next
to each repository go its alerting rules and Grafana dashboard (:mod:`pipeline.monitoring`).

GPU placement (``pipeline.gpu_layout``): each ``tensorrt_llm`` model gets its ``gpu_device_ids``
(orchestrator mode), KV fraction and KV capacity from the arm layout, which the stamp
``<variant>.render.json`` records for ``serve`` and ``loadtest``. Python models get a copy of the
project code they import under ``1/_specdeploy/`` and import it relative to their own file, so a
repository works wherever it is mounted (no checkout path is baked in).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.config import DeploymentConfig, config_hash
from pipeline.errors import SpecdeployError, StaleInputError
from pipeline.gpu_layout import ArmLayout, ArmPlacement, LayoutError, deployment_layout
from pipeline.model_code import copy_model_code
from pipeline.monitoring import write_operations_view
from pipeline.paths import PROJECT_ROOT, manifest_path, model_repo_dir

TEMPLATES_DIR = PROJECT_ROOT / "model_repo_templates"
VARIANTS = ("baseline", "speculative")
MANIFEST_FORMAT = "specdeploy-manifest/1"
EXECUTOR_WORKER_PATH = "/opt/tritonserver/backends/tensorrtllm/trtllmExecutorWorker"


class RenderError(SpecdeployError):
    """A template or a rendered config is broken; names the file and the reason."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("; ".join(problems))

    def lines(self) -> list[str]:
        return [f"render failed: {len(self.problems)} problem(s)"] + [f"  {p}" for p in self.problems]


@dataclass(frozen=True)
class ClientTarget:
    """Which Triton model a load-test arm calls and the extra inputs it must send."""

    model_name: str
    extra_inputs: dict = field(default_factory=dict)


# ----------------------------------------------------------------------------------------------
# Manifest


def load_manifest(cfg: DeploymentConfig) -> dict:
    """The build manifest of ``cfg`` (StaleInputError when missing or from another config).
    Engine dirs are not required here: a repository may be rendered for engines that live on
    another host (they are checked when the server starts)."""
    from pipeline.build import load_manifest as load_build_manifest  # noqa: PLC0415

    return load_build_manifest(cfg, check_engine_dirs=False)


def variants_for(cfg: DeploymentConfig) -> tuple[str, ...]:
    return ("baseline",) if cfg.method == "none" else VARIANTS


def drafts_in_engine(cfg: DeploymentConfig) -> bool:
    """Draft-target with ``speculation.orchestration: engine``: the speculative ``tensorrt_llm``
    model drafts inside its own engine (reference backend)."""
    return cfg.method == "draft_target" and cfg.speculation.orchestration == "engine"


def client_target(cfg: DeploymentConfig, variant: str) -> ClientTarget:
    """draft_target orchestrated by the BLS: both arms call the BLS (the speculative arm adds
    num_draft_tokens = K); none / medusa / eagle / draft_target drafting in the engine: both arms
    call the ensemble."""
    _check_variant(cfg, variant)
    if cfg.method == "draft_target" and not drafts_in_engine(cfg):
        extra = {"num_draft_tokens": cfg.speculation.num_draft_tokens} if variant == "speculative" else {}
        return ClientTarget("tensorrt_llm_bls", extra)
    return ClientTarget("ensemble", {})


def _check_variant(cfg: DeploymentConfig, variant: str) -> None:
    if variant not in variants_for(cfg):
        raise SpecdeployError(
            f"variant {variant!r} does not exist for speculation method {cfg.method!r} "
            f"(choose from: {', '.join(variants_for(cfg))})"
        )


# ----------------------------------------------------------------------------------------------
# Render contexts


def brace_choices(choices: list[list[int]]) -> str:
    """[[0], [0, 1]] → '{0}, {0, 1}' (the only tree syntax the C++ backend parses)."""
    return ", ".join("{" + ", ".join(str(i) for i in path) + "}" for path in choices)


def _tree_choices(spec, depth: int) -> list[list[int]]:
    return spec.choices if spec.choices else [[0] * (i + 1) for i in range(depth)]


def _bool(value: bool) -> str:
    return "True" if value else "False"


def _engine(manifest: dict, key: str) -> str:
    engines = manifest.get("engines", {})
    if key not in engines:
        raise StaleInputError(f"manifest has no '{key}' engine (engines: {sorted(engines)}); re-run `specdeploy build`")
    return str(engines[key])


@dataclass
class LlmSettings:
    model_name: str
    engine_dir: str
    decoupled: bool
    decoding_mode: str = ""
    medusa_choices: str = ""
    eagle_choices: str = ""
    dtm_member: bool = False  # target or draft of a draft-target deployment
    drafts_itself: bool = False  # draft-target target whose engine also drafts (orchestration: engine)


def llm_models(cfg: DeploymentConfig, manifest: dict, variant: str) -> list[LlmSettings]:
    method = cfg.method
    if variant == "baseline":
        return [LlmSettings("tensorrt_llm", _engine(manifest, "baseline"), cfg.triton.decoupled)]
    if drafts_in_engine(cfg):
        # decoupled like the baseline's, so the ensemble streams; the BLS handles either policy
        return [
            LlmSettings("tensorrt_llm", _engine(manifest, "speculative"), cfg.triton.decoupled,
                        dtm_member=True, drafts_itself=True),
            LlmSettings("tensorrt_llm_draft", _engine(manifest, "draft"), False, dtm_member=True),
        ]
    if method == "draft_target":
        return [
            LlmSettings("tensorrt_llm", _engine(manifest, "target"), False, dtm_member=True),
            LlmSettings("tensorrt_llm_draft", _engine(manifest, "draft"), False, dtm_member=True),
        ]
    spec = cfg.speculation
    settings = LlmSettings("tensorrt_llm", _engine(manifest, "speculative"), cfg.triton.decoupled)
    if method == "medusa":
        settings.decoding_mode = "medusa"
        settings.medusa_choices = brace_choices(_tree_choices(spec, spec.num_heads))
    elif method == "eagle":
        settings.decoding_mode = "eagle"
        settings.eagle_choices = brace_choices(_tree_choices(spec, spec.num_layers))
    return [settings]


def _placed(cfg: DeploymentConfig, llm: LlmSettings, placement: ArmPlacement | None) -> tuple[float, int | None, str]:
    """(KV fraction, KV capacity, gpu_device_ids) of one model: orchestrator mode names each
    model's GPUs, leader and single mode see only the arm's GPUs (CUDA_VISIBLE_DEVICES)."""
    model = placement.model(llm.model_name) if placement is not None else None
    if model is None:
        return cfg.triton.kv_cache_free_gpu_mem_fraction, cfg.triton.max_tokens_in_paged_kv_cache, ""
    device_ids = ",".join(str(g) for g in model.gpus) if placement.launch == "orchestrator" else ""
    return model.kv_cache_free_gpu_mem_fraction, model.max_tokens_in_paged_kv_cache, device_ids


def trtllm_parameters(cfg: DeploymentConfig, llm: LlmSettings, manifest: dict,
                      placement: ArmPlacement | None = None) -> dict[str, str]:
    """The ``tensorrt_llm`` model's parameters; ``placement`` (the arm's GPU placement) sets the
    GPUs, the KV fraction and the KV capacity (reference backend: None, the config's values)."""
    t = cfg.triton
    speculative = llm.dtm_member or llm.decoding_mode in ("medusa", "eagle")
    kv_fraction, kv_tokens, device_ids = _placed(cfg, llm, placement)
    unset = ""
    return {
        "max_beam_width": "1" if speculative else str(cfg.build.max_beam_width),
        "FORCE_CPU_ONLY_INPUT_TENSORS": "no",
        "gpt_model_type": t.batching_strategy,
        "gpt_model_path": llm.engine_dir,
        "encoder_model_path": unset,
        "max_tokens_in_paged_kv_cache": unset if kv_tokens is None else str(kv_tokens),
        "max_attention_window_size": unset if t.max_attention_window_size is None else str(t.max_attention_window_size),
        "sink_token_length": unset,
        "batch_scheduler_policy": t.batch_scheduler_policy,
        "kv_cache_free_gpu_mem_fraction": str(kv_fraction),
        "cross_kv_cache_fraction": unset,
        "kv_cache_host_memory_bytes": unset,
        "kv_cache_onboard_blocks": unset,
        # the BLS and the client-side loop slice output_ids assuming the prompt is present (the
        # BLS asks per request, so a target that also serves the ensemble keeps the baseline's)
        "exclude_input_in_output": _bool(
            False if llm.dtm_member and not llm.drafts_itself else t.exclude_input_in_output),
        "cancellation_check_period_ms": "100",
        "stats_check_period_ms": "100",
        "iter_stats_max_iterations": unset,
        "request_stats_max_iterations": unset,
        "enable_kv_cache_reuse": _bool(True if llm.dtm_member else t.enable_kv_cache_reuse),
        "normalize_log_probs": "True",
        "enable_chunked_context": _bool(t.enable_chunked_context),
        # participant_ids only matter with --disable-spawn-processes (docs/gpu-serving.md)
        "gpu_device_ids": device_ids,
        "participant_ids": unset,
        "num_nodes": unset,
        "lora_cache_optimal_adapter_size": unset,
        "lora_cache_max_adapter_size": unset,
        "lora_cache_gpu_memory_fraction": unset,
        "lora_cache_host_memory_bytes": unset,
        "lora_prefetch_dir": unset,
        "decoding_mode": llm.decoding_mode,
        "executor_worker_path": EXECUTOR_WORKER_PATH,
        "lookahead_window_size": unset,
        "lookahead_ngram_size": unset,
        "lookahead_verification_set_size": unset,
        "medusa_choices": llm.medusa_choices,
        "eagle_choices": llm.eagle_choices,
        "gpu_weights_percent": unset,
        "enable_context_fmha_fp32_acc": unset,
        "multi_block_mode": unset,
        "cuda_graph_mode": unset,
        "cuda_graph_cache_size": unset,
        "speculative_decoding_fast_logits": unset,
        "tokenizer_dir": unset,
        "guided_decoding_backend": unset,
        "xgrammar_tokenizer_info_path": unset,
    }


def bls_instance_count(cfg: DeploymentConfig, max_batch: int) -> int:
    """Each BLS instance serves one request at a time, so a draft-target deployment gets one per
    batch slot unless ``triton.bls_instance_count`` is set explicitly."""
    if cfg.method == "draft_target" and "bls_instance_count" not in cfg.triton.model_fields_set:
        return max(cfg.triton.bls_instance_count, max_batch)
    return cfg.triton.bls_instance_count


def model_contexts(cfg: DeploymentConfig, manifest: dict, variant: str,
                   placement: ArmPlacement | None = None) -> dict[str, tuple[str, dict]]:
    """model name → (template directory, render context)."""
    t = cfg.triton
    max_batch = cfg.build.max_batch_size
    if cfg.backend == "reference" and cfg.reference.max_batch_size:
        max_batch = cfg.reference.max_batch_size
    common = {
        "triton_max_batch_size": max_batch,
        "logits_datatype": "TYPE_FP32",
        "max_queue_delay_microseconds": t.max_queue_delay_microseconds,
        "max_queue_size": t.max_queue_size,
    }
    llms = llm_models(cfg, manifest, variant)
    target = llms[0]
    tokenizer_dir = str(manifest.get("tokenizer_dir") or "")
    if not tokenizer_dir:
        raise StaleInputError("manifest has no tokenizer_dir; re-run `specdeploy build`")
    tokenizer_code = _bool(cfg.target.trust_remote_code)  # pre/post: AutoTokenizer custom code
    contexts: dict[str, tuple[str, dict]] = {
        "ensemble": ("ensemble", {**common, "llm_model_name": target.model_name}),
        "preprocessing": ("preprocessing", {
            **common, "tokenizer_dir": tokenizer_dir, "add_special_tokens": "True", "trust_remote_code": tokenizer_code,
            "multimodal_model_path": "", "engine_dir": target.engine_dir, "max_num_images": "",
            "preprocessing_instance_count": t.preprocessing_instance_count,
        }),
        "postprocessing": ("postprocessing", {
            **common, "tokenizer_dir": tokenizer_dir, "skip_special_tokens": "True", "trust_remote_code": tokenizer_code,
            "postprocessing_instance_count": t.postprocessing_instance_count,
        }),
    }
    backend = "tensorrtllm" if cfg.backend == "trtllm" else "python"
    for llm in llms:
        contexts[llm.model_name] = ("tensorrt_llm", {
            **common, "model_name": llm.model_name, "triton_backend": backend,
            "decoupled_mode": "true" if llm.decoupled else "false",
            "encoder_input_features_data_type": "TYPE_FP16",
            "engine_note": f"engine: {llm.engine_dir} ({cfg.backend} backend, {variant} variant)",
            "trtllm_parameters": trtllm_parameters(cfg, llm, manifest, placement),
        })
    draft = next((llm.model_name for llm in llms if llm.model_name == "tensorrt_llm_draft"), "")
    contexts["tensorrt_llm_bls"] = ("tensorrt_llm_bls", {
        **common, "decoupled_mode": "true" if t.decoupled else "false",
        "accumulate_tokens": "False", "tensorrt_llm_model_name": target.model_name,
        "tensorrt_llm_draft_model_name": draft, "multimodal_encoders_name": "",
        "bls_instance_count": bls_instance_count(cfg, max_batch),
    })
    return contexts


# ----------------------------------------------------------------------------------------------
# Rendering


def _pbstr(value) -> str:
    if isinstance(value, bool):
        value = _bool(value)
    if not isinstance(value, (str, int, float)):
        str(value)  # a StrictUndefined raises UndefinedError here, naming the missing value
        raise ValueError(f"parameter value {value!r} is not a string")
    return json.dumps(str(value), ensure_ascii=False)


def jinja_environment(templates_dir: Path):
    import jinja2  # noqa: PLC0415

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir)),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
    )
    env.filters["pbstr"] = _pbstr
    env.filters["pystr"] = lambda value: json.dumps(str(value))
    return env


def _render_text(env, templates_dir: Path, template_name: str, context: dict) -> str:
    import jinja2  # noqa: PLC0415

    try:
        return env.get_template(template_name).render(**context)
    except jinja2.TemplateSyntaxError as exc:
        raise RenderError([f"{templates_dir / template_name}:{exc.lineno}: template syntax error: {exc.message}"]) from None
    except jinja2.UndefinedError as exc:
        raise RenderError([f"{templates_dir / template_name}: missing value: {exc.message}"]) from None
    except (jinja2.TemplateError, ValueError, TypeError) as exc:
        raise RenderError([f"{templates_dir / template_name}: {exc}"]) from None


def render_model(env, templates_dir: Path, template_dir: str, context: dict, model_name: str, dest: Path) -> None:

    template_name = f"{template_dir}/config.pbtxt.jinja"
    text = _render_text(env, templates_dir, template_name, context)
    if "${" in text:
        raise RenderError([f"{templates_dir / template_name}: unfilled placeholder '${{...}}' left in the output"])
    model_dir = dest / model_name
    version_dir = model_dir / "1"
    version_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.pbtxt").write_text(text)
    source_version = templates_dir / template_dir / "1"
    if context.get("triton_backend", "python") == "python" and source_version.is_dir():
        for item in sorted(source_version.rglob("*")):
            if "__pycache__" in item.parts or not item.is_file():
                continue
            target = version_dir / item.relative_to(source_version)
            target.parent.mkdir(parents=True, exist_ok=True)
            if item.suffix == ".jinja":  # e.g. model.py.jinja → model.py
                name = str(item.relative_to(templates_dir))
                target.with_suffix("").write_text(_render_text(env, templates_dir, name, context))
            else:
                shutil.copy2(item, target)
        if (version_dir / "model.py").is_file():
            copy_model_code((version_dir / "model.py").read_text(), version_dir)


def arm_layout(cfg: DeploymentConfig) -> ArmLayout:
    """Where the arms run on this host (``pipeline.gpu_layout``); a RenderError when they cannot."""
    try:
        return deployment_layout(cfg)
    except LayoutError as exc:
        raise RenderError([f"GPU placement: {exc}"]) from None


def render_repository(cfg: DeploymentConfig, manifest: dict, variant: str, dest: Path,
                      templates_dir: Path = TEMPLATES_DIR, layout: ArmLayout | None = None) -> list[str]:
    """Render one variant into ``dest`` (replaced atomically). Returns validator warnings."""
    _check_variant(cfg, variant)
    layout = layout or arm_layout(cfg)
    contexts = model_contexts(cfg, manifest, variant, layout.arms[variant])
    env = jinja_environment(templates_dir)
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    try:
        for model_name, (template_dir, context) in contexts.items():
            render_model(env, templates_dir, template_dir, context, model_name, tmp)
        warnings = validate_repository(tmp, backend=cfg.backend)
        _check_runtime_knobs(cfg, tmp)
        _swap_in(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return warnings


def _swap_in(new: Path, dest: Path) -> None:
    old = None
    if dest.exists():
        old = dest.with_name(f".{dest.name}.old-{new.name[-8:]}")
        dest.rename(old)
    new.rename(dest)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def render(cfg: DeploymentConfig, templates_dir: Path = TEMPLATES_DIR) -> dict[str, tuple[Path, list[str]]]:
    """Render every variant of the deployment. Returns variant → (repository dir, warnings)."""
    manifest = load_manifest(cfg)
    layout = arm_layout(cfg)
    out = {}
    for variant in variants_for(cfg):
        dest = model_repo_dir(cfg, variant)
        out[variant] = (dest, render_repository(cfg, manifest, variant, dest, templates_dir, layout))
        write_operations_view(cfg, variant, dest)
        stamp = {"config_hash": config_hash(cfg), "variant": variant, "manifest_created": manifest.get("created"),
                 "client_target": vars(client_target(cfg, variant)), "placement": layout.summary(variant)}
        tmp = render_stamp_path(cfg, variant).with_suffix(".tmp")
        tmp.write_text(json.dumps(stamp, indent=2) + "\n")
        tmp.replace(render_stamp_path(cfg, variant))
    return out


def render_stamp_path(cfg: DeploymentConfig, variant: str) -> Path:
    """``engines/NAME/model_repo/<variant>.render.json``: the config hash a repository was rendered from."""
    repo = model_repo_dir(cfg, variant)
    return repo.with_name(f"{repo.name}.render.json")


def rendered_placement(cfg: DeploymentConfig, variant: str) -> dict | None:
    """The arm placement ``render`` recorded for ``variant`` (None before this was recorded)."""
    path = render_stamp_path(cfg, variant)
    try:
        return json.loads(path.read_text()).get("placement")
    except (OSError, ValueError):
        return None


def _check_runtime_knobs(cfg: DeploymentConfig, repo: Path) -> None:
    """Chunked context needs an engine built with paged context FMHA: the runtime silently turns it
    off otherwise (TensorRT-LLM executor: "Chunked context is not supported for this
    configuration and will be disabled"), so a deployment asking for it is refused here."""
    if not cfg.triton.enable_chunked_context or cfg.backend != "trtllm":
        return
    problems = []
    for config_path in sorted(repo.glob("*/config.pbtxt")):
        engine = Path(_param(parse_config_file(config_path), "gpt_model_path") or "/nonexistent")
        if not (engine / "config.json").is_file():
            continue  # engines on another host: the build's own engine check covers the flag
        plugins = json.loads((engine / "config.json").read_text()).get("build_config", {}).get("plugin_config", {})
        if str(plugins.get("use_paged_context_fmha", False)).lower() not in ("true", "1", "enable"):
            problems.append(f"{config_path}: triton.enable_chunked_context needs an engine built with paged "
                            f"context FMHA, and {engine}/config.json has use_paged_context_fmha off")
    if problems:
        raise RenderError(problems)


def check_rendered(cfg: DeploymentConfig, variant: str) -> Path:
    """The rendered repository of ``variant``; refused when missing or rendered from another config."""
    _check_variant(cfg, variant)
    repo = model_repo_dir(cfg, variant)
    stamp_path = render_stamp_path(cfg, variant)
    if not (repo / "tensorrt_llm" / "config.pbtxt").is_file() or not stamp_path.is_file():
        raise StaleInputError(f"no rendered repository at {repo}: run `specdeploy render` first")
    stamp = json.loads(stamp_path.read_text())
    if stamp.get("config_hash") != config_hash(cfg):
        raise StaleInputError(f"{repo} was rendered from another config: re-run `specdeploy render` "
                              "(and `specdeploy build` if the engines changed)")
    return repo


# ----------------------------------------------------------------------------------------------
# Validation (Triton's load-time rules the protobuf parser does not check)


def parse_config_file(path: Path):
    from google.protobuf import text_format  # noqa: PLC0415
    from tritonclient.grpc import model_config_pb2  # noqa: PLC0415

    config = model_config_pb2.ModelConfig()
    try:
        text_format.Parse(path.read_text(), config)
    except text_format.ParseError as exc:
        raise RenderError([f"{path}: does not parse as a Triton ModelConfig: {exc}"]) from None
    return config


def _param(config, key: str) -> str:
    return config.parameters[key].string_value if key in config.parameters else ""


def validate_repository(repo: Path, backend: str | None = None) -> list[str]:
    """Check a rendered repository; raise RenderError listing every problem, return warnings."""
    repo = Path(repo)
    problems: list[str] = []
    warnings: list[str] = []
    configs = {}
    for config_path in sorted(repo.glob("*/config.pbtxt")):
        config = parse_config_file(config_path)
        model_dir = config_path.parent
        configs[model_dir.name] = config
        if config.name != model_dir.name:
            problems.append(f"{config_path}: name {config.name!r} differs from its directory {model_dir.name!r}")
        if not (model_dir / "1").is_dir():
            problems.append(f"{model_dir}: version directory 1/ is missing")
        if config.backend == "python" and not (model_dir / "1" / "model.py").is_file():
            problems.append(f"{model_dir}: python backend without 1/model.py")
        if config.max_batch_size <= 0:
            problems.append(f"{config_path}: max_batch_size must be > 0")
    if not configs:
        raise RenderError([f"{repo}: no */config.pbtxt found"])
    for name, config in configs.items():
        if config.platform == "ensemble":
            _check_ensemble(repo, name, config, configs, problems, warnings)
    _check_llm_rules(repo, configs, problems, backend)
    if problems:
        raise RenderError(problems)
    return warnings


def _check_ensemble(repo, name, config, configs, problems, warnings) -> None:
    where = f"{repo / name / 'config.pbtxt'}"
    if len(config.instance_group):
        problems.append(f"{where}: an ensemble may not declare instance_group")
    ens_inputs = {t.name: t for t in config.input}
    seen_outputs: dict[str, object] = {}
    for t in config.output:
        if t.name in seen_outputs:
            warnings.append(f"{where}: output {t.name!r} is declared more than once (Triton tolerates it)")
        seen_outputs[t.name] = t
    produced: dict[str, tuple[str, int]] = {}  # tensor → (step model, dtype)
    for step in config.ensemble_scheduling.step:
        step_cfg = configs.get(step.model_name)
        if step_cfg is None:
            problems.append(f"{where}: step model {step.model_name!r} is not in the repository")
            continue
        if step_cfg.max_batch_size < config.max_batch_size:
            problems.append(
                f"{where}: ensemble max_batch_size {config.max_batch_size} exceeds "
                f"{step.model_name}'s {step_cfg.max_batch_size}"
            )
        outputs = {t.name: t for t in step_cfg.output}
        for key, tensor in step.output_map.items():
            if key not in outputs:
                problems.append(f"{where}: step {step.model_name} maps unknown output {key!r}")
                continue
            if tensor in produced:
                problems.append(f"{where}: tensor {tensor!r} is produced by both {produced[tensor][0]} and {step.model_name}")
            produced[tensor] = (step.model_name, outputs[key].data_type)
    for step in config.ensemble_scheduling.step:
        step_cfg = configs.get(step.model_name)
        if step_cfg is None:
            continue
        inputs = {t.name: t for t in step_cfg.input}
        for key, tensor in step.input_map.items():
            if key not in inputs:
                problems.append(f"{where}: step {step.model_name} maps unknown input {key!r}")
                continue
            if tensor in ens_inputs:
                source_dtype = ens_inputs[tensor].data_type
                if ens_inputs[tensor].optional and not inputs[key].optional:
                    problems.append(f"{where}: optional ensemble input {tensor!r} feeds required {step.model_name}.{key}")
            elif tensor in produced:
                source_dtype = produced[tensor][1]
            else:
                problems.append(f"{where}: {step.model_name}.{key} reads {tensor!r}, which no input or step provides")
                continue
            if source_dtype != inputs[key].data_type:
                problems.append(f"{where}: dtype mismatch on {tensor!r} → {step.model_name}.{key}")
        for key, tensor in inputs.items():
            if not tensor.optional and key not in step.input_map:
                problems.append(f"{where}: required input {step.model_name}.{key} is not mapped")
    for out_name, tensor in seen_outputs.items():
        if out_name not in produced:
            problems.append(f"{where}: ensemble output {out_name!r} is produced by no step")
        elif produced[out_name][1] != tensor.data_type:
            problems.append(f"{where}: dtype mismatch on ensemble output {out_name!r}")


def _reference_descriptor(engine_dir: str) -> dict | None:
    """A reference engine's ``engine.json``, or None for any other engine directory."""
    descriptor = Path(engine_dir) / "engine.json"
    return json.loads(descriptor.read_text()) if descriptor.is_file() else None


def _engine_method(engine_dir: str, backend: str | None) -> str | None:
    """The speculation method an engine was built for, when its files say so."""
    path = Path(engine_dir)
    data = _reference_descriptor(engine_dir)
    if data is not None:
        return data.get("proposer", {}).get("method", "none") if data.get("role") != "target" else "draft_target"
    config = path / "config.json"
    if config.is_file():
        from pipeline.trtllm.engine_config import SPEC_MODE_BITS  # noqa: PLC0415

        # TensorRT-LLM writes the mode as an integer bit flag (SpeculativeDecodingMode); names pass too
        raw = json.loads(config.read_text()).get("build_config", {}).get("speculative_decoding_mode")
        if raw in (None, "") or isinstance(raw, bool):
            return None
        names = {bit: name for name, bit in SPEC_MODE_BITS.items()}
        mode = names.get(raw) if isinstance(raw, int) else str(raw).lower().removeprefix("speculativedecodingmode.")
        return {"medusa": "medusa", "eagle": "eagle", "draft_tokens_external": "draft_target"}.get(mode or "", "none")
    return None


def _engine_drafts_itself(engine_dir: str) -> bool:
    """A reference engine that verifies external drafts and also drafts with its own draft model."""
    data = _reference_descriptor(engine_dir) or {}
    return data.get("role") == "speculative" and data.get("proposer", {}).get("method") == "draft_target"


def _check_llm_rules(repo, configs, problems, backend) -> None:
    bls = configs.get("tensorrt_llm_bls")
    target_name = _param(bls, "tensorrt_llm_model_name") if bls else "tensorrt_llm"
    draft_name = _param(bls, "tensorrt_llm_draft_model_name") if bls else ""
    for name in ("tensorrt_llm", "tensorrt_llm_draft"):
        config = configs.get(name)
        if config is None:
            continue
        where = repo / name / "config.pbtxt"
        mode = _param(config, "decoding_mode")
        engine_method = _engine_method(_param(config, "gpt_model_path"), backend)
        if mode in ("medusa", "eagle") and engine_method not in (None, mode):
            problems.append(f"{where}: decoding_mode {mode!r} but the engine was built for {engine_method!r}")
        if not mode and engine_method in ("medusa", "eagle"):
            problems.append(f"{where}: the engine was built for {engine_method!r} but decoding_mode is unset")
        if mode == "medusa" and not _param(config, "medusa_choices"):
            problems.append(f"{where}: decoding_mode medusa needs medusa_choices")
        if mode == "eagle" and not _param(config, "eagle_choices"):
            problems.append(f"{where}: decoding_mode eagle needs eagle_choices")
    if bls is None:
        return
    bls_where = repo / "tensorrt_llm_bls" / "config.pbtxt"
    target = configs.get(target_name)
    if target is None:
        problems.append(f"{bls_where}: tensorrt_llm_model_name {target_name!r} is not in the repository")
        return
    if draft_name:
        draft = configs.get(draft_name)
        if draft is None:
            problems.append(f"{bls_where}: tensorrt_llm_draft_model_name {draft_name!r} is not in the repository")
            return
        if _param(target, "enable_kv_cache_reuse").lower() not in ("true", "1"):
            problems.append(f"{repo / target_name / 'config.pbtxt'}: draft-target needs enable_kv_cache_reuse True on the target")
        for name, config in ((target_name, target), (draft_name, draft)):
            if name == target_name and _engine_drafts_itself(_param(config, "gpt_model_path")):
                continue  # our BLS calls it with exec(decoupled=True) when it is decoupled
            if config.model_transaction_policy.decoupled:
                problems.append(f"{repo / name / 'config.pbtxt'}: draft-target needs decoupled false (the BLS calls it with exec(decoupled=False))")
    elif target.model_transaction_policy.decoupled != bls.model_transaction_policy.decoupled:
        problems.append(
            f"{bls_where}: decoupled ({bls.model_transaction_policy.decoupled}) differs from "
            f"{target_name} ({target.model_transaction_policy.decoupled})"
        )
