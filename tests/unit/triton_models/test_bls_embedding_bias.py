"""The BLS's ``embedding_bias`` (pipeline/triton_models/bls.py), in process with a stand-in for
``triton_python_backend_utils``: the tensor the target receives is FP32 [B, V] as its config
declares, and absent when the request sends no bias, whatever preprocessing's EMBEDDING_BIAS
holds. A soak through the BLS with half the streams cancelled saw one target call fail with an
INT32 ``embedding_bias`` from a request that sent no bias words (docs/operations.md)."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest


@pytest.fixture(scope="module")
def bls():
    fake = types.ModuleType("triton_python_backend_utils")
    fake.TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
    fake.Logger = types.SimpleNamespace(log_warn=lambda message: None, log_info=lambda message: None)
    saved = {name: sys.modules.get(name) for name in ("triton_python_backend_utils", "pipeline.triton_models.bls")}
    sys.modules["triton_python_backend_utils"] = fake
    sys.modules.pop("pipeline.triton_models.bls", None)
    try:
        from pipeline.triton_models import bls as module
        yield module
    finally:
        for name, value in saved.items():
            if value is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = value


def make_model(bls, pre_outputs: dict):
    """A BLS whose model calls return ``pre_outputs`` for preprocessing and record the rest."""
    model = object.__new__(bls.TritonPythonModel)
    model.calls = []

    def call(name, inputs, wanted, decoupled):
        model.calls.append((name, dict(inputs), list(wanted)))
        return [{k: v for k, v in pre_outputs.items() if k in wanted}]

    model.call = call
    return model


def pre_outputs(bias: np.ndarray) -> dict:
    return {"INPUT_ID": np.array([[5, 6, 7]], dtype=np.int32), "REQUEST_INPUT_LEN": np.array([[3]], dtype=np.int32),
            "BAD_WORDS_IDS": np.zeros((1, 2, 0), dtype=np.int32), "STOP_WORDS_IDS": np.zeros((1, 2, 0), dtype=np.int32),
            "OUT_END_ID": np.array([[2]], dtype=np.int32), "OUT_PAD_ID": np.array([[0]], dtype=np.int32),
            "EMBEDDING_BIAS": bias, "REQUEST_OUTPUT_LEN": np.array([[8]], dtype=np.int32)}


def request(with_bias: bool) -> dict:
    req = {"text_input": np.array([[b"hello"]], dtype=object), "max_tokens": np.array([[8]], dtype=np.int32)}
    if with_bias:
        req["embedding_bias_words"] = np.array([[b"hi", b"yo"]], dtype=object)
        req["embedding_bias_weights"] = np.array([[1.5, -2.0]], dtype=np.float32)
    return req


def target_inputs(bls, bias: np.ndarray, with_bias: bool) -> dict:
    model = make_model(bls, pre_outputs(bias))
    req = request(with_bias)
    return model.llm_common(req, model.preprocess(req))


def test_no_bias_sent_leaves_the_input_out_even_if_preprocessing_returns_an_int32_one(bls):
    # the soak's failure: a non-empty INT32 EMBEDDING_BIAS reached the target as embedding_bias
    inputs = target_inputs(bls, np.arange(6, dtype=np.int32).reshape(1, 6), with_bias=False)
    assert "embedding_bias" not in inputs


def test_no_bias_sent_does_not_ask_preprocessing_for_one(bls):
    model = make_model(bls, pre_outputs(np.zeros((1, 0), dtype=np.float32)))
    model.preprocess(request(False))
    ((name, _, wanted),) = model.calls
    assert name == "preprocessing" and "EMBEDDING_BIAS" not in wanted


def test_bias_sent_reaches_the_target_as_fp32_rows(bls):
    bias = np.array([[0.0, 1.5, -2.0, 0.0]], dtype=np.float64)
    inputs = target_inputs(bls, bias, with_bias=True)
    assert inputs["embedding_bias"].dtype == np.float32
    assert inputs["embedding_bias"].shape == (1, 4)
    np.testing.assert_array_equal(inputs["embedding_bias"], bias.astype(np.float32))


def test_bias_sent_but_empty_is_left_out(bls):
    assert "embedding_bias" not in target_inputs(bls, np.zeros((1, 0), dtype=np.float32), with_bias=True)


def test_integer_bias_is_a_bls_error_naming_it(bls):
    with pytest.raises(bls.BlsError, match="EMBEDDING_BIAS as int32"):
        target_inputs(bls, np.ones((1, 4), dtype=np.int32), with_bias=True)
