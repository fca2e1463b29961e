"""Tensor names and shapes of Hugging Face weight files, read without loading the weights.

Reads ``*.safetensors`` (the JSON header only), ``pytorch_model*.bin`` / ``*.pt`` / ``*.pth``
(``torch.load(weights_only=True, mmap=True)``: tensors and plain containers only, never arbitrary
pickled objects, and the data stays on disk) and ``*.index.json`` shard maps. Writes nothing.
Preflight uses it to accept the formats checkpoints really ship (Vicuna-7B v1.3's sharded
``.bin``, FasterDecoding's ``medusa_lm_head.pt``, EAGLE heads' ``pytorch_model.bin``) and still
check their shapes.
"""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.validate.weight_integrity import PICKLE_SUFFIXES, HeaderError, read_safetensors_header

Shapes = dict[str, tuple[int, ...]]


class UnreadableWeights(Exception):
    """The file's tensor list cannot be read here (the message says why)."""


def safetensors_shapes(path: Path) -> Shapes:
    try:
        return read_safetensors_header(path).shapes()
    except (OSError, HeaderError) as exc:
        raise UnreadableWeights(f"{path}: not a readable safetensors header ({exc})") from None


def pickle_shapes(path: Path) -> Shapes:
    """Shapes from a torch-saved state dict; refuses anything but tensors (weights_only)."""
    try:
        import torch  # noqa: PLC0415 - optional: torch (the reference extra; only a .bin/.pt checkpoint needs it, and its absence is reported)
    except ImportError:
        raise UnreadableWeights(f"{path}: reading .bin/.pt tensor names needs torch, which is not installed") from None
    state = None
    for mmap in (True, False):  # mmap needs the zip format; older legacy files load without it
        try:
            state = torch.load(str(path), map_location="cpu", weights_only=True, mmap=mmap)
            break
        except Exception as exc:  # noqa: BLE001 - torch raises RuntimeError, UnpicklingError, … for bad files
            error = exc
    if state is None:
        raise UnreadableWeights(f"{path}: not loadable as tensors only ({error})")
    if not isinstance(state, dict):
        raise UnreadableWeights(f"{path}: holds a {type(state).__name__}, not a state dict")
    return {str(k): tuple(v.shape) for k, v in state.items() if hasattr(v, "shape")}


def tensor_shapes(path: Path) -> Shapes:
    if path.suffix == ".safetensors":
        return safetensors_shapes(path)
    if path.suffix in PICKLE_SUFFIXES:
        return pickle_shapes(path)
    raise UnreadableWeights(f"{path}: unknown weight format")


def index_problems(directory: Path) -> list[str]:
    """Shards that a ``*.index.json`` names but the directory lacks, and unreadable indexes."""
    problems = []
    for index in sorted(directory.glob("*.index.json")):
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            shards = sorted(set(weight_map.values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            problems.append(f"{index.name} is not a readable shard index ({exc})")
            continue
        missing = [s for s in shards if not (directory / s).is_file()]
        if missing:
            problems.append(f"{index.name} names shards that are missing: {', '.join(missing)}")
    return problems
