"""A real reference-backend build (no fakes): tiny local checkpoints made here (HF Llama target and
draft, Medusa heads, EAGLE head, a WordLevel tokenizer) go through the real build runner and
``python -m pipeline.build.reference_step`` subprocesses; the engine dirs load in the reference
engine and the speculative engines reproduce the baseline's greedy output. A re-run is cached."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from pipeline.build.builder import SubprocessExecutor, build, load_manifest  # noqa: E402 - after the importorskip above
from pipeline.cli import run as cli_run  # noqa: E402 - after the importorskip above
from pipeline.config import parse_config  # noqa: E402 - after the importorskip above
from pipeline.errors import BuildError  # noqa: E402 - after the importorskip above
from pipeline.reference.api import ENGINE_FORMAT, GenerationRequest, SamplingParams  # noqa: E402 - after the importorskip above

VOCAB, HIDDEN = 64, 32


def save_tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, VOCAB)}}
    tokenizer = Tokenizer(models.WordLevel(vocab=words, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}))
    (out / "special_tokens_map.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}))


def save_llama(out: Path, seed: int, layers: int) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6,
        tie_word_embeddings=True, initializer_range=0.2, bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )
    LlamaForCausalLM(config).save_pretrained(str(out), safe_serialization=True)
    save_tokenizer(out)
    return out


def save_medusa(out: Path, heads: int) -> Path:
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(3)
    state = {}
    for i in range(heads):
        state[f"{i}.0.linear.weight"] = torch.randn(HIDDEN, HIDDEN, generator=g) * 0.1
        state[f"{i}.0.linear.bias"] = torch.zeros(HIDDEN)
        state[f"{i}.1.weight"] = torch.randn(VOCAB, HIDDEN, generator=g) * 0.1
    out.mkdir(parents=True)
    save_file(state, str(out / "medusa_lm_head.safetensors"))
    (out / "config.json").write_text(json.dumps({"medusa_num_heads": heads, "medusa_num_layers": 1, "hidden_size": HIDDEN,
                                                 "vocab_size": VOCAB, "base_model_name_or_path": "target"}))
    return out


def save_eagle(out: Path, target: Path) -> Path:
    from safetensors.torch import load_file, save_file

    g = torch.Generator().manual_seed(4)
    inter, kv = 2 * HIDDEN, HIDDEN // 2

    def rnd(*shape):
        return torch.randn(*shape, generator=g) * 0.1

    state = {
        "fc.weight": rnd(HIDDEN, 2 * HIDDEN), "fc.bias": rnd(HIDDEN),
        "embed_tokens.weight": load_file(str(target / "model.safetensors"))["model.embed_tokens.weight"].clone(),
        "layers.0.self_attn.q_proj.weight": rnd(HIDDEN, HIDDEN), "layers.0.self_attn.k_proj.weight": rnd(kv, HIDDEN),
        "layers.0.self_attn.v_proj.weight": rnd(kv, HIDDEN), "layers.0.self_attn.o_proj.weight": rnd(HIDDEN, HIDDEN),
        "layers.0.post_attention_layernorm.weight": torch.ones(HIDDEN),
        "layers.0.mlp.gate_proj.weight": rnd(inter, HIDDEN), "layers.0.mlp.up_proj.weight": rnd(inter, HIDDEN),
        "layers.0.mlp.down_proj.weight": rnd(HIDDEN, inter),
    }
    out.mkdir(parents=True)
    save_file(state, str(out / "model.safetensors"))
    config = json.loads((target / "config.json").read_text())
    config.update(num_hidden_layers=1, bias=True)
    (out / "config.json").write_text(json.dumps(config))
    return out


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("ckpt")
    target = save_llama(root / "target", seed=0, layers=2)
    return {
        "target": target,
        "draft": save_llama(root / "draft", seed=1, layers=1),
        "medusa": save_medusa(root / "medusa", heads=3),
        "eagle": save_eagle(root / "eagle", target),
    }


class CountingExecutor(SubprocessExecutor):
    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def run(self, step, argv, log_path):
        self.names.append(step.name)
        return super().run(step, argv, log_path)


def reference_cfg(name: str, target: Path, speculation: dict, **target_extra) -> dict:
    return {
        "name": name, "backend": "reference", "hardware": "cpu",
        "target": {"checkpoint": str(target), "dtype": "float32", **target_extra},
        "speculation": speculation,
        "build": {"max_batch_size": 4, "max_input_len": 64, "max_seq_len": 128},
    }


def read_descriptor(engine_dir: str) -> dict:
    return json.loads((Path(engine_dir) / "engine.json").read_text())


def greedy(engine_dir: str, prompt: list[int], n: int = 6) -> list[int]:
    from pipeline.reference.engine import load_engine

    engine = load_engine(Path(engine_dir))
    try:
        request = GenerationRequest(input_ids=prompt, max_new_tokens=n, sampling=SamplingParams(top_k=1))
        return engine.generate(request).output_ids
    finally:
        engine.shutdown()


@pytest.mark.slow
def test_draft_target_reference_build(checkpoints, tmp_path: Path) -> None:
    spec = {"method": "draft_target", "num_draft_tokens": 3,
            "draft": {"checkpoint": str(checkpoints["draft"]), "dtype": "float32", "quantization": {"format": "int8_wo"}}}
    cfg = parse_config(reference_cfg("ref-dtm", checkpoints["target"], spec), workdir=tmp_path)
    executor = CountingExecutor()
    manifest = build(cfg, executor=executor, progress=False)
    assert executor.names == ["resolve-target", "resolve-draft", "quantize-draft", "engine-baseline", "engine-target",
                              "engine-draft", "engine-speculative"]
    assert manifest == load_manifest(cfg)
    assert set(manifest["engines"]) == {"baseline", "target", "draft", "speculative"}
    assert manifest["tokenizer_dir"] == str(checkpoints["target"].resolve())
    assert manifest["backend"] == "reference" and manifest["trtllm_version"] is None
    quantized = tmp_path / "engines" / "ref-dtm" / "checkpoints" / "draft-int8_wo"
    assert json.loads((quantized / "config.json").read_text())["quantization_config"]["quant_method"]
    descriptors = {role: read_descriptor(path) for role, path in manifest["engines"].items()}
    for role, d in descriptors.items():
        assert d["format"] == ENGINE_FORMAT and d["role"] == role and Path(d["model_dir"]).is_absolute()
        # draft-target engines take the re-sent context plus drafts: max_input_len = max_seq_len - 1, as on GPU (issue 44)
        assert d["max_batch_size"] == 4 and d["max_seq_len"] == 128 and d["max_input_len"] == 127
    assert descriptors["baseline"]["model_dir"] == str(checkpoints["target"].resolve())
    assert descriptors["target"]["max_draft_len"] == 3 and descriptors["baseline"]["max_draft_len"] == 0
    assert descriptors["draft"]["model_dir"] == str(quantized) and descriptors["draft"]["quantization"] == "int8_wo"
    assert descriptors["speculative"]["proposer"] == {"method": "draft_target", "draft_dir": str(quantized),
                                                      "quantization": "int8_wo", "num_draft_tokens": 3}
    prompt = [5, 9, 17, 3, 22]
    assert greedy(manifest["engines"]["speculative"], prompt) == greedy(manifest["engines"]["baseline"], prompt)

    again = CountingExecutor()
    rerun = build(cfg, executor=again, progress=False)
    assert again.names == [] and {s["status"] for s in rerun["steps"]} == {"cached"}


def check_tree_build(method: str, manifest: dict, checkpoints: dict[str, Path]) -> None:
    """A tree method's build: two engines, the proposer's head and its chain of choices, and the
    speculative engine reproducing the baseline's greedy output."""
    assert set(manifest["engines"]) == {"baseline", "speculative"}
    d = read_descriptor(manifest["engines"]["speculative"])
    key = "heads_dir" if method == "medusa" else "head_dir"
    assert d["proposer"]["method"] == method and d["proposer"][key] == str(checkpoints[method].resolve())
    assert d["proposer"]["choices"] == [[0], [0, 0], [0, 0, 0]] and d["max_draft_len"] == 3
    prompt = [4, 8, 15, 16, 23]
    assert greedy(manifest["engines"]["speculative"], prompt) == greedy(manifest["engines"]["baseline"], prompt)


@pytest.mark.slow  # over the quick tier's CPU budget (tests/conftest.py)
def test_tree_method_reference_build(checkpoints, tmp_path: Path) -> None:
    # Medusa here; EAGLE's default build is the one test_fast_paths_off_reaches_every_engine_descriptor
    # makes (the same config, built once for both claims)
    spec = {"method": "medusa", "heads_dir": str(checkpoints["medusa"]), "num_heads": 3}
    cfg = parse_config(reference_cfg("ref-medusa", checkpoints["target"], spec), workdir=tmp_path)
    check_tree_build("medusa", build(cfg, progress=False), checkpoints)


@pytest.mark.slow  # over the quick tier's CPU budget (tests/conftest.py)
def test_fast_paths_off_reaches_every_engine_descriptor(checkpoints, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``reference.fast_paths: false`` → every engine.json says so and loads the plain models (not
    the fast subclasses); the default writes true. Output is the same either way. The default
    build is also the EAGLE tree-method build (check_tree_build)."""
    from pipeline.reference.engine import load_engine
    from pipeline.reference.modeling import EagleHead, LlamaModel

    monkeypatch.chdir(tmp_path)
    spec = {"method": "eagle", "head_dir": str(checkpoints["eagle"]), "num_layers": 3}
    manifests = {}
    for fast_paths in (True, False):
        raw = reference_cfg(f"ref-fast-{fast_paths}".lower(), checkpoints["target"], spec)
        if not fast_paths:  # True: no reference section at all, so the default is what writes true
            raw["reference"] = {"fast_paths": False}
        manifests[fast_paths] = build(parse_config(raw), progress=False)
        for path in manifests[fast_paths]["engines"].values():
            assert read_descriptor(path)["fast_paths"] is fast_paths
    check_tree_build("eagle", manifests[True], checkpoints)
    engine = load_engine(Path(manifests[False]["engines"]["speculative"]))
    try:
        assert type(engine.scheduler.target) is LlamaModel and type(engine.scheduler.proposer.head) is EagleHead
    finally:
        engine.shutdown()
    prompt = [4, 8, 15, 16, 23]
    assert greedy(manifests[False]["engines"]["speculative"], prompt) == greedy(manifests[True]["engines"]["baseline"], prompt)


def test_bad_local_checkpoint_fails_in_resolve(tmp_path: Path) -> None:
    bad = tmp_path / "not-a-model"
    bad.mkdir()
    (bad / "config.json").write_text("{}")
    cfg = parse_config(reference_cfg("ref-bad", bad, {"method": "none"}), workdir=tmp_path)
    with pytest.raises(BuildError) as err:
        build(cfg, progress=False)
    assert "step resolve-target failed" in str(err.value) and "lacks model.safetensors" in str(err.value)
    root = tmp_path / "engines" / "ref-bad"
    assert not (root / "checkpoints" / "target-hf").exists() and not (root / "manifest.json").exists()


@pytest.mark.slow  # builds from the module's checkpoints: over the quick tier's CPU budget (tests/conftest.py)
def test_cli_build_and_dry_run(checkpoints, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    import yaml

    monkeypatch.setenv("COLUMNS", "200")
    path = tmp_path / "base.yaml"
    path.write_text(yaml.safe_dump(reference_cfg("ref-cli", checkpoints["target"], {"method": "none"})))
    assert cli_run(["build", str(path), "--workdir", str(tmp_path), "--dry-run"]) == 0
    assert "would run" in capsys.readouterr().out
    assert cli_run(["build", str(path), "--workdir", str(tmp_path), "--no-progress"]) == 0
    assert "built 2, cached 0 step(s)" in capsys.readouterr().out
    assert os.path.islink(tmp_path / "engines" / "ref-cli" / "checkpoints" / "target-hf")
    assert cli_run(["build", str(path), "--workdir", str(tmp_path), "--no-progress"]) == 0
    assert "built 0, cached 2 step(s)" in capsys.readouterr().out
