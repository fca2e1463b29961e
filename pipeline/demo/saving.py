"""Saving the trained demo models in the layouts upstream's tools read (Hugging Face Llama,
upstream Medusa, upstream EAGLE) and the checksums they ship with.

Writes each model directory and ``SHA256SUMS.txt``; reads the target's config and tokenizer files.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from pipeline.demo.models import MODEL_NAMES, TARGET

SUMS_FILE = "SHA256SUMS.txt"  # .txt: shipped as package data (pyproject globs)


def _fix_permissions(directory: Path) -> None:
    for path in directory.iterdir():
        if path.is_file():
            path.chmod(0o644)


def save_llama(model, out_dir: Path, tokenizer_dir: Path | None) -> None:
    model.save_pretrained(str(out_dir), safe_serialization=True)
    config_path = out_dir / "config.json"
    config = json.loads(config_path.read_text())
    config["architectures"] = ["LlamaForCausalLM"]
    config["torch_dtype"] = "float32"
    config["rope_theta"] = config.get("rope_parameters", {}).get("rope_theta", 10000.0)
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    if tokenizer_dir is not None and tokenizer_dir != out_dir:
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            (out_dir / name).write_bytes((tokenizer_dir / name).read_bytes())
    _fix_permissions(out_dir)


def save_medusa(heads, out_dir: Path, recipe) -> None:
    """``recipe``: the training recipe (its head count and model sizes go into the config)."""
    from safetensors.torch import save_file

    from pipeline.demo.heads import MEDUSA_WEIGHTS, medusa_config, write_json

    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(heads.upstream_state_dict(), str(out_dir / MEDUSA_WEIGHTS), metadata={"format": "pt"})
    write_json(out_dir / "config.json", medusa_config(recipe.medusa_heads, recipe.hidden, recipe.vocab_size, f"builtin:{TARGET}"))
    _fix_permissions(out_dir)


def save_eagle(head, out_dir: Path, target_dir: Path) -> None:
    from safetensors.torch import save_file

    from pipeline.demo.heads import EAGLE_WEIGHTS, eagle_config, write_json

    out_dir.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous() for k, v in head.state_dict().items()}
    save_file(state, str(out_dir / EAGLE_WEIGHTS), metadata={"format": "pt"})
    target_config = json.loads((target_dir / "config.json").read_text())
    write_json(out_dir / "config.json", eagle_config(target_config, f"builtin:{TARGET}"))
    _fix_permissions(out_dir)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_sums(out_dir: Path) -> dict[str, str]:
    """``SHA256SUMS.txt`` (``sha256sum -c`` format) over every file of every model dir."""
    sums = {}
    for name in MODEL_NAMES:
        model_dir = out_dir / name
        if model_dir.is_dir():
            for path in sorted(model_dir.iterdir()):
                if path.is_file():
                    sums[f"{name}/{path.name}"] = sha256_file(path)
    (out_dir / SUMS_FILE).write_text("".join(f"{digest}  {rel}\n" for rel, digest in sorted(sums.items())))
    (out_dir / SUMS_FILE).chmod(0o644)
    return sums
