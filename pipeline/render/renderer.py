"""`specdeploy render`: the build manifest + ``model_repo_templates/`` → Triton model repositories
``engines/NAME/model_repo/{baseline,speculative}/``.

Reads ``engines/NAME/manifest.json`` (refused when its config hash differs from the config) and
the Jinja templates (StrictUndefined: a missing value is an error, never a hole in the file);
writes each repository into a temporary sibling directory, validates it (Triton's load-time rules,
:mod:`pipeline.render.triton_rules`) and only then swaps it in with a rename, so a broken template fails here,
never in the server. Beside each repository it writes the arm's deployment descriptor
``<variant>.render.json`` (:class:`pipeline.artefacts.deployment.ArmDeployment`: the model a client
calls, where drafts come from, draft limits, tokenizer, placement, config hash), which ``serve`` and
``loadtest`` read.
Next to each repository go its alerting rules and Grafana dashboard (:mod:`pipeline.render.monitoring`).

GPU placement (``pipeline.plan.gpu_layout``): each ``tensorrt_llm`` model gets its ``gpu_device_ids``
(orchestrator mode), KV fraction and KV capacity from the arm layout, which the stamp
descriptor records for ``serve`` and ``loadtest``. Python models get a copy of the
project code they import under ``1/_specdeploy/`` and import it relative to their own file, so a
repository works wherever it is mounted (no checkout path is baked in).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.artefacts.deployment import arms_of, check_arm, descriptor_path, load_arm
from pipeline.artefacts.manifest import MANIFEST_FORMAT, read_manifest  # noqa: F401 - MANIFEST_FORMAT re-exported for callers
from pipeline.config import DeploymentConfig, config_hash
from pipeline.errors import EXIT_USAGE, StaleInputError
from pipeline.methods.ngram import ngram_through_bls
from pipeline.paths import PROJECT_ROOT, manifest_path, model_repo_dir
from pipeline.plan.gpu_layout import ArmLayout, ArmPlacement, LayoutError, deployment_layout
from pipeline.render.arms import decide_arm
from pipeline.render.llmapi import render_llmapi
from pipeline.render.llmapi_cpu import render_reference_llmapi
from pipeline.render.model_code import copy_model_code
from pipeline.render.monitoring import write_operations_view
from pipeline.render.templating import jinja_environment, render_atomically, render_text, triton_bool
from pipeline.render.triton_rules import RenderError, config_param, parse_config_file, validate_repository
from pipeline.triton_models.ngram_params import NgramSettings

TEMPLATES_DIR = PROJECT_ROOT / "model_repo_templates"
VARIANTS = ("baseline", "speculative")
EXECUTOR_WORKER_PATH = "/opt/tritonserver/backends/tensorrtllm/trtllmExecutorWorker"


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
    return read_manifest(manifest_path(cfg), config_hash(cfg), check_engine_dirs=False)


def variants_for(cfg: DeploymentConfig) -> tuple[str, ...]:
    return arms_of(cfg)


def drafts_in_engine(cfg: DeploymentConfig) -> bool:
    """Draft-target with ``speculation.orchestration: engine``: the speculative ``tensorrt_llm``
    model drafts inside its own engine (reference backend)."""
    return cfg.method_info.draft_model and decide_arm(cfg, "speculative").drafts == "engine"


def client_target(cfg: DeploymentConfig, variant: str) -> ClientTarget:
    """The model a load-test arm calls and the inputs it adds (as the arm's descriptor records)."""
    arm = decide_arm(cfg, variant)
    return ClientTarget(arm.model_name, dict(arm.extra_inputs))


def _check_variant(cfg: DeploymentConfig, variant: str) -> None:
    check_arm(cfg, variant)


# ----------------------------------------------------------------------------------------------
# Render contexts


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
    method_parameters: dict[str, str] = field(default_factory=dict)  # the method's own tensorrt_llm parameters
    dtm_member: bool = False  # target or draft of a draft-target deployment
    drafts_itself: bool = False  # draft-target target whose engine also drafts (orchestration: engine)


def llm_models(cfg: DeploymentConfig, manifest: dict, variant: str) -> list[LlmSettings]:
    method = cfg.method_info
    if variant == "baseline":
        return [LlmSettings("tensorrt_llm", _engine(manifest, "baseline"), cfg.triton.decoupled)]
    if drafts_in_engine(cfg):
        # decoupled like the baseline's, so the ensemble streams; the BLS handles either policy
        return [
            LlmSettings("tensorrt_llm", _engine(manifest, "speculative"), cfg.triton.decoupled,
                        dtm_member=True, drafts_itself=True),
            LlmSettings("tensorrt_llm_draft", _engine(manifest, "draft"), False, dtm_member=True),
        ]
    if ngram_through_bls(cfg):
        # the BLS drafts; the target verifies external drafts, called like draft-target's target
        return [LlmSettings("tensorrt_llm", _engine(manifest, "target"), False, dtm_member=True)]
    if method.draft_model:
        return [
            LlmSettings("tensorrt_llm", _engine(manifest, "target"), False, dtm_member=True),
            LlmSettings("tensorrt_llm_draft", _engine(manifest, "draft"), False, dtm_member=True),
        ]
    return [LlmSettings("tensorrt_llm", _engine(manifest, "speculative"), cfg.triton.decoupled,
                        decoding_mode=method.triton_decoding_mode,
                        method_parameters=method.triton_parameters(cfg.speculation))]


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
    speculative = llm.dtm_member or bool(llm.decoding_mode)
    kv_fraction, kv_tokens, device_ids = _placed(cfg, llm, placement)
    unset = ""
    parameters = {
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
        "exclude_input_in_output": triton_bool(
            False if llm.dtm_member and not llm.drafts_itself else t.exclude_input_in_output),
        "cancellation_check_period_ms": "100",
        "stats_check_period_ms": "100",
        "iter_stats_max_iterations": unset,
        "request_stats_max_iterations": unset,
        "enable_kv_cache_reuse": triton_bool(True if llm.dtm_member else t.enable_kv_cache_reuse),
        "normalize_log_probs": "True",
        "enable_chunked_context": triton_bool(t.enable_chunked_context),
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
        "medusa_choices": unset,
        "eagle_choices": unset,
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
    unknown = set(llm.method_parameters) - set(parameters)
    if unknown:
        raise RenderError([f"method {cfg.method} sets tensorrt_llm parameters upstream's model has not: {sorted(unknown)}"])
    return parameters | llm.method_parameters


def bls_instance_count(cfg: DeploymentConfig, max_batch: int) -> int:
    """Each BLS instance serves one request at a time, so a draft-target deployment gets one per
    batch slot unless ``triton.bls_instance_count`` is set explicitly."""
    orchestrates = cfg.method_info.renders_bls(cfg.speculation)
    if orchestrates and "bls_instance_count" not in cfg.triton.model_fields_set:
        return max(cfg.triton.bls_instance_count, max_batch)
    return cfg.triton.bls_instance_count


def bls_ngram_parameters(cfg: DeploymentConfig, variant: str) -> dict[str, str]:
    """The speculative BLS's n-gram parameters (pipeline/triton_models/ngram_params.py); none for
    the baseline arm and for every other method."""
    if variant != "speculative" or not ngram_through_bls(cfg):
        return {}
    spec = cfg.speculation
    return NgramSettings(spec.max_draft_len, spec.max_matching_ngram_size, spec.min_matching_ngram_size,
                         spec.is_keep_all, spec.is_use_oldest).parameters()


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
    tokenizer_code = triton_bool(cfg.target.trust_remote_code)  # pre/post: AutoTokenizer custom code
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
        "ngram_parameters": bls_ngram_parameters(cfg, variant),
    })
    return contexts


# ----------------------------------------------------------------------------------------------
# Rendering


def render_model(env, templates_dir: Path, template_dir: str, context: dict, model_name: str, dest: Path) -> None:

    template_name = f"{template_dir}/config.pbtxt.jinja"
    text = render_text(env, templates_dir, template_name, context)
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
                target.with_suffix("").write_text(render_text(env, templates_dir, name, context))
            else:
                shutil.copy2(item, target)
        if (version_dir / "model.py").is_file():
            copy_model_code((version_dir / "model.py").read_text(), version_dir)


def arm_layout(cfg: DeploymentConfig) -> ArmLayout:
    """Where the arms run on this host (``pipeline.plan.gpu_layout``); a RenderError when they cannot."""
    try:
        return deployment_layout(cfg)
    except LayoutError as exc:
        raise RenderError([f"GPU placement: {exc}"], exit_code=EXIT_USAGE) from None


def render_repository(cfg: DeploymentConfig, manifest: dict, variant: str, dest: Path,
                      templates_dir: Path = TEMPLATES_DIR, layout: ArmLayout | None = None) -> list[str]:
    """Render one variant into ``dest`` (replaced atomically). Returns validator warnings."""
    _check_variant(cfg, variant)
    layout = layout or arm_layout(cfg)
    contexts = model_contexts(cfg, manifest, variant, layout.arms[variant])
    env = jinja_environment(templates_dir)

    def fill(tmp: Path) -> list[str]:
        for model_name, (template_dir, context) in contexts.items():
            render_model(env, templates_dir, template_dir, context, model_name, tmp)
        warnings = validate_repository(tmp, backend=cfg.backend)
        _check_runtime_knobs(cfg, tmp)
        return warnings

    return render_atomically(Path(dest), fill)


def render(cfg: DeploymentConfig, templates_dir: Path = TEMPLATES_DIR) -> dict[str, tuple[Path, list[str]]]:
    """Render every variant of the deployment and write each one's deployment descriptor.
    Returns variant → (repository dir, warnings)."""
    manifest = load_manifest(cfg)
    layout = arm_layout(cfg)
    if cfg.runs_llm_api:
        return render_llmapi(cfg, manifest, templates_dir, layout)
    if cfg.llmapi_layout:  # the CPU reference engine behind the llmapi layout
        return render_reference_llmapi(cfg, manifest, templates_dir)
    out = {}
    for variant in variants_for(cfg):
        dest = model_repo_dir(cfg, variant)
        out[variant] = (dest, render_repository(cfg, manifest, variant, dest, templates_dir, layout))
        write_operations_view(cfg, variant, dest)
        decide_arm(cfg, variant, manifest, layout.summary(variant)).write(descriptor_path(dest))
    return out


def render_stamp_path(cfg: DeploymentConfig, variant: str) -> Path:
    """``engines/NAME/model_repo/<variant>.render.json``: the arm's deployment descriptor."""
    return descriptor_path(model_repo_dir(cfg, variant))


def rendered_placement(cfg: DeploymentConfig, variant: str) -> dict | None:
    """The arm placement ``render`` recorded for ``variant`` (None when nothing was rendered)."""
    path = render_stamp_path(cfg, variant)
    return load_arm(cfg, variant)[1].placement if path.is_file() else None


def _check_runtime_knobs(cfg: DeploymentConfig, repo: Path) -> None:
    """Chunked context needs an engine built with paged context FMHA: the runtime silently turns it
    off otherwise (TensorRT-LLM executor: "Chunked context is not supported for this
    configuration and will be disabled"), so a deployment asking for it is refused here."""
    if not cfg.triton.enable_chunked_context or cfg.backend != "trtllm":
        return
    problems = []
    for config_path in sorted(repo.glob("*/config.pbtxt")):
        engine = Path(config_param(parse_config_file(config_path), "gpt_model_path") or "/nonexistent")
        if not (engine / "config.json").is_file():
            continue  # engines on another host: the build's own engine check covers the flag
        plugins = json.loads((engine / "config.json").read_text()).get("build_config", {}).get("plugin_config", {})
        if str(plugins.get("use_paged_context_fmha", False)).lower() not in ("true", "1", "enable"):
            problems.append(f"{config_path}: triton.enable_chunked_context needs an engine built with paged "
                            f"context FMHA, and {engine}/config.json has use_paged_context_fmha off")
    if problems:
        raise RenderError(problems)
