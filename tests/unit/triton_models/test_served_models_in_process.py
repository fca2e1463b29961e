"""The served ``preprocessing`` and ``postprocessing`` models (pipeline/triton_models/), driven in
process through a stand-in for ``triton_python_backend_utils`` (the Triton stub, which cannot be
imported outside a server), over both tokenizer loaders: a ``tokenizer.json`` checkpoint (HF
``tokenizers``) and a SentencePiece ``tokenizer.model`` one (``transformers.AutoTokenizer``).

These tests need no torch and no tritonserver, so scripts/ngc-pinned-env.sh also runs them at the
packages the TensorRT-LLM container pins (transformers 4.x, numpy 1.x; pipeline/validate/
ngc_image_packages.yaml); the real-Triton tests in tests/integration cover the served path here."""

from __future__ import annotations

import json
import sys
import types

import numpy as np
import pytest

from tests import sentencepiece_fixture as spf

TEXTS = ["The quick brown fox", "def add(a, b):\n    return a + b"]


class _Tensor:
    def __init__(self, name: str, array):
        self._name, self._array = name, np.asarray(array)

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array


class _TritonError(Exception):
    INVALID_ARG = 3

    def __init__(self, message: str, code: int | None = None):
        super().__init__(message)
        self.code = code

    def message(self) -> str:
        return str(self)


class _Request:
    def __init__(self, tensors: dict):
        self.tensors = tensors

    def inputs(self) -> list:
        return list(self.tensors.values())


class _Response:
    def __init__(self, output_tensors, error=None):
        self.outputs = {t.name(): t.as_numpy() for t in output_tensors}
        self.error = error


def _stub_module() -> types.ModuleType:
    stub = types.ModuleType("triton_python_backend_utils")
    stub.Tensor = _Tensor
    stub.TritonError = _TritonError
    stub.InferenceResponse = _Response
    stub.get_input_tensor_by_name = lambda request, name: request.tensors.get(name)
    return stub


@pytest.fixture(scope="module")
def models():
    """preprocessing and postprocessing imported against the stand-in stub."""
    names = ("triton_python_backend_utils", "pipeline.triton_models.io", "pipeline.triton_models.preprocessing",
             "pipeline.triton_models.postprocessing")
    import pipeline.triton_models as package

    saved = {name: sys.modules.get(name) for name in names}
    # `from pipeline.triton_models import io` takes the package's attribute when it is set: an
    # earlier test's import (bound to its own stand-in stub) must not be reused
    saved_attributes = {name: package.__dict__.pop(name.rsplit(".", 1)[1], None) for name in names[1:]}
    sys.modules["triton_python_backend_utils"] = _stub_module()
    for name in names[1:]:
        sys.modules.pop(name, None)
    try:
        from pipeline.triton_models import postprocessing, preprocessing

        yield preprocessing, postprocessing
    finally:
        for name, value in saved.items():
            if value is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = value
        for name, value in saved_attributes.items():
            attribute = name.rsplit(".", 1)[1]
            if value is None:
                package.__dict__.pop(attribute, None)
            else:
                setattr(package, attribute, value)


@pytest.fixture(scope="module", params=["tokenizer.json", "sentencepiece"])
def tokenizer_dir(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp(request.param.replace(".", "_")) / "tok"
    if request.param == "tokenizer.json":
        import tiny_deploy

        tiny_deploy.make_tokenizer(directory)
    else:
        spf.write_tokenizer_dir(directory)
    return directory


def _initialized(model_class, tokenizer_dir):
    model = model_class()
    config = {"parameters": {"tokenizer_dir": {"string_value": str(tokenizer_dir)}}}
    model.initialize({"model_config": json.dumps(config)})
    return model


def _inputs(**arrays) -> _Request:
    return _Request({name: _Tensor(name, value) for name, value in arrays.items()})


def _texts(rows: list[str]) -> np.ndarray:
    return np.array([[text.encode("utf-8")] for text in rows], dtype=object)


def test_preprocessing_gives_upstreams_shapes_and_postprocessing_reads_them_back(models, tokenizer_dir):
    preprocessing, postprocessing = models
    pre = _initialized(preprocessing.TritonPythonModel, tokenizer_dir)
    post = _initialized(postprocessing.TritonPythonModel, tokenizer_dir)
    request = _inputs(QUERY=_texts(TEXTS), REQUEST_OUTPUT_LEN=np.array([[8], [8]], dtype=np.int32),
                      STOP_WORDS_DICT=_texts(["fox", "return"]))
    [response] = pre.execute([request])
    assert response.error is None
    ids, lengths = response.outputs["INPUT_ID"], response.outputs["REQUEST_INPUT_LEN"]
    assert ids.dtype == np.int32 and ids.shape == (2, int(lengths.max()))
    assert lengths.dtype == np.int32 and lengths.shape == (2, 1)
    expected = [pre.tokenizer.encode(text) for text in TEXTS]
    for row, want in enumerate(expected):
        assert ids[row, : len(want)].tolist() == want
        assert (ids[row, len(want):] == pre.tokenizer.pad_id).all()  # right-padded with the tokenizer's pad id
    stop = response.outputs["STOP_WORDS_IDS"]
    assert stop.dtype == np.int32 and stop.shape[:2] == (2, 2)
    assert response.outputs["OUT_END_ID"].tolist() == [[pre.tokenizer.end_id]] * 2

    tokens = ids.reshape(2, 1, -1)  # [batch, beam, tokens]
    [decoded] = post.execute([_inputs(TOKENS_BATCH=tokens, SEQUENCE_LENGTH=lengths.reshape(2, 1))])
    assert decoded.error is None
    output = decoded.outputs["OUTPUT"]
    assert output.shape == (2,)
    assert [text.decode("utf-8") for text in output] == TEXTS


def test_a_bad_request_is_an_error_response_and_the_model_keeps_serving(models, tokenizer_dir):
    preprocessing, _ = models
    pre = _initialized(preprocessing.TritonPythonModel, tokenizer_dir)
    empty = _inputs(QUERY=_texts([""]), REQUEST_OUTPUT_LEN=np.array([[4]], dtype=np.int32))
    good = _inputs(QUERY=_texts(["hello"]), REQUEST_OUTPUT_LEN=np.array([[4]], dtype=np.int32))
    bad_response, good_response = pre.execute([empty, good])
    assert "text_input is empty" in bad_response.error.message()
    assert bad_response.error.code == _TritonError.INVALID_ARG
    assert good_response.error is None and good_response.outputs["INPUT_ID"].shape[0] == 1
