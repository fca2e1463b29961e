"""The shipped demo models: hash-verified resolution, exact checkpoint formats, and quality floors
(the target continues in-domain text with the right structure; the draft and heads agree with it)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
torch.set_num_threads(1)

from safetensors import safe_open  # noqa: E402 - after the importorskip above

from pipeline import demo  # noqa: E402 - after the importorskip above
from pipeline.demo import corpus  # noqa: E402 - after the importorskip above
from pipeline.errors import SpecdeployError  # noqa: E402 - after the importorskip above

H, V, I_SIZE, HEADS = 256, 1024, 672, 4


def _keys_and_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    with safe_open(str(path), framework="pt") as handle:
        return {key: tuple(handle.get_slice(key).get_shape()) for key in handle.keys()}


@pytest.fixture(scope="module")
def target_and_tokenizer():
    from transformers import AutoTokenizer, LlamaForCausalLM

    target_dir = demo.resolve_builtin("builtin:tiny-target")
    return LlamaForCausalLM.from_pretrained(str(target_dir)).eval(), AutoTokenizer.from_pretrained(str(target_dir))


def test_every_builtin_resolves_to_a_verified_shipped_dir():
    for name in demo.BUILTIN_NAMES:
        path = demo.resolve_builtin(f"builtin:{name}")
        assert path == demo.ARTIFACTS_DIR / name
        assert (path / demo.WEIGHT_FILES[name]).is_file()
    sums = demo.read_sums(demo.ARTIFACTS_DIR)
    assert {rel.split("/")[0] for rel in sums} == set(demo.BUILTIN_NAMES)


def test_unknown_builtin_is_a_clear_error():
    with pytest.raises(SpecdeployError, match="unknown demo model 'builtin:tiny-giant'.*builtin:tiny-target"):
        demo.resolve_builtin("builtin:tiny-giant")


def test_corrupted_copy_is_refused_with_a_retrain_hint(tmp_path, monkeypatch):
    shutil.copytree(demo.ARTIFACTS_DIR / "tiny-medusa", tmp_path / "tiny-medusa")
    shutil.copy(demo.ARTIFACTS_DIR / "SHA256SUMS.txt", tmp_path / "SHA256SUMS.txt")
    assert demo.verify_artifact("tiny-medusa", tmp_path) == tmp_path / "tiny-medusa"
    weights = tmp_path / "tiny-medusa" / "medusa_lm_head.safetensors"
    data = bytearray(weights.read_bytes())
    data[-7] ^= 0x01  # one flipped bit in a weight
    weights.write_bytes(bytes(data))
    with pytest.raises(SpecdeployError, match="'tiny-medusa' is corrupted: .*medusa_lm_head.safetensors.*specdeploy demo train"):
        demo.verify_artifact("tiny-medusa", tmp_path)
    monkeypatch.setattr(demo, "ARTIFACTS_DIR", tmp_path)
    with pytest.raises(SpecdeployError, match="corrupted"):
        demo.resolve_builtin("tiny-medusa")


def test_missing_file_and_missing_record_are_errors(tmp_path):
    shutil.copytree(demo.ARTIFACTS_DIR / "tiny-eagle", tmp_path / "tiny-eagle")
    with pytest.raises(SpecdeployError, match="no recorded sha256"):
        demo.verify_artifact("tiny-eagle", tmp_path)
    shutil.copy(demo.ARTIFACTS_DIR / "SHA256SUMS.txt", tmp_path / "SHA256SUMS.txt")
    (tmp_path / "tiny-eagle" / "config.json").unlink()
    with pytest.raises(SpecdeployError, match="incomplete: .*config.json is missing"):
        demo.verify_artifact("tiny-eagle", tmp_path)


@pytest.mark.parametrize("name", ["tiny-target", "tiny-draft"])
def test_llama_checkpoints_have_the_hf_layout(name):
    model_dir = demo.resolve_builtin(name)
    config = json.loads((model_dir / "config.json").read_text())
    layers = 6 if name == "tiny-target" else 1
    assert config["architectures"] == ["LlamaForCausalLM"] and config["model_type"] == "llama"
    assert (config["vocab_size"], config["hidden_size"], config["intermediate_size"]) == (V, H, I_SIZE)
    assert (config["num_hidden_layers"], config["num_attention_heads"], config["num_key_value_heads"]) == (layers, HEADS, HEADS)
    assert config["tie_word_embeddings"] is True and config["torch_dtype"] == "float32"
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (1, 2, 0)
    for key in ("rms_norm_eps", "rope_theta", "max_position_embeddings"):
        assert key in config
    for file in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
        assert (model_dir / file).is_file()
    shapes = _keys_and_shapes(model_dir / "model.safetensors")
    assert shapes["model.embed_tokens.weight"] == (V, H) and shapes["model.norm.weight"] == (H,)
    assert "lm_head.weight" not in shapes  # tied
    assert shapes[f"model.layers.{layers - 1}.mlp.gate_proj.weight"] == (I_SIZE, H)
    assert len(shapes) == 2 + 9 * layers


def test_medusa_checkpoint_has_the_upstream_layout():
    heads_dir = demo.resolve_builtin("tiny-medusa")
    config = json.loads((heads_dir / "config.json").read_text())
    assert config == {"medusa_num_heads": 5, "medusa_num_layers": 1, "hidden_size": H, "vocab_size": V,
                      "base_model_name_or_path": "builtin:tiny-target"}
    expected = {}
    for i in range(5):
        expected |= {f"{i}.0.linear.weight": (H, H), f"{i}.0.linear.bias": (H,), f"{i}.1.weight": (V, H)}
    assert _keys_and_shapes(heads_dir / "medusa_lm_head.safetensors") == expected


def test_eagle_checkpoint_has_the_upstream_layout():
    head_dir = demo.resolve_builtin("tiny-eagle")
    config = json.loads((head_dir / "config.json").read_text())
    assert config["num_hidden_layers"] == 1 and config["bias"] is True and config["hidden_size"] == H
    expected = {"fc.weight": (H, 2 * H), "fc.bias": (H,), "embed_tokens.weight": (V, H),
                "layers.0.post_attention_layernorm.weight": (H,),
                "layers.0.mlp.gate_proj.weight": (I_SIZE, H), "layers.0.mlp.up_proj.weight": (I_SIZE, H),
                "layers.0.mlp.down_proj.weight": (H, I_SIZE)}
    expected |= {f"layers.0.self_attn.{p}_proj.weight": (H, H) for p in "qkvo"}
    assert _keys_and_shapes(head_dir / "model.safetensors") == expected
    with safe_open(str(head_dir / "model.safetensors"), framework="pt") as eagle, \
         safe_open(str(demo.resolve_builtin("tiny-target") / "model.safetensors"), framework="pt") as target:
        assert torch.equal(eagle.get_tensor("embed_tokens.weight"), target.get_tensor("model.embed_tokens.weight"))


def _greedy(model, tokenizer, prompt: str, new_tokens: int):
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    assert ids[0, 0].item() == tokenizer.bos_token_id
    out = model.generate(ids, max_new_tokens=new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0)
    return ids, out


def _continuation(model, tokenizer, prompt: str, new_tokens: int) -> str:
    """Greedy continuation up to the end of the document (the first ``</s>``)."""
    ids, out = _greedy(model, tokenizer, prompt, new_tokens)
    return tokenizer.decode(out[0, ids.shape[1]:]).split("</s>")[0]


@pytest.mark.slow  # over the quick tier's CPU budget (tests/conftest.py)
def test_target_continues_arithmetic_with_the_right_structure(target_and_tokenizer):
    model, tokenizer = target_and_tokenizer
    good = 0
    for sample in corpus.samples("arithmetic", 5, seed=corpus.HELDOUT_SEED + 99):
        prompt = "\n".join(sample.splitlines()[:2])  # documents have 4-7 lines: it must go on
        lines = _continuation(model, tokenizer, prompt, 24).split("\n")
        complete = lines[1:-1] if len(lines) > 2 else lines[1:]  # [0] ends the prompt's line
        good += bool(complete) and all(re.fullmatch(r"\d+ [-+*] \d+ = \d+", line) for line in complete)
    assert good >= 4, good


# slow: the module fixture loads the target through transformers' Llama, ~3 CPU s to import in a
# process where nothing else in the quick tier imports it (tests/reference_fixtures.py)
@pytest.mark.slow
def test_target_continues_code_with_python_structure(target_and_tokenizer):
    model, tokenizer = target_and_tokenizer
    text = _continuation(model, tokenizer, "def count_items(items, limit):\n    total = 0", 30)
    # the structure of the 'total' template (the tiny target does not reliably copy names)
    assert re.match(r"\n    for (\w+) in \w+:\n        if \1 > \w+:\n            total = total [-+*] \1\n    return total\n", text), text


@pytest.mark.slow
def test_draft_agrees_with_the_target_on_held_out_prompts(target_and_tokenizer):
    from transformers import LlamaForCausalLM

    model, tokenizer = target_and_tokenizer
    draft = LlamaForCausalLM.from_pretrained(str(demo.resolve_builtin("tiny-draft"))).eval()
    hits = total = 0
    for category in corpus.IN_DOMAIN:
        for record in corpus.prompts(category, 3, seed=corpus.HELDOUT_SEED + 99):
            ids, out = _greedy(model, tokenizer, record["prompt"], 24)
            with torch.no_grad():
                draft_top1 = draft(input_ids=out).logits[0, ids.shape[1] - 1 : -1].argmax(-1)
            hits += int((draft_top1 == out[0, ids.shape[1]:]).sum())
            total += out.shape[1] - ids.shape[1]
    assert hits / total > 0.6, hits / total


def test_training_report_matches_the_shipped_hashes():
    report = json.loads((demo.ARTIFACTS_DIR / "training_report.json").read_text())
    assert report["sha256"] == demo.read_sums(demo.ARTIFACTS_DIR)
    assert report["quality"]["draft_top1_agreement"]["in_domain"] > 0.6


@pytest.mark.slow  # the module fixture's transformers Llama (see above)
def test_reference_engine_reads_the_heads_with_the_training_semantics(target_and_tokenizer):
    """The contract between this package (training) and the CPU engine (serving): the same
    features, Medusa logits and EAGLE hidden states from both implementations."""
    from pipeline.demo.heads import load_eagle, load_medusa
    from pipeline.reference import modeling

    model, tokenizer = target_and_tokenizer
    ids = tokenizer("def count_items(items, limit):\n    total = 0\n    for item in items:").input_ids
    with torch.no_grad():
        features = model.model(input_ids=torch.tensor([ids])).last_hidden_state[0]  # [T, H], after the norm
        engine_target = modeling.LlamaModel(demo.resolve_builtin("tiny-target"))
        pool = engine_target.new_pool(1, 128)
        engine_features = engine_target.forward(pool, [modeling.StepInput(pool.allocate(), ids, list(range(len(ids))))])[0]
        assert torch.allclose(features, engine_features, atol=1e-4)

        medusa = load_medusa(demo.resolve_builtin("tiny-medusa"))(features[None])[:, 0].transpose(0, 1)  # [T, heads, V]
        engine_medusa = modeling.MedusaHeads(demo.resolve_builtin("tiny-medusa"), torch.float32).logits(features)
        assert torch.allclose(medusa, engine_medusa, atol=1e-4)

        eagle_dir = demo.resolve_builtin("tiny-eagle")
        h = load_eagle(eagle_dir)(torch.tensor([ids[1:]]), features[None, :-1])[0]  # pairs (f_t, x_{t+1}) at position t
        engine_eagle = modeling.EagleHead(eagle_dir, engine_target, torch.float32)
        epool = engine_eagle.new_pool(1, 128)
        engine_h = engine_eagle.forward(epool, [modeling.StepInput(epool.allocate(), ids[1:], list(range(len(ids) - 1)))], features[None, :-1])[0]
        assert torch.allclose(h, engine_h, atol=1e-4)
