"""The lean Llama forward against Hugging Face (logits; greedy ``generate``, also with
``assistant_model``, as independent oracles), exact KV rollback and tree compaction, checkpoint
refusals, and the int8 weight-only path (real int8 kernel, top-1 agreement with float32)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from pipeline.errors import SpecdeployError
from pipeline.reference.api import GenerationRequest
from pipeline.reference.engine import create_engine
from pipeline.reference.fast.kernels import DRAFT_PACK_ROWS
from pipeline.reference.fast.linear import FastLinear, int8_copy
from pipeline.reference.fast.models import FastLlamaModel
from pipeline.reference.modeling import LlamaModel as PlainLlamaModel
from pipeline.reference.modeling import StepInput
from pipeline.reference.quantize import quantize_checkpoint
from tests.reference_fixtures import eager_kernels, one_thread, random_prompts, shared_checkpoints

TIE_GAP = 1e-4
BOTH = pytest.mark.parametrize("model_type", [FastLlamaModel, PlainLlamaModel], ids=["fast", "plain"])


@pytest.fixture(scope="module")
def ckpt():
    one_thread()
    return shared_checkpoints()


@pytest.fixture(scope="module")
def hf_target(ckpt):
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(str(ckpt["target"])).eval()


def _prefill(model, tokens, pool=None):
    pool = pool or model.new_pool(1, 256)
    cache = pool.allocate()
    hidden = model.forward(pool, [StepInput(cache, tokens, list(range(len(tokens))))])
    return pool, cache, model.logits(hidden)[0]


@pytest.mark.slow  # transformers' Llama: ~3 CPU s to import in a test process (reference_fixtures.py)
@BOTH
@torch.inference_mode()
def test_logits_match_hugging_face(ckpt, hf_target, model_type):
    ids = random_prompts(1, seed=3, min_len=30, max_len=30)[0]
    ref = hf_target(torch.tensor([ids])).logits[0]
    _, _, ours = _prefill(model_type(ckpt["target"]), ids)
    assert (ours - ref).abs().max() < 1e-4


@BOTH
@torch.inference_mode()
def test_rollback_and_compaction_equal_a_cache_built_from_scratch(ckpt, model_type):
    model = model_type(ckpt["target"])
    ids = random_prompts(1, seed=4, min_len=12, max_len=12)[0]
    pool, cache, _ = _prefill(model, ids[:8])
    model.forward(pool, [StepInput(cache, [50, 51, 52], [8, 9, 10])])  # rejected drafts
    cache.rollback(8)
    hidden = model.forward(pool, [StepInput(cache, ids[8:], list(range(8, 12)))])
    clean_pool, clean, _ = _prefill(model, ids[:8])  # same chunking, never saw the drafts
    clean_hidden = model.forward(clean_pool, [StepInput(clean, ids[8:], list(range(8, 12)))])
    assert torch.equal(pool.k[:, cache.slot, :12], clean_pool.k[:, clean.slot, :12])
    assert torch.equal(pool.v[:, cache.slot, :12], clean_pool.v[:, clean.slot, :12])
    assert torch.equal(hidden, clean_hidden)
    fresh_pool, fresh, fresh_logits = _prefill(model, ids)  # one pass: equal up to rounding
    assert torch.allclose(pool.k[:, cache.slot, :12], fresh_pool.k[:, fresh.slot, :12], atol=1e-5)
    assert torch.allclose(model.logits(hidden)[0], fresh_logits[8:], atol=1e-4)
    # a tree [pending, a, b(child of pending), c(child of b)]: accept pending → b → c
    pool, cache, _ = _prefill(model, ids[:8])
    tree = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], dtype=torch.bool)
    model.forward(pool, [StepInput(cache, [ids[8], 77, ids[9], ids[10]], [8, 9, 9, 10], tree)])
    cache.compact(8, [8, 10, 11])
    hidden = model.forward(pool, [StepInput(cache, [ids[11]], [11])])
    assert cache.length == 12
    assert torch.allclose(pool.k[:, cache.slot, :12], fresh_pool.k[:, fresh.slot, :12], atol=1e-5)
    assert torch.allclose(model.logits(hidden)[0, 0], fresh_logits[11], atol=1e-4)


def _tie_aware_equal(hf_model, prompt, ours, theirs) -> bool:
    """Equal, or diverging only where the target's top-2 logit gap is below TIE_GAP."""
    if ours == theirs:
        return True
    i = next(j for j, (a, b) in enumerate(zip(ours, theirs)) if a != b)
    with torch.no_grad():
        logits = hf_model(torch.tensor([prompt + ours[:i]])).logits[0, -1]
    top = logits.topk(2).values
    return float(top[0] - top[1]) < TIE_GAP


@pytest.mark.slow
def test_greedy_matches_hugging_face_generate_and_assisted_generation(ckpt, hf_target):
    from transformers import LlamaForCausalLM

    draft = LlamaForCausalLM.from_pretrained(str(ckpt["draft"])).eval()
    base = create_engine(ckpt["target"])
    spec = create_engine(ckpt["target"], role="speculative",
                         proposer={"method": "draft_target", "draft_dir": str(ckpt["draft"]), "num_draft_tokens": 3})
    try:
        for prompt in random_prompts(12, seed=11):
            ours = base.generate(GenerationRequest(prompt, 12)).output_ids
            ours_spec = spec.generate(GenerationRequest(prompt, 12)).output_ids
            x = torch.tensor([prompt])
            with torch.no_grad():
                plain = hf_target.generate(x, max_new_tokens=12, min_new_tokens=12, do_sample=False)[0, len(prompt):]
                hf_target.generation_config.num_assistant_tokens_schedule = "constant"
                assisted = hf_target.generate(x, assistant_model=draft, max_new_tokens=12, min_new_tokens=12,
                                              do_sample=False, num_assistant_tokens=3)[0, len(prompt):]
            assert _tie_aware_equal(hf_target, prompt, ours, plain.tolist())
            assert _tie_aware_equal(hf_target, prompt, ours_spec, assisted.tolist())
    finally:
        base.shutdown()
        spec.shutdown()


def test_checkpoint_refusals(ckpt, tmp_path):
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    shutil.copy(ckpt["target"] / "config.json", pickled / "config.json")
    (pickled / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(SpecdeployError, match="only safetensors"):
        FastLlamaModel(pickled)
    scaled = tmp_path / "scaled"
    shutil.copytree(ckpt["target"], scaled)
    cfg = json.loads((scaled / "config.json").read_text())
    cfg["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0}
    (scaled / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(SpecdeployError, match="rope scaling"):
        FastLlamaModel(scaled)


@torch.inference_mode()
def test_int8_weight_only_runs_real_int8_and_agrees_on_top1(ckpt, tmp_path):
    quantize_checkpoint(ckpt["target"], tmp_path / "int8")
    cfg = json.loads((tmp_path / "int8" / "config.json").read_text())
    assert cfg["quantization_config"]["quant_method"] == "specdeploy_int8_wo"
    from safetensors.torch import load_file

    state = load_file(str(tmp_path / "int8" / "model.safetensors"))
    assert state["model.layers.0.self_attn.q_proj.weight"].dtype == torch.int8
    assert state["lm_head.weight"].dtype == torch.int8
    q = FastLlamaModel(tmp_path / "int8")
    assert q.layers[0].qkv.int8 and q.layers[0].qkv.weight is None  # int8 product, nothing dequantized
    assert q.lm_head.int8 and q.layers[0].qkv.weight_t.dtype == torch.int8
    ids = random_prompts(1, seed=5, min_len=60, max_len=60)[0]
    _, _, ref = _prefill(FastLlamaModel(ckpt["target"]), ids)
    _, _, got = _prefill(q, ids)
    agree = (ref.argmax(-1) == got.argmax(-1)).float().mean().item()
    assert agree >= 0.85
    with pytest.raises(SpecdeployError, match="already quantized"):
        quantize_checkpoint(tmp_path / "int8", tmp_path / "again")
    with pytest.raises(SpecdeployError, match="not supported"):
        quantize_checkpoint(ckpt["target"], tmp_path / "x", fmt="fp8")


@pytest.mark.slow  # over the quick tier's CPU budget (tests/conftest.py)
def test_int8_rows_are_independent_so_speculation_stays_lossless(ckpt, tmp_path):
    """Per-row activation scales: a row's result does not depend on the batch it is in."""
    quantize_checkpoint(ckpt["target"], tmp_path / "int8")
    q = FastLlamaModel(tmp_path / "int8")
    x = torch.randn(7, q.shape.hidden_size)
    with torch.inference_mode():
        assert torch.equal(q.layers[0].gate_up(x)[2], q.layers[0].gate_up(x[2:3])[0])
    base = create_engine(tmp_path / "int8")
    spec = create_engine(tmp_path / "int8", role="speculative",
                         proposer={"method": "draft_target", "draft_dir": str(ckpt["draft"]), "num_draft_tokens": 3,
                                   "draft_int8": True})
    try:
        for prompt in random_prompts(15, seed=12):
            want = base.generate(GenerationRequest(prompt, 12)).output_ids
            assert spec.generate(GenerationRequest(prompt, 12)).output_ids == want
    finally:
        base.shutdown()
        spec.shutdown()


@torch.inference_mode()
def test_draft_side_int8_runs_the_few_row_kernel_up_to_its_row_limit(ckpt, tmp_path):
    """``int8_copy`` (draft-side weights): up to DRAFT_PACK_ROWS rows run
    ``_weight_int8pack_mm`` on bfloat16 activations, more rows the target-side per-row ``_int_mm``
    on the same int8 weights; both near float32. An int8 checkpoint's Linear gets the same kernel."""
    linear = FastLlamaModel(ckpt["draft"]).layers[0].gate_up
    q = int8_copy(linear)
    weight_int8, scale_bf16 = q.packed  # [out, in] int8, [out] bf16
    assert weight_int8.dtype == torch.int8 and scale_bf16.dtype == torch.bfloat16
    plain = FastLinear(q.weight_t.t(), None, q.scale)  # the same int8 weights, no drafting kernel
    torch.manual_seed(0)
    x = torch.randn(DRAFT_PACK_ROWS + 4, linear.weight.shape[1])
    ref = linear(x)
    few = q(x[:DRAFT_PACK_ROWS])
    dequant = weight_int8.float() * scale_bf16.float()[:, None]
    assert torch.allclose(few, x[:DRAFT_PACK_ROWS].bfloat16().float() @ dequant.t(), rtol=2e-2, atol=2e-2)
    assert not torch.equal(few, plain(x[:DRAFT_PACK_ROWS]))  # not the per-row int8 kernel ...
    assert torch.equal(q(x), plain(x))  # ... which more rows do use
    for got in (few, q(x)):
        assert (got - ref[: got.shape[0]]).abs().max() < 0.05 * ref.abs().max()
    quantize_checkpoint(ckpt["draft"], tmp_path / "int8")
    loaded = FastLlamaModel(tmp_path / "int8").layers[0].gate_up
    assert loaded.int8 and loaded.packed is None
    twin = int8_copy(loaded)
    assert twin.packed is not None and torch.equal(twin.packed[0], loaded.weight_t.t())
    assert int8_copy(twin) is twin
    for draft_int8 in (False, True):  # an int8_wo draft checkpoint: the per-row kernel unless asked
        engine = create_engine(ckpt["target"], role="speculative", proposer={
            "method": "draft_target", "draft_dir": str(tmp_path / "int8"), "num_draft_tokens": 3, "draft_int8": draft_int8})
        try:
            qkv = engine.scheduler.proposer.model.layers[0].qkv
            assert qkv.int8 and (qkv.packed is not None) is draft_int8
            assert engine.scheduler.proposer.model.lean is None  # no float weights to fuse: decode()
        finally:
            engine.shutdown()


@pytest.mark.parametrize("in_features", [200, 264, 40])
@torch.inference_mode()
def test_draft_kernel_is_refused_for_input_widths_it_mishandles(in_features):
    """_weight_int8pack_mm reads out of bounds when in_features is not a multiple of 16 (torch
    2.13: garbage or SIGSEGV); such Linears keep the per-row _int_mm kernel and stay correct."""
    torch.manual_seed(1)
    linear = FastLinear(torch.randn(64, in_features) * 0.05)
    q = int8_copy(linear)
    assert q.int8 and q.packed is None
    x = torch.randn(3, in_features)
    ref = linear(x)
    assert (q(x) - ref).abs().max() < 0.05 * ref.abs().max()


@pytest.mark.parametrize("slots", [[0, 1, 2], [2, 1, 0], [1, 0, 2], [1, 2, 0], [3, 0, 5], [5, 0, 3]],
                         ids=["ascending", "reversed", "swapped", "3-cycle", "with-gaps", "with-gaps-3-cycle"])
@BOTH
@torch.inference_mode()
def test_a_ragged_batch_in_any_slot_order_equals_each_sequence_alone(ckpt, slots, model_type):
    """Batched steps read keys through a pool view when the slots are contiguous (the batch is
    sorted by slot, then put back) and gather them otherwise: either way each row is what the
    sequence gets alone, and its K/V rows land in its own slot."""
    model = model_type(ckpt["target"])
    prompts = random_prompts(3, seed=11, min_len=5, max_len=9)
    news = [[7], [8, 9, 10], [11, 12]]  # ragged widths
    pool = model.new_pool(6, 64)
    pool._free = [s for s in range(6) if s not in slots][::-1] + slots[::-1]
    caches = [pool.allocate() for _ in slots]
    assert [c.slot for c in caches] == slots
    for cache, prompt in zip(caches, prompts):
        model.forward(pool, [StepInput(cache, prompt, list(range(len(prompt))))])
    batched = model.forward(pool, [StepInput(c, n, list(range(c.length, c.length + len(n))))
                                   for c, n in zip(caches, news)])
    for b, (cache, prompt, new) in enumerate(zip(caches, prompts, news)):
        alone_pool, alone_cache, _ = _prefill(model, prompt)
        alone = model.forward(alone_pool, [StepInput(alone_cache, new, list(range(len(prompt), len(prompt) + len(new))))])
        torch.testing.assert_close(batched[b, : len(new)], alone[0], atol=1e-5, rtol=1e-5)
        rows = len(prompt) + len(new)
        torch.testing.assert_close(pool.k[:, cache.slot, :rows], alone_pool.k[:, alone_cache.slot, :rows], atol=1e-5, rtol=1e-5)


def test_every_kernel_is_scripted(monkeypatch):
    """A kernel TorchScript cannot compile silently falls back to Python (slower, same maths):
    this catches it."""
    from pipeline.reference.fast import kernels

    names = ["row_mm", "row_addmm", "inv_rms", "attend_last", "lean_block", "eagle_greedy_chain", "linear",
             "decoder_layer", "lean_decode", "lean_decode_greedy_chain"]
    assert all(isinstance(getattr(kernels, n), torch.jit.ScriptFunction) for n in names)
    eager = eager_kernels(monkeypatch)
    assert not any(isinstance(getattr(eager, n), torch.jit.ScriptFunction) for n in names)
    for name in names:  # each fallback says so
        assert any(f"kernels.{name}: TorchScript failed" in w and "no TorchScript here" in w
                   for w in eager.fallback_warnings), name


@pytest.mark.parametrize("dtype,int8", [(torch.float32, False), (torch.float64, False), (torch.float32, True)],
                         ids=["float32", "float64", "int8"])
@pytest.mark.parametrize("slots", [[0, 1, 2], [3, 0, 5]], ids=["contiguous", "with-gaps"])
@torch.inference_mode()
def test_the_scripted_layer_equals_its_python_function_bit_for_bit(ckpt, slots, dtype, int8, monkeypatch):
    """Every decoder layer is one TorchScript call (``kernels.decoder_layer``); its Python
    function gives the same bits (the engine's results do not depend on TorchScript) for prefill,
    a one-row step, a causal chain, a tree, and ragged batches whose slots are contiguous (keys
    read through a pool view) or not (gathered); float32 (oneDNN / one-row ``mm``), float64
    (``F.linear``) and int8 (``int8_gemm``'s product) projections."""
    from pipeline.reference.fast import models as modeling

    model = FastLlamaModel(ckpt["target"], dtype)
    if int8:
        model.to_int8()
    eager = eager_kernels(monkeypatch)
    prompts = random_prompts(3, seed=13, min_len=5, max_len=9)
    tree = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)  # two children of the pending row
    steps = [
        lambda cs: [StepInput(cs[0], [7], [cs[0].length])],
        lambda cs: [StepInput(cs[1], [8, 9, 10, 11], list(range(cs[1].length, cs[1].length + 4)))],
        lambda cs: [StepInput(cs[2], [12, 13, 14], [cs[2].length] + [cs[2].length + 1] * 2, tree)],
        lambda cs: [StepInput(c, n, list(range(c.length, c.length + len(n))))
                    for c, n in zip(cs, [[5], [6, 7, 8], [9, 10]])],
        lambda cs: [StepInput(c, [15, 16, 17], [c.length] + [c.length + 1] * 2, tree) for c in cs],
    ]
    runs = []
    for layer_fn in (modeling.decoder_layer, eager.decoder_layer):
        monkeypatch.setattr(modeling, "decoder_layer", layer_fn)
        pool = model.new_pool(6, 64)
        pool._free = [s for s in range(6) if s not in slots][::-1] + slots[::-1]
        caches = [pool.allocate() for _ in slots]
        outputs = [model.forward(pool, [StepInput(c, p, list(range(len(p))))]) for c, p in zip(caches, prompts)]
        outputs += [model.forward(pool, make(caches)) for make in steps]
        runs.append((outputs, pool))
    (scripted, scripted_pool), (python, python_pool) = runs
    assert len(scripted) == len(python) == 8
    for a, b in zip(scripted, python):
        assert torch.equal(a, b)
    assert torch.equal(scripted_pool.k, python_pool.k) and torch.equal(scripted_pool.v, python_pool.v)


@torch.inference_mode()
def test_lean_decode_matches_the_batched_forward(ckpt):
    """``FastLlamaModel.decode`` (the lone-sequence drafting path, one row at a time, no masks) gives
    the hidden state and K/V rows the general forward gives, to float rounding."""
    model = FastLlamaModel(ckpt["target"])
    prompt = random_prompts(1, seed=12, min_len=9, max_len=9)[0]
    pool = model.new_pool(2, 64)
    general, lean = pool.allocate(), pool.allocate()
    for cache in (general, lean):
        model.forward(pool, [StepInput(cache, prompt, list(range(len(prompt))))])
    expected = model.forward(pool, [StepInput(general, [5, 6, 7], [9, 10, 11])])[0, -1]
    got = model.decode(lean, [5, 6, 7])
    assert got.shape == (1, model.shape.hidden_size) and lean.length == general.length == 12
    torch.testing.assert_close(got[0], expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(pool.k[:, lean.slot, :12], pool.k[:, general.slot, :12], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(pool.v[:, lean.slot, :12], pool.v[:, general.slot, :12], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="at least one token"):
        model.decode(lean, [])


def _with_random_norms(model: FastLlamaModel, seed: int) -> FastLlamaModel:
    """Norm weights that are not all ones (the lean drafting path folds them into its matmuls)."""
    gen = torch.Generator().manual_seed(seed)

    def rand(like):
        return (torch.rand(like.shape, generator=gen, dtype=torch.float64) * 0.4 + 0.8).to(like.dtype)

    for layer in model.layers:
        layer.input_norm, layer.post_norm = rand(layer.input_norm), rand(layer.post_norm)
    model.norm = rand(model.norm)
    return model


@pytest.mark.parametrize("dtype,int8,tol", [(torch.float64, False, 1e-10), (torch.float32, False, 1e-4),
                                            (torch.float32, True, 2e-2)], ids=["float64", "float32", "int8"])
@torch.inference_mode()
def test_lean_draft_logits_match_the_batched_forward(ckpt, dtype, int8, tol):
    """``FastLlamaModel.draft_logits`` through ``LeanDecodeStep`` (norm weights and the attention
    scale folded into the weights; int8: quantized after folding) gives the logits and K/V rows
    of the general float forward: to rounding in float64 and float32, to ~1% in int8. Without
    ``use_lean_decode`` it is ``logits(decode(...))``."""
    reference = _with_random_norms(FastLlamaModel(ckpt["target"], dtype), seed=4)
    model = _with_random_norms(FastLlamaModel(ckpt["target"], dtype), seed=4)
    assert model.lean is None
    model.use_lean_decode()
    if int8:
        model.to_int8()
    assert model.lean is not None and (model.lean.w_lm.packed is not None) == int8
    prompt = random_prompts(1, seed=13, min_len=9, max_len=9)[0]
    pool = model.new_pool(2, 64)
    general, lean = pool.allocate(), pool.allocate()
    for cache in (general, lean):
        reference.forward(pool, [StepInput(cache, prompt, list(range(len(prompt))))])
    expected = reference.logits(reference.forward(pool, [StepInput(general, [5, 6], [9, 10])])[:, -1])
    got = model.draft_logits(lean, [5, 6])
    assert got.shape == (1, model.shape.vocab_size) and lean.length == general.length == 11
    scale = float(expected.abs().max())
    assert float((got - expected).abs().max()) < tol * scale
    for pool_rows in (pool.k, pool.v):
        rows = pool_rows[:, :, :11]
        assert float((rows[:, lean.slot] - rows[:, general.slot]).abs().max()) < tol * max(1.0, float(rows.abs().max()))
    with pytest.raises(ValueError, match="at least one token"):
        model.draft_logits(lean, [])


@pytest.mark.parametrize("dtype,int8", [(torch.float64, False), (torch.float32, False), (torch.float32, True)],
                         ids=["float64", "float32", "int8"])
@torch.inference_mode()
def test_draft_greedy_chain_drafts_what_draft_logits_and_argmax_draft(ckpt, dtype, int8):
    """A draft model's whole greedy chain in one scripted call against one ``draft_logits`` +
    argmax per draft: the same tokens, the same K/V rows bit for bit (two pools of one slot: the
    same memory layout), the cache holding the fed tokens and every draft but the last; too long
    a chain is refused before anything is written. Without the fused step: None."""
    model = _with_random_norms(FastLlamaModel(ckpt["target"], dtype), seed=6)
    assert model.greedy_chain(model.new_pool(1, 8).allocate(), [5], 2) is None
    model.use_lean_decode()
    if int8:
        model.to_int8()
    prompt = random_prompts(1, seed=14, min_len=9, max_len=9)[0]
    pools = model.new_pool(1, 64), model.new_pool(1, 64)
    chained, stepped = pools[0].allocate(), pools[1].allocate()
    for cache in (chained, stepped):
        model.forward(cache.pool, [StepInput(cache, prompt, list(range(len(prompt))))])
    drafts = model.greedy_chain(chained, [5, 6], 5)
    expected, feed = [], [5, 6]
    for _ in range(5):
        expected.append(int(model.draft_logits(stepped, feed)[0].argmax()))
        feed = expected[-1:]
    assert drafts == expected and len(set(drafts)) > 1
    assert chained.length == stepped.length == len(prompt) + 2 + 4
    rows = chained.length
    assert torch.equal(pools[0].k[:, 0, :rows], pools[1].k[:, 0, :rows])
    assert torch.equal(pools[0].v[:, 0, :rows], pools[1].v[:, 0, :rows])
    with pytest.raises(ValueError, match="longer than the KV cache"):
        model.greedy_chain(chained, [7], 64)
    for feed, k in (([7], 0), ([], 2)):
        with pytest.raises(ValueError, match="at least one"):
            model.greedy_chain(chained, feed, k)
    assert chained.length == rows


def test_batched_step_mask_follows_the_ragged_causal_and_tree_rules():
    """The batch mask, built at once: a real row i of a sequence with ``s`` cached rows sees keys
    ``[0, s + i]``; a padding row the cached keys and itself; a tree or ``visible`` mask replaces
    the new-token block or the cached block of its own sequence only."""
    from pipeline.reference.kv_cache import KVPool
    from pipeline.reference.modeling import StepTensors

    pool = KVPool(1, 4, 32, 1, 4, torch.float32)
    caches = [pool.allocate() for _ in range(3)]
    for cache, length in zip(caches, (5, 0, 3)):
        cache.length = length
    tree = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)  # two children of row 0
    visible = torch.tensor([[1, 0, 1]], dtype=torch.bool)  # hides cached row 1
    inputs = [StepInput(caches[0], [1, 2], [5, 6]), StepInput(caches[1], [3, 4, 5], [0, 1, 1], tree),
              StepInput(caches[2], [6], [3], visible=visible)]
    step = StepTensors(pool, inputs)
    mask = step.mask[:, 0]  # [B, T, K]
    assert step.key_len == 8 and mask.shape == (3, 3, 8)
    assert step.ids.tolist() == [[1, 2, 0], [3, 4, 5], [6, 0, 0]]
    assert step.positions.tolist() == [[5, 6, 6], [0, 1, 1], [3, 3, 3]]
    expected = torch.zeros(3, 3, 8, dtype=torch.bool)
    expected[0, 0, :6] = expected[0, 1, :7] = True  # causal after 5 cached rows
    expected[0, 2, :5] = expected[0, 2, 7] = True  # padding row: cached keys and itself
    expected[1, :, :3] = tree
    expected[2, 0, [0, 2, 3]] = True  # visible cached rows 0 and 2, and itself
    expected[2, 1, [0, 1, 2, 4]] = expected[2, 2, [0, 1, 2, 5]] = True  # padding rows
    assert torch.equal(mask, expected)


@pytest.mark.parametrize("slots", [[0, 1, 2], [0, 2, 5], [3, 5, 0]], ids=["contiguous", "with-gaps", "out-of-order"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@torch.inference_mode()
def test_the_fast_forward_equals_the_plain_maths(ckpt, dtype, slots):
    """``reference.fast_paths`` changes kernels, never maths: the fast model's batched forward
    (scripted layers, keys read through pool views where the slots are contiguous) gives the plain
    model's hidden states and K/V rows bit for bit in float64 (both run ``F.linear`` there) for
    prefill, a one-row step, a causal chain, a tree and ragged batches. Two things only round
    differently: float32 (oneDNN / one-row ``mm`` against ``F.linear``), and a batch whose slots
    are out of order, which the fast path sorts by slot (rows sit elsewhere in each matmul)."""
    prompts = random_prompts(3, seed=17, min_len=5, max_len=9)
    tree = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    steps = [
        lambda cs: [StepInput(cs[0], [7], [cs[0].length])],
        lambda cs: [StepInput(cs[1], [8, 9, 10, 11], list(range(cs[1].length, cs[1].length + 4)))],
        lambda cs: [StepInput(cs[2], [12, 13, 14], [cs[2].length] + [cs[2].length + 1] * 2, tree)],
        lambda cs: [StepInput(c, n, list(range(c.length, c.length + len(n))))
                    for c, n in zip(cs, [[5], [6, 7, 8], [9, 10]])],
        lambda cs: [StepInput(c, [15, 16, 17], [c.length] + [c.length + 1] * 2, tree) for c in cs],
    ]
    runs = []
    for model_type in (FastLlamaModel, PlainLlamaModel):
        model = model_type(ckpt["target"], dtype)
        pool = model.new_pool(6, 64)
        pool._free = [s for s in range(6) if s not in slots][::-1] + slots[::-1]
        caches = [pool.allocate() for _ in slots]
        outputs = [model.forward(pool, [StepInput(c, p, list(range(len(p))))]) for c, p in zip(caches, prompts)]
        outputs += [model.forward(pool, make(caches)) for make in steps]
        outputs.append(model.logits(outputs[-1]))
        runs.append((outputs, pool))
    (fast, fast_pool), (plain, plain_pool) = runs
    assert len(fast) == len(plain) == 9
    if dtype == torch.float64 and slots == sorted(slots):
        assert all(torch.equal(a, b) for a, b in zip(fast, plain))
        assert torch.equal(fast_pool.k, plain_pool.k) and torch.equal(fast_pool.v, plain_pool.v)
    else:
        for a, b in zip(fast, plain):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(fast_pool.k, plain_pool.k, atol=1e-5, rtol=1e-5)


@pytest.mark.slow  # over the quick tier's CPU budget (tests/conftest.py)
def test_fast_paths_off_serves_the_same_tokens(ckpt):
    """The engine switch end to end (float64: no near-ties): every method's greedy output with
    ``fast_paths`` off equals the output with it on, at batch 1 and batched."""
    specs = {"baseline": None,
             "draft_target": {"method": "draft_target", "draft_dir": str(ckpt["draft"]), "num_draft_tokens": 3},
             "medusa": {"method": "medusa", "heads_dir": str(ckpt["medusa"]), "num_heads": 4},
             "eagle_tree": {"method": "eagle", "head_dir": str(ckpt["eagle"]), "choices": [[0], [1], [0, 0], [0, 1]]}}
    prompts = random_prompts(10, seed=23)
    for name, spec in specs.items():
        outputs = []
        for fast_paths in (True, False):
            engine = create_engine(ckpt["target"], role="speculative" if spec else "baseline", proposer=spec,
                                   compute_dtype="float64", fast_paths=fast_paths)
            try:
                alone = [engine.generate(GenerationRequest(p, 10)).output_ids for p in prompts]
                handles = [engine.submit(GenerationRequest(p, 10)) for p in prompts]
                outputs.append((alone, [h.result(timeout=120).output_ids for h in handles]))
            finally:
                engine.shutdown()
        assert outputs[0] == outputs[1], name
        assert outputs[0][0] == outputs[0][1], name
