"""The request-rule table of docs/request-validation.md, row by row, on the rules the served
``tensorrt_llm`` model applies in this order (pipeline/triton_models/llm.py ``_check_rules``):
TensorRT-LLM's ranges, ``end_id`` against the vocabulary, then the CPU engine's limits. Every
refused value gives the exact message a client sees; every value TensorRT-LLM accepts passes.
tests/integration/test_request_validation.py sends one row of each kind and every accepted value
through a real tritonserver (the wiring, the server staying up, the engine answering)."""

from __future__ import annotations

import pytest

from pipeline.triton_models.request_rules import RuleError, check_cpu_engine, check_end_id, check_ranges
from tests.request_rule_table import ACCEPTED, REFUSED, VOCAB, accepted_batches


def as_served(values: dict) -> None:
    """The served model's order: ranges, end_id against the vocabulary, the CPU engine's limits."""
    check_ranges(values.get)
    end_id = values.get("end_id")
    check_end_id(None if end_id is None else int(end_id), VOCAB)
    check_cpu_engine(values.get)


@pytest.mark.parametrize("name,value,message", REFUSED, ids=[f"{n}={v}" for n, v, _ in REFUSED])
def test_refused_with_the_message_a_client_sees(name, value, message):
    with pytest.raises(RuleError) as info:
        as_served({name: value})
    assert str(info.value).startswith(message), str(info.value)


@pytest.mark.parametrize("name,value", ACCEPTED, ids=[f"{n}={v}" for n, v in ACCEPTED])
def test_accepted(name, value):
    as_served({name: value})


def test_accepted_values_pass_together():
    """The served test sends the accepted values a few at a time: together they pass too."""
    for batch in accepted_batches():
        as_served(batch)


def test_accepted_batches_cover_every_row():
    assert sorted((n, str(v)) for b in accepted_batches() for n, v in b.items()) == sorted((n, str(v)) for n, v in ACCEPTED)
