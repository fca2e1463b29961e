"""Reference engine losslessness: every method's greedy output equals target-only greedy output
(float64, so no near-ties) at batch 1 and batched, with and without the fast paths — on 200 random
prompts in the cell that runs the most machinery at once (EAGLE tree, batched, fast paths) and on
the first 40 of them in every other cell; same-model drafts accept
everything, random drafts almost nothing; speculative sampling matches the exact target
distribution (chi-square), and a broken residual does not."""

from __future__ import annotations

import functools

import pytest
import torch

from pipeline.reference import verify
from pipeline.reference.api import GenerationRequest, SamplingParams
from pipeline.reference.engine import create_engine
from tests.reference_fixtures import VOCAB, chi2_pvalue, one_thread, random_prompts, shared_checkpoints

NEW_TOKENS = 16
PROMPTS = random_prompts(200, seed=7)
FEW = 40  # prompts per greedy cell, except FULL_CELL's
FULL_CELL = ("eagle_tree", True, True)  # (method, batched, fast_paths): all 200 prompts


@pytest.fixture(scope="module")
def ckpt():
    one_thread()
    return shared_checkpoints()


def _specs(ckpt) -> dict[str, dict]:
    return {
        "draft_target": {"method": "draft_target", "draft_dir": str(ckpt["draft"]), "num_draft_tokens": 3},
        "medusa": {"method": "medusa", "heads_dir": str(ckpt["medusa"]), "num_heads": 4},
        "medusa_tree": {"method": "medusa", "heads_dir": str(ckpt["medusa"]), "num_heads": 3,
                        "choices": [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0], [2]]},
        "eagle": {"method": "eagle", "head_dir": str(ckpt["eagle"]), "num_layers": 4},
        "eagle_tree": {"method": "eagle", "head_dir": str(ckpt["eagle"]),
                       "choices": [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 0, 1], [0, 0, 0, 0], [2]]},
    }


def _engine(ckpt, spec=None, dtype="float64", **kw):
    role = "speculative" if spec else "baseline"
    return create_engine(ckpt["target"], role=role, proposer=spec, compute_dtype=dtype, **kw)


def _run(engine, prompts, batched: bool, **req):
    if batched:
        handles = [engine.submit(GenerationRequest(p, NEW_TOKENS, **req)) for p in prompts]
        return [h.result(timeout=120) for h in handles]
    return [engine.generate(GenerationRequest(p, NEW_TOKENS, **req)) for p in prompts]


class ReferenceOutputs:
    """Target-only greedy outputs of the fast baseline, computed for as many prompts as a test
    reads (the quick tests read 20-30, FULL_CELL all 200) and kept for the module."""

    def __init__(self, ckpt):
        self.ckpt, self.outputs = ckpt, []

    def __getitem__(self, index):
        wanted = index.stop if isinstance(index, slice) else index + 1
        if wanted is None or wanted > len(self.outputs):
            engine = _engine(self.ckpt)
            try:
                more = PROMPTS[len(self.outputs):wanted]
                self.outputs += [r.output_ids for r in _run(engine, more, batched=False)]
            finally:
                engine.shutdown()
        return self.outputs[index]


@pytest.fixture(scope="module")
def reference_outputs(ckpt):
    return ReferenceOutputs(ckpt)


# (method, batched, fast_paths); not ("baseline", False, True): that is the engine that computes
# ``reference_outputs``, the same engine on the same prompts would compare it with itself
GREEDY_CELLS = [(m, b, f) for m in ("baseline", "draft_target", "medusa", "medusa_tree", "eagle", "eagle_tree")
                for b in (False, True) for f in (True, False) if (m, b, f) != ("baseline", False, True)]


@pytest.mark.slow
@pytest.mark.parametrize(("method", "batched", "fast_paths"), GREEDY_CELLS,
                         ids=[f"{m}-{'batched' if b else 'batch1'}-{'fast' if f else 'plain'}" for m, b, f in GREEDY_CELLS])
def test_greedy_speculation_is_lossless(ckpt, reference_outputs, method, batched, fast_paths):
    """``reference_outputs`` come from the fast baseline: the plain maths path (``fast_paths``
    off) must give the same tokens too."""
    spec = None if method == "baseline" else _specs(ckpt)[method]
    prompts = PROMPTS if (method, batched, fast_paths) == FULL_CELL else PROMPTS[:FEW]
    engine = _engine(ckpt, spec, fast_paths=fast_paths)
    try:
        results = _run(engine, prompts, batched)
    finally:
        engine.shutdown()
    assert len(results) == len(prompts)
    expected = reference_outputs[:len(prompts)]
    mismatches = [i for i, r in enumerate(results) if r.output_ids != expected[i]]
    assert not mismatches, f"{method}: {len(mismatches)} prompts differ, first {mismatches[:5]}"
    assert all(len(r.output_ids) == NEW_TOKENS and r.finish_reason == "length" for r in results)
    if method != "baseline":
        assert sum(r.stats.verify_steps for r in results) > 0
        assert sum(r.stats.draft_tokens for r in results) > 0


def test_same_model_draft_accepts_everything(ckpt, reference_outputs):
    spec = {"method": "draft_target", "draft_dir": str(ckpt["target"]), "num_draft_tokens": 4}
    engine = _engine(ckpt, spec)
    try:
        results = _run(engine, PROMPTS[:20], batched=True)
    finally:
        engine.shutdown()
    for r, ref in zip(results, reference_outputs[:20]):
        assert r.output_ids == ref
        # 16 tokens = 3 steps of K+1 = 5, then one plain step (no budget left for drafts)
        assert r.stats.acceptance_rate == 1.0
        assert r.stats.accepted_per_position == r.stats.drafted_per_position == [3, 3, 3, 3]
        assert r.stats.verify_steps == 3 and r.stats.decode_steps == 4
        assert r.stats.mean_acceptance_length == 5.0  # τ = K + 1


def test_random_draft_accepts_almost_nothing(ckpt, reference_outputs):
    engine = _engine(ckpt, _specs(ckpt)["draft_target"])
    try:
        results = _run(engine, PROMPTS[:30], batched=True)
    finally:
        engine.shutdown()
    assert [r.output_ids for r in results] == reference_outputs[:30]
    drafted = sum(r.stats.draft_tokens for r in results)
    accepted = sum(r.stats.accepted_tokens for r in results)
    assert drafted > 0 and accepted / drafted < 0.2


@functools.cache
def _oracle(model_dir):
    """The HF model at ``model_dir`` in float64, loaded once for the module's sampled tests."""
    # imported here: transformers is the oracle of the sampled tests only
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(str(model_dir), dtype=torch.float64).eval()


def _exact_first(model_dir, prompt, params):
    """Exact next-token distribution of the model at ``model_dir`` (HF model as the oracle)."""
    from pipeline.reference.sampling import to_probs

    with torch.no_grad():
        return to_probs(_oracle(model_dir)(torch.tensor([prompt])).logits[0, -1], params)  # [V]


def _exact_first_two(ckpt, prompt, params):
    """Exact target marginals of the first and second sampled token (HF model as the oracle)."""
    from pipeline.reference.sampling import to_probs

    model = _oracle(ckpt["target"])
    with torch.no_grad():
        first = to_probs(model(torch.tensor([prompt])).logits[0, -1], params)  # [V]
        ctx = torch.tensor([prompt + [0]] * VOCAB)
        ctx[:, -1] = torch.arange(VOCAB)
        second = to_probs(model(ctx).logits[:, -1], params)  # [V, V]
    return first, first @ second


def _sample_counts(ckpt, spec, prompt, params, n):
    # 32 rows a step instead of 8: every request has its own seeded generator, so the draws are
    # the same at either batch size (checked: identical counts), for a quarter less CPU
    engine = _engine(ckpt, spec, prefix_cache_entries=0, max_batch_size=32)
    try:
        handles = [engine.submit(GenerationRequest(prompt, 2, sampling=SamplingParams(
            temperature=params.temperature, top_k=params.top_k, top_p=params.top_p, seed=s))) for s in range(n)]
        outs = [h.result(timeout=300).output_ids for h in handles]
    finally:
        engine.shutdown()
    c1, c2 = torch.zeros(VOCAB, dtype=torch.float64), torch.zeros(VOCAB, dtype=torch.float64)
    for out in outs:
        c1[out[0]] += 1
        c2[out[1]] += 1
    return c1, c2


@pytest.mark.slow
@pytest.mark.parametrize("method", ["draft_target", "medusa", "eagle"])
def test_speculative_sampling_matches_target_distribution(ckpt, method):
    """One chi-square per proposer family. The rule itself is checked exactly
    (test_reference_verify.py: ``verify.one_step_distribution`` equals the target, a broken
    residual does not); here the engine's draws follow the target, and — the test has the power
    to see a broken rule — the same draws reject the exact distribution that resampling from the
    target instead of the residual would give."""
    params = SamplingParams(temperature=0.7, top_k=40, top_p=0.95)
    prompt = [5, 17, 33, 8]
    first, second = _exact_first_two(ckpt, prompt, params)
    c1, c2 = _sample_counts(ckpt, _specs(ckpt)[method], prompt, params, 2000)
    assert chi2_pvalue(c1, first) > 1e-3 and chi2_pvalue(c2, second) > 1e-3
    if method == "draft_target":
        draft_probs = _exact_first(ckpt["draft"], prompt, params)  # [V], what the draft proposes from
        accepted = torch.minimum(first, draft_probs)
        broken = accepted + (1.0 - accepted.sum()) * first  # verify.one_step_distribution, residual := target
        assert not torch.allclose(verify.one_step_distribution(first, draft_probs), broken, atol=1e-3)
        assert chi2_pvalue(c1, broken) < 1e-3


@pytest.mark.parametrize("fast_paths", [True, False], ids=["fast", "plain"])
@torch.inference_mode()
def test_eagle_tree_top1_path_equals_the_chain(ckpt, fast_paths):
    """The tree's all-zeros path sees exactly the chain's context (ancestors only), so its tokens
    equal the chain's; siblings are the next-best tokens of the same predicted feature."""
    from pipeline.reference.sequence import SeqState, make_generator

    choices = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 0, 1], [0, 0, 0, 0], [1, 0, 0]]
    spec = _specs(ckpt)["eagle"]
    drafts = {}
    for name, extra in (("chain", {}), ("tree", {"choices": choices})):
        engine = _engine(ckpt, {**spec, **extra}, dtype="float64", fast_paths=fast_paths)
        engine.shutdown()  # drive the scheduler directly, on this thread
        sch = engine.scheduler
        prompt = PROMPTS[3]
        seq = SeqState(GenerationRequest(prompt, 8), SamplingParams(), make_generator(0), list(prompt))
        sch.admit(seq)
        drafts[name] = sch.proposer.propose([seq], [len(choices)])[0]
        assert seq.proposer_state.cache.length == len(prompt) - 1  # speculative rows dropped
        sch.release(seq)
    from pipeline.reference.proposers.base import sort_choices

    tree, choices = drafts["tree"], sort_choices(choices)  # proposal order: parents first
    path = [tree.tokens[choices.index([0] * d)] for d in range(1, 5)]
    assert path == drafts["chain"].tokens
    assert tree.parents[choices.index([1, 0, 0])] == 1 + choices.index([1, 0])
    assert tree.tokens[choices.index([1])] != tree.tokens[choices.index([0])]


@pytest.mark.slow
def test_external_drafts_with_draft_logits_sample_the_target_distribution(ckpt):
    """draft_input_ids + draft_logits (docs/triton-contract.md): probability-based acceptance with residual
    resampling; the first new token follows the target's distribution exactly."""
    params = SamplingParams(temperature=1.0, top_p=1.0)
    prompt = [5, 17, 33, 8]
    first, _ = _exact_first_two(ckpt, prompt, params)
    gen = torch.Generator().manual_seed(5)
    draft_logits = torch.randn(2, VOCAB, generator=gen, dtype=torch.float64) * 2  # an arbitrary q
    draft_probs = torch.softmax(draft_logits, -1)
    engine = create_engine(ckpt["target"], role="target", max_draft_len=2, compute_dtype="float64",
                           prefix_cache_entries=4)
    try:
        handles = []
        for seed in range(2000):
            drafts = torch.multinomial(draft_probs, 1, generator=gen)[:, 0].tolist()  # drafts ~ q
            handles.append(engine.submit(GenerationRequest(
                prompt, 3, draft_input_ids=drafts, draft_logits=draft_logits.tolist(),
                sampling=SamplingParams(temperature=1.0, top_p=1.0, seed=seed))))
        outs = [h.result(timeout=300) for h in handles]
    finally:
        engine.shutdown()
    counts = torch.zeros(VOCAB, dtype=torch.float64)
    for r in outs:
        assert 1 <= len(r.output_ids) <= 3 and r.stats.verify_steps == 1
        counts[r.output_ids[0]] += 1
    assert chi2_pvalue(counts, first) > 1e-3


def test_on_chunk_runs_on_every_chunk_and_a_failing_hook_loses_nothing(ckpt):
    """``submit(on_chunk=...)``: the hook's result rides on each chunk as ``payload`` (the Triton
    model builds its responses there); a hook that raises leaves ``payload`` None and the
    generation completes unchanged."""
    engine = _engine(ckpt, dtype="float32")
    try:
        prompt = random_prompts(1, seed=21)[0]
        expected = engine.generate(GenerationRequest(prompt, 6)).output_ids
        seen = []
        handle = engine.submit(GenerationRequest(prompt, 6), on_chunk=lambda c: seen.append(c) or ("built", tuple(c.tokens)))
        chunks = list(handle.chunks(timeout=60))
        assert [c.payload for c in chunks] == [("built", tuple(c.tokens)) for c in chunks]
        assert len(seen) == len(chunks) and sum(len(c.tokens) for c in chunks) == len(expected) == 6

        def boom(chunk):
            raise RuntimeError("hook failed")

        result = engine.submit(GenerationRequest(prompt, 6), on_chunk=boom)
        chunks = list(result.chunks(timeout=60))
        assert all(c.payload is None for c in chunks) and chunks[-1].finished
        assert [t for c in chunks for t in c.tokens] == expected
    finally:
        engine.shutdown()


@pytest.fixture(scope="module")
def float32_outputs(ckpt):
    """Target-only greedy outputs of the float32 baseline on the first 40 prompts (the int8 tests'
    reference, computed once for the four of them)."""
    base = _engine(ckpt, dtype="float32")
    try:
        return [r.output_ids for r in _run(base, PROMPTS[:40], batched=False)]
    finally:
        base.shutdown()


@pytest.mark.slow
@pytest.mark.parametrize("method", ["draft_target", "medusa", "eagle", "eagle_tree"])
def test_int8_draft_side_weights_keep_greedy_output(ckpt, float32_outputs, method):
    """``draft_int8`` (config ``reference.draft_weights: int8``): every draft-side Linear runs the
    few-row int8 kernel, and greedy output stays the float32 target's, at batch 1 and batched."""
    spec = {**_specs(ckpt)[method], "draft_int8": True}
    fast = _engine(ckpt, spec, dtype="float32")
    try:
        proposer = fast.scheduler.proposer
        linears = {"draft_target": lambda: [proposer.model.lm_head, proposer.model.layers[0].qkv],
                   "medusa": lambda: proposer.heads.blocks + proposer.heads.heads,
                   "eagle": lambda: [proposer.head.fc_features, proposer.head.layer.down, proposer.head.lm_head],
                   }[method.split("_tree")[0]]()
        assert all(linear.int8 and linear.packed is not None for linear in linears)
        if method == "draft_target":  # the lone-sequence drafting step: fused, then quantized
            w_qkv, block = proposer.model.lean.layers[0]
            fused = (w_qkv, block.w_o, block.w_gate_up, block.w_down, proposer.model.lean.w_lm)
            assert all(w.packed is not None for w in fused)
        assert fast.scheduler.target.lm_head.packed is None and not fast.scheduler.target.lm_head.int8
        assert fast.scheduler.target.lean is None  # the target never drafts
        for batched in (False, True):
            results = _run(fast, PROMPTS[:40], batched)
            assert [r.output_ids for r in results] == float32_outputs, f"{method} batched={batched}"
        assert sum(r.stats.accepted_tokens for r in results) > 0
    finally:
        fast.shutdown()
