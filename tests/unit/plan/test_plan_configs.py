"""Config dicts shared by the plan tests: the five example deployments (as the issue names them)
plus version and backend variants. Paths are absolute and need not exist (plan is a dry run)."""

from __future__ import annotations

import copy

EXAMPLES: dict[str, dict] = {
    "llama31-8b-draft1b-fp8-h100": {
        "name": "llama31-8b-draft1b-fp8-h100",
        "hardware": "h100-sxm-80gb",
        "target": {"checkpoint": "/models/Llama-3.1-8B-Instruct", "quantization": {"format": "fp8", "kv_cache_dtype": "fp8"}},
        "speculation": {
            "method": "draft_target",
            "draft": {"checkpoint": "/models/Llama-3.2-1B-Instruct", "quantization": {"format": "fp8"}},
            "num_draft_tokens": 4,
        },
        "build": {"max_batch_size": 16, "max_input_len": 2048, "max_seq_len": 4096, "max_num_tokens": 8192},
    },
    "llama31-70b-draft8b-int4awq-tp4-a100": {
        "name": "llama31-70b-draft8b-int4awq-tp4-a100",
        "hardware": "a100-80gb",
        "target": {"checkpoint": "/models/Llama-3.1-70B-Instruct", "tp": 4,
                   "quantization": {"format": "int4_awq", "calibration_size": 512}},
        "speculation": {
            "method": "draft_target",
            "draft": {"checkpoint": "/models/Llama-3.1-8B-Instruct", "quantization": {"format": "int4_awq"}},
            "num_draft_tokens": 4,
            "max_draft_len": 8,
            "use_draft_logits": True,
        },
        "build": {"max_batch_size": 32, "max_input_len": 4096, "max_seq_len": 8192, "max_num_tokens": 16384},
    },
    "vicuna7b-medusa-fp8-h100": {
        "name": "vicuna7b-medusa-fp8-h100",
        "target": {"checkpoint": "/models/vicuna-7b-v1.3", "dtype": "float16",
                   "quantization": {"format": "fp8", "kv_cache_dtype": "fp8"}},
        "speculation": {"method": "medusa", "heads_dir": "/models/medusa-vicuna-7b-v1.3", "num_heads": 4,
                        "choices": [[0], [0, 0], [1], [0, 1], [2], [0, 0, 0], [1, 0], [0, 2], [3], [0, 3]]},
        "build": {"max_batch_size": 4, "max_input_len": 1024, "max_seq_len": 2048},
    },
    "vicuna7b-eagle-h100": {
        "name": "vicuna7b-eagle-h100",
        "target": {"checkpoint": "/models/vicuna-7b-v1.3", "dtype": "float16"},
        "speculation": {"method": "eagle", "head_dir": "/models/EAGLE-Vicuna-7B-v1.3", "num_layers": 4,
                        "max_draft_len": 63, "max_non_leaves_per_layer": 10},
        "build": {"max_batch_size": 4, "max_input_len": 1024, "max_seq_len": 2048},
    },
    "llama31-8b-baseline-h100": {
        "name": "llama31-8b-baseline-h100",
        "target": {"checkpoint": "/models/Llama-3.1-8B-Instruct"},
        "build": {"max_batch_size": 64, "max_input_len": 2048, "max_seq_len": 4096},
    },
}


def _variant(base: str, name: str, **changes) -> dict:
    cfg = copy.deepcopy(EXAMPLES[base])
    cfg["name"] = name
    for key, value in changes.items():
        cfg[key] = value
    return cfg


VARIANTS: dict[str, dict] = {
    "dtm-bf16-trtllm0.18": _variant(
        "llama31-8b-draft1b-fp8-h100", "dtm-bf16-trtllm0.18", trtllm_version="0.18.2",
        target={"checkpoint": "/models/Llama-3.1-8B-Instruct", "tp": 2},
        speculation={"method": "draft_target", "draft": {"checkpoint": "/models/Llama-3.2-1B-Instruct"}, "num_draft_tokens": 6},
    ),
    "medusa-fp16-trtllm0.19": _variant(
        "vicuna7b-medusa-fp8-h100", "medusa-fp16-trtllm0.19", trtllm_version="0.19.0",
        target={"checkpoint": "/models/vicuna-7b-v1.3", "dtype": "float16", "tp": 2},
    ),
    "medusa-fp16-trtllm1.2": _variant(
        "vicuna7b-medusa-fp8-h100", "medusa-fp16-trtllm1.2",
        target={"checkpoint": "/models/vicuna-7b-v1.3", "dtype": "float16", "tp": 2},
    ),
    "eagle-fp8-trtllm1.2": _variant(
        "vicuna7b-eagle-h100", "eagle-fp8-trtllm1.2",
        target={"checkpoint": "/models/vicuna-7b-v1.3", "dtype": "float16", "quantization": {"format": "fp8", "kv_cache_dtype": "fp8"}},
    ),
    "tiny-dtm-reference": {
        "name": "tiny-dtm-reference",
        "backend": "reference",
        "target": {"checkpoint": "builtin:tiny-target", "dtype": "float32"},
        "speculation": {"method": "draft_target", "draft": {"checkpoint": "builtin:tiny-draft", "quantization": {"format": "int8_wo"}},
                        "num_draft_tokens": 4},
        "build": {"max_batch_size": 8, "max_input_len": 256, "max_seq_len": 512},
    },
    "tiny-medusa-reference": {
        "name": "tiny-medusa-reference",
        "backend": "reference",
        "target": {"checkpoint": "builtin:tiny-target", "dtype": "float32"},
        "speculation": {"method": "medusa", "heads_dir": "builtin:tiny-medusa", "num_heads": 3},
        "build": {"max_batch_size": 8, "max_input_len": 256, "max_seq_len": 512},
    },
    "tiny-eagle-reference": {
        "name": "tiny-eagle-reference",
        "backend": "reference",
        "target": {"checkpoint": "builtin:tiny-target", "dtype": "float32", "quantization": {"format": "int8_wo"}},
        "speculation": {"method": "eagle", "head_dir": "builtin:tiny-eagle", "num_layers": 3},
        "build": {"max_batch_size": 8, "max_input_len": 256, "max_seq_len": 512},
        "reference": {"threads": 1, "prefix_cache_entries": 16},
    },
    "tiny-baseline-reference-builtin-on-trtllm": {
        "name": "tiny-baseline-trtllm",
        "target": {"checkpoint": "builtin:tiny-target", "dtype": "float32"},
        "build": {"max_batch_size": 8, "max_input_len": 256, "max_seq_len": 512},
    },
}

ALL = {**EXAMPLES, **VARIANTS}
