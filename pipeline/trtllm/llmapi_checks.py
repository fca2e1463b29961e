"""Preflight rules of the LLM-API runtime (``trtllm_runtime: llm_api``), against the recorded facts.

Reads the validated config, the facts of its ``trtllm_version`` (``pipeline.trtllm.llmapi_facts``)
and, through the preflight context, the shapes and directories preflight already resolved; adds
findings (error / warning / info with the field path and the fix) to that context. Writes nothing.
Rules: which runtime the version has; which methods each runtime runs (Medusa and EAGLE-1 are
engine-only, EAGLE-3 / MTP are LLM-API-only on trtllm, n-gram too except as BLS external drafts; n-gram
also runs on the CPU reference engine); the generated LLM arguments and
``speculative_config`` and the user's pass-through sections against the version's fields and
types; the quantization ModelOpt can export; MTP's DeepSeek-family target; the EAGLE-3 head's sizes.
"""

from __future__ import annotations

from pipeline.config import ENGINE_RUNTIME_MAX_VERSION
from pipeline.methods import ENGINE, LLM_API, METHODS, REFERENCE
from pipeline.trtllm.llmapi_args import decoding_problems, llm_args
from pipeline.trtllm.llmapi_facts import (
    facts_for,
    field_problems,
    known_versions,
)
from pipeline.validate.severity import ERROR

# what the CPU llmapi model can build from model.yaml: the methods of both the LLM API and the CPU engine
REFERENCE_LLMAPI_METHODS = tuple(name for name, m in METHODS.items() if {LLM_API, REFERENCE} <= m.runtimes)
LLM_API_MIN_VERSION = (1, 2)
LLM_API_QUANT_FORMATS = ("none", "fp8", "int4_awq")  # ModelOpt hf_ptq exports the project plans
LLM_API_KV_DTYPES = ("auto", "fp8")
_PLACEHOLDER_DIRS = {"baseline": "<target>", "speculative": "<target>", "draft": "<draft>"}


def check_runtime(ctx) -> None:
    """Runtime × version × backend × method: the rules that decide whether anything can run."""
    cfg = ctx.cfg
    version = cfg.trtllm_version_tuple[:2]
    if cfg.backend == "reference":
        if cfg.llmapi_layout:
            _check_reference_llmapi(ctx)
            return
        if REFERENCE not in cfg.method_info.runtimes:
            ctx.add(ERROR, "method", f"method {cfg.method} runs on the TensorRT-LLM LLM API only; the CPU reference "
                    "engine lacks it", "use backend trtllm with trtllm_runtime llm_api, or another method",
                    "speculation.method")
        return
    if cfg.runtime == "engine":
        _check_engine_runtime(ctx, version)
    else:
        _check_llm_api_runtime(ctx, version)


def _check_reference_llmapi(ctx) -> None:
    """``backend: reference`` + ``trtllm_runtime: llm_api``: the CPU engine behind the llmapi layout
    (``pipeline.triton_models.llmapi``). It reads ``model.yaml`` as upstream's model does, so the
    config must be one the recorded facts accept, and one the CPU engine can honour."""
    cfg = ctx.cfg
    if facts_for(cfg.trtllm_version) is None:
        ctx.add(ERROR, "version", f"no LLM-API facts are recorded for TensorRT-LLM {cfg.trtllm_version} (recorded: "
                f"{', '.join(known_versions())}); the llmapi model.yaml could not be checked",
                "use a recorded release line (e.g. 1.2.1)", "trtllm_version")
        return
    if cfg.method not in REFERENCE_LLMAPI_METHODS:
        why = (f"{cfg.method} is engine-only upstream" if cfg.method_info.engine_only_decoding_type
               else f"the CPU reference engine has no {cfg.method} proposer on the llmapi layout yet")
        ctx.add(ERROR, "method", f"method {cfg.method} cannot run on the CPU llmapi layout: {why}",
                f"use one of {', '.join(REFERENCE_LLMAPI_METHODS)}, or remove trtllm_runtime", "speculation.method")
        return
    cfg.method_info.check_cpu_llmapi_layout(ctx)
    for path in ("extra_llm_args", "extra_speculative_config"):
        if getattr(cfg.llm_api, path):
            ctx.add(ERROR, "llm-args", "the CPU reference engine honours no pass-through LLM arguments (it reads "
                    "model, max_batch_size, max_seq_len and speculative_config from model.yaml)",
                    f"remove llm_api.{path}", f"llm_api.{path}")
    _check_method_on_llm_api(ctx, facts_for(cfg.trtllm_version))
    _check_args(ctx)


def _check_engine_runtime(ctx, version: tuple[int, ...]) -> None:
    cfg = ctx.cfg
    if version > ENGINE_RUNTIME_MAX_VERSION:
        ctx.add(ERROR, "version", f"TensorRT-LLM {cfg.trtllm_version} no longer ships the engine path "
                "(trtllm-build, convert_checkpoint.py, the C++ tensorrtllm backend: NVIDIA/TensorRT-LLM PRs "
                "#15763, #15907)", "set trtllm_runtime: llm_api, or pin trtllm_version to 1.2.x (e.g. 1.2.1)",
                "trtllm_version")
    if ENGINE in cfg.method_info.runtimes:
        cfg.method_info.check_engine_runtime(ctx)
    else:
        ctx.add(ERROR, "method", f"method {cfg.method} runs on the LLM API only (PyTorch backend); the engine "
                "runtime has no such decoding mode", "set trtllm_runtime: llm_api (TensorRT-LLM ≥ 1.2)",
                "speculation.method")


def _check_llm_api_runtime(ctx, version: tuple[int, ...]) -> None:
    cfg = ctx.cfg
    facts = facts_for(cfg.trtllm_version)
    if version < LLM_API_MIN_VERSION or facts is None:
        ctx.add(ERROR, "version", f"no LLM-API facts are recorded for TensorRT-LLM {cfg.trtllm_version} (recorded: "
                f"{', '.join(known_versions())}); the generated LLM arguments could not be checked",
                "use a recorded release line, or add its section to pipeline/trtllm/llmapi_facts.yaml from "
                "tensorrt_llm/llmapi/llm_args.py at that tag", "trtllm_version")
        return
    method = cfg.method_info
    if method.engine_only_decoding_type:
        reason = method.engine_only_reason or facts.engine_only_reason(method.engine_only_decoding_type)
        ctx.add(ERROR, "method", f"method {cfg.method} is engine-only: {reason}",
                "use eagle3 (an EAGLE-3 draft checkpoint) on llm_api, or trtllm_runtime: engine with "
                "trtllm_version 1.2.x", "speculation.method")
        return
    decoding = method.llmapi_decoding_type
    if decoding and facts.decoding_type(decoding) is None:
        ctx.add(ERROR, "method", f"TensorRT-LLM {facts.line} has no {decoding} decoding_type "
                f"({facts.citation()})", "pick a method this version has", "speculation.method")
        return
    _check_method_on_llm_api(ctx, facts)
    _check_args(ctx)


def _check_method_on_llm_api(ctx, facts) -> None:
    ctx.cfg.method_info.check_llm_api(ctx, facts)


def _check_args(ctx) -> None:
    """The user's pass-through sections (named by their own field paths), then what the project
    generates, against the version's facts."""
    cfg = ctx.cfg
    facts = facts_for(cfg.trtllm_version)
    where = f"TensorRT-LLM {facts.line} LLM arguments ({facts.citation()})"
    problems = field_problems(cfg.llm_api.extra_llm_args, facts.llm_args, "llm_api.extra_llm_args", where)
    for problem in problems:
        _add_path_problem(ctx, problem, "the LLM accepts only these arguments")
    variant = "speculative" if cfg.speculative else "baseline"
    args = llm_args(cfg, _PLACEHOLDER_DIRS, variant)
    spec = args.get("speculative_config")
    extra_spec = cfg.llm_api.extra_speculative_config
    if extra_spec and not isinstance(spec, dict):
        ctx.add(ERROR, "llm-args", "speculative_config fields need a speculative method", "remove the section",
                "llm_api.extra_speculative_config")
    if isinstance(spec, dict):
        decoding = facts.decoding_type(spec["decoding_type"])
        name = f"{spec['decoding_type'].replace('_', '')}DecodingConfig of TensorRT-LLM {facts.line}"
        for problem in field_problems(extra_spec, decoding["fields"], "llm_api.extra_speculative_config", name):
            _add_path_problem(ctx, problem, "the decoding config accepts only these fields")
        own = {k: v for k, v in spec.items() if k not in extra_spec}
        for problem in decoding_problems(cfg, own, "speculation"):
            _add_path_problem(ctx, problem, "fix the field")
    generated = {k: v for k, v in args.items() if k not in cfg.llm_api.extra_llm_args and k != "speculative_config"}
    for problem in field_problems(generated, facts.llm_args, "", where):
        ctx.add(ERROR, "llm-args", f"generated LLM argument {problem}", "report this: the facts file and "
                "pipeline/trtllm/llmapi_args.py disagree", "trtllm_version")


def _add_path_problem(ctx, problem: str, fix: str) -> None:
    path, message = problem.split(": ", 1)
    ctx.add(ERROR, "llm-args", message, fix, path)


# ----------------------------------------------------------------------------------------------
# Quantization, MTP target, EAGLE-3 head


def check_quantization(ctx) -> None:
    """ModelOpt (examples/llm_ptq/hf_ptq.py) exports the formats the plan quantizes to; the
    LLM API reads the result (hf_quant_config.json) as it is."""
    cfg = ctx.cfg
    if not cfg.runs_llm_api:
        return
    models = [("target", cfg.target)] + ([("speculation.draft", cfg.draft)] if cfg.draft is not None else [])
    for path, spec in models:
        q = spec.quantization
        if q.format not in LLM_API_QUANT_FORMATS:
            ctx.add(ERROR, "gpu-quant", f"the LLM-API plan quantizes to {', '.join(LLM_API_QUANT_FORMATS[1:])} "
                    f"(ModelOpt hf_ptq.py), not {q.format}", "use fp8 on Hopper or int4_awq on Ampere, or point "
                    "checkpoint at a ModelOpt-exported directory with format none", f"{path}.quantization.format")
        if q.kv_cache_dtype not in LLM_API_KV_DTYPES:
            ctx.add(ERROR, "kv-dtype", f"KV-cache dtype {q.kv_cache_dtype} is not planned on the LLM-API runtime",
                    "use auto or fp8", f"{path}.quantization.kv_cache_dtype")
