"""The Python packages our served models import (pre/post-processing, BLS, the llmapi helpers),
at the versions installed, against what specdeploy and the installed TensorRT-LLM each require.

Reads installed distribution metadata only (``importlib.metadata``: versions, and the
requirements of ``specdeploy`` — base + ``serving`` extra — and of ``tensorrt_llm``); imports
nothing. Writes nothing. Issue #28 item 3 (the container's own packages, ``doctor``'s package
section) is another module's; :func:`served_model_packages` is this preflight's own small version.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.version import InvalidVersion, Version

from pipeline.validate.live.result import LiveCheck, failed, passed

SERVED_MODEL_PACKAGES = ("transformers", "tokenizers", "numpy", "torch")
PYPROJECT = Path(__file__).resolve().parents[3] / "pyproject.toml"


@dataclass(frozen=True)
class PackageState:
    name: str
    installed: str | None
    requirements: tuple[tuple[str, str], ...]  # (who requires it, specifier)

    def violations(self) -> list[str]:
        if self.installed is None:
            return [f"{who} needs {self.name}{spec or ''}" for who, spec in self.requirements]
        try:
            version = Version(self.installed)
        except InvalidVersion:
            return []
        return [f"{who} needs {self.name}{spec}" for who, spec in self.requirements
                if spec and not Requirement(f"{self.name}{spec}").specifier.contains(version, prereleases=True)]


def _installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _specdeploy_requirements() -> list[str]:
    try:
        return list(metadata.requires("specdeploy") or [])
    except metadata.PackageNotFoundError:
        data = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]
        return list(data["dependencies"]) + [f'{r}; extra == "serving"' for r in data["optional-dependencies"]["serving"]]


def _trtllm_requirements() -> list[str]:
    for name in ("tensorrt_llm", "tensorrt-llm"):
        try:
            return list(metadata.requires(name) or [])
        except metadata.PackageNotFoundError:
            continue
    return []


def _applies(req: Requirement, extras: tuple[str, ...]) -> bool:
    if req.marker is None:
        return True
    return any(req.marker.evaluate({"extra": extra}) for extra in extras)


def served_model_packages() -> list[PackageState]:
    """Each package the served models import: installed version and every requirement on it."""
    wanted: dict[str, list[tuple[str, str]]] = {name: [] for name in SERVED_MODEL_PACKAGES}
    sources = (("specdeploy[serving]", _specdeploy_requirements(), ("serving",)),
               ("tensorrt_llm", _trtllm_requirements(), ("",)))
    for who, lines, extras in sources:
        for line in lines:
            req = Requirement(line)
            name = req.name.lower()
            if name in wanted and _applies(req, extras):
                wanted[name].append((who, str(req.specifier)))
    return [PackageState(name, _installed(name), tuple(reqs)) for name, reqs in wanted.items()]


def check_packages() -> list[LiveCheck]:
    out = []
    for state in served_model_packages():
        expected = "; ".join(f"{who}: {spec or 'any'}" for who, spec in state.requirements) or "not required"
        source = "installed metadata of specdeploy and tensorrt_llm"
        name = f"package {state.name}"
        found = state.installed or "not installed"
        problems = state.violations() if state.requirements else []
        if problems:
            out.append(failed(name, expected, source, found, "; ".join(problems) + ": install specdeploy with the "
                              "GPU-host install (docs/gpu-runbook.md) so it leaves TensorRT-LLM's packages alone"))
        else:
            out.append(passed(name, expected, source, found))
    return out
