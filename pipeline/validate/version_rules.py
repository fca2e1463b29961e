"""Honest versions: ``trtllm_version`` is a published release or a release candidate named as one,
and the ``container_image`` carries it.

Reads the config and the recorded versions (:mod:`pipeline.trtllm.versions`: PyPI's list, the
images' TensorRT-LLM per tensorrtllm_backend's Dockerfile) and, for a release candidate, the facts
of its release line that are carried over unverified (``pipeline/trtllm/llmapi_facts.yaml``:
``*_inferred`` / ``inferred`` / ``unverified`` entries). Adds findings to the preflight context;
writes nothing.
"""

from __future__ import annotations

from pipeline.trtllm.llmapi_facts import facts_for
from pipeline.trtllm.versions import version_problems
from pipeline.validate.findings import INFO


def unverified_facts(version: str) -> list[str]:
    """What the facts of ``version``'s release line carry over without having been read there."""
    facts = facts_for(version)
    if facts is None:
        return [f"no LLM-API facts are recorded for the {version} line at all"]
    out = [f"{key.removesuffix('_inferred')}: {text}" for key, text in facts.data.items() if key.endswith("_inferred")]
    out += [f"{name}: {entry['inferred']}" for name, entry in facts.data["decoding_types"].items() if "inferred" in entry]
    out += [f"{field}: {why}" for field, why in (facts.data.get("unverified") or {}).items()]
    return out


def check_versions(ctx) -> None:
    cfg = ctx.cfg
    if cfg.backend != "trtllm" and not cfg.llmapi_layout:
        return  # the CPU reference engine runs no TensorRT-LLM; its trtllm_version is unused
    explicit = "container_image" in cfg.triton.model_fields_set
    unverified = unverified_facts(cfg.trtllm_version)
    problems = version_problems(cfg.trtllm_version, cfg.triton.container_image, explicit, unverified)
    for problem in problems:
        if cfg.backend != "trtllm" and problem.field == "triton.container_image":
            continue  # no image on the CPU path
        ctx.add(problem.severity, "version", problem.message, problem.fix, problem.field)
    if cfg.runs_llm_api and unverified and not any(p.field == "trtllm_version" for p in problems):
        ctx.add(INFO, "version", f"LLM-API facts of TensorRT-LLM {cfg.trtllm_version} not verified at its tag: "
                + "; ".join(unverified), "run `specdeploy validate CONFIG --live` in the container: it loads "
                "model.yaml into the installed classes", "trtllm_version")
