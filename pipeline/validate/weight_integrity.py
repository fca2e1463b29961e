"""Whether a checkpoint directory's weight files are whole and hold the model its config.json names.

Reads, for one checkpoint directory: the header of every ``*.safetensors`` file (the 8-byte
little-endian header length and the JSON header; never the tensor data), the file sizes, the
``*.safetensors.index.json`` shard maps, the central directory of zip-format ``.bin``/``.pt``/``.pth``
files (never unpickled) and ``config.json``. Writes nothing. A truncated download, a header that is
not JSON, a shard the index names but that is missing or lacks its tensors, tensors whose shapes
contradict config.json, or a config.json naming an architecture the deployment cannot load each
give one :class:`WeightProblem` naming the file, so ``validate`` (and the live preflight) stop there
instead of ``serve`` failing three stages later.

Entry points: :func:`checkpoint_problems` (everything for one role of a deployment) and, without a
config, :func:`weight_file_problems` (the files alone) and :func:`safetensors_problems` (one file).
"""

from __future__ import annotations

import json
import re
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipeline.config import DeploymentConfig

# safetensors refuses headers above 100 MB (safetensors/src/tensor.rs MAX_HEADER_SIZE); a larger
# declared length is a file of another format, not a large header.
MAX_HEADER_BYTES = 100_000_000
# Bytes per element of the safetensors dtypes whose width is a whole number of bytes
# (safetensors/src/tensor.rs Dtype); sub-byte dtypes (F4, F6_*) are not size-checked per tensor.
DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8,
}
PICKLE_SUFFIXES = (".bin", ".pt", ".pth")
_ZIP_MAGIC = b"PK\x03\x04"
_LAYER = re.compile(r"^(?:model\.)?layers\.(\d+)\.")


@dataclass(frozen=True)
class WeightProblem:
    """One reason a checkpoint cannot be loaded: ``message`` names ``file``; ``fix`` says what to do."""

    file: Path
    message: str
    fix: str

    def line(self) -> str:
        return f"{self.message} (fix: {self.fix})"


class HeaderError(ValueError):
    """A safetensors file whose header cannot be read; the message says why (not which file)."""


@dataclass(frozen=True)
class SafetensorsHeader:
    length: int  # bytes of JSON after the 8-byte length
    tensors: dict[str, dict]  # name → {"dtype", "shape", "data_offsets"}

    @property
    def declared_size(self) -> int:
        """The file size the header implies: length prefix + header + the end of the last tensor."""
        data_end = max((int(t["data_offsets"][1]) for t in self.tensors.values()), default=0)
        return 8 + self.length + data_end

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {name: tuple(int(d) for d in info["shape"]) for name, info in self.tensors.items()}


def read_safetensors_header(path: Path) -> SafetensorsHeader:
    """The parsed header of ``path`` (JSON only; the data is not read). HeaderError says what is
    wrong with it; OSError when the file cannot be opened."""
    with Path(path).open("rb") as handle:
        prefix = handle.read(8)
        if len(prefix) < 8:
            raise HeaderError(f"is {len(prefix)} bytes, shorter than a safetensors header length")
        (length,) = struct.unpack("<Q", prefix)
        if length > MAX_HEADER_BYTES:
            raise HeaderError(f"declares a {length}-byte header: not a safetensors file")
        raw = handle.read(length)
    if len(raw) < length:
        raise HeaderError(f"is truncated inside its header ({8 + len(raw)} bytes, the header alone needs {8 + length})")
    try:
        header = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise HeaderError(f"has a header that is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise HeaderError(f"has a header that is a JSON {type(header).__name__}, not an object")
    tensors = {name: info for name, info in header.items() if name != "__metadata__"}
    for name, info in tensors.items():
        problem = _entry_problem(info)
        if problem:
            raise HeaderError(f"has a malformed header entry {name!r}: {problem}")
    return SafetensorsHeader(length, tensors)


def _entry_problem(info: object) -> str | None:
    if not isinstance(info, dict):
        return "not an object"
    shape, offsets = info.get("shape"), info.get("data_offsets")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        return f"shape {shape!r}"
    if (not isinstance(offsets, list) or len(offsets) != 2 or not all(isinstance(o, int) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1]):
        return f"data_offsets {offsets!r}"
    itemsize = DTYPE_BYTES.get(str(info.get("dtype")))
    if itemsize is not None:
        numel = 1
        for d in shape:
            numel *= d
        if numel * itemsize != offsets[1] - offsets[0]:
            return (f"{info.get('dtype')} {shape} needs {numel * itemsize} bytes, its data_offsets span "
                    f"{offsets[1] - offsets[0]}")
    return None


def safetensors_problems(path: Path) -> list[str]:
    """Why ``path`` is not a whole safetensors file, each naming it; [] when it is."""
    try:
        header = read_safetensors_header(path)
        size = Path(path).stat().st_size
    except HeaderError as exc:
        return [f"{path} {exc}"]
    except OSError as exc:
        return [f"{path} cannot be read ({exc.strerror or exc})"]
    declared = header.declared_size
    if size < declared:
        return [f"{path} is truncated: its header declares {declared} bytes, the file has {size}"]
    if size > declared:
        return [f"{path} has {size - declared} bytes past the end its header declares ({declared} bytes): "
                "not a file safetensors loads"]
    return []


def pickle_archive_problem(path: Path) -> str | None:
    """Why a zip-format torch file (``torch.save`` since 1.6) is not whole, from its central
    directory alone; None when it opens or is a legacy (non-zip) pickle, which cannot be checked
    without unpickling."""
    try:
        with Path(path).open("rb") as handle:
            magic = handle.read(4)
        if magic != _ZIP_MAGIC:
            return None
        with zipfile.ZipFile(path) as archive:
            archive.namelist()
    except zipfile.BadZipFile as exc:
        return f"{path} is not a whole torch zip archive ({exc}): truncated or corrupt"
    except OSError as exc:
        return f"{path} cannot be read ({exc.strerror or exc})"
    return None


def _index_problems(directory: Path, index: Path, headers: dict[Path, SafetensorsHeader]) -> list[WeightProblem]:
    """Shards an index names that do not hold the tensors it places in them (missing shards and
    unreadable indexes are ``weight_files.index_problems``' findings)."""
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        placed = {str(name): str(shard) for name, shard in weight_map.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return []
    problems = []
    for shard in sorted(set(placed.values())):
        header = headers.get(directory / shard)
        if header is None:
            continue  # missing or unreadable: reported on its own
        absent = sorted(name for name, where in placed.items() if where == shard and name not in header.tensors)
        if absent:
            shown = ", ".join(absent[:3]) + (f" and {len(absent) - 3} more" if len(absent) > 3 else "")
            problems.append(WeightProblem(directory / shard, f"{index.name} places {shown} in {directory / shard}, "
                                          "which does not hold them", "download the checkpoint's shards again"))
    return problems


def weight_file_problems(directory: Path) -> tuple[list[WeightProblem], dict[str, tuple[int, ...]]]:
    """Every weight file of ``directory`` checked on its own (each safetensors file, each shard an
    index names, each zip-format pickle), and the tensor shapes of the whole ones (union over shards)."""
    directory = Path(directory)
    problems: list[WeightProblem] = []
    headers: dict[Path, SafetensorsHeader] = {}
    redownload = "download the file again (a partial download or copy leaves it short)"
    for path in sorted(directory.glob("*.safetensors")):
        found = safetensors_problems(path)
        problems += [WeightProblem(path, message, redownload) for message in found]
        if not found:
            headers[path] = read_safetensors_header(path)
    for index in sorted(directory.glob("*.safetensors.index.json")):
        problems += _index_problems(directory, index, headers)
    for path in sorted(p for p in directory.iterdir() if p.suffix in PICKLE_SUFFIXES and p.is_file()):
        message = pickle_archive_problem(path)
        if message:
            problems.append(WeightProblem(path, message, redownload))
    shapes: dict[str, tuple[int, ...]] = {}
    for header in headers.values():
        shapes.update(header.shapes())
    return problems, shapes


# ----------------------------------------------------------------------------------------------
# config.json against the weights and against what the deployment loads

MODEL_ROLES = ("target", "draft")


def config_shape_problems(directory: Path, config: dict, shapes: dict[str, tuple[int, ...]]) -> list[str]:
    """Tensors whose shapes contradict ``config.json`` (embedding and LM head against
    vocab_size × hidden_size, decoder layers against num_hidden_layers), each naming the file."""
    where = Path(directory) / "config.json"
    try:
        vocab, hidden = int(config["vocab_size"]), int(config["hidden_size"])
    except (KeyError, TypeError, ValueError):
        return []  # the shape loader reports an unusable config.json
    problems = []
    for name in ("model.embed_tokens.weight", "embed_tokens.weight", "lm_head.weight"):
        shape = shapes.get(name)
        if shape is not None and shape != (vocab, hidden):
            problems.append(f"{name} is {list(shape)} in the weights but {where} says vocab_size {vocab} × "
                            f"hidden_size {hidden}")
    layers = {int(m.group(1)) for name in shapes if (m := _LAYER.match(name))}
    declared = config.get("num_hidden_layers")
    if layers and isinstance(declared, int) and layers != set(range(declared)):
        missing = sorted(set(range(declared)) - layers)
        extra = sorted(layers - set(range(declared)))
        detail = "; ".join(part for part in (f"missing layers {missing}" if missing else "",
                                             f"extra layers {extra}" if extra else "") if part)
        problems.append(f"{where} says num_hidden_layers {declared} but the weights hold layers "
                        f"{min(layers)}..{max(layers)} ({detail})")
    return problems


@dataclass(frozen=True)
class ArchitectureRule:
    """What a loader accepts in config.json: ``model_types`` / ``architectures`` (an absent key
    passes, as the loader defaults it) and who says so."""

    model_types: tuple[str, ...]
    architectures: tuple[str, ...]
    loader: str


# The CPU reference engine's model class loads Llama checkpoints only
# (pipeline/reference/modeling.py LlamaModel: model_type "llama", architectures[0] LlamaForCausalLM).
REFERENCE_LLAMA = ArchitectureRule(("llama",), ("LlamaForCausalLM",), "the CPU reference engine (LlamaModel)")


def expected_architecture(cfg: DeploymentConfig, role: str) -> ArchitectureRule | None:
    """The architecture ``role``'s checkpoint must declare for ``cfg`` to load it; None when the
    route takes what the checkpoint says: heads carry the base's architecture or none, and
    TensorRT-LLM's Llama converter keeps whatever ``architectures[0]`` a Llama-shaped config names
    (``LLaMAConfig.from_hugging_face``, tensorrt_llm/models/llama/config.py), so the engine route
    has no list to hold a draft to (the EAGLE base rule is ``methods.eagle``'s)."""
    if cfg.backend == "reference" and role in MODEL_ROLES:
        return REFERENCE_LLAMA
    return None


def architecture_problem(directory: Path, config: dict, rule: ArchitectureRule) -> str | None:
    """Why ``config`` (``directory``'s config.json) names an architecture ``rule`` refuses."""
    model_type = config.get("model_type")
    architectures = config.get("architectures") or []
    first = architectures[0] if isinstance(architectures, list) and architectures else None
    wrong = []
    if model_type is not None and model_type not in rule.model_types:
        wrong.append(f"model_type {model_type!r}")
    if first is not None and first not in rule.architectures:
        wrong.append(f"architectures {architectures!r}")
    if not wrong:
        return None
    return (f"{Path(directory) / 'config.json'} names {' and '.join(wrong)}; {rule.loader} loads "
            f"{' / '.join(rule.architectures)} (model_type {' / '.join(rule.model_types)})")


def checkpoint_problems(cfg: DeploymentConfig, role: str, directory: Path) -> list[WeightProblem]:
    """Everything that makes ``directory`` — the checkpoint of ``role`` ("target", "draft",
    "medusa heads", "EAGLE head", "EAGLE-3 head") in deployment ``cfg`` — unloadable: weight files
    that are not whole, tensors contradicting config.json, config.json naming an architecture the
    route does not load. Each problem names its file. Missing files are not reported here
    (``checkpoints.check_files`` does)."""
    directory = Path(directory)
    problems, shapes = weight_file_problems(directory)
    config_path = directory / "config.json"
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return problems  # missing or unreadable config.json: the shape loader reports it
    if not isinstance(config, dict):
        return problems
    rule = expected_architecture(cfg, role)
    wrong = architecture_problem(directory, config, rule) if rule else None
    if wrong:
        problems.append(WeightProblem(config_path, wrong,
                                      f"use a {' / '.join(rule.architectures)} checkpoint as the {role}"))
    # The CPU engine loads the HF tensors as they are named and shaped, so a contradiction is a
    # certain failure at serve time. Heads have their own shapes (EAGLE-3's draft vocabulary, no
    # decoder layers): checkpoints.check_heads. The TensorRT-LLM converters re-lay the tensors; their
    # own checks (and `validate --live`) cover that route.
    if role in MODEL_ROLES and cfg.backend == "reference":
        problems += [WeightProblem(config_path, message, "use the config.json that came with these weights")
                     for message in config_shape_problems(directory, config, shapes)]
    return problems
