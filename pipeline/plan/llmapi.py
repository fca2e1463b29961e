"""The build plan of the LLM-API runtime: no engine compile, only optional ModelOpt quantization.

``plan_llm_api`` fills a :class:`pipeline.plan.planner._Planner` (steps + ``engines`` role → model dir)
from a validated config; reads nothing but the environment (``SPECDEPLOY_MODELOPT_ROOT``). The
LLM API loads Hugging Face checkpoints directly, and a checkpoint exported by NVIDIA
Model-Optimizer (``examples/llm_ptq/hf_ptq.py``, HF format with ``hf_quant_config.json``) as it is,
so the only steps are one ``hf_ptq.py`` run per model that is quantized (FP8 on Hopper, INT4-AWQ
on Ampere; the GPU × format gate in preflight decides where each may run). The manifest's
``engines`` then name model directories: ``baseline`` and ``speculative`` the target's, ``draft``
the draft model or EAGLE-3 head (the speculative arm's ``speculative_model``).
"""

from __future__ import annotations

import os
from pathlib import Path

from pipeline.config import DeploymentConfig, ModelSpec
from pipeline.plan.step import Step
from pipeline.trtllm.llmapi_facts import load_facts

MODELOPT_ENV = "SPECDEPLOY_MODELOPT_ROOT"
MODELOPT_REPO = "https://github.com/NVIDIA/Model-Optimizer"
HF_PTQ = "examples/llm_ptq/hf_ptq.py"


def modelopt_root(cfg: DeploymentConfig, environ=None) -> str:
    """``llm_api.modelopt_root``, else ``$SPECDEPLOY_MODELOPT_ROOT``, else ./Model-Optimizer (absolute)."""
    environ = os.environ if environ is None else environ
    root = cfg.llm_api.modelopt_root or environ.get(MODELOPT_ENV) or "Model-Optimizer"
    return str(Path(root).expanduser().absolute())


def hf_ptq_argv(cfg: DeploymentConfig, spec: ModelSpec, src: str, out: str) -> list[str]:
    """One ``hf_ptq.py`` run exporting ``src`` quantized to an HF-format checkpoint in ``out``.
    ``--kv_cache_qformat`` is always given: the script defaults it to fp8, which would quantize
    the KV cache of a config that asked for none."""
    facts = load_facts()["modelopt_quantization"]
    q = spec.quantization
    argv = ["python3", str(Path(modelopt_root(cfg)) / HF_PTQ), "--pyt_ckpt_path", src, "--export_path", out,
            "--qformat", facts["qformat"][q.format], "--kv_cache_qformat", facts["kv_cache_qformat"][q.kv_cache_dtype],
            "--calib_size", str(min(q.calibration_size, 32) if q.format == "int4_awq" else q.calibration_size),
            "--dataset", q.calibration_dataset, "--export_fmt", "hf"]
    if spec.trust_remote_code:
        argv.append("--trust_remote_code")
    return argv


def _model_dir(p, label: str, spec: ModelSpec) -> str:

    src = str(Path(spec.checkpoint).expanduser().absolute())
    if spec.quantization.format == "none":
        return src  # loaded as is; an FP8 KV cache without FP8 weights is a runtime KvCacheConfig dtype
    out = p.path("checkpoints", f"{label}-{spec.quantization.format}-modelopt")
    p.add(Step(f"quantize-{label}", hf_ptq_argv(p.cfg, spec, src, out), [src], [out], kind="quantize"))
    return out


def plan_llm_api(p) -> str:
    """Steps and engines of the LLM-API runtime; returns the tokenizer dir (the target's HF dir)."""
    cfg, spec = p.cfg, p.cfg.speculation
    tokenizer = str(Path(cfg.target.checkpoint).expanduser().absolute())
    target = _model_dir(p, "target", cfg.target)
    p.engines["baseline"] = target
    if cfg.speculative:
        p.engines["speculative"] = target
    head = cfg.method_info.llmapi_draft_dir(spec)
    if cfg.draft is not None:
        p.engines["draft"] = _model_dir(p, "draft", cfg.draft)
    elif head is not None:
        p.engines["draft"] = str(Path(head).expanduser().absolute())
    return tokenizer


def missing_modelopt_scripts(plan) -> list[tuple[str, str]]:
    """(message, fix) for each quantize step whose hf_ptq.py is not on this host."""
    out = []
    for step in plan.steps:
        script = step.argv[1] if len(step.argv) > 1 else ""
        if step.kind == "quantize" and script.endswith(HF_PTQ) and not Path(script).is_file():
            root = script[: -len(HF_PTQ) - 1]
            out.append((f"{script} (step {step.name}) does not exist: the Model-Optimizer checkout is not at {root}",
                        f"git clone {MODELOPT_REPO} {root} && pip install -r {root}/examples/llm_ptq/requirements.txt "
                        f"(or set llm_api.modelopt_root / ${MODELOPT_ENV})"))
    return out
