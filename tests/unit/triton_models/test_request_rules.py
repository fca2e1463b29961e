"""The request rules (pipeline.triton_models.request_rules) on plain values: every range at its
boundaries, NaN refused where the executor compares, the client names the BLS uses, and the CPU
engine's limits after the upstream ranges."""

from __future__ import annotations

import math

import pytest

from pipeline.triton_models.request_rules import RuleError, check_cpu_engine, check_end_id, check_ranges

# (tensorrt_llm input, refused values, accepted values)
RANGES = [
    ("beam_width", [0, -1], [1, 4]),
    ("runtime_top_k", [-1], [0, 1, 50]),
    ("runtime_top_p", [1.0001, 5.0, math.nan], [1.0, 0.5, 0.0, -1.0]),
    ("runtime_top_p_min", [-0.1, 1.1, math.nan], [0.0, 1.0]),
    ("runtime_top_p_decay", [0.0, 1.5, math.nan], [1e-6, 1.0]),
    ("runtime_top_p_reset_ids", [-1], [0, 7]),
    ("temperature", [-1e-6, math.nan], [0.0, 2.0]),
    ("len_penalty", [-0.1], [0.0, 1.5]),
    ("repetition_penalty", [0.0, -1.0], [0.1, 1.0]),
    ("beam_search_diversity_rate", [-0.1], [0.0]),
    ("min_tokens", [-1], [0, 5]),
    ("num_return_sequences", [0, -2], [1]),
    ("request_output_len", [0, -5], [1]),
]


def _getter(values: dict):
    return lambda name: values.get(name)


@pytest.mark.parametrize("name,refused,accepted", RANGES, ids=[r[0] for r in RANGES])
def test_ranges(name, refused, accepted):
    for value in refused:
        with pytest.raises(RuleError, match=rf"^{name}\b.* must be .*got"):
            check_ranges(_getter({name: value}))
    for value in accepted:
        check_ranges(_getter({name: value}))


def test_client_names_on_the_bls():
    with pytest.raises(RuleError, match=r"^top_p must be <= 1 \(a value <= 0 means unset\), got 5$"):
        check_ranges(_getter({"top_p": 5.0}), use_client_names=True)
    with pytest.raises(RuleError, match=r"^length_penalty must be >= 0, got -1$"):
        check_ranges(_getter({"length_penalty": -1.0}), use_client_names=True)
    check_ranges(_getter({"runtime_top_p": 5.0}), use_client_names=True)  # not a BLS input name


def test_tensorrt_llm_message_names_the_client_input_too():
    with pytest.raises(RuleError, match=r"^runtime_top_p \(top_p on the ensemble and the BLS\) must be"):
        check_ranges(_getter({"runtime_top_p": 5.0}))


def test_num_return_sequences_at_most_beam_width_with_beam_search():
    with pytest.raises(RuleError, match=r"num_return_sequences \(3\) must be <= beam_width \(2\)"):
        check_ranges(_getter({"beam_width": 2, "num_return_sequences": 3}))
    check_ranges(_getter({"beam_width": 1, "num_return_sequences": 3}))  # sampling: any count


def test_end_id_range():
    for bad in (-2, 320, 1000):
        with pytest.raises(RuleError, match=rf"end_id \({bad}\) is not within acceptable range \[-1, 320\)"):
            check_end_id(bad, 320)
    for good in (-1, 0, 319, None):
        check_end_id(good, 320)


def test_cpu_engine_limits():
    check_cpu_engine(_getter({"beam_width": 1, "num_return_sequences": 1, "repetition_penalty": 1.0,
                              "presence_penalty": 0.0, "frequency_penalty": 0.0, "runtime_top_p_decay": 1.0}))
    for values, text in (({"beam_width": 2}, "beam_width must be 1"), ({"num_return_sequences": 2}, "num_return_sequences must be 1"),
                         ({"repetition_penalty": 1.1}, "repetition_penalty 1.1 is not supported"),
                         ({"presence_penalty": math.nan}, "presence_penalty nan is not supported"),
                         ({"frequency_penalty": 0.2}, "frequency_penalty 0.2 is not supported"),
                         ({"runtime_top_p_decay": 0.9}, "runtime_top_p_decay 0.9 is not supported")):
        with pytest.raises(RuleError, match=text):
            check_cpu_engine(_getter(values))
