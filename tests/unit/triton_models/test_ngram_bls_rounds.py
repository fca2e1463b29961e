"""The BLS's n-gram rounds (pipeline/triton_models/ngram_bls.py) against the reference engine as
the external-draft target, in process: the round code runs as in tritonserver, with a stand-in
for ``triton_python_backend_utils`` and the BLS's model calls answered by a target engine that
verifies ``draft_input_ids`` (the served path is tests/integration/test_serving_ngram_bls.py).

Greedy output equals target-only output (float64, no near-ties) while drafts are offered and
accepted; sampled output follows the exact target distribution (chi-square against the HF
model's probabilities) and a broken residual is detected; the BLS parameters render and parse
back; a request above the engine's draft limit is refused."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest
import torch

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
K = 4
PROMPTS = [p + p[: max(2, len(p) // 2)] if i % 2 else p for i, p in enumerate(random_prompts(40, seed=11))]


@pytest.fixture(scope="module")
def rounds():
    """The n-gram rounds class, imported with a stand-in for Triton's Python-backend module."""
    fake = types.ModuleType("triton_python_backend_utils")
    fake.TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
    fake.Logger = types.SimpleNamespace(log_warn=lambda message: None, log_info=lambda message: None)
    saved = sys.modules.get("triton_python_backend_utils")
    sys.modules["triton_python_backend_utils"] = fake
    try:
        from pipeline.triton_models.ngram_bls import NgramDraftTarget
        yield NgramDraftTarget
    finally:
        if saved is None:
            sys.modules.pop("triton_python_backend_utils", None)
        else:
            sys.modules["triton_python_backend_utils"] = saved


@pytest.fixture(scope="module")
def ckpt():
    one_thread()
    return shared_checkpoints()


class Recorder:
    def __init__(self):
        self.calls = []

    def add(self, *args):
        self.calls.append(args)

    fallback = observe = add


class FakeBls:
    """What NgramDraftTarget uses of the BLS: preprocessing's outputs, the shared target inputs,
    the target call (the reference engine with external drafts), the response sender."""

    target_name, draft_name, target_decoupled = "tensorrt_llm", "", False

    def __init__(self, engine, settings, sampling=None):
        from pipeline.reference.api import SamplingParams

        self.engine, self.ngram, self.target_max_draft_len = engine, settings, K
        self.sampling = sampling or SamplingParams(top_k=1)
        self.counters, self.latency = Recorder(), Recorder()
        self.sent: list[tuple[list[int], bool]] = []
        self.target_calls: list[list[int]] = []  # the drafts of each call

    def preprocess(self, request):
        prompt = request["prompt"]
        return {"INPUT_ID": np.array([prompt], dtype=np.int32), "REQUEST_INPUT_LEN": np.array([[len(prompt)]]),
                "REQUEST_OUTPUT_LEN": np.array([[request["max_tokens"]]]),
                "STOP_WORDS_IDS": np.zeros((1, 2, 0), dtype=np.int32)}

    def llm_common(self, request, pre):
        return {}

    def call(self, model, inputs, wanted, decoupled):
        from pipeline.reference.api import GenerationRequest

        assert model == self.target_name and not decoupled
        context = [int(t) for t in inputs["input_ids"].reshape(-1)]
        drafts = [int(t) for t in inputs["draft_input_ids"].reshape(-1)] if "draft_input_ids" in inputs else None
        self.target_calls.append(drafts or [])
        result = self.engine.generate(GenerationRequest(
            context, int(inputs["request_output_len"].reshape(-1)[0]), draft_input_ids=drafts, sampling=self.sampling))
        ids = context + list(result.output_ids)
        return [{"output_ids": np.array(ids, dtype=np.int32).reshape(1, 1, -1),
                 "sequence_length": np.array([[len(ids)]], dtype=np.int32),
                 "total_draft_tokens": np.array([[result.stats.draft_tokens]]),
                 "total_accepted_draft_tokens": np.array([[result.stats.accepted_tokens]])}]

    def send_text(self, sender, ids, extra, final):
        self.sent.append((list(ids), final))

    @staticmethod
    def cancelled(sender):
        return False


def _request(prompt, max_tokens, k=K):
    return {"prompt": prompt, "max_tokens": max_tokens, "text_input": np.array([[b"x"]], dtype=object),
            "num_draft_tokens": np.array([[k]], dtype=np.int32)}


def _settings(**knobs):
    from pipeline.triton_models.ngram_params import NgramSettings

    return NgramSettings(**{"max_draft_len": K, "max_matching_ngram_size": 3, **knobs})


def _engines(ckpt):
    from pipeline.reference.engine import create_engine

    target = create_engine(ckpt["target"], role="target", max_draft_len=K, compute_dtype="float64",
                           prefix_cache_entries=0)
    baseline = create_engine(ckpt["target"], role="baseline", compute_dtype="float64")
    return target, baseline


def _generate(rounds, bls, prompt, max_tokens, k=K) -> list[int]:
    bls.sent.clear()
    rounds(bls, _request(prompt, max_tokens, k), sender=None, num_draft=k, streaming=False).run()
    ((ids, final),) = bls.sent
    assert final
    return ids[len(prompt):]


@pytest.mark.slow  # over the quick tier's CPU budget (tests/conftest.py)
@pytest.mark.parametrize("knobs", [{}, {"is_use_oldest": False, "min_matching_ngram_size": 2}],
                         ids=["oldest", "newest-min2"])
def test_greedy_bls_ngram_equals_target_only(rounds, ckpt, knobs):
    from pipeline.reference.api import GenerationRequest

    target, baseline = _engines(ckpt)
    try:
        bls = FakeBls(target, _settings(**knobs))
        outputs = [_generate(rounds, bls, p, NEW_TOKENS) for p in PROMPTS]
        expected = [baseline.generate(GenerationRequest(p, NEW_TOKENS)).output_ids for p in PROMPTS]
    finally:
        target.shutdown()
        baseline.shutdown()
    mismatches = [i for i, (a, b) in enumerate(zip(outputs, expected)) if a != b]
    assert not mismatches, f"{len(mismatches)} prompts differ, first {mismatches[:5]}"
    drafted = sum(len(d) for d in bls.target_calls)
    accepted = sum(c[1] for c in bls.counters.calls)
    assert drafted > 0 and accepted > 0
    assert all(len(d) <= K for d in bls.target_calls)
    # fewer target calls than tokens: accepted drafts are tokens target-only decoding needed a call for
    assert len(bls.target_calls) < len(PROMPTS) * NEW_TOKENS


def test_draft_len_above_the_engine_limit_is_refused(rounds, ckpt):
    from pipeline.triton_models.draft_target import SpecError

    bls = FakeBls(None, _settings())
    with pytest.raises(SpecError, match="larger than maximum number of draft tokens"):
        rounds(bls, _request([1, 2, 3], 4, k=K + 1), sender=None, num_draft=K + 1, streaming=False).run()


def _exact_marginals(ckpt, params, prompt):
    from transformers import LlamaForCausalLM

    from pipeline.reference.sampling import to_probs

    model = LlamaForCausalLM.from_pretrained(str(ckpt["target"]), dtype=torch.float64).eval()
    with torch.no_grad():
        first = to_probs(model(torch.tensor([prompt])).logits[:, -1], params)[0]
        ctx = torch.tensor([prompt + [0]] * VOCAB)
        ctx[:, -1] = torch.arange(VOCAB)
        second = first @ to_probs(model(ctx).logits[:, -1], params)
    return first, second


def _draft_prompt(ckpt, params):
    """[a, b, X, c, a, b]: the suffix (a, b) makes the lookup draft X, with X the token whose
    target probability there is closest to one half (accept and reject paths both weigh)."""
    from transformers import LlamaForCausalLM

    from pipeline.reference.sampling import to_probs

    model = LlamaForCausalLM.from_pretrained(str(ckpt["target"]), dtype=torch.float64).eval()
    a, b, c = 5, 17, 33
    with torch.no_grad():
        candidates = torch.tensor([[a, b, x, c, a, b] for x in range(VOCAB)])
        p_x = to_probs(model(candidates).logits[:, -1], params)[torch.arange(VOCAB), torch.arange(VOCAB)]
    x = int((p_x - 0.5).abs().argmin())
    return [a, b, x, c, a, b], x


def _sample_counts(rounds, ckpt, prompt, params, n):
    from pipeline.reference.engine import create_engine

    torch.manual_seed(1234)  # unseeded requests draw their generator seeds from torch's global RNG
    target = create_engine(ckpt["target"], role="target", max_draft_len=K, compute_dtype="float64",
                           prefix_cache_entries=0)
    c1, c2 = torch.zeros(VOCAB, dtype=torch.float64), torch.zeros(VOCAB, dtype=torch.float64)
    try:
        bls = FakeBls(target, _settings(max_matching_ngram_size=2), sampling=params)
        for _ in range(n):
            out = _generate(rounds, bls, prompt, 2)
            c1[out[0]] += 1
            if len(out) > 1:  # the broken residual can hand back the draft, which then ends the request
                c2[out[1]] += 1
    finally:
        target.shutdown()
    assert sum(1 for d in bls.target_calls if d) >= n  # every request verified a draft
    return c1, c2


@pytest.mark.slow
def test_sampled_bls_ngram_matches_target_distribution_and_broken_residual_does_not(rounds, ckpt, monkeypatch):
    from pipeline.reference import verify
    from pipeline.reference.api import SamplingParams

    params = SamplingParams(temperature=0.8, top_k=40, top_p=0.95)
    prompt, x = _draft_prompt(ckpt, params)
    first, second = _exact_marginals(ckpt, params, prompt)
    assert 0.1 < float(first[x]) < 0.9, f"draft token {x} has p={float(first[x]):.3f}; pick another prompt"
    c1, c2 = _sample_counts(rounds, ckpt, prompt, params, 1500)
    assert c2.sum() == 1500
    assert chi2_pvalue(c1, first) > 1e-3 and chi2_pvalue(c2, second) > 1e-3
    # negative control: rejected drafts resampled from p itself over-weight the draft token
    # (BROKEN_DRAWS: why 600 draws are enough)
    monkeypatch.setattr(verify, "residual", lambda target_probs, draft_probs: target_probs)
    b1, _ = _sample_counts(rounds, ckpt, prompt, params, BROKEN_DRAWS)
    assert chi2_pvalue(b1, first) < 1e-3


def test_bls_parameters_round_trip_and_bad_values_are_refused():
    from pipeline.triton_models.ngram_params import NgramSettings, ngram_settings

    settings = NgramSettings(5, 3, 2, False, False)
    params = settings.parameters()
    assert params == {"speculative_method": "ngram", "ngram_max_draft_len": "5", "ngram_max_matching_ngram_size": "3",
                      "ngram_min_matching_ngram_size": "2", "ngram_is_keep_all": "false", "ngram_is_use_oldest": "false"}
    config = {"parameters": {k: {"string_value": v} for k, v in params.items()}}
    assert ngram_settings(config) == settings
    assert ngram_settings({"parameters": {}}) is None
    config["parameters"]["ngram_min_matching_ngram_size"] = {"string_value": "4"}
    with pytest.raises(ValueError, match="min_matching_ngram_size"):
        ngram_settings(config)
