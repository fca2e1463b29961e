"""Which TensorRT-LLM versions exist, and which one each Triton NGC image carries.

Reads ``pipeline/trtllm/versions.yaml`` (once per process; sources per entry: PyPI's version list,
the docs site, tensorrtllm_backend's ``rYY.MM`` Dockerfile). Writes nothing.
:func:`version_problems` is what ``validate`` says about a config's ``trtllm_version`` and
``container_image``: a version that was never published, a release candidate (named, with the facts
carried over unverified for it), an image that carries another version, a version no known image
carries without an explicit image.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from packaging.version import InvalidVersion, Version

VERSIONS_PATH = Path(__file__).with_name("versions.yaml")
_IMAGE_TAG = re.compile(r"tritonserver:(\d\d\.\d\d)-trtllm-python-py3$")


@functools.lru_cache(maxsize=1)
def load_versions() -> dict[str, Any]:
    return yaml.safe_load(VERSIONS_PATH.read_text(encoding="utf-8"))


def releases() -> list[str]:
    return list(load_versions()["releases"]["versions"])


def release_candidate_lines() -> dict[str, dict[str, Any]]:
    return {entry["line"]: entry for entry in load_versions()["release_candidates"]}


def image_tag(image: str) -> str | None:
    """``nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3`` → ``26.04``; None for other images."""
    match = _IMAGE_TAG.search(image)
    return match.group(1) if match else None


def image_trtllm(image: str) -> str | None:
    """The TensorRT-LLM version recorded for ``image``, or None when the image is not recorded."""
    tag = image_tag(image)
    entry = load_versions()["images"]["carries"].get(tag) if tag else None
    return entry["trtllm"] if entry else None


def images_carrying(version: str) -> list[str]:
    data = load_versions()["images"]
    return [data["pattern"].format(tag=tag) for tag, entry in data["carries"].items() if entry["trtllm"] == version]


def image_source() -> str:
    s = load_versions()["images"]["source"]
    return f"{s['repo']} {s['path']}"


def same_version(a: str, b: str) -> bool:
    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a == b


@dataclass(frozen=True)
class VersionProblem:
    severity: str  # error | warning
    field: str
    message: str
    fix: str


def version_problems(version: str, image: str, image_explicit: bool, unverified: list[str]) -> list[VersionProblem]:
    """What ``validate`` says about ``trtllm_version`` (``unverified``: the facts carried over
    unverified for its release line) and ``container_image``."""
    out = _release_problems(version, unverified)
    carried = image_trtllm(image)
    if carried is not None and not same_version(carried, version):
        carriers = images_carrying(version)
        out.append(VersionProblem(
            "error", "triton.container_image",
            f"{image} carries TensorRT-LLM {carried} ({image_source()} at r{image_tag(image)}), not trtllm_version "
            f"{version}: the build and the server would run {carried} against a config checked for {version}",
            f"set trtllm_version: \"{carried}\"" + (f", or container_image: {carriers[-1]}" if carriers else
                                                    ", or name an image that carries it in triton.container_image")))
    elif carried is None and not image_explicit:
        out.append(VersionProblem(
            "error", "triton.container_image",
            f"no recorded image carries TensorRT-LLM {version} (recorded: pipeline/trtllm/versions.yaml)",
            "name the image that carries it in triton.container_image"))
    return out


def _release_problems(version: str, unverified: list[str]) -> list[VersionProblem]:
    try:
        parsed = Version(version)
    except InvalidVersion:
        return [VersionProblem("error", "trtllm_version", f"'{version}' is not a version PEP 440 can read",
                               "use a published version such as 1.2.1")]
    if version in releases() or (not parsed.is_prerelease and any(same_version(version, r) for r in releases())):
        return []
    line = f"{parsed.major}.{parsed.minor}"
    candidates = release_candidate_lines().get(line)
    if parsed.is_prerelease:
        if candidates is None:
            return [VersionProblem("error", "trtllm_version", f"{version} is a pre-release of a line with no recorded "
                                   "release candidates", "use a published release such as 1.2.1")]
        carried = "; ".join(unverified) if unverified else "none recorded"
        return [VersionProblem("warning", "trtllm_version", f"{version} is a release candidate, not a release "
                               f"({candidates['versions']}); facts carried over unverified for it: {carried}",
                               "run `specdeploy validate CONFIG --live` in the container to check them against "
                               "the installed TensorRT-LLM")]
    hint = (f"the {line} line has release candidates only ({candidates['versions']}): name one, e.g. "
            f"{candidates['last']}" if candidates else f"published: {', '.join(releases()[-4:])}")
    return [VersionProblem("error", "trtllm_version", f"TensorRT-LLM {version} was never published ({hint})",
                           f"use a published release (latest {releases()[-1]}) or name a release candidate")]
