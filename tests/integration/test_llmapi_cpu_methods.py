"""Every method of the CPU llmapi layout (``backend: reference`` + ``trtllm_runtime: llm_api``)
against the engine-layout deployment's ensemble for the same method, on real tritonservers:
greedy streamed text is equal (none = the baseline arm, draft_target, n-gram), and with the same
``sampling_param_temperature/top_k/top_p/seed`` as the ensemble's ``temperature/top_k/top_p/seed``
the sampled text is equal too, seed by seed — the llmapi model hands the engine the same
SamplingParams the ensemble does — and first tokens sampled over many seeds follow the target's
exact softmax (chi-square). Servers: the session's shared ones (conftest.py) where the layout is
served elsewhere too, a module-scoped one for the decoupled n-gram llmapi layout."""

from __future__ import annotations

import numpy as np
import pytest
from server_stops import stop_later
from test_llmapi_cpu_triton import MAX_TOKENS, PROMPTS, _stream, _text, llmapi_inputs

import tiny_deploy
from triton_clients import grpc_stream, text_inputs

pytestmark = [pytest.mark.triton, pytest.mark.slow]

SEEDS = (0, 1, 7, 123)
SAMPLED = ({"temperature": 0.8, "top_k": 0, "top_p": 1.0}, {"temperature": 1.3, "top_k": 5, "top_p": 0.9})
NGRAM = tiny_deploy.NGRAM


# per method: (llmapi server, ensemble server), the shared session servers of conftest.py where the
# layout is one the other modules serve too ('none' is the draft-target build's baseline arm)
PAIRS = {"none": ("dt_llmapi_baseline_server", "baseline_server"),
         "draft_target": ("dt_llmapi_server", "dt_engine_server"),
         "ngram": ("ngram_llmapi_server", "ngram_server")}


@pytest.fixture(scope="module")
def ngram_llmapi_server(serving_workdir, tiny_models):
    """n-gram on the llmapi layout, decoupled (test_llmapi_cpu_triton serves the unary one)."""
    from pipeline.serve.server import start_deployment

    cfg = tiny_deploy.built_deployment(serving_workdir, tiny_models, "tiny-methods-ngram-llmapi", NGRAM, llmapi=True)
    server = start_deployment(cfg, "speculative")
    yield server
    stop_later(server)


@pytest.fixture(scope="module", params=[pytest.param(method, marks=pytest.mark.shares(*PAIRS[method]))
                                        for method in PAIRS])
def servers(request):
    """(method, llmapi server, ensemble server)."""
    method = request.param
    llmapi, ensemble = (request.getfixturevalue(name) for name in PAIRS[method])
    return method, llmapi, ensemble


def _ensemble_text(url: str, prompt: str, **sampling) -> str:
    extra = dict(sampling)
    if "seed" in extra:
        extra["seed"] = np.array([[extra["seed"]]], dtype=np.uint64)
    # not streamed: the completion decoded at once, as the llmapi model's cumulative text (sampled
    # bytes that are not UTF-8 decode differently when cut into deltas)
    responses = grpc_stream(url, "ensemble", text_inputs(prompt, MAX_TOKENS, stream=False,
                                                         exclude_input_in_output=True, **extra))
    return responses[-1]["text_output"].reshape(-1)[0].decode()


def _llmapi_text(url: str, prompt: str, **sampling) -> tuple[str, int]:
    extra = {f"sampling_param_{k}": v for k, v in sampling.items() if k != "seed"}
    inputs = llmapi_inputs(prompt, streaming=True, sampling_param_return_perf_metrics=True, **extra)
    if "seed" in sampling:
        inputs["sampling_param_seed"] = np.array([sampling["seed"]], dtype=np.uint64)
    responses = _stream(url, inputs)
    return _text(responses), int(responses[-1]["total_draft_tokens"][0][0])


def test_greedy_text_equals_the_ensemble(servers):
    method, llmapi, ensemble = servers
    drafted = 0
    for prompt in PROMPTS:
        text, drafts = _llmapi_text(llmapi.grpc_url, prompt)
        assert text == _ensemble_text(ensemble.grpc_url, prompt, top_k=1), (method, prompt)
        drafted += drafts
    assert (drafted > 0) == (method != "none")  # speculation ran (or not) inside the llmapi model


@pytest.mark.parametrize("sampling", SAMPLED, ids=["t0.8-full", "t1.3-k5-p0.9"])
def test_sampled_text_equals_the_ensemble_seed_by_seed(servers, sampling):
    method, llmapi, ensemble = servers
    for seed in SEEDS:
        prompt = PROMPTS[seed % len(PROMPTS)]
        text, _ = _llmapi_text(llmapi.grpc_url, prompt, seed=seed, **sampling)
        assert text == _ensemble_text(ensemble.grpc_url, prompt, seed=seed, **sampling), (method, seed)
    # the seed matters: on one prompt, other seeds give other samples (equal texts above could
    # otherwise come from a model that ignores the seed)
    assert_seed_matters({seed: _llmapi_text(llmapi.grpc_url, PROMPTS[2], seed=seed, **sampling)[0] for seed in (11, 12, 13)})


def assert_seed_matters(texts_by_seed: dict[int, str]) -> None:
    """Samples of one prompt under several seeds: not all the same text."""
    assert len(set(texts_by_seed.values())) > 1, f"every seed gave the same text: {texts_by_seed}"


def test_the_seed_check_fails_when_the_seed_is_ignored(dt_llmapi_server):
    """The check above on a broken input: every request carries seed 11 whatever seed it is
    filed under (what a model that drops the request's seed for a fixed one answers)."""
    sampling = SAMPLED[0]
    texts = {seed: _llmapi_text(dt_llmapi_server.grpc_url, PROMPTS[2], seed=11, **sampling)[0] for seed in (11, 12, 13)}
    with pytest.raises(AssertionError, match="every seed gave the same text"):
        assert_seed_matters(texts)


N_DRAWS = 240


def _first_token_probs(target_dir, prompt_ids: list[int], temperature: float):
    """The target's exact next-token distribution (transformers, float32) at ``temperature``."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target_dir, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids])).logits[0, -1]
    return torch.softmax(logits.double() / temperature, dim=-1)


def test_sampled_first_tokens_follow_the_target_distribution(servers, tiny_models):
    """One token per request over many seeds: chi-square against the target's softmax, with the
    tokens binned by their text (the llmapi model returns text; tokens that decode alike share a
    bin). With speculation the first token passes through the draft's acceptance rule."""
    import torch

    from pipeline.triton_models.tokenizer import TextTokenizer
    from tests.reference_fixtures import chi2_pvalue

    method, llmapi, _ = servers
    tokenizer = TextTokenizer(tiny_models["target"])
    prompt, temperature = PROMPTS[2], 1.0
    probs = _first_token_probs(tiny_models["target"], tokenizer.encode(prompt), temperature)
    texts = [tokenizer.decode([i]) for i in range(probs.numel())]
    bins = {text: n for n, text in enumerate(dict.fromkeys(texts))}
    index = torch.tensor([bins[t] for t in texts])

    def binned(p):
        return torch.zeros(len(bins), dtype=torch.float64).index_add_(0, index, p)

    counts = torch.zeros(len(bins), dtype=torch.float64)
    for seed in range(N_DRAWS):
        inputs = llmapi_inputs(prompt, 1, streaming=True, sampling_param_temperature=temperature,
                               sampling_param_top_p=1.0)
        inputs["sampling_param_seed"] = np.array([seed], dtype=np.uint64)
        counts[bins[_text(_stream(llmapi.grpc_url, inputs))]] += 1
    assert chi2_pvalue(counts, binned(probs)) > 1e-3, method
    # the check can fail: the same draws against the distribution at another temperature
    colder = _first_token_probs(tiny_models["target"], tokenizer.encode(prompt), 0.3)
    assert chi2_pvalue(counts, binned(colder)) < 1e-3
