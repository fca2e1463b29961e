"""The lean one-sequence EAGLE path (``EagleHead.extend`` / ``LeanEagleStep``) against the general
batched ``EagleHead.forward``: the split fc equals fc over the concatenation; extend writes the
same K/V rows and predicts the same feature (float64: to rounding; float32 and int8: closely);
a lone sequence drafts the same tokens as the same sequence inside a batch; the single-chain
causal mask of the target's verify step equals the general mask. Losslessness of the engine
with this path is covered by test_reference_engine (batch 1 runs it)."""

from __future__ import annotations

import shutil

import pytest
import torch
import torch.nn.functional as F

from pipeline.reference.api import GenerationRequest, SamplingParams
from pipeline.reference.engine import create_engine
from pipeline.reference.fast.models import FastEagleHead, FastLlamaModel
from pipeline.reference.kv_cache import KVPool
from pipeline.reference.modeling import EagleHead, LlamaModel, StepInput, StepTensors
from pipeline.reference.sequence import SeqState, make_generator
from tests.reference_fixtures import VOCAB, eager_kernels, one_thread, random_prompts, shared_checkpoints


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """The shared random checkpoints, plus an EAGLE head whose post-attention RMSNorm weight is
    not all ones (the lean path folds it into the gate/up weights)."""
    from safetensors.torch import load_file, save_file

    one_thread()
    shared = shared_checkpoints()
    eagle = tmp_path_factory.mktemp("eagle-norm")
    shutil.copy(shared["eagle"] / "config.json", eagle / "config.json")
    state = load_file(str(shared["eagle"] / "model.safetensors"))
    gen = torch.Generator().manual_seed(11)
    norm = state["layers.0.post_attention_layernorm.weight"]
    state["layers.0.post_attention_layernorm.weight"] = torch.rand(norm.shape, generator=gen) * 0.4 + 0.8
    save_file(state, str(eagle / "model.safetensors"))
    return {**shared, "eagle": eagle}


def _head(ckpt, dtype, int8: bool = False, fast: bool = True) -> EagleHead:
    """The fast path's head (what the engine loads by default), or the plain one."""
    head_type, model_type = (FastEagleHead, FastLlamaModel) if fast else (EagleHead, LlamaModel)
    head = head_type(ckpt["eagle"], model_type(ckpt["target"], dtype), dtype)
    if int8:
        head.to_int8()
    return head


@torch.inference_mode()
def test_split_fc_equals_fc_over_the_concatenation(ckpt):
    from safetensors.torch import load_file

    head = _head(ckpt, torch.float64)
    state = {k: v.double() for k, v in load_file(str(ckpt["eagle"] / "model.safetensors")).items()}
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, VOCAB, (7,), generator=gen)
    features = torch.randn(7, head.shape.hidden_size, generator=gen, dtype=torch.float64)
    expected = F.linear(torch.cat([state["embed_tokens.weight"][tokens], features], -1),
                        state["fc.weight"], state["fc.bias"])
    ours = head.token_rows[tokens] + head.fc_features(features)
    assert (ours - expected).abs().max() < 1e-12


def _general_and_lean(head: EagleHead, prompt_len: int, chain: int, reference: EagleHead | None = None):
    """Feed the same pairs to two caches: the general forward of ``reference`` (default: the
    same head; catch-up of ``prompt_len`` rows, then one row per step) and ``head.extend``;
    return both predicted features per step and the pools."""
    reference = reference or head
    gen = torch.Generator().manual_seed(prompt_len)
    hidden = head.shape.hidden_size
    tokens = torch.randint(3, VOCAB, (prompt_len + chain,), generator=gen).tolist()
    features = torch.randn(prompt_len + chain, hidden, generator=gen, dtype=torch.float64).to(head.dtype)
    general_pool, lean_pool = head.new_pool(1, 64), head.new_pool(1, 64)
    general_cache, lean_cache = general_pool.allocate(), lean_pool.allocate()
    general, lean = [], []
    spans = [(0, prompt_len)] + [(prompt_len + i, prompt_len + i + 1) for i in range(chain)]
    for a, b in spans:
        step = StepInput(general_cache, tokens[a:b], list(range(a, b)))
        general.append(reference.forward(general_pool, [step], features[None, a:b])[0, -1])
        lean.append(head.extend(lean_cache, tokens[a:b], features[a:b])[0])
        assert lean_cache.length == general_cache.length == b
    return general, lean, general_pool, lean_pool


@pytest.mark.parametrize("dtype,int8,tol", [(torch.float64, False, 1e-10), (torch.float32, False, 2e-4),
                                            (torch.float32, True, 2e-2)], ids=["float64", "float32", "int8"])
@torch.inference_mode()
def test_extend_matches_the_general_forward(ckpt, dtype, int8, tol):
    """Against the plain head's general forward (``fast_paths`` off); int8: the fused step
    quantized after fusing (packed int8 weights, catch-up included) against the float head, to
    quantization error (~1%)."""
    head = _head(ckpt, dtype, int8)
    assert head.lean is not None
    assert [w.packed is not None for w in (head.lean.w_in, head.lean.block.w_down, head.lean.w_lm)] == [int8] * 3
    if dtype == torch.float32:  # a oneDNN copy for float catch-up; int8 uses the packed w_in
        assert (head.lean.w_in_rows is None) == int8
    reference = _head(ckpt, dtype, fast=False)  # the plain maths: the general forward of the float head
    general, lean, general_pool, lean_pool = _general_and_lean(head, prompt_len=6, chain=4, reference=reference)
    for g, ours in zip(general, lean):
        assert (g - ours).abs().max() < tol * max(1.0, float(g.abs().max()))
    rows = 10
    assert (general_pool.k[0, 0, :rows] - lean_pool.k[0, 0, :rows]).abs().max() < tol * 10
    assert (general_pool.v[0, 0, :rows] - lean_pool.v[0, 0, :rows]).abs().max() < tol * 10
    logits_general = reference.logits(torch.stack(general))
    logits_lean = torch.cat([head.draft_logits(x[None]) for x in lean])
    assert (logits_general - logits_lean).abs().max() < tol * 10 * max(1.0, float(logits_general.abs().max()))


@torch.inference_mode()
def test_extend_refuses_to_run_past_the_cache(ckpt):
    head = _head(ckpt, torch.float64)
    cache = head.new_pool(1, 4).allocate()
    with pytest.raises(ValueError, match="longer than the KV cache"):
        head.extend(cache, [5, 6, 7, 8, 9], torch.zeros(5, head.shape.hidden_size, dtype=torch.float64))
    assert cache.length == 0


def _pairs(head: EagleHead, count: int, seed: int) -> tuple[list[int], torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(3, VOCAB, (count,), generator=gen).tolist()
    features = torch.randn(count, head.shape.hidden_size, generator=gen, dtype=torch.float64).to(head.dtype)
    return tokens, features


@pytest.mark.parametrize("dtype,int8", [(torch.float64, False), (torch.float32, False), (torch.float32, True)],
                         ids=["float64", "float32", "int8"])
@torch.inference_mode()
def test_greedy_chain_drafts_what_extend_and_argmax_draft(ckpt, dtype, int8):
    """The one-call chain (catch-up + k drafts, TorchScript) against catch-up through ``extend``
    and one ``extend`` + argmax of ``draft_logits`` per draft: the same tokens, the same K/V rows
    bit for bit (the same kernels run), scratch rows included; the cache keeps the catch-up rows."""
    head = _head(ckpt, dtype, int8)
    tokens, features = _pairs(head, 12, seed=7)
    pools = head.new_pool(1, 64), head.new_pool(1, 64)  # one slot each: the same memory layout
    chained, stepped = pools[0].allocate(), pools[1].allocate()
    for cache in (chained, stepped):
        head.extend(cache, tokens[:9], features[:9])
    drafts = head.greedy_chain(chained, tokens[9:], features[9:], 5)
    last, expected = head.extend(stepped, tokens[9:], features[9:]), []
    real = stepped.length
    for i in range(5):
        if i:
            last = head.extend(stepped, expected[-1:], last)
        expected.append(int(head.draft_logits(last)[0].argmax()))
    assert drafts == expected and len(set(drafts)) > 1
    assert chained.length == real == 12
    rows = real + 4  # the catch-up rows and the four drafts' scratch rows
    assert torch.equal(pools[0].k[0, 0, :rows], pools[1].k[0, 0, :rows])
    assert torch.equal(pools[0].v[0, 0, :rows], pools[1].v[0, 0, :rows])


@torch.inference_mode()
def test_greedy_chain_refuses_to_run_past_the_cache(ckpt):
    """The drafts' scratch rows count: 3 cached + 3 pairs + 3 more drafts do not fit in 8 rows."""
    head = _head(ckpt, torch.float64)
    tokens, features = _pairs(head, 6, seed=3)
    cache = head.new_pool(1, 8).allocate()
    head.extend(cache, tokens[:3], features[:3])
    with pytest.raises(ValueError, match="longer than the KV cache"):
        head.greedy_chain(cache, tokens[3:], features[3:], 4)
    assert cache.length == 3
    with pytest.raises(ValueError, match="at least one"):
        head.greedy_chain(cache, tokens[3:], features[3:], 0)
    assert cache.length == 3
    assert len(head.greedy_chain(cache, tokens[3:], features[3:], 3)) == 3 and cache.length == 6


@torch.inference_mode()
def test_kernels_without_torchscript_compute_the_same_chain(ckpt, monkeypatch):
    """Where ``torch.jit.script`` fails, :mod:`pipeline.reference.fast.kernels` keeps its Python
    functions; they draft the same tokens and write the same rows as the scripted ones (int8:
    no ``addmm``, which TorchScript splits into ``mm`` + ``add``, rounding float a little
    differently)."""
    from pipeline.reference.fast import kernels

    eager = eager_kernels(monkeypatch)
    assert isinstance(kernels.eagle_greedy_chain, torch.jit.ScriptFunction)
    assert not isinstance(eager.eagle_greedy_chain, torch.jit.ScriptFunction)
    head = _head(ckpt, torch.float32, int8=True)
    tokens, features = _pairs(head, 4, seed=9)
    lean, results = head.lean, []
    for module in (kernels, eager):
        pool = head.new_pool(1, 32)
        xqkv = lean._project(tokens, features)
        drafts = module.eagle_greedy_chain(xqkv, 0, 5, lean.rows, *lean.w_in.pair, *lean.w_lm.pair,
                                           lean.qkv_shape[1], pool.k[0, 0], pool.v[0, 0], *lean.block.weights())
        results.append((drafts, pool.k[0, 0, :8].clone(), pool.v[0, 0, :8].clone()))
    (drafts, keys, values), (eager_drafts, eager_keys, eager_values) = results
    assert drafts == eager_drafts and len(drafts) == 5
    assert torch.equal(keys, eager_keys) and torch.equal(values, eager_values)


@pytest.mark.parametrize("fast_paths", [True, False], ids=["fast", "plain"])
@pytest.mark.parametrize("greedy", [True, False], ids=["greedy", "sampled"])
@torch.inference_mode()
def test_a_lone_sequence_drafts_what_it_drafts_inside_a_batch(ckpt, greedy, fast_paths):
    """Same sequence, same generator seed: alone (the head's one-sequence path: lean extend with
    ``fast_paths``, the plain forward without) and next to another sequence (batched general
    forward) → the same draft tokens (float64: no near-ties)."""
    spec = {"method": "eagle", "head_dir": str(ckpt["eagle"]), "num_layers": 4}
    engine = create_engine(ckpt["target"], role="speculative", proposer=spec, compute_dtype="float64",
                           fast_paths=fast_paths)
    engine.shutdown()  # drive the scheduler directly, on this thread
    sch = engine.scheduler
    params = SamplingParams() if greedy else SamplingParams(temperature=0.8, top_k=20)

    def admitted(prompt):
        seq = SeqState(GenerationRequest(prompt, 8, sampling=params), params, make_generator(3), list(prompt))
        sch.admit(seq)
        return seq

    prompts = random_prompts(6, seed=21, min_len=4, max_len=12)
    for prompt, other in zip(prompts, prompts[1:] + prompts[:1]):
        alone = admitted(prompt)
        lone = sch.proposer.propose([alone], [4])[0]
        sch.release(alone)
        first, second = admitted(prompt), admitted(other)
        batched = sch.proposer.propose([first, second], [4, 4])[0]
        assert first.proposer_state.cache.length == len(prompt) - 1  # speculative rows dropped
        sch.release(first)
        sch.release(second)
        assert lone.tokens == batched.tokens and len(lone.tokens) == 4
        if not greedy:
            assert torch.allclose(lone.draft_probs, batched.draft_probs, atol=1e-9)


def test_single_chain_mask_equals_the_general_mask():
    pool = KVPool(1, 2, 64, 1, 4, torch.float32)
    cache = pool.allocate()
    for start in (0, 1, 9):
        for width in (1, 2, 5):
            cache.length = start
            inputs = [StepInput(cache, list(range(width)), list(range(start, start + width)))]
            step = StepTensors(pool, inputs)
            fast = step.mask
            step.single = False  # the general construction
            general = step._mask(inputs, [start], width)
            if fast is None:
                assert width == 1 and bool(general.all())
            else:
                assert torch.equal(fast, general)


def test_chain_shaped_choices_run_as_a_chain(ckpt):
    """``specdeploy plan`` hands the engine the default chain as a tree ([[0], [0, 0], …]); the
    proposer runs it as a chain (same drafts; the lean path, a chain verify). Real trees stay
    trees, and a gap in a chain is still an error."""
    from pipeline.reference.proposers.eagle import EagleDrafter

    head = _head(ckpt, torch.float64)
    chain = EagleDrafter(head, 4, 1, 32, [[0, 0], [0], [0, 0, 0, 0, 0], [0, 0, 0], [0, 0, 0, 0]])
    assert chain.choices is None and chain.depth == 5 and chain.max_draft_len == 5
    tree = EagleDrafter(head, 4, 1, 32, [[0], [1], [0, 0]])
    assert tree.choices == [[0], [1], [0, 0]] and tree.depth == 2
    with pytest.raises(ValueError, match="no parent"):
        EagleDrafter(head, 4, 1, 32, [[0], [0, 0, 0]])


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "plain"])
@pytest.mark.parametrize("slots", [[1, 2, 0], [2, 0, 1]], ids=["3-cycle", "other-3-cycle"])
@torch.inference_mode()
def test_batched_forward_in_any_slot_order_equals_each_sequence_alone(ckpt, slots, fast):
    """``EagleHead.forward`` sorts the batch by KV slot: the features go in slot order and the
    predicted rows come back in the caller's order (3-cycles: a permutation that is not its own
    inverse, so swapping the two directions would fail). The plain head gathers, unsorted."""
    head = _head(ckpt, torch.float64, fast=fast)
    hidden = head.shape.hidden_size
    gen = torch.Generator().manual_seed(5)
    lengths = [4, 6, 3]
    tokens = [torch.randint(0, VOCAB, (n,), generator=gen).tolist() for n in lengths]
    features = [torch.randn(n, hidden, generator=gen, dtype=torch.float64) for n in lengths]
    pool = head.new_pool(3, 32)
    pool._free = slots[::-1]
    caches = [pool.allocate() for _ in slots]
    assert [c.slot for c in caches] == slots
    width = max(lengths)
    padded = torch.zeros(3, width, hidden, dtype=torch.float64)
    for b, f in enumerate(features):
        padded[b, : lengths[b]] = f
    batched = head.forward(pool, [StepInput(c, t, list(range(len(t)))) for c, t in zip(caches, tokens)], padded)
    for b in range(3):
        alone_pool = head.new_pool(1, 32)
        alone = head.forward(alone_pool, [StepInput(alone_pool.allocate(), tokens[b], list(range(lengths[b])))],
                             features[b][None])
        torch.testing.assert_close(batched[b, : lengths[b]], alone[0], atol=1e-9, rtol=1e-9)
