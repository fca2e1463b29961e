"""`specdeploy render` for ``backend: reference`` + ``trtllm_runtime: llm_api``: the CPU reference
engine behind the Triton ``llmapi`` repository layout.

Reads the validated config, the build manifest (``engines``: the reference engine directories the
CPU build wrote) and each arm's engine descriptor (``<engine>/engine.json``: the checkpoint the
engine runs and, for draft-target, the draft's). Writes, per arm (``baseline``, ``speculative``):

- ``engines/NAME/model_repo/<arm>/tensorrt_llm/config.pbtxt`` — the template the GPU llmapi
  repository uses (upstream's tensors, ``max_batch_size: 0``, decoupled as configured), plus one
  parameter, ``reference_engine_dir``: the built engine whose CPU-only settings (threads, compute
  dtype, quantized weights, prefix cache, fast paths) the model keeps;
- ``tensorrt_llm/1/model.yaml`` — the LLM arguments (:func:`pipeline.trtllm.llmapi_args.llm_args`)
  with ``model`` the target checkpoint and, in the speculative arm, ``speculative_config``
  (``Draft_Target`` with ``speculative_model`` the draft checkpoint, ``Eagle3`` with it the
  EAGLE-3 head, or ``NGram``), checked against
  the recorded facts of ``trtllm_version`` like the GPU repository's;
- ``tensorrt_llm/1/model.py`` + ``_specdeploy/`` — :mod:`pipeline.triton_models.llmapi` and the
  project code it imports, so the repository runs without the checkout;
- the arm's deployment descriptor and its alert rules / dashboard.

Each repository is rendered into a temporary sibling, validated
(:func:`pipeline.render.llmapi.validate_llmapi_repository`) and only then swapped in.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.artefacts.deployment import arms_of, descriptor_path
from pipeline.artefacts.engine import ENGINE_DESCRIPTOR, EngineDescriptor
from pipeline.config import DeploymentConfig
from pipeline.errors import StaleInputError
from pipeline.paths import model_repo_dir
from pipeline.render.arms import decide_arm
from pipeline.render.llmapi import (
    MODEL_NAME,
    jinja_env,
    template_context,
    validate_llmapi_repository,
    write_template,
)
from pipeline.render.model_code import copy_model_code
from pipeline.render.monitoring import write_operations_view
from pipeline.render.templating import render_atomically, render_text
from pipeline.render.triton_rules import RenderError
from pipeline.trtllm.llmapi_args import llm_args
from pipeline.trtllm.llmapi_facts import triton_llmapi

MODEL_TEMPLATE = "llmapi/tensorrt_llm/cpu_model.py.jinja"
ENGINE_PARAMETER = "reference_engine_dir"


def _descriptor(manifest: dict, role: str) -> tuple[Path, EngineDescriptor]:
    engines = manifest.get("engines", {})
    if role not in engines:
        raise StaleInputError(f"manifest has no '{role}' engine (engines: {sorted(engines)}); re-run `specdeploy build`")
    engine_dir = Path(engines[role]).absolute()
    return engine_dir, EngineDescriptor.load(engine_dir / ENGINE_DESCRIPTOR)


def _model_dirs(manifest: dict) -> dict[str, str]:
    """The checkpoints model.yaml names (upstream's ``model`` and ``speculative_model`` are
    checkpoint directories, not engines): the arm's target and, for draft-target, the draft."""
    _, baseline = _descriptor(manifest, "baseline")
    dirs = {"baseline": str(Path(baseline.model_dir).absolute())}
    if "speculative" in manifest.get("engines", {}):
        _, speculative = _descriptor(manifest, "speculative")
        dirs["speculative"] = str(Path(speculative.model_dir).absolute())
        # speculative_model: the draft checkpoint, or the EAGLE-3 head
        draft = getattr(speculative.proposer, "draft_dir", None) or getattr(speculative.proposer, "head_dir", None)
        if draft is not None:
            dirs["draft"] = str(Path(draft).absolute())
    return dirs


def arm_args(cfg: DeploymentConfig, manifest: dict, variant: str) -> dict[str, Any]:
    """The LLM arguments of one arm; the batch limit is the one the CPU engine was built for."""
    _, descriptor = _descriptor(manifest, variant)
    args = llm_args(cfg, _model_dirs(manifest), variant)
    args["max_batch_size"] = descriptor.max_batch_size
    args["max_seq_len"] = descriptor.max_seq_len
    return args


def _render_repo(cfg: DeploymentConfig, env, templates_dir: Path, manifest: dict, variant: str, tmp: Path) -> None:
    tensors = triton_llmapi()
    engine_dir, _ = _descriptor(manifest, variant)
    context = {**template_context(cfg, variant), "decoupled": "true" if cfg.triton.decoupled else "false",
               "inputs": tensors["inputs"], "outputs": tensors["outputs"], "gpu_device_ids": "",
               "model_parameters": {ENGINE_PARAMETER: str(engine_dir)},
               "llm_args": arm_args(cfg, manifest, variant),
               "triton_config": {"max_batch_size": 0, "decoupled": cfg.triton.decoupled}}
    model_dir = tmp / MODEL_NAME
    write_template(env, templates_dir, "llmapi/tensorrt_llm/config.pbtxt.jinja", context, model_dir / "config.pbtxt")
    write_template(env, templates_dir, "llmapi/tensorrt_llm/1/model.yaml.jinja", context, model_dir / "1" / "model.yaml")
    source = render_text(env, templates_dir, MODEL_TEMPLATE, context)
    (model_dir / "1" / "model.py").write_text(source)
    copy_model_code(source, model_dir / "1")


def render_reference_llmapi(cfg: DeploymentConfig, manifest: dict, templates_dir: Path) -> dict[str, tuple[Path, list[str]]]:
    """Render, validate and swap in every arm; variant → (repository, warnings)."""
    env = jinja_env(templates_dir)
    out = {}
    for variant in arms_of(cfg):
        dest = model_repo_dir(cfg, variant)

        def fill(tmp: Path, variant=variant) -> None:
            _render_repo(cfg, env, templates_dir, manifest, variant, tmp)
            problems = validate_llmapi_repository(cfg, tmp)
            if problems:
                raise RenderError(problems)

        render_atomically(dest, fill)
        write_operations_view(cfg, variant, dest)
        decide_arm(cfg, variant, manifest).write(descriptor_path(dest))
        out[variant] = (dest, [])
    return out
