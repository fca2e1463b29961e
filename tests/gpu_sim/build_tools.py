"""Stand-ins for TensorRT-LLM 1.2.1's build tools, for the GPU-host simulation.

Simulates only the external tools that cannot run here — ``examples/quantization/quantize.py``,
``examples/eagle/{quantize,convert_checkpoint}.py``, ``examples/medusa/convert_checkpoint.py``,
``examples/models/core/llama/convert_checkpoint.py`` and ``trtllm-build`` — from what their
upstream sources (NVIDIA/TensorRT-LLM 1.x) do at their interface:

- each parses its arguments with the flags the upstream script declares (an unknown flag or value
  exits 2, as argparse does), reads the input files the upstream script reads (and fails the way
  it fails when they are absent: ``pytorch_model.bin`` for the EAGLE quantizer, ``fc.bias`` for the
  EAGLE converter, ``layers.{i}.*`` for ``--eagle_num_layers``), and writes what it writes: a
  TensorRT-LLM checkpoint (``config.json`` + ``rank{r}.safetensors``), a ModelOpt HF export
  (``config.json`` + ``hf_quant_config.json`` + ``model.safetensors``), or an engine dir
  (``config.json`` with ``version``/``pretrained_config``/``build_config`` as
  ``EngineConfig.to_dict`` writes it, + ``rank{r}.engine``);
- ``trtllm-build`` applies the builder's adjustments of ``tensorrt_llm/builder.py build()``
  (max_seq_len grows by max_draft_len, EAGLE also by num_eagle_layers; max_draft_len from the
  checkpoint when 0; max_num_tokens ≥ max_batch_size × (max_draft_len + 1); paged context FMHA
  switched off for FP8 KV without FP8 context FMHA and for INT8 KV, forced on for EAGLE);
- every call but a bare ``--help`` (the live preflight reading the parser) appends
  ``{"tool", "argv", "env"}`` to the JSONL log named by ``$GPU_SIM_LOG``.

The stand-in parsers of ``quantize.py`` and ``trtllm-build`` declare only flags the upstream
scripts declare, with choices upstream accepts: tests/gpu_sim/test_upstream_flags.py checks them
against tests/gpu_sim/upstream_flags.json (upstream file + revision per script; written by
scripts/upstream_flags.py from a checkout). The converters' parsers are not recorded there yet.

Knobs (environment): ``GPU_SIM_SM`` (the simulated GPU's SM version, default 90),
``GPU_SIM_FORCE_KV_CACHE_QUANT_ALGO`` (quantize.py writes this KV algorithm, as a ModelOpt export
that defaults it would), ``GPU_SIM_TRTLLM_VERSION`` (default 1.2.1).
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys
from pathlib import Path

TRACKED_ENV = ("CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "SPECDEPLOY_TRTLLM_ROOT", "HF_HUB_OFFLINE",
               "HF_DATASETS_OFFLINE", "TRTLLM_ORCHESTRATOR", "PYTHONPATH")
QUANT_ALGO = {"fp8": "FP8", "int8_sq": "W8A8_SQ_PER_CHANNEL", "int4_awq": "W4A16_AWQ", "w4a8_awq": "W4A8_AWQ",
              "int8_wo": "W8A16", "int4_wo": "W4A16", "nvfp4": "NVFP4", "full_prec": None}
SPEC_MODE_BITS = {"draft_tokens_external": 2, "medusa": 4, "lookahead_decoding": 8, "explicit_draft_tokens": 16,
                  "eagle": 32}
FP8_CONTEXT_FMHA_ALGOS = ("FP8", "W4A8_AWQ", "NVFP4")


class ToolFailure(Exception):
    """What the upstream script would die of (printed, exit 1)."""


# ------------------------------------------------------------------------------------------------
# I/O helpers


def record(tool: str, argv: list[str]) -> None:
    log = os.environ.get("GPU_SIM_LOG")
    if not log:
        return
    entry = {"tool": tool, "argv": list(argv), "env": {k: os.environ[k] for k in TRACKED_ENV if k in os.environ}}
    with open(log, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(entry) + "\n")


def write_safetensors(path: Path, names: list[str]) -> None:
    """A valid safetensors file with one float16 element per named tensor."""
    header = {name: {"dtype": "F16", "shape": [1], "data_offsets": [2 * i, 2 * i + 2]} for i, name in enumerate(names)}
    blob = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + b"\0\0" * len(names))


def tensor_names(path: Path) -> set[str]:
    if path.suffix == ".safetensors":
        with path.open("rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            return {k for k in json.loads(handle.read(length)) if k != "__metadata__"}
    import torch  # the image's python has torch; pickled weights need it

    return set(torch.load(str(path), map_location="cpu", weights_only=True, mmap=True))


def read_json(path: Path) -> dict:
    if not path.is_file():
        raise ToolFailure(f"FileNotFoundError: [Errno 2] No such file or directory: '{path}'")
    return json.loads(path.read_text(encoding="utf-8"))


def hf_weights(model_dir: Path) -> list[Path]:
    """What a Hugging Face from_pretrained / ModelWeightsLoader finds: safetensors, else .bin/.pth."""
    for pattern in ("*.safetensors", "*.bin", "*.pth"):
        found = sorted(model_dir.glob(pattern))
        if found:
            return found
    raise ToolFailure(f"OSError: no file named model.safetensors or pytorch_model.bin found in directory {model_dir}")


def _dtype(value: str, hf_config: dict) -> str:
    return hf_config.get("torch_dtype", "float16") if value == "auto" else value


def checkpoint_config(hf: dict, *, dtype: str, tp: int, pp: int, architecture: str) -> dict:
    """The fields a TRT-LLM checkpoint config.json carries (tensorrt_llm/models/modeling_utils.py PretrainedConfig)."""
    heads = hf["num_attention_heads"]
    return {
        "architecture": architecture, "dtype": dtype, "logits_dtype": "float32",
        "num_hidden_layers": hf["num_hidden_layers"], "num_attention_heads": heads,
        "num_key_value_heads": hf.get("num_key_value_heads", heads), "hidden_size": hf["hidden_size"],
        "intermediate_size": hf["intermediate_size"], "vocab_size": hf["vocab_size"],
        "position_embedding_type": "rope_gpt_neox", "max_position_embeddings": hf.get("max_position_embeddings"),
        "hidden_act": hf.get("hidden_act", "silu"), "norm_epsilon": hf.get("rms_norm_eps", 1e-5),
        "rotary_base": hf.get("rope_theta", 10000.0), "head_size": hf["hidden_size"] // heads,
        "quantization": {"quant_algo": None, "kv_cache_quant_algo": None},
        "mapping": {"world_size": tp * pp, "tp_size": tp, "pp_size": pp},
    }


def save_checkpoint(out: Path, config: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=4), encoding="utf-8")
    for rank in range(config["mapping"]["world_size"]):
        write_safetensors(out / f"rank{rank}.safetensors", ["transformer.vocab_embedding.weight"])


def _check_model_dir(model_dir: str) -> dict:
    hf = read_json(Path(model_dir) / "config.json")
    hf_weights(Path(model_dir))
    return hf


# ------------------------------------------------------------------------------------------------
# examples/quantization/quantize.py


def _quantize_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="quantize.py")
    p.add_argument("--model_dir", required=True)
    p.add_argument("--output_dir", default="exported_model")
    p.add_argument("--dtype", default="auto", choices=["auto", "float16", "bfloat16", "float32"])
    p.add_argument("--qformat", default="full_prec", choices=list(QUANT_ALGO))
    p.add_argument("--kv_cache_dtype", default=None, choices=["int8", "fp8", None])
    p.add_argument("--calib_size", type=int, default=512)
    p.add_argument("--calib_dataset", default="cnn_dailymail")
    p.add_argument("--awq_block_size", type=int, default=128)
    p.add_argument("--tp_size", type=int, default=1)
    p.add_argument("--pp_size", type=int, default=1)
    p.add_argument("--medusa_model_dir", default=None)
    p.add_argument("--num_medusa_heads", type=int, default=4)
    p.add_argument("--num_medusa_layers", type=int, default=1)
    p.add_argument("--max_draft_len", type=int, default=63)
    p.add_argument("--medusa_hidden_act", default="silu")
    p.add_argument("--quant_medusa_head", action="store_true")
    return p


def _medusa_heads_file(heads_dir: Path) -> Path:
    for name in ("medusa_lm_head.pt", "medusa_lm_head.safetensors"):  # load_medusa_hf's order
        if (heads_dir / name).is_file():
            return heads_dir / name
    raise ToolFailure(f"FileNotFoundError: No such file or directory: '{heads_dir / 'medusa_lm_head.safetensors'}'")


def _medusa_fields(heads_dir: str, heads: int, layers: int, max_draft_len: int, act: str) -> dict:
    names = tensor_names(_medusa_heads_file(Path(heads_dir)))
    for h in range(heads):
        for key in [f"{h}.{layer}.linear.weight" for layer in range(layers)] + [f"{h}.{layers}.weight"]:
            if key not in names:
                raise ToolFailure(f"KeyError: '{key}'")
    return {"architecture": "MedusaForCausalLM", "num_medusa_heads": heads, "num_medusa_layers": layers,
            "max_draft_len": max_draft_len, "medusa_hidden_act": act}


def quantize(argv: list[str]) -> None:
    args = _quantize_parser().parse_args(argv)
    hf = _check_model_dir(args.model_dir)
    dtype = _dtype(args.dtype, hf)
    config = checkpoint_config(hf, dtype=dtype, tp=args.tp_size, pp=args.pp_size, architecture="LlamaForCausalLM")
    kv = {"fp8": "FP8", "int8": "INT8"}.get(args.kv_cache_dtype)
    config["quantization"] = {"quant_algo": QUANT_ALGO[args.qformat], "kv_cache_quant_algo":
                              os.environ.get("GPU_SIM_FORCE_KV_CACHE_QUANT_ALGO") or kv, "exclude_modules": ["lm_head"]}
    if "awq" in args.qformat:
        config["quantization"]["group_size"] = args.awq_block_size
    if args.medusa_model_dir:
        config.update(_medusa_fields(args.medusa_model_dir, args.num_medusa_heads, args.num_medusa_layers,
                                     args.max_draft_len, args.medusa_hidden_act))
        if not args.quant_medusa_head:
            config["quantization"]["exclude_modules"].append("*medusa_heads*")
    save_checkpoint(Path(args.output_dir), config)


# ------------------------------------------------------------------------------------------------
# examples/models/core/llama/convert_checkpoint.py and examples/medusa/convert_checkpoint.py


def _convert_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog)
    p.add_argument("--model_dir", default=None)
    p.add_argument("--output_dir", default="tllm_checkpoint")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    p.add_argument("--tp_size", type=int, default=1)
    p.add_argument("--pp_size", type=int, default=1)
    p.add_argument("--workers", type=int, default=1)
    return p


def convert_llama(argv: list[str]) -> None:
    args = _convert_parser("convert_checkpoint.py").parse_args(argv)
    hf = _check_model_dir(args.model_dir)
    save_checkpoint(Path(args.output_dir), checkpoint_config(
        hf, dtype=_dtype(args.dtype, hf), tp=args.tp_size, pp=args.pp_size, architecture="LlamaForCausalLM"))


def convert_medusa(argv: list[str]) -> None:
    p = _convert_parser("convert_checkpoint.py")
    p.add_argument("--medusa_model_dir", default=None)
    p.add_argument("--num_medusa_heads", type=int, default=4)
    p.add_argument("--num_medusa_layers", type=int, default=1)
    p.add_argument("--max_medusa_token_len", type=int, default=63)
    p.add_argument("--medusa_hidden_act", default="silu")
    p.add_argument("--model_type", default="llama", choices=["llama", "mixtral", "qwen2"])
    args = p.parse_args(argv)
    hf = _check_model_dir(args.model_dir)
    config = checkpoint_config(hf, dtype=_dtype(args.dtype, hf), tp=args.tp_size, pp=args.pp_size,
                               architecture="MedusaForCausalLM")
    config.update(_medusa_fields(args.medusa_model_dir, args.num_medusa_heads, args.num_medusa_layers,
                                 args.max_medusa_token_len, args.medusa_hidden_act))
    save_checkpoint(Path(args.output_dir), config)


# ------------------------------------------------------------------------------------------------
# examples/eagle/quantize.py and examples/eagle/convert_checkpoint.py

EAGLE_LAYER_KEYS = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                    "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
                    "post_attention_layernorm.weight")


def eagle_quantize(argv: list[str]) -> None:
    """Loads the base model, then exactly ``<eagle_model_dir>/pytorch_model.bin``; copies
    ``layers.{i}.*`` for i < --eagle_num_layers, ``fc.weight`` and ``fc.bias`` (zeros when absent);
    exports an HF-format ModelOpt checkpoint."""
    p = argparse.ArgumentParser(prog="quantize.py")
    p.add_argument("--model_dir", default=None)
    p.add_argument("--eagle_model_dir", default=None)
    p.add_argument("--eagle_num_layers", type=int, default=1)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--calib_dataset", default="cnn_dailymail")
    p.add_argument("--qformat", default="full_prec", choices=["fp8"])
    p.add_argument("--calib_size", type=int, default=512)
    p.add_argument("--output_dir", default="exported_model")
    p.add_argument("--kv_cache_dtype", default=None, choices=["int8", "fp8", None])
    args = p.parse_args(argv)
    if args.model_dir is None or args.eagle_model_dir is None:
        raise ToolFailure("ValueError: One of source checkpoint (model_dir) must be specified")
    hf = _check_model_dir(args.model_dir)
    weights = Path(args.eagle_model_dir) / "pytorch_model.bin"
    if not weights.is_file():
        raise ToolFailure(f"FileNotFoundError: [Errno 2] No such file or directory: '{weights}'")
    names = tensor_names(weights)
    for key in [f"layers.{i}.{k}" for i in range(args.eagle_num_layers) for k in EAGLE_LAYER_KEYS] + ["fc.weight"]:
        if key not in names:
            raise ToolFailure(f"KeyError: '{key}'")
    eagle_cfg = read_json(Path(args.eagle_model_dir) / "config.json")
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps({**hf, "eagle": {**eagle_cfg, "eagle_num_layers": args.eagle_num_layers}}))
    quant = {"quant_algo": "FP8", "kv_cache_quant_algo": {"fp8": "FP8", "int8": "INT8"}.get(args.kv_cache_dtype),
             "exclude_modules": ["lm_head", "eagle_module.lm_head"]}
    (out / "hf_quant_config.json").write_text(json.dumps({"producer": {"name": "modelopt"}, "quantization": quant}))
    write_safetensors(out / "model.safetensors", ["model.embed_tokens.weight", "eagle_module.fc.weight", "eagle_module.fc.bias"])


def _eagle_convert_parser() -> argparse.ArgumentParser:
    p = _convert_parser("convert_checkpoint.py")
    p.add_argument("--eagle_model_dir", default=None)
    p.add_argument("--max_draft_len", type=int, default=63)
    p.add_argument("--num_eagle_layers", type=int, default=4)
    p.add_argument("--max_non_leaves_per_layer", type=int, default=10)
    return p


def eagle_convert(argv: list[str]) -> None:
    """Two HF checkpoints (base + EAGLE, read by ModelWeightsLoader: ``fc.bias`` must exist), or one
    ModelOpt export (``--model_dir`` only, quantization from its hf_quant_config.json)."""
    args = _eagle_convert_parser().parse_args(argv)
    if args.pp_size != 1:
        raise ToolFailure("AssertionError: Pipeline parallelism is not supported in EAGLE yet.")
    if args.max_draft_len > 256:
        raise ToolFailure("AssertionError: args.max_draft_len > 256 is not supported")
    hf = _check_model_dir(args.model_dir)
    config = checkpoint_config(hf, dtype=_dtype(args.dtype, hf), tp=args.tp_size, pp=1, architecture="EagleForCausalLM")
    if args.eagle_model_dir is None:
        eagle_cfg = hf.get("eagle") or {}
        quant = read_json(Path(args.model_dir) / "hf_quant_config.json")["quantization"]
        config["quantization"].update({k: quant.get(k) for k in ("quant_algo", "kv_cache_quant_algo", "exclude_modules")})
    else:
        eagle_cfg = read_json(Path(args.eagle_model_dir) / "config.json")
        names = set().union(*(tensor_names(p) for p in hf_weights(Path(args.eagle_model_dir))))
        for key in ("fc.weight", "fc.bias"):
            if key not in names:
                raise ToolFailure(f"KeyError: '{key}'")
    config.update({"max_draft_len": args.max_draft_len, "num_eagle_layers": args.num_eagle_layers,
                   "max_non_leaves_per_layer": args.max_non_leaves_per_layer,
                   "eagle_net_config": {**{k: eagle_cfg.get(k) for k in ("num_hidden_layers", "hidden_size")},
                                        "architecture": "LlamaForCausalLM"}})
    save_checkpoint(Path(args.output_dir), config)


# ------------------------------------------------------------------------------------------------
# trtllm-build (tensorrt_llm/commands/build.py + builder.py build())


def _build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="trtllm-build")
    p.add_argument("--checkpoint_dir", required=True)
    p.add_argument("--output_dir", default="engine_outputs")
    p.add_argument("--max_batch_size", type=int, default=2048)
    p.add_argument("--max_input_len", type=int, default=1024)
    p.add_argument("--max_seq_len", type=int, default=None)
    p.add_argument("--max_beam_width", type=int, default=1)
    p.add_argument("--max_num_tokens", type=int, default=8192)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--speculative_decoding_mode", default=None, choices=list(SPEC_MODE_BITS))
    p.add_argument("--max_draft_len", type=int, default=0)
    p.add_argument("--gather_generation_logits", action="store_true")
    p.add_argument("--output_timing_cache", default="model.cache")
    p.add_argument("--gemm_plugin", default=None, choices=["auto", "float16", "bfloat16", "float32", "fp8", "disable"])
    for switch in ("--use_paged_context_fmha", "--multiple_profiles", "--use_fp8_context_fmha", "--context_fmha"):
        p.add_argument(switch, default=None, choices=["enable", "disable"])
    return p


def _plugin_config(args, ckpt: dict, sm: int) -> dict:
    quant = ckpt.get("quantization") or {}
    fp8_kv, int8_kv = quant.get("kv_cache_quant_algo") == "FP8", quant.get("kv_cache_quant_algo") == "INT8"
    paged = (args.use_paged_context_fmha or "enable") == "enable"
    fp8_fmha = quant.get("quant_algo") in FP8_CONTEXT_FMHA_ALGOS and sm >= 89
    if paged and fp8_kv and not fp8_fmha:
        paged = False  # "FP8 Paged Context FMHA is disabled because FP8 context FMHA is disabled."
    if paged and int8_kv:
        paged = False  # "Paged Context FMHA is disabled because it doesn't work with int8 kv cache currently."
    if args.speculative_decoding_mode == "eagle":
        paged = True  # "Paged Context FMHA is required for EAGLE. Turning it on"
    return {"gpt_attention_plugin": "auto", "gemm_plugin": args.gemm_plugin, "context_fmha": True,
            "use_paged_context_fmha": paged, "use_fp8_context_fmha": bool(fp8_fmha and fp8_kv),
            "remove_input_padding": True, "tokens_per_block": 32,
            "multiple_profiles": (args.multiple_profiles or "disable") == "enable"}


def _build_config(args, ckpt: dict, sm: int) -> dict:
    draft_len = args.max_draft_len or ckpt.get("max_draft_len", 0)
    seq = args.max_seq_len or ckpt.get("max_position_embeddings") or 2048
    inp = min(args.max_input_len, seq)
    tokens = args.max_num_tokens
    mode = args.speculative_decoding_mode
    if mode:
        seq += draft_len
        tokens = max(tokens, args.max_batch_size * (draft_len + 1))
    if mode == "eagle":
        seq += ckpt["num_eagle_layers"]
        if args.max_batch_size > 512 or draft_len > 256:
            raise ToolFailure("AssertionError: Max batch size > 512 / max draft len > 256 is not supported for EAGLE")
    return {"max_input_len": inp, "max_seq_len": seq, "max_batch_size": args.max_batch_size,
            "max_beam_width": args.max_beam_width, "max_num_tokens": tokens, "opt_num_tokens": None,
            "max_draft_len": draft_len, "speculative_decoding_mode": SPEC_MODE_BITS.get(mode, 1),
            "gather_context_logits": False, "gather_generation_logits": args.gather_generation_logits,
            "kv_cache_type": "PAGED", "plugin_config": _plugin_config(args, ckpt, sm)}


def trtllm_build(argv: list[str]) -> None:
    args = _build_parser().parse_args(argv)
    ckpt_dir = Path(args.checkpoint_dir)
    ckpt = read_json(ckpt_dir / "config.json")
    world = ckpt["mapping"]["world_size"]
    missing = [f"rank{r}.safetensors" for r in range(world) if not (ckpt_dir / f"rank{r}.safetensors").is_file()]
    if missing:
        raise ToolFailure(f"FileNotFoundError: {ckpt_dir}: missing {', '.join(missing)}")
    sm = int(os.environ.get("GPU_SIM_SM", "90"))
    if sm < 89 and ckpt["quantization"].get("quant_algo") == "FP8":
        raise ToolFailure("RuntimeError: Networks with FP8 precision require hardware with FP8 support.")
    engine = {"version": os.environ.get("GPU_SIM_TRTLLM_VERSION", "1.2.1"), "pretrained_config": ckpt,
              "build_config": _build_config(args, ckpt, sm)}
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(engine, indent=4), encoding="utf-8")
    for rank in range(world):
        (out / f"rank{rank}.engine").write_bytes(b"simulated TensorRT engine\n")
    Path(args.output_timing_cache).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output_timing_cache).write_bytes(b"timing cache\n")


TOOLS = {
    "quantization/quantize.py": quantize,
    "models/core/llama/convert_checkpoint.py": convert_llama,
    "llama/convert_checkpoint.py": convert_llama,
    "medusa/convert_checkpoint.py": convert_medusa,
    "eagle/quantize.py": eagle_quantize,
    "eagle/convert_checkpoint.py": eagle_convert,
    "trtllm-build": trtllm_build,
}


def main(tool: str, argv: list[str]) -> int:
    if argv != ["--help"]:  # the live preflight reads every parser's help: not a step of the build
        record(tool, argv)
    try:
        TOOLS[tool](argv)
    except ToolFailure as exc:
        print(f"Traceback (most recent call last):\n  (simulated {tool})\n{exc}", file=sys.stderr)
        return 1
    return 0
