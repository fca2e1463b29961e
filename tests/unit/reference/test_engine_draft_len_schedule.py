"""The reference engine runs a speculation schedule: each step drafts the K of the range holding
the live batch size (pipeline/artefacts/schedule.py), 0 = a plain target step with no drafting
work; output stays lossless (greedy equals target-only) across every K change, for every method
with a variable draft length.

The steps are driven through the engine's scheduler directly (admit, step, release), so which
batch size each step sees is fixed by the test, not by thread timing."""

from __future__ import annotations

import pytest
import torch

from pipeline.artefacts.schedule import DraftLenRange
from pipeline.reference.api import GenerationRequest
from pipeline.reference.engine import create_engine
from pipeline.reference.sequence import SeqState, make_generator
from tests.reference_fixtures import one_thread, random_prompts, shared_checkpoints

# K 3 for a lone sequence, 0 (speculation off) from two sequences on
SCHEDULE = [DraftLenRange(min_concurrency=1, max_concurrency=1, draft_len=3),
            DraftLenRange(min_concurrency=2, draft_len=0)]
LONG, SHORT = 14, 5  # new tokens of the sequence that runs alone, and of the two that join it


@pytest.fixture(scope="module")
def ckpt():
    one_thread()
    return shared_checkpoints()


def _specs(ckpt) -> dict[str, dict]:
    return {
        "draft_target": {"method": "draft_target", "draft_dir": str(ckpt["draft"]), "num_draft_tokens": 3},
        "medusa": {"method": "medusa", "heads_dir": str(ckpt["medusa"]), "num_heads": 3},
        "medusa_tree": {"method": "medusa", "heads_dir": str(ckpt["medusa"]), "num_heads": 3,
                        "choices": [[0], [1], [0, 0], [0, 1], [0, 0, 0]]},
        "eagle": {"method": "eagle", "head_dir": str(ckpt["eagle"]), "num_layers": 3},
        "eagle_tree": {"method": "eagle", "head_dir": str(ckpt["eagle"]),
                       "choices": [[0], [1], [0, 0], [0, 1], [0, 0, 0]]},
        "ngram": {"method": "ngram", "max_draft_len": 3},
        "lookahead": {"method": "lookahead", "max_window_size": 2, "max_ngram_size": 3, "max_verification_set_size": 2},
    }


def _seq(prompt: list[int], new_tokens: int) -> SeqState:
    request = GenerationRequest(list(prompt), new_tokens)
    return SeqState(request=request, params=request.sampling, generator=make_generator(None), tokens=list(prompt))


def _drive(engine, prompts: list[list[int]]) -> tuple[list[list[int]], list[dict]]:
    """Sequence 0 decodes alone for 3 steps, sequences 1 and 2 join (batch 3) until they finish,
    then sequence 0 finishes alone. Returns every output and, per step, the batch size and the
    drafts each sequence carried into it."""
    sched = engine.scheduler
    seqs = [_seq(prompts[0], LONG), _seq(prompts[1], SHORT), _seq(prompts[2], SHORT)]
    log = []
    with torch.inference_mode():
        sched.admit(seqs[0])
        for step in range(200):
            if step == 3:
                for seq in seqs[1:]:
                    sched.admit(seq)
            live = [s for s in seqs if s.cache is not None and not s.finished]
            if not live:
                break
            before = [s.stats.draft_tokens for s in live]
            sched.step(live)
            log.append({"batch": len(live), "drafted": [s.stats.draft_tokens - b for s, b in zip(live, before)]})
            for seq in live:
                if seq.finished:
                    sched.release(seq)
    return [list(s.output) for s in seqs], log


@pytest.fixture(scope="module")
def expected(ckpt):
    """Target-only greedy outputs of the same three prompts (the same step pattern)."""
    engine = create_engine(ckpt["target"], compute_dtype="float64")
    try:
        outputs, _ = _drive(engine, random_prompts(3, seed=11))
    finally:
        engine.shutdown()
    return outputs


@pytest.mark.parametrize("method", ["draft_target", "medusa", "medusa_tree", "eagle", "eagle_tree", "ngram",
                                    "lookahead"])
def test_schedule_switches_k_by_batch_and_stays_lossless(ckpt, expected, method):
    spec = _specs(ckpt)[method]
    engine = create_engine(ckpt["target"], role="speculative", proposer=spec, compute_dtype="float64",
                           draft_len_schedule=SCHEDULE)
    try:
        outputs, log = _drive(engine, random_prompts(3, seed=11))
    finally:
        engine.shutdown()
    assert outputs == expected, f"{method}: greedy output differs from target-only across a K change"
    crowded = [s for s in log if s["batch"] >= 2]
    alone = [s for s in log if s["batch"] == 1]
    assert crowded and alone, log
    assert all(d == 0 for s in crowded for d in s["drafted"]), f"{method} drafted above the threshold: {crowded}"
    if method not in ("ngram", "lookahead"):  # these draft only where the sequence offers a match
        assert sum(s["drafted"][0] for s in alone) > 0, f"{method} never drafted alone: {alone}"


def test_k_zero_step_does_no_drafting_work(ckpt):
    """At K 0 the draft model runs no forward: its KV cache does not move; when the batch shrinks,
    the next drafting step catches it up and the chain is capped by the schedule's K (here 2)."""
    spec = _specs(ckpt)["draft_target"]
    schedule = [DraftLenRange(min_concurrency=1, max_concurrency=1, draft_len=2),
                DraftLenRange(min_concurrency=2, draft_len=0)]
    engine = create_engine(ckpt["target"], role="speculative", proposer=spec, compute_dtype="float64",
                           draft_len_schedule=schedule)
    sched = engine.scheduler
    a, b = (_seq(p, 8) for p in random_prompts(2, seed=5))
    try:
        with torch.inference_mode():
            sched.admit(a)
            sched.admit(b)
            draft_rows = a.proposer_state.cache.length
            calls = []
            real = sched.proposer.model.forward
            sched.proposer.model.forward = lambda *args, **kw: calls.append(1) or real(*args, **kw)
            sched.step([a, b])
            assert a.proposer_state.cache.length == draft_rows and not calls
            assert a.stats.verify_steps == 0 and a.stats.decode_steps == 1
            sched.step([a])
            assert a.stats.verify_steps == 1 and a.stats.draft_tokens == 2
    finally:
        engine.shutdown()


def test_descriptor_refuses_a_schedule_with_gaps(ckpt):
    from pipeline.artefacts.base import ArtefactError

    gappy = [DraftLenRange(min_concurrency=1, max_concurrency=2, draft_len=3),
             DraftLenRange(min_concurrency=4, draft_len=0)]
    with pytest.raises(ArtefactError, match="expected 3"):
        create_engine(ckpt["target"], role="speculative", proposer=_specs(ckpt)["ngram"], draft_len_schedule=gappy)
