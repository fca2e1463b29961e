"""The lookahead proposer (Jacobi window + n-gram pool): upstream's sizes and pool rules, the
draft tree it builds, and through the reference engine greedy output equal to target-only output
(float64, batch 1 and batched, three window/n-gram/verification-set sizes) while drafts are
accepted; the sampled tree verifier and the engine's sampled output follow the exact target
distribution (chi-square), and a broken residual is detected (negative control)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # tests.reference_fixtures under plain `pytest`

import pytest
import torch

from pipeline.artefacts.base import ArtefactError
from pipeline.artefacts.engine import EngineDescriptor
from pipeline.reference import verify
from pipeline.reference.api import GenerationRequest, SamplingParams
from pipeline.reference.draft_len import check_lookahead_sizes, lookahead_max_draft_len
from pipeline.reference.engine import create_engine, load_engine
from pipeline.reference.proposers.lookahead import LookaheadDrafter, NgramPool
from pipeline.reference.sequence import SeqState, make_generator
from tests.reference_fixtures import VOCAB, chi2_pvalue, one_thread, random_prompts, shared_checkpoints

# Draws in the broken-residual negative control (the positive half keeps its 1500). The prompt
# [a, b, X, c, a, b] makes the draft X, at which the target has p_x = 0.27 (temperature 0.8,
# top-k 40, top-p 0.95; the same X in test_reference_ngram_engine, test_reference_lookahead and
# test_ngram_bls_rounds), so a broken rule's first token follows b = p_x*delta_x + (1-p_x)*p.
# chi2_pvalue(counts ~ b, p) < 1e-3 misses that at 600 draws with probability 1.2e-7 (noncentral
# chi-square; 0 of 20,000 simulated runs, the largest p-value 2e-4); the lookahead engine's broken
# draws fit b (p = 0.89 at 1,500). The positive half's false-positive rate is its 1e-3 threshold,
# unchanged.
BROKEN_DRAWS = 600

NEW_TOKENS = 20
PROMPTS = [p + p[: max(2, len(p) // 2)] if i % 2 else p for i, p in enumerate(random_prompts(60, seed=23))]
SIZES = [(4, 3, 4), (2, 4, 2), (5, 2, 3)]  # (W, N, G): upstream's defaults, a deep n-gram, bigrams


@pytest.fixture(scope="module")
def ckpt():
    one_thread()
    return shared_checkpoints()


def _spec(w=4, n=3, g=4) -> dict:
    return {"method": "lookahead", "max_window_size": w, "max_ngram_size": n, "max_verification_set_size": g}


def _engine(ckpt, spec=None, **kw):
    role = "speculative" if spec else "baseline"
    return create_engine(ckpt["target"], role=role, proposer=spec, compute_dtype="float64", **kw)


def _run(engine, prompts, batched: bool):
    if batched:
        handles = [engine.submit(GenerationRequest(p, NEW_TOKENS)) for p in prompts]
        return [h.result(timeout=300) for h in handles]
    return [engine.generate(GenerationRequest(p, NEW_TOKENS)) for p in prompts]


# -- sizes and pool ----------------------------------------------------------------------------


def test_capacity_and_legality_follow_upstream():
    # calculateSpeculativeResourceTuple: (N-2) + (W-1+G)(N-1); N = 1 drafts nothing
    assert lookahead_max_draft_len(4, 3, 4) == 15
    assert lookahead_max_draft_len(1, 1, 0) == 0
    assert lookahead_max_draft_len(7, 4, 7) == 2 + 13 * 3
    check_lookahead_sizes(1, 1, 0)
    for bad in [(0, 3, 4), (4, 0, 4), (4, 3, -1), (2, 1, 0), (1, 1, 1)]:
        with pytest.raises(ValueError, match="lookahead|max_ngram_size"):
            check_lookahead_sizes(*bad)
    with pytest.raises(ValueError):
        EngineDescriptor.model_validate({"model_dir": "m", "role": "speculative",
                                         "proposer": {"method": "lookahead", "max_ngram_size": 1}})
    spec = EngineDescriptor.model_validate({"model_dir": "m", "role": "speculative",
                                            "proposer": {"method": "lookahead"}}).proposer
    assert (spec.max_window_size, spec.max_ngram_size, spec.max_verification_set_size) == (4, 3, 4)


def test_pool_keeps_the_newest_distinct_continuations():
    pool = NgramPool(capacity=2)
    pool.add_all([1, 2, 3, 1, 2, 4, 1, 2, 3], 3)  # (1,2,3) (2,3,1) (3,1,2) (1,2,4) (2,4,1) (4,1,2) (1,2,3)
    assert pool.guesses(1) == [(2, 4), (2, 3)]  # re-inserted (2, 3) moved to the newest end
    pool.add([1, 5, 5])
    assert pool.guesses(1) == [(2, 3), (5, 5)]  # the oldest left at capacity
    assert pool.guesses(9) == []
    empty = NgramPool(capacity=0)
    empty.add([1, 2, 3])
    assert empty.guesses(1) == []


def test_tree_holds_the_window_columns_and_the_guesses():
    proposer = LookaheadDrafter(3, 3, 2)
    prompt = [7, 8, 9, 7, 8, 10]
    seq = SeqState(request=GenerationRequest(prompt, 4), params=SamplingParams(), generator=make_generator(None),
                   tokens=list(prompt))
    proposer.start(seq, None)
    seq.proposer_state.levels = [[20, 21, 22], [30, 31, 32]]  # a full window (N - 1 = 2 levels)
    seq.proposer_state.pool.add([10, 40, 41])
    prop = proposer.propose([seq], [proposer.max_draft_len])[0]
    # column 0 starts at the pending token: [30]; column 1: 21 → 31 under column 0's start; column 2:
    # 22 under 21, then 32; the guess (40, 41) under the pending token
    assert prop.tokens == [30, 21, 31, 22, 32, 40, 41]
    assert prop.parents == [0, 0, 2, 2, 4, 0, 6]
    assert len(prop.tokens) <= proposer.max_draft_len
    assert seq.proposer_state.tops == [1, 3, 5]
    logits = torch.zeros(1 + len(prop.tokens), VOCAB, dtype=torch.float64)
    for row, token in zip(seq.proposer_state.tops, (50, 51, 52)):
        logits[row, token] = 1.0
    proposer.observe(seq, prop, logits)
    assert seq.proposer_state.levels == [[30, 31, 32], [50, 51, 52]]  # oldest dropped, newest appended
    pool = seq.proposer_state.pool
    assert (30, 50) in pool.guesses(10) and (31, 51) in pool.guesses(21) and (32, 52) in pool.guesses(22)
    # a budget too small for the window: the guesses alone (oldest first), cut to it; the window stays
    short = proposer.propose([seq], [1])[0]
    assert short.tokens == [40, 30] and short.parents == [0, 0] and seq.proposer_state.tops == []


# -- through the engine ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def reference_outputs(ckpt):
    engine = _engine(ckpt)
    try:
        return [r.output_ids for r in _run(engine, PROMPTS, batched=False)]
    finally:
        engine.shutdown()


@pytest.mark.slow  # over the quick tier's CPU budget (60 prompts through the engine)
@pytest.mark.parametrize("batched", [False, True], ids=["batch1", "batched"])
@pytest.mark.parametrize("sizes", SIZES, ids=["w4n3g4", "w2n4g2", "w5n2g3"])
def test_greedy_lookahead_is_lossless(ckpt, reference_outputs, sizes, batched):
    engine = _engine(ckpt, _spec(*sizes))
    try:
        assert engine.max_draft_len == lookahead_max_draft_len(*sizes)
        results = _run(engine, PROMPTS, batched)
    finally:
        engine.shutdown()
    mismatches = [i for i, r in enumerate(results) if r.output_ids != reference_outputs[i]]
    assert not mismatches, f"{len(mismatches)} prompts differ, first {mismatches[:5]}"
    assert all(len(r.output_ids) == NEW_TOKENS and r.finish_reason == "length" for r in results)
    assert sum(r.stats.accepted_tokens for r in results) > 0
    # fewer target passes than tokens: every step emits its accepted drafts + one token
    assert sum(r.stats.decode_steps for r in results) < len(PROMPTS) * NEW_TOKENS
    assert all(r.stats.decode_steps + r.stats.accepted_tokens == NEW_TOKENS for r in results)


def test_engine_dir_with_a_lookahead_descriptor_loads(ckpt, tmp_path):
    descriptor = EngineDescriptor.model_validate({"role": "speculative", "model_dir": str(ckpt["target"]),
                                                  "compute_dtype": "float64", "proposer": _spec(3, 3, 2)})
    descriptor.write(tmp_path / "engine.json")
    engine = load_engine(tmp_path)
    try:
        assert engine.method == "lookahead" and engine.max_draft_len == lookahead_max_draft_len(3, 3, 2)
        assert engine.generate(GenerationRequest(PROMPTS[1], 8)).output_ids
    finally:
        engine.shutdown()
    with pytest.raises((ArtefactError, ValueError)):
        create_engine(ckpt["target"], role="speculative", proposer=_spec(0, 3, 2))


def test_build_step_writes_a_lookahead_engine_that_loads(ckpt, tmp_path):
    from pipeline.build import reference_step

    common = ["engine", "--role", "speculative", "--model-dir", str(ckpt["target"]), "--method", "lookahead",
              "--max-batch-size", "2", "--max-seq-len", "128", "--max-input-len", "64", "--compute-dtype", "float64"]
    sizes = {"max_window_size": 3, "max_ngram_size": 4, "max_verification_set_size": 2}
    assert reference_step.main([*common, "--out", str(tmp_path / "sized"), "--proposer-fields", json.dumps(sizes),
                                "--draft-weights", "int8"]) == 0
    assert reference_step.main([*common, "--out", str(tmp_path / "defaults")]) == 0
    sized = json.loads((tmp_path / "sized" / "engine.json").read_text())["proposer"]
    defaults = json.loads((tmp_path / "defaults" / "engine.json").read_text())["proposer"]
    assert sized == _spec(3, 4, 2)  # no draft weights: --draft-weights int8 adds nothing
    assert defaults == _spec(4, 3, 4)  # upstream's defaults
    engine = load_engine(tmp_path / "sized")
    try:
        assert engine.max_draft_len == lookahead_max_draft_len(3, 4, 2)
        assert engine.generate(GenerationRequest(PROMPTS[1], 6)).output_ids
    finally:
        engine.shutdown()
    assert reference_step.main([*common, "--out", str(tmp_path / "bad"),
                                "--proposer-fields", json.dumps({"max_ngram_size": 1})]) != 0


def test_seeded_sampled_output_repeats(ckpt):
    params = SamplingParams(temperature=0.9, top_k=30, seed=7)
    engine = _engine(ckpt, _spec())
    try:
        runs = [engine.generate(GenerationRequest(PROMPTS[3], NEW_TOKENS, sampling=params)) for _ in range(2)]
    finally:
        engine.shutdown()
    assert runs[0].output_ids == runs[1].output_ids and runs[0].stats.draft_tokens > 0


# -- sampled: the tree verifier and the engine -------------------------------------------------


def _tree_first_token_counts(target_probs, tokens, parents, n, seed=0):
    counts = torch.zeros(VOCAB, dtype=torch.float64)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(n):
        result = verify.verify_sampled_tree(target_probs, tokens, parents, generator)
        first = tokens[result.accepted[0] - 1] if result.accepted else result.next_token
        counts[first] += 1
    return counts


@pytest.mark.slow  # over the quick tier's CPU budget (a chi-square over many draws)
def test_sampled_tree_of_deterministic_drafts_keeps_the_target_distribution(monkeypatch):
    gen = torch.Generator().manual_seed(5)
    target_probs = torch.softmax(torch.randn(4, VOCAB, generator=gen, dtype=torch.float64) * 2, -1)  # [N+1, V]
    top = target_probs[0].argsort(descending=True).tolist()
    tokens, parents = [top[0], top[1], top[2]], [0, 0, 0]  # three sibling drafts under the pending token
    assert chi2_pvalue(_tree_first_token_counts(target_probs, tokens, parents, 6000), target_probs[0]) > 1e-3
    # on a chain it draws exactly as the chain verifier with one-hot drafts
    chain = [top[0], top[3]]
    one_hot = torch.nn.functional.one_hot(torch.tensor(chain), VOCAB).double()
    for seed in range(50):
        a = verify.verify_sampled_tree(target_probs, chain, [0, 1], torch.Generator().manual_seed(seed))
        b = verify.verify_sampled_chain(target_probs, one_hot, chain, torch.Generator().manual_seed(seed))
        assert (a.accepted, a.next_token) == (b.accepted, b.next_token)
    # negative control: a rejected sibling resampled from p itself over-weights the drafts
    monkeypatch.setattr(verify, "residual", lambda target_probs, draft_probs: target_probs)
    assert chi2_pvalue(_tree_first_token_counts(target_probs, tokens, parents, 6000), target_probs[0]) < 1e-3


def _first_probs(model, prompts: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    from pipeline.reference.sampling import to_probs

    with torch.no_grad():
        return to_probs(model(prompts).logits[:, -1], params)  # [B, V]


def _prompt_and_first_marginal(ckpt, params: SamplingParams):
    """A prompt [a, b, X, c, a, b]: the pool starts with the prompt's n-grams, so (b, X, c) is a
    guess after the pending b; X is the token whose target probability there is closest to one half."""
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(str(ckpt["target"]), dtype=torch.float64).eval()
    a, b, c = 5, 17, 33
    candidates = torch.tensor([[a, b, x, c, a, b] for x in range(VOCAB)])
    p_x = _first_probs(model, candidates, params)[torch.arange(VOCAB), torch.arange(VOCAB)]
    x = int((p_x - 0.5).abs().argmin())
    prompt = [a, b, x, c, a, b]
    return prompt, x, _first_probs(model, torch.tensor([prompt]), params)[0]


def _sample_counts(ckpt, prompt, params, n):
    engine = _engine(ckpt, _spec(), prefix_cache_entries=0)
    try:
        handles = [engine.submit(GenerationRequest(prompt, 2, sampling=SamplingParams(
            temperature=params.temperature, top_k=params.top_k, top_p=params.top_p, seed=s))) for s in range(n)]
        results = [h.result(timeout=600) for h in handles]
    finally:
        engine.shutdown()
    assert all(r.stats.draft_tokens >= 1 for r in results)  # every request verified a draft tree
    counts = torch.zeros(VOCAB, dtype=torch.float64)
    for r in results:
        counts[r.output_ids[0]] += 1
    return counts


@pytest.mark.slow
def test_sampled_lookahead_matches_target_distribution_and_broken_residual_does_not(ckpt, monkeypatch):
    params = SamplingParams(temperature=0.8, top_k=40, top_p=0.95)
    prompt, x, first = _prompt_and_first_marginal(ckpt, params)
    assert 0.1 < float(first[x]) < 0.9, f"draft token {x} has p={float(first[x]):.3f}; pick another prompt"
    assert chi2_pvalue(_sample_counts(ckpt, prompt, params, 1500), first) > 1e-3
    # negative control (rejected guesses resampled from p): BROKEN_DRAWS
    monkeypatch.setattr(verify, "residual", lambda target_probs, draft_probs: target_probs)
    assert chi2_pvalue(_sample_counts(ckpt, prompt, params, BROKEN_DRAWS), first) < 1e-3
