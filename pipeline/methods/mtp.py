"""MTP: the target's own multi-token-prediction layers propose (``MTPDecodingConfig``);
DeepSeek-family targets on the LLM-API runtime only.

Reads and writes nothing (its shape rule reads the target's ``config.json``); registered in
:mod:`pipeline.methods` as ``mtp``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field

from pipeline.config.base import Section, described
from pipeline.methods.base import LLM_API, Method

if TYPE_CHECKING:
    from pipeline.config import DeploymentConfig
    from pipeline.validate.findings import CheckContext


class MtpSpec(Section):
    """Multi-token prediction with the target's own MTP layers (``MTPDecodingConfig``): DeepSeek-family
    targets only; LLM-API runtime only."""

    method: Literal["mtp"] = described("Speculation method: MTP layers of a DeepSeek-family target (LLM-API runtime).")
    num_nextn_predict_layers: Annotated[int, Field(ge=1, le=8)] = described(
        "MTP modules used; each proposes one token (speculative_config.num_nextn_predict_layers).", default=1
    )


class MtpMethod(Method):
    name = "mtp"
    section = MtpSpec
    title = "MTP"
    runtimes = frozenset({LLM_API})
    llmapi_decoding_type = "MTP"

    def check_shapes(self, ctx: CheckContext) -> None:
        from pipeline.trtllm.llmapi_checks import check_mtp_target  # noqa: PLC0415 - validate's module, loaded by validate
        from pipeline.validate.model_shapes import read_config_json  # noqa: PLC0415 - same

        target_dir, target_config = ctx.dirs.get("target"), None
        if target_dir is not None and (target_dir / "config.json").is_file():
            try:
                target_config = read_config_json(target_dir)
            except (OSError, ValueError):
                target_config = None  # reported by the shape loader
        check_mtp_target(ctx, target_dir, target_config, ctx.shapes.get("target"))

    def speculative_config(self, cfg: DeploymentConfig, spec: MtpSpec, engines: dict[str, str]) -> dict[str, Any]:
        return {"num_nextn_predict_layers": spec.num_nextn_predict_layers}


METHOD = MtpMethod()
