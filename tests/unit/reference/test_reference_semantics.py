"""Request semantics of the reference engine (docs/triton-contract.md, `tensorrt_llm`): external-draft verification in one
step (correction vs bonus, caps, DraftTooLongError), a client-side draft-target loop reproducing
target-only greedy output with prefix reuse, end_id, min_tokens, stop and bad words, streaming,
cancellation and request validation."""

from __future__ import annotations

import pytest

from pipeline.reference.api import DraftTooLongError, GenerationRequest
from pipeline.reference.engine import create_engine
from tests.reference_fixtures import one_thread, shared_checkpoints

PROMPT = [88, 11, 23, 78, 8]  # greedy continuation starts with 10 distinct tokens


@pytest.fixture(scope="module")
def ckpt():
    one_thread()
    return shared_checkpoints()


@pytest.fixture(scope="module")
def engines(ckpt):
    made = {
        "baseline": create_engine(ckpt["target"], compute_dtype="float64"),
        "target": create_engine(ckpt["target"], role="target", max_draft_len=4, compute_dtype="float64"),
        "draft": create_engine(ckpt["draft"], role="draft", compute_dtype="float64"),
        "medusa": create_engine(ckpt["target"], role="speculative", compute_dtype="float64",
                                proposer={"method": "medusa", "heads_dir": str(ckpt["medusa"])}),
        "same_draft": create_engine(ckpt["target"], role="speculative", compute_dtype="float64",
                                    proposer={"method": "draft_target", "draft_dir": str(ckpt["target"]),
                                              "num_draft_tokens": 4}),
    }
    yield made
    for engine in made.values():
        engine.shutdown()


@pytest.fixture(scope="module")
def greedy(engines):
    return engines["baseline"].generate(GenerationRequest(PROMPT, 40)).output_ids


def _verify(engines, drafts, max_new=None, **kw):
    req = GenerationRequest(PROMPT, max_new if max_new is not None else len(drafts) + 1,
                            draft_input_ids=drafts, **kw)
    return engines["target"].generate(req)


def test_external_drafts_one_step_correction_and_bonus(engines, greedy):
    wrong = (greedy[2] + 1) % 90 + 3
    r = _verify(engines, greedy[:2] + [wrong, greedy[3]])
    assert r.output_ids == greedy[:3]  # 2 accepted + the correction
    assert (r.stats.draft_tokens, r.stats.accepted_tokens, r.stats.verify_steps) == (4, 2, 1)
    r = _verify(engines, greedy[:4])
    assert r.output_ids == greedy[:5]  # all accepted + the bonus
    assert r.stats.acceptance_rate == 1.0
    r = _verify(engines, [])
    assert r.output_ids == greedy[:1] and r.stats.verify_steps == 0
    assert _verify(engines, greedy[:4], max_new=2).output_ids == greedy[:2]  # capped by max tokens


def test_external_drafts_stop_at_end_id(engines, greedy):
    r = _verify(engines, greedy[:4], end_id=greedy[1])
    assert r.output_ids == greedy[:1] and r.finish_reason == "end_id"


def test_too_many_drafts_is_upstreams_error(engines, greedy):
    with pytest.raises(DraftTooLongError, match=r"^Number of draft tokens \(5\) is larger than maximum number of draft tokens \(4\)$"):
        _verify(engines, greedy[:5])
    with pytest.raises(DraftTooLongError, match=r"\(1\) is larger than maximum number of draft tokens \(0\)"):
        engines["baseline"].submit(GenerationRequest(PROMPT, 2, draft_input_ids=[3]))


def test_client_side_draft_target_loop_reproduces_greedy_with_prefix_reuse(engines, greedy):
    """The upstream client loop: the draft engine proposes K, the target verifies in one step,
    the context grows by the accepted tokens + 1 and is re-sent in full."""
    k, context, produced, reused = 3, list(PROMPT), [], []
    while len(produced) < 24:
        drafts = engines["draft"].generate(GenerationRequest(context, k)).output_ids
        r = engines["target"].generate(GenerationRequest(context, k + 1, draft_input_ids=drafts))
        assert 1 <= len(r.output_ids) <= k + 1
        reused.append(r.stats.kv_cache_reused_tokens)
        produced += r.output_ids
        context += r.output_ids
    assert produced[:24] == greedy[:24]
    assert all(n >= len(PROMPT) for n in reused[1:])  # each round reuses the previous context


@pytest.mark.parametrize("name", ["baseline", "medusa", "same_draft"])
def test_end_id_is_excluded(engines, greedy, name):
    r = engines[name].generate(GenerationRequest(PROMPT, 20, end_id=greedy[3]))
    assert r.output_ids == greedy[:3] and r.finish_reason == "end_id"


@pytest.mark.parametrize("name", ["medusa", "same_draft"])
def test_min_tokens_stop_and_bad_words_match_baseline(engines, greedy, name):
    cases = [
        dict(end_id=greedy[0], min_tokens=3),
        dict(stop_words=[[greedy[2], greedy[3]]]),
        dict(bad_words=[[greedy[1]], [greedy[4], greedy[5]]]),
    ]
    for kw in cases:
        base = engines["baseline"].generate(GenerationRequest(PROMPT, 12, **kw))
        spec = engines[name].generate(GenerationRequest(PROMPT, 12, **kw))
        assert spec.output_ids == base.output_ids and spec.finish_reason == base.finish_reason, kw
    r = engines[name].generate(GenerationRequest(PROMPT, 12, stop_words=[[greedy[2], greedy[3]]]))
    assert r.output_ids == greedy[:4] and r.finish_reason == "stop_word"
    r = engines[name].generate(GenerationRequest(PROMPT, 12, end_id=greedy[0], min_tokens=3))
    assert len(r.output_ids) >= 3 and greedy[0] not in r.output_ids[:3]
    r = engines[name].generate(GenerationRequest(PROMPT, 12, bad_words=[[greedy[1]]]))
    assert greedy[1] not in r.output_ids


def test_streaming_chunks_carry_new_tokens_only(engines, greedy):
    handle = engines["same_draft"].submit(GenerationRequest(PROMPT, 17))
    chunks = list(handle.chunks(timeout=60))
    assert chunks[-1].finished and chunks[-1].finish_reason == "length"
    assert all(not c.finished for c in chunks[:-1]) and all(c.tokens for c in chunks[:-1])
    assert [t for c in chunks for t in c.tokens] == greedy[:17]
    assert max(len(c.tokens) for c in chunks) == 5  # a speculative step emits K+1 tokens at once
    assert chunks[-1].stats.verify_steps >= 3


def test_cancellation_ends_the_stream(engines):
    engine = engines["baseline"]
    handle = engine.submit(GenerationRequest(PROMPT, 400, request_id="cancel-me"))
    stream = handle.chunks(timeout=60)
    first = next(stream)
    assert first.tokens
    assert engine.cancel("cancel-me") is True
    rest = list(stream)
    assert rest[-1].finished and rest[-1].finish_reason == "cancelled"
    assert sum(len(c.tokens) for c in [first] + rest) < 400
    assert engine.cancel("cancel-me") is False  # gone
    assert engine.generate(GenerationRequest(PROMPT, 3)).finish_reason == "length"  # engine still fine


def test_prefix_reuse_hit_gives_identical_output(ckpt, engines, greedy):
    longer = PROMPT + greedy[:6]
    fresh = create_engine(ckpt["target"], compute_dtype="float64", prefix_cache_entries=0)
    try:
        expected = fresh.generate(GenerationRequest(longer, 10))
    finally:
        fresh.shutdown()
    engines["baseline"].generate(GenerationRequest(PROMPT, 8))
    hit = engines["baseline"].generate(GenerationRequest(longer, 10))
    assert hit.stats.kv_cache_reused_tokens >= len(PROMPT) + 5
    assert expected.stats.kv_cache_reused_tokens == 0
    assert hit.output_ids == expected.output_ids == greedy[6:16]


def test_invalid_requests_are_refused(engines):
    with pytest.raises(ValueError, match="empty"):
        engines["baseline"].submit(GenerationRequest([], 4))
    with pytest.raises(ValueError, match="max_seq_len"):
        engines["baseline"].submit(GenerationRequest(PROMPT, 10_000))
    with pytest.raises(ValueError, match="vocabulary"):
        engines["baseline"].submit(GenerationRequest([10_000], 4))
    r = engines["baseline"].generate(GenerationRequest(PROMPT, 0))
    assert r.output_ids == [] and r.finish_reason == "length"


def test_submit_from_many_threads_and_per_request_draft_count(engines, greedy):
    import threading

    results: dict[int, list[int]] = {}

    def worker(i: int) -> None:
        results[i] = engines["same_draft"].generate(GenerationRequest(PROMPT, 10 + i)).output_ids

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert all(results[i] == greedy[: 10 + i] for i in range(6))
    r = engines["same_draft"].generate(GenerationRequest(PROMPT, 10, num_draft_tokens=2))
    assert r.output_ids == greedy[:10] and max(len(p) for p in [r.stats.drafted_per_position]) == 2
    r = engines["same_draft"].generate(GenerationRequest(PROMPT, 6, num_draft_tokens=0))
    assert r.output_ids == greedy[:6] and r.stats.verify_steps == 0 and r.stats.decode_steps == 6
