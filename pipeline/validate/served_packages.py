"""The third-party packages our served Python models import inside Triton (preprocessing,
postprocessing, tensorrt_llm_bls; pipeline/triton_models/), the versions they need, and the ones
installed here. On a GPU host these come from the container, not from our extras (docs/install.md),
so `doctor` shows them and scripts/ngc-pinned-env.sh tests the models at the container's pins.

Reads installed package metadata (importlib.metadata; imports none of the packages) and
``ngc_image_packages.yaml`` beside this module (the container's pins, each with its source).
Writes nothing. ``python -m pipeline.validate.served_packages --requirements`` prints the
container pins as pip requirements, one a line."""

from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path
from typing import NamedTuple

import yaml
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

NGC_PACKAGES_FILE = Path(__file__).with_name("ngc_image_packages.yaml")

# What the served models need, and why. transformers 4.x and 5.x are both tested
# (scripts/ngc-pinned-env.sh runs the models' tests at the container's 4.x pin).
SERVED_MODEL_NEEDS: dict[str, tuple[str, str]] = {
    "numpy": (">=1.24", "every served model (tensors)"),
    "tokenizers": (">=0.20", "pre/postprocessing: a checkpoint with tokenizer.json"),
    "transformers": (">=4.57,<6", "pre/postprocessing: a checkpoint without tokenizer.json (AutoTokenizer)"),
    "sentencepiece": (">=0.1.99", "pre/postprocessing: a SentencePiece tokenizer.model"),
    "protobuf": (">=4", "transformers 4.x reading a SentencePiece tokenizer.model"),
}


class ServedPackage(NamedTuple):
    installed: str | None  # the installed version, None when the package is absent
    required: str  # the range the served models need (a PEP 440 specifier set)


def installed_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def served_model_packages() -> dict[str, ServedPackage]:
    """name → (installed version or None, the range the served models need)."""
    return {name: ServedPackage(installed_version(name), needed) for name, (needed, _) in SERVED_MODEL_NEEDS.items()}


def satisfies(version: str | None, required: str) -> bool:
    if version is None:
        return False
    try:
        return Version(version) in SpecifierSet(required)
    except InvalidVersion:
        return False


def verdict(package: ServedPackage) -> str:
    if package.installed is None:
        return "not installed"
    return "ok" if satisfies(package.installed, package.required) else f"outside {package.required}"


def ngc_image_packages(path: Path = NGC_PACKAGES_FILE) -> dict:
    """The container record: image, tensorrt_llm, python and packages (pin, upstream, source)."""
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def ngc_requirements(path: Path = NGC_PACKAGES_FILE) -> list[str]:
    """The container's pins as pip requirement strings (``transformers==4.57.1``, ...)."""
    return [f"{name}{entry['pin']}" for name, entry in ngc_image_packages(path)["packages"].items()]


def main(argv: list[str]) -> int:
    if argv == ["--requirements"]:
        print("\n".join(ngc_requirements()))
        return 0
    if argv == ["--python"]:
        print(ngc_image_packages()["python"])
        return 0
    print("usage: python -m pipeline.validate.served_packages --requirements | --python", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))


def doctor_report() -> dict[str, dict]:
    """``doctor``'s section: per package the installed version, the needed range, the verdict and
    what needs it."""
    return {name: {"installed": package.installed, "required": package.required, "verdict": verdict(package),
                   "needed_for": SERVED_MODEL_NEEDS[name][1]}
            for name, package in served_model_packages().items()}


def doctor_rows(report: dict[str, dict]) -> list[tuple[str, str]]:
    """The section as (label, value) table rows."""
    return [(f"served models: {name}", f"{entry['installed'] or 'not installed'} (need {entry['required']}: "
             f"{entry['verdict']}; {entry['needed_for']})") for name, entry in report.items()]
