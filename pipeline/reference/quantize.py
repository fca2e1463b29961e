"""Int8 weight-only quantization of a Hugging Face Llama checkpoint for the reference engine.

Reads ``src_dir`` (``config.json``, ``model.safetensors``, tokenizer files) and writes ``dst_dir``:
the same files, with every projection weight of the decoder layers and the LM head stored as
int8 (symmetric, one scale per output channel: ``<name>.weight`` int8 + ``<name>.weight_scale``
float32), embeddings and norms kept in float, and ``config.json`` carrying
``quantization_config = {"quant_method": "specdeploy_int8_wo", ...}``. The loader
(:mod:`pipeline.reference.modeling`) keeps those weights int8 in memory and multiplies with
an int8 × int8 product (activations quantized per row so rows never couple), never dequantizing
to a float copy (float64 test runs excepted); where ``_int_mm`` is slow on the CPU it also holds
the same integers in float for an exact float GEMM (:mod:`pipeline.reference.int8_gemm`).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from pipeline.errors import UsageError
from pipeline.reference.checkpoint import QUANT_METHOD, load_safetensors, quantize_weight, read_config

FORMATS = ("int8_wo",)
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
COPIED = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
          "tokenizer.model", "vocab.json", "merges.txt")


def quantize_checkpoint(src_dir: Path, dst_dir: Path, fmt: str = "int8_wo") -> None:
    from safetensors.torch import save_file  # noqa: PLC0415 - start-up: safetensors (loaded when a quantized checkpoint is written)

    if fmt not in FORMATS:
        raise UsageError(f"quantization format {fmt!r} is not supported by the reference engine "
                         f"(supported: {', '.join(FORMATS)})")
    src_dir, dst_dir = Path(src_dir), Path(dst_dir)
    cfg = read_config(src_dir)
    if (cfg.get("quantization_config") or {}).get("quant_method"):
        raise UsageError(f"{src_dir}: checkpoint is already quantized")
    state = load_safetensors(src_dir)
    out: dict = {}
    modules = []
    for name, tensor in state.items():
        module = name.removesuffix(".weight")
        if name.endswith(".weight") and module.rsplit(".", 1)[-1] in PROJECTIONS + ("lm_head",):
            out[name], out[f"{module}.weight_scale"] = quantize_weight(tensor)
            modules.append(module)
        else:
            out[name] = tensor.contiguous()
    if "lm_head.weight" not in state:  # tied: quantize a separate LM head, keep the float embedding
        out["lm_head.weight"], out["lm_head.weight_scale"] = quantize_weight(state["model.embed_tokens.weight"])
        modules.append("lm_head")
    tmp = dst_dir.with_name(dst_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(out, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    cfg["quantization_config"] = {"quant_method": QUANT_METHOD, "bits": 8, "granularity": "per_channel",
                                  "symmetric": True, "modules": sorted(set(modules))}
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
    for filename in COPIED:
        if (src_dir / filename).is_file():
            shutil.copyfile(src_dir / filename, tmp / filename)
    for path in tmp.iterdir():
        os.chmod(path, 0o644)
    shutil.rmtree(dst_dir, ignore_errors=True)
    tmp.rename(dst_dir)
