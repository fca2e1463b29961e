"""EAGLE-3 in the reference engine: greedy output equals target-only output (float64, plain and
fast paths, batch 1 and batched); sampled output follows the exact target distribution
(chi-square); the target's captured layers are the same on both paths; the head loads from
safetensors only (``torch.load`` refused), including the shipped demo head, which drafts well
enough on the demo target to be worth it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from pipeline.errors import SpecdeployError
from pipeline.reference.api import GenerationRequest, SamplingParams
from pipeline.reference.engine import create_engine
from tests.reference_fixtures import HIDDEN, VOCAB, chi2_pvalue, one_thread, random_prompts, shared_checkpoints

NEW_TOKENS = 16
PROMPTS = random_prompts(80, seed=11)
LAYERS = [0, 1, 1]  # the random target has 2 layers


def make_eagle3(out: Path, seed: int, target_dir: Path, draft_vocab: int = 64) -> Path:
    """A random EAGLE-3 head in the upstream layout (``midlayer.*``, ``d2t``, no ``embed_tokens``)
    over a random reduced draft vocabulary."""
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    hidden, inter, kv = HIDDEN, 2 * HIDDEN, HIDDEN // 2

    def rnd(*shape):
        return torch.randn(*shape, generator=g) * 0.1

    draft_ids = torch.randperm(VOCAB, generator=g)[:draft_vocab].sort().values
    state = {
        "fc.weight": rnd(hidden, len(LAYERS) * hidden),
        "midlayer.input_layernorm.weight": torch.ones(hidden),
        "midlayer.hidden_norm.weight": torch.ones(hidden),
        "midlayer.self_attn.q_proj.weight": rnd(hidden, 2 * hidden),
        "midlayer.self_attn.k_proj.weight": rnd(kv, 2 * hidden),
        "midlayer.self_attn.v_proj.weight": rnd(kv, 2 * hidden),
        "midlayer.self_attn.o_proj.weight": rnd(hidden, hidden),
        "midlayer.post_attention_layernorm.weight": torch.ones(hidden),
        "midlayer.mlp.gate_proj.weight": rnd(inter, hidden),
        "midlayer.mlp.up_proj.weight": rnd(inter, hidden),
        "midlayer.mlp.down_proj.weight": rnd(hidden, inter),
        "norm.weight": torch.ones(hidden),
        "lm_head.weight": rnd(draft_vocab, hidden) * 3,
        "d2t": draft_ids - torch.arange(draft_vocab),
    }
    out.mkdir(parents=True, exist_ok=True)
    save_file(state, str(out / "model.safetensors"))
    cfg = json.loads((target_dir / "config.json").read_text())
    cfg.update({"num_hidden_layers": 1, "architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": draft_vocab,
                "eagle_config": {"eagle_aux_hidden_state_layer_ids": LAYERS}})
    (out / "config.json").write_text(json.dumps(cfg))
    return out


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    one_thread()
    shared = shared_checkpoints()
    return {**shared, "eagle3": make_eagle3(tmp_path_factory.mktemp("eagle3"), 5, shared["target"])}


def _spec(ckpt, depth=3):
    return {"method": "eagle3", "head_dir": str(ckpt["eagle3"]), "max_draft_len": depth}


def _engine(ckpt, spec=None, dtype="float64", **kw):
    return create_engine(ckpt["target"], role="speculative" if spec else "baseline", proposer=spec,
                         compute_dtype=dtype, **kw)


def _run(engine, prompts, batched: bool, **req):
    if batched:
        handles = [engine.submit(GenerationRequest(p, NEW_TOKENS, **req)) for p in prompts]
        return [h.result(timeout=120) for h in handles]
    return [engine.generate(GenerationRequest(p, NEW_TOKENS, **req)) for p in prompts]


@pytest.fixture(scope="module")
def reference_outputs(ckpt):
    engine = _engine(ckpt)
    try:
        return [r.output_ids for r in _run(engine, PROMPTS, batched=False)]
    finally:
        engine.shutdown()


@pytest.mark.slow
@pytest.mark.parametrize("fast_paths", [True, False], ids=["fast", "plain"])
@pytest.mark.parametrize("batched", [False, True], ids=["batch1", "batched"])
def test_greedy_eagle3_is_lossless(ckpt, reference_outputs, batched, fast_paths):
    engine = _engine(ckpt, _spec(ckpt), fast_paths=fast_paths)
    try:
        results = _run(engine, PROMPTS, batched)
    finally:
        engine.shutdown()
    mismatches = [i for i, r in enumerate(results) if r.output_ids != reference_outputs[i]]
    assert not mismatches, f"{len(mismatches)} prompts differ, first {mismatches[:5]}"
    assert sum(r.stats.verify_steps for r in results) > 0
    assert sum(r.stats.draft_tokens for r in results) > 0


def _exact_first_two(ckpt, prompt, params):
    from transformers import LlamaForCausalLM

    from pipeline.reference.sampling import to_probs

    model = LlamaForCausalLM.from_pretrained(str(ckpt["target"]), dtype=torch.float64).eval()
    with torch.no_grad():
        first = to_probs(model(torch.tensor([prompt])).logits[0, -1], params)
        ctx = torch.tensor([prompt + [0]] * VOCAB)
        ctx[:, -1] = torch.arange(VOCAB)
        second = to_probs(model(ctx).logits[:, -1], params)
    return first, first @ second


@pytest.mark.slow
def test_sampled_eagle3_matches_target_distribution(ckpt):
    """Drafts sampled from the head's distribution over its reduced vocabulary (zero elsewhere);
    rejection sampling against the target keeps the first two tokens' marginals exact."""
    params = SamplingParams(temperature=0.7, top_k=40, top_p=0.95)
    prompt = [5, 17, 33, 8]
    first, second = _exact_first_two(ckpt, prompt, params)
    engine = _engine(ckpt, _spec(ckpt, depth=2), prefix_cache_entries=0)
    try:
        handles = [engine.submit(GenerationRequest(prompt, 2, sampling=SamplingParams(
            temperature=0.7, top_k=40, top_p=0.95, seed=s))) for s in range(2000)]
        outs = [h.result(timeout=300) for h in handles]
    finally:
        engine.shutdown()
    c1, c2 = torch.zeros(VOCAB, dtype=torch.float64), torch.zeros(VOCAB, dtype=torch.float64)
    for out in outs:
        c1[out.output_ids[0]] += 1
        c2[out.output_ids[1]] += 1
    assert sum(o.stats.draft_tokens for o in outs) > 0
    assert chi2_pvalue(c1, first) > 1e-3 and chi2_pvalue(c2, second) > 1e-3


@torch.inference_mode()
def test_captured_layers_equal_on_plain_and_fast_paths(ckpt):
    from pipeline.reference.fast.models import FAST_MODELS
    from pipeline.reference.modeling import PLAIN_MODELS, StepInput

    def step(target):
        pool = target.new_pool(3, 64)
        caches = [pool.allocate() for _ in range(3)][::-1]  # out of slot order: the fast path reorders
        return pool, [StepInput(c, p, list(range(len(p)))) for c, p in zip(caches, PROMPTS[:3])]

    captured = {}
    for name, models in (("plain", PLAIN_MODELS), ("fast", FAST_MODELS)):
        target = models.llama(ckpt["target"], torch.float64)
        hidden, aux = target.forward_capture(*step(target), (0, 1, 1))
        assert torch.equal(hidden, target.forward(*step(target)))
        captured[name] = aux
        assert aux.shape[-1] == 3 * HIDDEN and torch.equal(aux[..., HIDDEN : 2 * HIDDEN], aux[..., 2 * HIDDEN :])
    torch.testing.assert_close(captured["fast"], captured["plain"], rtol=0, atol=1e-12)


def test_head_loads_from_safetensors_only(ckpt, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("torch.load called")

    monkeypatch.setattr(torch, "load", refuse)
    engine = _engine(ckpt, _spec(ckpt), dtype="float32")
    try:
        assert engine.generate(GenerationRequest(PROMPTS[0], 4)).output_ids
        assert engine.scheduler.proposer.capture_layers == tuple(LAYERS)
    finally:
        engine.shutdown()
    assert sorted(p.name for p in ckpt["eagle3"].iterdir()) == ["config.json", "model.safetensors"]


def test_head_whose_fc_does_not_fit_the_capture_layers_is_refused(ckpt, tmp_path):
    head = tmp_path / "head"
    head.mkdir()
    (head / "model.safetensors").write_bytes((ckpt["eagle3"] / "model.safetensors").read_bytes())
    cfg = json.loads((ckpt["eagle3"] / "config.json").read_text())
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [0, 1]
    (head / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(SpecdeployError, match="fc takes"):
        _engine(ckpt, {"method": "eagle3", "head_dir": str(head), "max_draft_len": 2})


@pytest.mark.slow
def test_shipped_demo_head_is_lossless_and_drafts_well(monkeypatch):
    """The shipped tiny-eagle3 on the shipped tiny-target: greedy equals target-only, and a
    trained head gets most of its first drafts accepted on in-domain text (a random one would
    not)."""
    from pipeline.demo import resolve_builtin
    from pipeline.demo.tokenizer import load_tokenizer

    monkeypatch.setattr(torch, "load", lambda *a, **k: (_ for _ in ()).throw(AssertionError("torch.load")))
    target, head = resolve_builtin("tiny-target"), resolve_builtin("tiny-eagle3")
    tok = load_tokenizer(target)
    prompts = [[1] + tok.encode(t).ids for t in ("def add(a, b):", "The river", "name: alice, age:")]
    base = create_engine(target, compute_dtype="float32")
    spec = create_engine(target, role="speculative", compute_dtype="float32",
                         proposer={"method": "eagle3", "head_dir": str(head), "max_draft_len": 4})
    try:
        want = [base.generate(GenerationRequest(p, 32)).output_ids for p in prompts]
        got = [spec.generate(GenerationRequest(p, 32)) for p in prompts]
    finally:
        base.shutdown()
        spec.shutdown()
    assert [r.output_ids for r in got] == want
    first = sum(r.stats.accepted_per_position[0] for r in got) / sum(r.stats.drafted_per_position[0] for r in got)
    assert first > 0.5
