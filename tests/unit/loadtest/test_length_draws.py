"""Input and output lengths (issue 46.2): each distribution draws within its bounds, prompts are
cut from the dataset's real text to exactly the drawn length in the demo target's tokenizer, the
dataset's own lengths are used when asked, and each request's max_tokens (and forced length)
reaches the request the Locust users send."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from pipeline.config import load_config
from pipeline.demo import resolve_builtin
from pipeline.errors import UsageError
from pipeline.loadtest.inputs import LoadTestUsageError, load_prompt_set, with_loadtest_overrides
from pipeline.loadtest.lengths import LengthDistribution, draw, parse_length

ROOT = Path(__file__).resolve().parents[3]
SAMPLES = ROOT / "tests" / "fixtures" / "datasets"
MEDUSA = ROOT / "configs" / "tiny-cpu-medusa.yaml"
sys.path.insert(0, str(ROOT / "locustfiles"))

from openai_user import openai_body  # noqa: E402 - after the sys.path set-up above

from lt_common import RunSettings, request_inputs  # noqa: E402 - after the sys.path set-up above


def tokenizer():
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(Path(resolve_builtin("builtin:tiny-target")) / "tokenizer.json"))


def count(text: str) -> int:
    return len(tokenizer().encode(text, add_special_tokens=False).ids)


@pytest.mark.parametrize("written, low, high", [
    ("96", 96, 96), ("64:256", 64, 256), ("uniform:5:9", 5, 9), ("normal:512,128,256,1024", 256, 1024),
    ("normal:20,40", 1, None), ("lognormal:200,150,16,1024", 16, 1024), ("lognormal:30,60", 1, None),
])
def test_every_distribution_draws_within_its_bounds(written, low, high):
    spec = parse_length(written)
    values = draw(spec, 4000, np.random.default_rng(7))
    assert all(isinstance(v, int) for v in values)
    assert min(values) >= low and (high is None or max(values) <= high)
    if high is not None and high - low > 50:
        # truncated, not clipped: no pile-up at a bound
        assert values.count(low) < 0.05 * len(values) and values.count(high) < 0.05 * len(values)


def test_the_normal_and_lognormal_have_the_mean_and_spread_asked():
    normal = np.array(draw(parse_length("normal:500,50"), 20000, np.random.default_rng(1)))
    assert abs(normal.mean() - 500) < 2 and abs(normal.std() - 50) < 2
    lognormal = np.array(draw(parse_length("lognormal:200,150"), 40000, np.random.default_rng(1)))
    assert abs(lognormal.mean() - 200) < 5 and abs(lognormal.std() - 150) < 10
    assert np.median(lognormal) < lognormal.mean()  # skewed right, as output lengths are


@pytest.mark.parametrize("written", ["0", "9:3", "normal:10,0", "normal:5,2,10,20", "poisson:4", "", "1.5"])
def test_a_length_that_cannot_be_drawn_is_a_usage_error(written):
    with pytest.raises(UsageError, match="--input-len"):
        parse_length(written)
    assert parse_length("dataset") == LengthDistribution("dataset")


def with_loadtest(**changes):
    return with_loadtest_overrides(load_config(MEDUSA), changes)


def test_prompts_are_cut_from_real_text_to_the_drawn_token_length():
    cfg = with_loadtest(input_len="normal:60,25,10,140", output_len="lognormal:40,30,4,120", num_prompts=40)
    prompts, dataset = load_prompt_set(cfg)
    source = {p["id"]: p["prompt"] for p in load_prompt_set(load_config(MEDUSA))[0]}
    assert len(prompts) == 40 and dataset["lengths"]["cut_prompts"] == 40
    assert dataset["lengths"]["inexact_cuts"] == 0
    for p in prompts:
        assert count(p["prompt"]) == p["input_len"]  # the drawn length, in the target's tokenizer
        assert 10 <= p["input_len"] <= 140 and 4 <= p["max_tokens"] <= 120
        original = source[p["id"]]
        # real text: the prompt itself cut, or the prompt continued with its category's other prompts
        assert p["prompt"].startswith(original) or original.startswith(p["prompt"])
    assert len({p["max_tokens"] for p in prompts}) > 5
    again, _ = load_prompt_set(cfg)
    assert again == prompts  # seeded: both arms and a resumed run get the same requests


def test_a_trace_is_cut_to_its_own_lengths_from_the_prompt_set():
    cfg = with_loadtest(dataset_name="mooncake_trace", dataset_path=str(SAMPLES / "mooncake_trace.jsonl"))
    prompts, dataset = load_prompt_set(cfg)
    assert [p["arrival_s"] for p in prompts] == [0.0, 0.25, 0.25, 1.375, 2.0]
    assert [count(p["prompt"]) for p in prompts[:4]] == [24, 40, 16, 32]
    assert [p["max_tokens"] for p in prompts] == [12, 20, 8, 30, 16]
    assert prompts[4]["prompt"] == "Tell me a fact about octopuses."
    assert dataset["trace"] is True and dataset["format"] == "mooncake_trace"


def test_output_len_dataset_is_the_recorded_answers_token_length():
    cfg = with_loadtest(dataset_name="sharegpt", dataset_path=str(SAMPLES / "sharegpt.json"), output_len="dataset")
    prompts, _ = load_prompt_set(cfg)
    answers = ["Start with ten minutes a day on a free trainer, keep your eyes off the keyboard, and favour accuracy "
               "over speed for the first two weeks.",
               "About five minutes for a thin steak, up to ten for a thick one, loosely covered.",
               "A crew assembles for one last job. The plan unravels in the middle. Someone was playing everyone "
               "from the start."]
    assert [p["max_tokens"] for p in prompts] == [count(a) for a in answers]
    assert all("reference_output" not in p for p in prompts)


def test_num_prompts_draws_down_or_repeats_up_the_same_in_both_arms():
    few, _ = load_prompt_set(with_loadtest(num_prompts=7))
    assert len(few) == 7 and few == load_prompt_set(with_loadtest(num_prompts=7))[0]
    many, _ = load_prompt_set(with_loadtest(dataset_name="spec_bench", dataset_path=str(SAMPLES / "spec_bench.jsonl"),
                                            num_prompts=10))
    assert len(many) == 10 and len({p["id"] for p in many}) == 10
    assert {p["id"].split("#")[0] for p in many} == {"81", "161", "241", "321"}


def test_a_bad_flag_value_names_the_flag():
    with pytest.raises(LoadTestUsageError, match=r"^--output-len: 'normal:3' is not a length"):
        with_loadtest(output_len="normal:3")
    with pytest.raises(LoadTestUsageError, match=r"^--dataset-name: unknown dataset format 'vicuna'"):
        with_loadtest(dataset_name="vicuna")


def settings(**changes) -> RunSettings:
    base = {"run_id": "r", "arm": "baseline", "repeat": 0, "endpoint": "127.0.0.1:1", "model_name": "ensemble",
            "prompts": [{"id": "a", "prompt": "hi"}], "max_tokens": 64}
    return RunSettings(**{**base, **changes})


def test_each_request_carries_its_own_max_tokens_and_forced_length_per_transport():
    prompt = {"id": "a", "prompt": "hi", "max_tokens": 17}
    assert request_inputs(settings(), "hi", 0, prompt)["max_tokens"] == 17
    assert request_inputs(settings(), "hi", 0, {"id": "b", "prompt": "hi"})["max_tokens"] == 64
    assert "min_tokens" not in request_inputs(settings(), "hi", 0, prompt)
    triton = request_inputs(settings(ignore_eos=True), "hi", 0, prompt)
    assert triton["min_tokens"] == 17 and "ignore_eos" not in triton  # TensorRT-LLM has no ignore_eos input
    openai = request_inputs(settings(ignore_eos=True, transport="openai"), "hi", 0, prompt)
    body = openai_body(openai, "m", "completions")
    assert (body["max_tokens"], body["min_tokens"], body["ignore_eos"]) == (17, 17, True)
    llmapi = request_inputs(settings(contract="llmapi"), "hi", 0, prompt)
    assert llmapi["sampling_param_max_tokens"] == 17


def test_a_conversation_goes_to_the_chat_api_as_its_messages():
    history = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
               {"role": "user", "content": "Bye?"}]
    prompt = {"id": "a", "prompt": "user: Hi\n\nassistant: Hello\n\nuser: Bye?", "messages": history}
    inputs = request_inputs(settings(transport="openai", openai_api="chat"), prompt["prompt"], 0, prompt)
    assert openai_body(inputs, "m", "chat")["messages"] == history
    completions = openai_body(request_inputs(settings(transport="openai"), prompt["prompt"], 0, prompt), "m", "completions")
    assert completions["prompt"] == prompt["prompt"] and "messages" not in completions


def test_forced_lengths_over_the_llmapi_model_are_refused_before_any_server():
    from pipeline.loadtest.inputs import check_forced_lengths
    from pipeline.render.arms import decide_arm  # what render writes as each arm's descriptor

    def rendered(cfg):
        return {arm: decide_arm(cfg, arm) for arm in ("baseline", "speculative")}

    cfg = with_loadtest_overrides(load_config(ROOT / "configs" / "tiny-cpu-llmapi.yaml"), {"ignore_eos": True})
    with pytest.raises(LoadTestUsageError, match="llmapi model takes no min_tokens or ignore_eos"):
        check_forced_lengths(cfg, rendered(cfg))
    ensemble = with_loadtest(ignore_eos=True)
    check_forced_lengths(ensemble, rendered(ensemble))  # the ensemble takes min_tokens
