"""The load tester's llmapi contract (locustfiles/llmapi_contract.py): requests use only tensors
upstream's llmapi model declares, with their dtypes; cumulative streamed text becomes deltas and
re-tokenized counts; perf outputs sent as strings are read as numbers; the deployment descriptor
names the contract; the report marks missing acceptance as not reported."""

from __future__ import annotations

import llmapi_contract
import pytest

from lt_common import RunSettings, request_inputs
from pipeline.trtllm.llmapi_facts import triton_llmapi

TRITON_DTYPE = {"TYPE_STRING": "BYTES", "TYPE_BOOL": "BOOL", "TYPE_INT32": "INT32", "TYPE_FP32": "FP32",
                "TYPE_UINT64": "UINT64", "TYPE_INT64": "INT64"}


def _settings(**kw) -> RunSettings:
    base = {"run_id": "r", "arm": "speculative", "repeat": 0, "endpoint": "127.0.0.1:1", "model_name": "tensorrt_llm",
            "contract": "llmapi", "max_tokens": 12, "sampling": {"top_k": 1, "top_p": 0.9, "temperature": 0.5, "seed": 7}}
    return RunSettings(**{**base, **kw})


def test_request_uses_upstream_inputs_with_their_dtypes():
    inputs = request_inputs(_settings(), "hello", prompt_index=3)
    declared = {t["name"]: TRITON_DTYPE[t["data_type"]] for t in triton_llmapi()["inputs"]}
    assert set(inputs) <= set(declared)
    for name in inputs:
        assert llmapi_contract.input_dtype(name)[0] == declared[name], name
    assert inputs["text_input"] == "hello" and inputs["streaming"] is True
    assert inputs["sampling_param_max_tokens"] == 12 and inputs["sampling_param_top_k"] == 1
    assert inputs["sampling_param_seed"] == 7 + 3  # the same prompt gets the same seed in both arms
    assert inputs["sampling_param_return_perf_metrics"] is True


def test_ensemble_contract_is_unchanged():
    inputs = request_inputs(_settings(contract="ensemble"), "hello", 0)
    assert inputs["max_tokens"] == 12 and inputs["stream"] is True and "sampling_param_max_tokens" not in inputs


def test_sampling_left_unset_is_not_sent():
    inputs = request_inputs(_settings(sampling={}), "x", 0)
    assert not any(k in inputs for k in ("sampling_param_top_k", "sampling_param_seed", "sampling_param_temperature"))


def test_perf_outputs_are_outputs_upstream_declares():
    declared = {t["name"] for t in triton_llmapi()["outputs"]}
    assert set(llmapi_contract.PERF_OUTPUTS) <= declared
    assert set(llmapi_contract.PERF_OUTPUTS) == set(triton_llmapi()["responses"]["perf_outputs"])


def test_cumulative_text_becomes_deltas_and_token_counts():
    count = lambda text: len(text.split())  # noqa: E731 - a stand-in tokenizer: one token per word
    stream = llmapi_contract.CumulativeText(count)
    assert stream.delta("a b") == ("a b", 2)
    assert stream.delta("a b c d") == (" c d", 2)
    assert stream.delta("a b c d") == ("", 0)  # a repeated response adds nothing
    assert stream.delta("a b c x e") == ("x e", 1)  # a revised tail: the differing text, counts from the whole


def test_without_tokenizer_no_count():
    stream = llmapi_contract.CumulativeText()
    assert not stream.retokenized
    assert stream.delta("ab") == ("ab", None) and stream.delta("abc") == ("c", None)


@pytest.mark.parametrize("raw, expected", [
    ({"acceptance_rate": b"0.5", "total_draft_tokens": b"12", "total_accepted_draft_tokens": "6"},
     {"acceptance_rate": 0.5, "total_draft_tokens": 12, "total_accepted_draft_tokens": 6}),
    ({"acceptance_rate": 0.25, "total_draft_tokens": 4, "arrival_time_ns": b"1700000000000000000"},
     {"acceptance_rate": 0.25, "total_draft_tokens": 4, "arrival_time_ns": 1700000000000000000}),
    ({"acceptance_rate": b"None", "total_draft_tokens": b""}, {}),
    ({}, {}),
])
def test_perf_values_read_strings_or_numbers(raw, expected):
    assert llmapi_contract.perf_values(raw.get) == expected


def test_descriptor_names_the_contract(tmp_path):
    from pipeline.config import parse_config
    from pipeline.render.arms import decide_arm

    api = parse_config({"name": "api", "backend": "trtllm", "hardware": "h100-sxm-80gb", "trtllm_version": "1.2.1",
                        "trtllm_runtime": "llm_api", "target": {"checkpoint": "/models/Meta-Llama-3.1-8B-Instruct"},
                        "speculation": {"method": "eagle3", "head_dir": "/models/EAGLE3-LLaMA3.1-Instruct-8B"}},
                       workdir=tmp_path)
    for arm in ("baseline", "speculative"):
        d = decide_arm(api, arm)
        assert (d.model_name, d.contract) == ("tensorrt_llm", "llmapi")


def test_missing_acceptance_is_not_reported_never_zero():
    from pipeline.report.acceptance_reported import acceptance_reported, missing_acceptance_line
    from pipeline.report.stats import RunData

    ok = {"status": "ok", "stage": "measure", "draft_tokens": None, "accepted_tokens": None}
    runs = [RunData(info={"arm": "speculative", "metrics_delta": None}, records=[ok, ok]),
            RunData(info={"arm": "baseline", "metrics_delta": {"draft_tokens": 0, "verify_steps": 0}},
                    records=[{**ok, "draft_tokens": 0, "accepted_tokens": 0}])]
    reported = acceptance_reported(runs)
    assert reported["speculative"] == {"per_request": "not reported", "requests_with_figures": 0, "requests": 2,
                                       "metrics": "not reported", "metrics_source": None}
    assert reported["baseline"]["per_request"] == "reported"  # a reported 0 is a figure
    line = missing_acceptance_line(reported)
    assert "not reported" in line and "0%" not in line and "2 of 2" in line
