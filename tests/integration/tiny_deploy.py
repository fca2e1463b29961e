"""Tiny CPU deployments for the serving tests and the served benchmark: a random Llama target
(fixed seed, HF layout + a small byte-level BPE tokenizer), a draft that is the target with a
little noise on its last layer (high but imperfect acceptance), random Medusa heads and a random
EAGLE head in their upstream layouts; plus, per deployment, the config YAML, the reference engine
descriptors (``engine.json``) and the build manifest that ``specdeploy build`` would write — so the
tests exercise render and serve without depending on the build stage's runtime; ``built_deployment``
for the configs that go through the real build step, and ``render_llmapi_standin`` for the GPU
llmapi repository with the stand-in model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import yaml

K = 3  # num_draft_tokens / heads / EAGLE depth
MAX_SEQ_LEN = 256
MAX_INPUT_LEN = 128
CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "The quick brown fox jumps over the lazy dog.",
    "Speculative decoding drafts tokens and verifies them in one pass.",
    "1 + 2 = 3, 2 + 3 = 5, 3 + 5 = 8, 5 + 8 = 13",
    "name: tiny\nvalue: 42\nitems: [a, b, c]\n",
] * 20


def _torch():
    import torch

    torch.set_num_threads(1)
    return torch


def make_tokenizer(out_dir: Path) -> None:
    from pipeline.demo.tokenizer import save_tokenizer, train_tokenizer

    save_tokenizer(train_tokenizer(CORPUS, vocab_size=320), out_dir)


def _unprintable_ids(tok_dir: Path, vocab_size: int) -> list[int]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    bad = [0, 1]
    for i in range(3, vocab_size):
        text = tok.decode([i])
        if not text or not text.isascii() or not text.isprintable():
            bad.append(i)
    return bad


def _llama_config(vocab: int, layers: int):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, rope_theta=10000.0,
        max_position_embeddings=MAX_SEQ_LEN + 64, tie_word_embeddings=False,
        bos_token_id=1, eos_token_id=2, pad_token_id=0, torch_dtype="float32",
    )


def make_models(root: Path) -> dict[str, Path]:
    """Write tokenizer, target, draft, medusa and eagle checkpoints under ``root`` (once)."""
    dirs = {name: root / name for name in ("target", "draft", "medusa", "eagle")}
    if all((d / "config.json").is_file() for d in dirs.values()):
        return dirs
    torch = _torch()
    from safetensors.torch import save_file
    from transformers import LlamaForCausalLM

    from pipeline.demo import heads

    tok_dir = root / "tokenizer"
    make_tokenizer(tok_dir)
    vocab = json.loads((tok_dir / "tokenizer.json").read_text())["model"]["vocab"]
    vocab_size = max(vocab.values()) + 1
    torch.manual_seed(0)
    target = LlamaForCausalLM(_llama_config(vocab_size, 2)).eval()
    with torch.no_grad():  # sharper logits: fewer near-ties, stable greedy paths
        target.lm_head.weight.mul_(4.0)
        # tokens that decode to partial UTF-8 (or pad/BOS) never win greedily: per-chunk
        # streaming deltas then concatenate to exactly the whole decoded text
        target.lm_head.weight[_unprintable_ids(tok_dir, vocab_size)] = 0.0
    target.save_pretrained(dirs["target"], safe_serialization=True)
    with torch.no_grad():
        layer = target.model.layers[-1].mlp.down_proj.weight
        layer.add_(0.02 * torch.randn_like(layer))
    target.save_pretrained(dirs["draft"], safe_serialization=True)
    for d in (dirs["target"], dirs["draft"]):
        for f in tok_dir.iterdir():
            shutil.copy2(f, d / f.name)
    target_cfg = json.loads((dirs["target"] / "config.json").read_text())
    torch.manual_seed(1)
    medusa = heads.MedusaHeads(K, 64, vocab_size)
    dirs["medusa"].mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in medusa.upstream_state_dict().items()}, str(dirs["medusa"] / "medusa_lm_head.safetensors"))
    heads.write_json(dirs["medusa"] / "config.json", heads.medusa_config(K, 64, vocab_size, str(dirs["target"])))
    eagle = heads.EagleHead(64, 4, 128, vocab_size, 1e-5, 10000.0)
    with torch.no_grad():
        eagle.embed_tokens.weight.copy_(target.model.embed_tokens.weight)
    dirs["eagle"].mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in eagle.state_dict().items()}, str(dirs["eagle"] / "model.safetensors"))
    eagle_cfg = heads.eagle_config(target_cfg, str(dirs["target"]))
    eagle_cfg["num_key_value_heads"] = eagle_cfg["num_attention_heads"]  # the demo head has no GQA
    heads.write_json(dirs["eagle"] / "config.json", eagle_cfg)
    return dirs


def _descriptor(role: str, model_dir: Path, proposer: dict, max_draft_len: int) -> dict:
    return {
        "format": "specdeploy-reference-engine/1", "role": role, "model_dir": str(model_dir),
        "quantization": "none", "proposer": proposer, "max_draft_len": max_draft_len,
        "max_batch_size": 4, "max_seq_len": MAX_SEQ_LEN, "max_input_len": MAX_INPUT_LEN,
        "compute_dtype": "float32", "threads": 1, "prefix_cache_entries": 16,
    }


def chain(depth: int) -> list[list[int]]:
    return [[0] * (i + 1) for i in range(depth)]


def make_deployment(workdir: Path, models: dict[str, Path], method: str, name: str | None = None,
                    decoupled: bool = True, k: int = K, orchestration: str = "bls",
                    reference: dict | None = None, loadtest: dict | None = None, triton: dict | None = None) -> Path:
    """Config + engine descriptors + manifest under ``workdir`` (the cwd of later stages);
    ``triton``: more settings of the ``triton`` section (e.g. ``bls_instance_count``)."""
    from pipeline.config import config_hash, load_config

    name = name or f"tiny-{method.replace('_', '-')}"
    speculation: dict = {"method": method}
    if method == "draft_target":
        speculation.update(draft={"checkpoint": str(models["draft"]), "dtype": "float32"}, num_draft_tokens=k,
                           orchestration=orchestration)
    elif method == "medusa":
        speculation.update(heads_dir=str(models["medusa"]), num_heads=k)
    elif method == "eagle":
        speculation.update(head_dir=str(models["eagle"]), num_layers=k)
    config = {
        "name": name, "backend": "reference", "hardware": "cpu",
        "target": {"checkpoint": str(models["target"]), "dtype": "float32"},
        "speculation": speculation,
        "build": {"max_batch_size": 4, "max_input_len": MAX_INPUT_LEN, "max_seq_len": MAX_SEQ_LEN},
        "triton": {"decoupled": decoupled, "startup_timeout_s": 240, **(triton or {})},
    }
    if reference:
        config["reference"] = reference
    if loadtest:
        config["loadtest"] = loadtest
    cfg_path = workdir / f"{name}.yaml"
    cfg_path.write_text(yaml.safe_dump(config, sort_keys=False))
    cfg = load_config(cfg_path)
    root = workdir / "engines" / name
    none = {"method": "none"}
    engines = {"baseline": _descriptor("baseline", models["target"], none, 0)}
    if method == "draft_target":
        engines["target"] = _descriptor("target", models["target"], none, k)
        engines["draft"] = _descriptor("draft", models["draft"], none, 0)
        engines["speculative"] = _descriptor(
            "speculative", models["target"], {"method": "draft_target", "draft_dir": str(models["draft"]), "num_draft_tokens": k}, k)
    elif method == "medusa":
        engines["speculative"] = _descriptor(
            "speculative", models["target"], {"method": "medusa", "heads_dir": str(models["medusa"]), "num_heads": k, "choices": chain(k)}, k)
    elif method == "eagle":
        engines["speculative"] = _descriptor(
            "speculative", models["target"], {"method": "eagle", "head_dir": str(models["eagle"]), "num_layers": k, "choices": chain(k)}, k)
    if method == "draft_target":  # as the plan builds them (planner.engine_max_input_len): the BLS re-sends the context
        for descriptor in engines.values():
            descriptor["max_input_len"] = MAX_SEQ_LEN - 1
    engine_dirs = {}
    for role, descriptor in engines.items():
        d = root / "engine" / role
        d.mkdir(parents=True, exist_ok=True)
        (d / "engine.json").write_text(json.dumps(descriptor, indent=2))
        engine_dirs[role] = str(d.resolve())
    manifest = {
        "format": "specdeploy-manifest/1", "name": name, "config_hash": config_hash(cfg),
        "backend": "reference", "method": method, "trtllm_version": cfg.trtllm_version,
        "created": "2026-01-01T00:00:00Z", "tool_version": "test", "git_sha": None,
        "engines": engine_dirs, "tokenizer_dir": str(models["target"]),
        "max_draft_len": k if method != "none" else 0,
        "num_draft_tokens": k if method == "draft_target" else None, "steps": [], "versions": {},
    }
    (root / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return cfg_path


NGRAM = {"method": "ngram", "max_draft_len": K, "max_matching_ngram_size": 3, "is_public_pool": False}


def draft_target_spec(models: dict[str, Path], k: int = K) -> dict:
    return {"method": "draft_target", "num_draft_tokens": k,
            "draft": {"checkpoint": str(models["draft"]), "dtype": "float32"}}


def built_deployment(workdir: Path, models: dict[str, Path], name: str, speculation: dict, llmapi: bool = False,
                     decoupled: bool = True):
    """A config under ``workdir`` built by ``build`` (the reference engines' real build step) and
    rendered: what ``specdeploy build`` + ``render`` leave; returns the loaded config."""
    from pipeline.build.builder import build
    from pipeline.config import load_config
    from pipeline.render.renderer import render

    data = {"name": name, "backend": "reference", "hardware": "cpu",
            "target": {"checkpoint": str(models["target"]), "dtype": "float32"}, "speculation": speculation,
            "build": {"max_batch_size": 4, "max_input_len": MAX_INPUT_LEN, "max_seq_len": MAX_SEQ_LEN},
            "triton": {"startup_timeout_s": 240, "decoupled": decoupled}}
    if llmapi:
        data["trtllm_runtime"] = "llm_api"
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    cfg = load_config(path, workdir)
    build(cfg, progress=False)
    render(cfg)
    return cfg


STANDIN = Path(__file__).resolve().parents[1] / "fixtures" / "llmapi_standin" / "model.py"


def render_llmapi_standin(workdir: Path, name: str = "api-served", **config) -> tuple[object, dict[str, Path]]:
    """An EAGLE-3 deployment on the LLM-API runtime (H100, no GPU queried), rendered for both arms
    with tests/fixtures/llmapi_standin/model.py in place of upstream's model.py; ``config``
    adds top-level sections (``loadtest``, ``triton``). Returns (config, repositories by arm)."""
    import json
    import shutil

    from pipeline.config import config_hash, parse_config
    from pipeline.plan.planner import make_plan
    from pipeline.render.renderer import render

    data = {"name": name, "backend": "trtllm", "hardware": "h100-sxm-80gb", "trtllm_version": "1.2.1",
            "trtllm_runtime": "llm_api", "target": {"checkpoint": "/models/Meta-Llama-3.1-8B-Instruct"},
            "speculation": {"method": "eagle3", "head_dir": "/models/EAGLE3-LLaMA3.1-Instruct-8B"},
            "build": {"max_batch_size": 4, "max_input_len": 128, "max_seq_len": 256}, **config}
    import pytest

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("pipeline.plan.gpu_layout.query_gpus", lambda nvidia_smi=None: None)
        cfg = parse_config(data, workdir=workdir)
        plan = make_plan(cfg)
        manifest = {"format": "specdeploy-manifest/1", "name": cfg.name, "config_hash": config_hash(cfg),
                    "engines": plan.engines, "tokenizer_dir": plan.tokenizer_dir, "created": "t"}
        (workdir / "engines" / cfg.name).mkdir(parents=True)
        (workdir / "engines" / cfg.name / "manifest.json").write_text(json.dumps(manifest))
        repos = {arm: repo for arm, (repo, _) in render(cfg).items()}
    for repo in repos.values():
        shutil.copy(STANDIN, repo / "tensorrt_llm" / "1" / "model.py")
    return cfg, repos
