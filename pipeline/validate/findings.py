"""What a preflight check reports and what it reads: :class:`Finding` and :class:`CheckContext`.

Every check in :mod:`pipeline.validate` takes a :class:`CheckContext` (the config, the hardware
profile, what the checks before it resolved) and appends findings to it. Reads and writes nothing.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pipeline.config import DeploymentConfig, ModelSpec
from pipeline.facts.hardware import HardwareProfile
from pipeline.facts.model_shapes import ModelShape
from pipeline.validate.severity import ERROR, INFO, WARNING  # noqa: F401 - re-exported: every check imports them from here


@dataclass
class Finding:
    severity: str  # error | warning | info
    check: str  # short id of the check, e.g. "gpu-quant"
    message: str
    fix: str = ""
    field: str = ""
    data: dict[str, Any] | None = None

    def line(self) -> str:
        where = f"{self.field}: " if self.field else ""
        return f"{where}{self.message}" + (f" (fix: {self.fix})" if self.fix else "")

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v not in (None, "")}


@dataclass
class CheckContext:
    cfg: DeploymentConfig
    profile: HardwareProfile
    offline: bool
    trtllm_root: str | None = None  # --trtllm-root, when given
    findings: list[Finding] = field(default_factory=list)
    dirs: dict[str, Path | None] = field(default_factory=dict)  # role → resolved dir (None = skipped)
    shapes: dict[str, ModelShape | None] = field(default_factory=dict)

    def add(self, severity: str, check: str, message: str, fix: str = "", field_path: str = "", **data: Any) -> None:
        self.findings.append(Finding(severity, check, message, fix, field_path, data or None))


# ----------------------------------------------------------------------------------------------
# Helpers


def spec_models(cfg: DeploymentConfig) -> list[tuple[str, ModelSpec]]:
    models = [("target", cfg.target)]
    if cfg.draft is not None:
        models.append(("speculation.draft", cfg.draft))
    return models


def spec_roles(cfg: DeploymentConfig) -> list[tuple[str, str, ModelSpec]]:
    return [("target" if path == "target" else "draft", path, spec) for path, spec in spec_models(cfg)]


def spec_checkpoints(cfg: DeploymentConfig) -> list[tuple[str, str, str]]:
    """(role, field path, checkpoint string) of every directory the deployment reads."""
    items = [("target", "target.checkpoint", cfg.target.checkpoint)]
    method = cfg.method_info
    if cfg.draft is not None:
        items.append(("draft", "speculation.draft.checkpoint", cfg.draft.checkpoint))
    elif method.head_field:
        items.append((method.head_role, f"speculation.{method.head_field}", getattr(cfg.speculation, method.head_field)))
    return items
