"""A deployment whose target checkpoint has only a SentencePiece ``tokenizer.model`` (no
``tokenizer.json``, as Llama-1/2 and Vicuna v1.3 ship) renders, loads and serves: preprocessing and
postprocessing tokenize exactly as ``transformers.AutoTokenizer`` (upstream's loader) does, and the
ensemble's text equals AutoTokenizer's decoding of the engine's own tokens."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from server_stops import stop_later

import tiny_deploy
from tests import sentencepiece_fixture as spf
from triton_clients import grpc_infer, grpc_stream, http_generate, text_inputs

pytestmark = [pytest.mark.triton, pytest.mark.slow]
PROMPTS = ["The quick brown fox", "def add(a, b):"]
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def sp_checkpoint(tmp_path_factory) -> Path:
    return spf.write_checkpoint(tmp_path_factory.mktemp("sp-models") / "target")


@pytest.fixture(scope="module")
def sp_server(tmp_path_factory, sp_checkpoint):
    from pipeline.config import load_config
    from pipeline.render.renderer import render
    from pipeline.serve.server import start_deployment

    workdir = tmp_path_factory.mktemp("sp-serving")
    assert not (sp_checkpoint / "tokenizer.json").exists()
    cfg_path = tiny_deploy.make_deployment(workdir, {"target": sp_checkpoint}, "none", name="tiny-sp")
    cfg = load_config(cfg_path, workdir)
    render(cfg)
    server = start_deployment(cfg, "baseline")
    yield server
    stop_later(server)


@pytest.fixture(scope="module")
def hf(sp_checkpoint):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(sp_checkpoint), legacy=False, padding_side="left", trust_remote_code=False)
    if not tok.pad_token:
        tok.pad_token = tok.eos_token
    return tok


def test_preprocessing_tokenizes_like_autotokenizer(sp_server, hf):
    out = grpc_infer(sp_server.grpc_url, "preprocessing", {
        "QUERY": np.array([[p] for p in PROMPTS], dtype=np.object_),
        "REQUEST_OUTPUT_LEN": np.array([[MAX_TOKENS]] * 2, dtype=np.int32),
        "STOP_WORDS_DICT": np.array([["fox"], ["add"]], dtype=np.object_)})
    rows = [hf.encode(p) for p in PROMPTS]
    assert all(r[0] == spf.BOS_ID for r in rows)
    width = max(len(r) for r in rows)
    expected = [r + [hf.pad_token_id] * (width - len(r)) for r in rows]
    np.testing.assert_array_equal(out["INPUT_ID"], np.array(expected, dtype=np.int32))
    np.testing.assert_array_equal(out["REQUEST_INPUT_LEN"], [[len(r)] for r in rows])
    assert out["OUT_END_ID"].tolist() == [[spf.EOS_ID]] * 2
    assert out["OUT_PAD_ID"].tolist() == [[spf.EOS_ID]] * 2  # no pad token: pad = EOS, as upstream
    fox, add = hf.encode("fox", add_special_tokens=False), hf.encode("add", add_special_tokens=False)
    assert out["STOP_WORDS_IDS"][0, 0, : len(fox)].tolist() == fox and out["STOP_WORDS_IDS"][1, 0, : len(add)].tolist() == add


def test_postprocessing_decodes_like_autotokenizer(sp_server, hf):
    ids = hf.encode("def add(a, b):\n    return a + b") + [spf.EOS_ID]
    out = grpc_infer(sp_server.grpc_url, "postprocessing", {
        "TOKENS_BATCH": np.array([[ids]], dtype=np.int32), "SEQUENCE_LENGTH": np.array([[len(ids)]], dtype=np.int32)})
    assert out["OUTPUT"].shape == (1,)
    assert out["OUTPUT"][0].decode() == hf.decode(ids, skip_special_tokens=True) == "def add(a, b):\n    return a + b"


def test_ensemble_text_is_autotokenizer_decoding_of_the_engine_tokens(sp_server, hf):
    for prompt in PROMPTS:
        (engine,) = grpc_stream(sp_server.grpc_url, "tensorrt_llm", {
            "input_ids": np.array([hf.encode(prompt)], dtype=np.int32),
            "input_lengths": np.array([[len(hf.encode(prompt))]], dtype=np.int32),
            "request_output_len": np.array([[MAX_TOKENS]], dtype=np.int32),
            "end_id": np.array([[spf.EOS_ID]], dtype=np.int32), "pad_id": np.array([[spf.EOS_ID]], dtype=np.int32)})
        tokens = engine["output_ids"][0, 0, : int(engine["sequence_length"][0, 0])].tolist()
        status, body = http_generate(sp_server.http_url, "ensemble", {"text_input": prompt, "max_tokens": MAX_TOKENS})
        assert status == 200, body
        assert body["text_output"] == hf.decode(tokens, skip_special_tokens=True)
        chunks = grpc_stream(sp_server.grpc_url, "ensemble", text_inputs(prompt, MAX_TOKENS, stream=True))
        assert chunks and all(c["text_output"].shape == (1,) for c in chunks)
