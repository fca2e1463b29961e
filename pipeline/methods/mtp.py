"""MTP: the target's own multi-token-prediction layers propose (``MTPDecodingConfig``);
DeepSeek-family targets on the LLM-API runtime only.

Reads and writes nothing (its shape rule reads the target's ``config.json``); registered in
:mod:`pipeline.methods` as ``mtp``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field

from pipeline.config_base import Section, described
from pipeline.facts.model_shapes import read_config_json
from pipeline.methods.base import LLM_API, Method
from pipeline.methods.drafting import DraftPlan, chain_plan
from pipeline.methods.eagle3 import chain_head_seconds
from pipeline.trtllm.llmapi_facts import load_facts
from pipeline.validate.severity import ERROR, INFO

if TYPE_CHECKING:
    from pipeline.methods.base import CheckContext, DeploymentConfig


class MtpSpec(Section):
    """Multi-token prediction with the target's own MTP layers (``MTPDecodingConfig``): DeepSeek-family
    targets only; LLM-API runtime only."""

    method: Literal["mtp"] = described("Speculation method: MTP layers of a DeepSeek-family target (LLM-API runtime).")
    num_nextn_predict_layers: Annotated[int, Field(ge=1, le=8)] = described(
        "MTP modules used; each proposes one token (speculative_config.num_nextn_predict_layers).", default=1
    )


class MtpMethod(Method):
    name = "mtp"
    vllm_method = "mtp"  # the schedule's vLLM form (pipeline/schedule/forms.py)
    section = MtpSpec
    title = "MTP"
    runtimes = frozenset({LLM_API})
    llmapi_decoding_type = "MTP"

    def draft_plan(self, spec: MtpSpec) -> DraftPlan:
        return chain_plan(self.name, spec.num_nextn_predict_layers, spec)

    def draft_seconds(self, ctx: Any, plan: DraftPlan) -> float:
        """Priced as an EAGLE-3 head's chain: one MTP module per drafted token."""
        return chain_head_seconds(ctx, plan)

    def check_shapes(self, ctx: CheckContext) -> None:
        target_dir, target_config = ctx.dirs.get("target"), None
        if target_dir is not None and (target_dir / "config.json").is_file():
            try:
                target_config = read_config_json(target_dir)
            except (OSError, ValueError):
                target_config = None  # reported by the shape loader
        check_mtp_target(ctx, target_dir, target_config, ctx.shapes.get("target"))

    def speculative_config(self, cfg: DeploymentConfig, spec: MtpSpec, engines: dict[str, str]) -> dict[str, Any]:
        return {"num_nextn_predict_layers": spec.num_nextn_predict_layers}


def check_mtp_target(ctx: CheckContext, target_dir: Path | None, target_config: dict | None, shape) -> None:
    """MTP runs the target's own next-n layers: DeepSeek-V3-family checkpoints only."""
    allowed = load_facts()["mtp_targets"]
    if target_config is not None:
        model_type = target_config.get("model_type")
        arch = (target_config.get("architectures") or [None])[0]
        seen = f"model_type {model_type!r}, architecture {arch!r}"
    elif shape is not None:
        model_type, arch, seen = None, shape.architecture, f"architecture {shape.architecture!r} ({shape.source})"
    else:
        ctx.add(INFO, "method", "MTP target family not checked: no config.json here and not a known model", "",
                "target.checkpoint")
        return
    if model_type not in allowed["model_types"] and arch not in allowed["architectures"]:
        ctx.add(ERROR, "method", f"MTP needs a DeepSeek-family target with MTP layers, got {seen} "
                f"({allowed['source']})", "use a DeepSeek-V3/R1 checkpoint, or eagle3 / draft_target / ngram",
                "target.checkpoint")
    elif target_config is not None and int(target_config.get("num_nextn_predict_layers") or 0) < 1:
        ctx.add(ERROR, "method", f"{target_dir}/config.json has no num_nextn_predict_layers: the checkpoint ships "
                "no MTP layers", "use the full DeepSeek checkpoint (its MTP layers included)", "target.checkpoint")


METHOD = MtpMethod()
