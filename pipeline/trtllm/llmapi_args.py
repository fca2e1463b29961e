"""The LLM arguments of one arm on the LLM-API runtime: what goes into the Triton ``llmapi``
model's ``model.yaml`` and into the ``trtllm-serve --extra_llm_api_options`` file.

Reads a validated :class:`DeploymentConfig` and the model directories the build produced (the
manifest's ``engines``: HF or ModelOpt checkpoint dirs, not engines); returns plain dicts (no
files written). Field names are TensorRT-LLM's (``tensorrt_llm/llmapi/llm_args.py``: TorchLlmArgs,
KvCacheConfig, CudaGraphConfig and the DecodingConfig subclasses); ``pipeline.trtllm.llmapi_facts``
checks them against the recorded facts of the configured version, user pass-through included.
"""

from __future__ import annotations

from typing import Any

from pipeline.config import DeploymentConfig
from pipeline.trtllm.llmapi_facts import facts_for, field_problems


def speculative_config(cfg: DeploymentConfig, engines: dict[str, str]) -> dict[str, Any] | None:
    """``speculative_config`` of the speculative arm (None for a method without an LLM-API decoding config)."""
    method = cfg.method_info
    if method.llmapi_decoding_type is None:
        return None
    out: dict[str, Any] = {"decoding_type": method.llmapi_decoding_type}
    out.update(method.speculative_config(cfg, cfg.speculation, engines))
    out.update(cfg.llm_api.extra_speculative_config)
    return out


def kv_cache_config(cfg: DeploymentConfig, free_fraction: float | None = None) -> dict[str, Any]:
    t, q = cfg.triton, cfg.target.quantization
    out: dict[str, Any] = {
        "enable_block_reuse": t.enable_kv_cache_reuse,
        "free_gpu_memory_fraction": round(free_fraction if free_fraction is not None else t.kv_cache_free_gpu_mem_fraction, 4),
        # a ModelOpt checkpoint's hf_quant_config.json carries its KV dtype, which "auto" follows
        "dtype": "fp8" if q.kv_cache_dtype == "fp8" and q.format == "none" else "auto",
    }
    if t.max_tokens_in_paged_kv_cache is not None:
        out["max_tokens"] = t.max_tokens_in_paged_kv_cache
    return out


def llm_args(cfg: DeploymentConfig, engines: dict[str, str], variant: str,
             free_fraction: float | None = None) -> dict[str, Any]:
    """The LLM arguments of ``variant`` (baseline | speculative), without Triton's own keys."""
    b, target, api = cfg.build, cfg.target, cfg.llm_api
    args: dict[str, Any] = {
        "model": engines[variant],
        "tensor_parallel_size": target.tp,
        "pipeline_parallel_size": target.pp,
        "trust_remote_code": target.trust_remote_code,
        "max_batch_size": b.max_batch_size,
        "max_num_tokens": b.max_num_tokens,
        "max_seq_len": b.max_seq_len,
        "max_beam_width": 1,
        "enable_chunked_prefill": cfg.triton.enable_chunked_context,
        "disable_overlap_scheduler": api.disable_overlap_scheduler,
        "return_perf_metrics": True,  # per-request acceptance (acceptance_rate, total_*_draft_tokens)
        "kv_cache_config": kv_cache_config(cfg, free_fraction),
        "cuda_graph_config": ({"max_batch_size": b.max_batch_size, "enable_padding": api.cuda_graph_padding}
                              if api.cuda_graphs else None),
    }
    if variant == "speculative":
        args["speculative_config"] = speculative_config(cfg, engines)
    args.update(api.extra_llm_args)
    return args


def args_problems(cfg: DeploymentConfig, args: dict[str, Any], spec_path: str = "speculative_config") -> list[str]:
    """Problems of generated LLM arguments against the configured version's facts: the LLM
    arguments, the nested configs, and ``speculative_config`` against its decoding_type."""
    facts = facts_for(cfg.trtllm_version)
    if facts is None:
        return [f"trtllm_version: no LLM-API facts recorded for {cfg.trtllm_version}"]
    where = f"TensorRT-LLM {facts.line} LLM arguments"
    problems = field_problems(args, facts.llm_args, "", where)
    spec = args.get("speculative_config")
    if isinstance(spec, dict):
        problems += decoding_problems(cfg, spec, spec_path)
    return problems


def decoding_problems(cfg: DeploymentConfig, spec: dict[str, Any], path: str) -> list[str]:
    facts = facts_for(cfg.trtllm_version)
    name = spec.get("decoding_type")
    decoding = facts.decoding_type(name) if facts else None
    if decoding is None:
        return [f"{path}.decoding_type: TensorRT-LLM {facts.line if facts else cfg.trtllm_version} has no "
                f"decoding_type {name!r}"]
    body = {k: v for k, v in spec.items() if k != "decoding_type"}
    where = f"{name}DecodingConfig of TensorRT-LLM {facts.line}".replace("_", "")
    problems = field_problems(body, decoding["fields"], path, where)
    problems += [f"{path}.{key}: required by {where}" for key in decoding.get("required", []) if body.get(key) is None]
    return problems
