"""On the LLM-API runtime: each arm's ``model.yaml`` LLM arguments (and ``speculative_config``)
loaded into the installed ``tensorrt_llm`` LLM-args classes — pydantic validation only, no model
load, no GPU work — so an unknown or renamed field is named with the installed class.

Reads the rendered ``engines/NAME/model_repo/<arm>/tensorrt_llm/1/model.yaml`` and
``engines/NAME/trtllm-serve/<arm>/extra_llm_api_options.yaml`` when ``render`` has run, else the
arguments render would write (:func:`pipeline.trtllm.llmapi_args.llm_args`, with the config's
checkpoint directories). The child interpreter (:mod:`.probe`) builds
``DecodingBaseConfig.from_dict(speculative_config)`` and ``TorchLlmArgs(**args)`` from
``tensorrt_llm.llmapi.llm_args``. Writes nothing.
"""

from __future__ import annotations

from typing import Any

import yaml

from pipeline.config import DeploymentConfig
from pipeline.paths import engine_root, model_repo_dir
from pipeline.trtllm.llmapi_args import llm_args
from pipeline.trtllm.llmapi_facts import facts_for
from pipeline.validate.live.probe import MARKER, run_probe
from pipeline.validate.live.result import LiveCheck, failed, passed, skipped

_VALIDATE_CODE = f"""
import json, sys
payload = json.load(sys.stdin)
try:
    from tensorrt_llm.llmapi import llm_args as mod
except Exception as exc:
    print({MARKER!r} + json.dumps({{"error": f"{{type(exc).__name__}}: {{exc}}"}}))
    raise SystemExit(0)

def errors(exc, prefix):
    if hasattr(exc, "errors"):
        return [{{"loc": prefix + ".".join(str(p) for p in e["loc"]), "msg": e["msg"]}} for e in exc.errors()]
    return [{{"loc": prefix.rstrip("."), "msg": f"{{type(exc).__name__}}: {{exc}}"}}]

out = {{}}
for label, args in payload.items():
    args = dict(args)
    spec = args.pop("speculative_config", None)
    problems = []
    if isinstance(spec, dict):
        decoding = getattr(mod, "DecodingBaseConfig")
        try:
            spec = decoding.from_dict(dict(spec))
        except Exception as exc:
            problems += errors(exc, "speculative_config.")
            spec = None
        else:
            problems += [{{"class": type(spec).__name__}}]
    try:
        mod.TorchLlmArgs(**args, speculative_config=spec)
    except Exception as exc:
        problems += errors(exc, "")
    out[label] = problems
print({MARKER!r} + json.dumps({{"results": out}}))
"""


def arm_args(cfg: DeploymentConfig) -> dict[str, tuple[dict[str, Any], str]]:
    """label → (LLM arguments, where they come from)."""
    out: dict[str, tuple[dict[str, Any], str]] = {}
    draft = getattr(cfg.speculation, "head_dir", None) or (cfg.draft.checkpoint if cfg.draft else None)
    dirs = {"baseline": cfg.target.checkpoint, "speculative": cfg.target.checkpoint, "draft": draft or ""}
    variants = ["baseline"] + (["speculative"] if cfg.speculative else [])
    for variant in variants:
        model_yaml = model_repo_dir(cfg, variant) / "tensorrt_llm" / "1" / "model.yaml"
        serve_yaml = engine_root(cfg) / "trtllm-serve" / variant / "extra_llm_api_options.yaml"
        if model_yaml.is_file():
            data = yaml.safe_load(model_yaml.read_text(encoding="utf-8")) or {}
            data.pop("triton_config", None)
            out[f"{variant} model.yaml"] = (data, str(model_yaml))
        else:
            out[f"{variant} (to render)"] = (llm_args(cfg, dirs, variant), "the arguments render would write")
        if serve_yaml.is_file():
            data = yaml.safe_load(serve_yaml.read_text(encoding="utf-8")) or {}
            model = out.get(f"{variant} model.yaml", out.get(f"{variant} (to render)"))[0].get("model")
            out[f"{variant} extra_llm_api_options.yaml"] = ({"model": model, **data}, str(serve_yaml))
    return out


def _wrong_fact(cfg: DeploymentConfig, loc: str) -> str:
    facts = facts_for(cfg.trtllm_version)
    if facts is None:
        return ""
    parts = loc.split(".")
    if parts[0] == "speculative_config" and len(parts) > 1:
        spec = cfg.speculation
        decoding = next((d for d in facts.data["decoding_types"].values() if parts[1] in d["fields"]), None)
        if decoding is not None and getattr(spec, "method", None) != "none":
            return (f"recorded fact 'TensorRT-LLM {facts.line} decoding configs have field {parts[1]}' "
                    f"(pipeline/trtllm/llmapi_facts.yaml, {facts.citation()}) is wrong for this install")
        return ""
    if parts[0] in facts.llm_args:
        return (f"recorded fact 'TensorRT-LLM {facts.line} LLM arguments include {parts[0]}' "
                f"(pipeline/trtllm/llmapi_facts.yaml) is wrong for this install")
    return ""


def check_llm_args(cfg: DeploymentConfig, trtllm_found: bool) -> list[LiveCheck]:
    source_fact = "pipeline/trtllm/llmapi_facts.yaml (validate passed against it)"
    if not cfg.runs_llm_api:
        return [skipped("LLM args", "not used", f"trtllm_runtime {cfg.runtime}", "engine runtime: no model.yaml")]
    labels = arm_args(cfg)
    if not trtllm_found:
        return [skipped(f"LLM args {label}", "validates in TorchLlmArgs", source_fact, "no tensorrt_llm to load into")
                for label in labels]
    data, problem = run_probe(_VALIDATE_CODE, {label: args for label, (args, _) in labels.items()})
    if data is None or "error" in (data or {}):
        why = problem if data is None else data["error"]
        return [failed("LLM args", "tensorrt_llm.llmapi.llm_args importable", source_fact, why,
                       "run inside the TensorRT-LLM container")]
    out = []
    for label, (_, where) in labels.items():
        results = data["results"][label]
        classes = [r["class"] for r in results if "class" in r]
        errors = [r for r in results if "loc" in r]
        name = f"LLM args {label}"
        expected = f"validates in the installed TorchLlmArgs: {where}"
        if not errors:
            out.append(passed(name, expected, source_fact,
                              "accepted" + (f" (speculative_config → {classes[0]})" if classes else "")))
            continue
        lines = [f"{e['loc'] or '(model)'}: {e['msg']}" for e in errors]
        wrong = "; ".join(dict.fromkeys(w for w in (_wrong_fact(cfg, e["loc"]) for e in errors) if w))
        out.append(failed(name, expected, source_fact, "; ".join(lines),
                          "remove or rename the field named (llm_api.extra_llm_args / extra_speculative_config), "
                          "or set trtllm_version to the installed version so validate checks its facts", wrong))
    return out

