"""``preprocessing`` model: text → token ids with the target's tokenizer. Reads the request's
inputs (QUERY, REQUEST_OUTPUT_LEN, optional word lists, bias words, END_ID/PAD_ID, DECODER_QUERY,
PROMPT_TABLE_EXTRA_ID); writes the tensors upstream's model sends, with upstream's shapes, dtypes
and padding (tensorrtllm_backend@r25.05 ``all_models/inflight_batcher_llm/preprocessing/1/model.py``;
table in ``docs/triton-contract.md``). For a batch of B prompts, all INT32 unless noted:

- INPUT_ID [B, max_len], right-padded with the *tokenizer's* pad id; REQUEST_INPUT_LEN [B, 1];
- DECODER_INPUT_ID [B, 1] = the pad id and REQUEST_DECODER_INPUT_LEN [B, 1] = 1, or the
  DECODER_QUERY encoded like QUERY;
- BAD_WORDS_IDS / STOP_WORDS_IDS [B, 2, L]: ids padded with 0, end offsets padded with -1,
  L ≥ 1 once the input is sent, [B, 2, 0] when it is not;
- EMBEDDING_BIAS FP32 [B, len(vocab)] when words and weights are both sent, else [B, 0];
- REQUEST_OUTPUT_LEN as sent ([B, 1]); OUT_END_ID / OUT_PAD_ID [B, 1] (the request's value,
  else the tokenizer's EOS / pad-or-EOS);
- OUT_PROMPT_TABLE_EXTRA_IDS UINT64 [B, max_len] (only with PROMPT_TABLE_EXTRA_ID): the salt where
  the id is a prompt-table id (≥ the tokenizer's base vocabulary), 0 elsewhere.

Bad input (a missing QUERY / REQUEST_OUTPUT_LEN, empty or non-UTF-8 text, max_tokens ≤ 0) is an
error response naming the input; the model keeps serving."""

from __future__ import annotations

import json

import numpy as np

from pipeline.triton_models import io
from pipeline.triton_models.tokenizer import TextTokenizer


def word_list_format(words_rows: list[list[str]], tokenizer: TextTokenizer) -> np.ndarray:
    """Per batch row a list of words → INT32 [batch, 2, L]: each word is one stop/bad sequence
    (tokenized without special tokens; words that encode to nothing are skipped); ids padded with
    0, cumulative end offsets with -1, L at least 1."""
    per_row = []
    for row in words_rows:
        ids: list[int] = []
        offsets: list[int] = []
        for word in row:
            word_ids = tokenizer.encode(word, add_special_tokens=False)
            if word_ids:
                ids.extend(word_ids)
                offsets.append(len(ids))
        per_row.append((ids, offsets))
    width = max([1] + [len(ids) for ids, _ in per_row])
    out = np.zeros((len(per_row), 2, width), dtype=np.int32)
    out[:, 1, :] = -1
    for b, (ids, offsets) in enumerate(per_row):
        out[b, 0, : len(ids)] = ids
        out[b, 1, : len(offsets)] = offsets
    return out


def pad_rows(rows: list[list[int]], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Token rows → (ids INT32 [B, max_len] right-padded with ``pad_id``, lengths INT32 [B, 1])."""
    width = max(len(ids) for ids in rows)
    ids = np.full((len(rows), width), pad_id, dtype=np.int32)
    for b, row in enumerate(rows):
        ids[b, : len(row)] = row
    return ids, np.array([[len(row)] for row in rows], dtype=np.int32)


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.tokenizer = TextTokenizer(io.param(config, "tokenizer_dir"),
                                       trust_remote_code=io.param_bool(config, "trust_remote_code", False))
        self.add_special_tokens = io.param_bool(config, "add_special_tokens", True)
        pad = self.tokenizer.pad_id
        self.input_pad_id = 0 if pad is None else pad  # upstream pads INPUT_ID with the tokenizer's

    def execute(self, requests):
        return io.answer_each(requests, self._process, "preprocessing")

    def _process(self, request) -> list:
        query = io.required(request, "QUERY", "text_input")
        output_len = io.required(request, "REQUEST_OUTPUT_LEN", "max_tokens")
        batch = query.shape[0]
        output_len = output_len.reshape(batch, -1).astype(np.int32)
        if (output_len <= 0).any():
            raise io.RequestError(f"max_tokens must be > 0, got {int(output_len.min())}")
        input_ids, lengths = pad_rows(self._encode_rows(io.texts(request, "QUERY"), "text_input"), self.input_pad_id)
        end_id = self._id_override(request, "END_ID", self.tokenizer.end_id, batch)
        pad_id = self._id_override(request, "PAD_ID", self.tokenizer.pad_id, batch)
        decoder_ids, decoder_lengths = pad_id.copy(), np.ones((batch, 1), dtype=np.int32)
        if io.get(request, "DECODER_QUERY") is not None:
            rows = self._encode_rows(io.texts(request, "DECODER_QUERY"), "decoder_text_input")
            decoder_ids, decoder_lengths = pad_rows(rows, self.input_pad_id)
        outputs = [
            io.tensor("INPUT_ID", input_ids),
            io.tensor("REQUEST_INPUT_LEN", lengths),
            io.tensor("DECODER_INPUT_ID", decoder_ids),
            io.tensor("REQUEST_DECODER_INPUT_LEN", decoder_lengths),
            io.tensor("BAD_WORDS_IDS", self._words(request, "BAD_WORDS_DICT", batch)),
            io.tensor("STOP_WORDS_IDS", self._words(request, "STOP_WORDS_DICT", batch)),
            io.tensor("EMBEDDING_BIAS", self._embedding_bias(request, batch)),
            io.tensor("REQUEST_OUTPUT_LEN", output_len),
            io.tensor("OUT_END_ID", end_id),
            io.tensor("OUT_PAD_ID", pad_id),
        ]
        extra = io.get(request, "PROMPT_TABLE_EXTRA_ID")
        if extra is not None:
            salts = extra.reshape(batch, -1)[:, :1].astype(np.uint64)
            in_table = input_ids >= self.tokenizer.base_vocab_size
            outputs.append(io.tensor("OUT_PROMPT_TABLE_EXTRA_IDS", np.where(in_table, salts, 0).astype(np.uint64)))
        return outputs

    def _encode_rows(self, rows: list[list[str]], client_name: str) -> list[list[int]]:
        encoded = []
        for row in rows:
            if not row or not row[0]:
                raise io.RequestError(f"{client_name} is empty: send a non-empty prompt")
            encoded.append(self.tokenizer.encode(row[0], self.add_special_tokens))
        return encoded

    def _id_override(self, request, name: str, default: int | None, batch: int) -> np.ndarray:
        value = io.get(request, name)
        if value is not None:
            return value.reshape(batch, -1)[:, :1].astype(np.int32)
        return np.full((batch, 1), -1 if default is None else default, dtype=np.int32)

    def _words(self, request, name: str, batch: int) -> np.ndarray:
        rows = io.texts(request, name)
        if rows is None:
            return np.zeros((batch, 2, 0), dtype=np.int32)
        return word_list_format(rows, self.tokenizer)

    def _embedding_bias(self, request, batch: int) -> np.ndarray:
        """Upstream's bias: every id of ``encode(word)`` (its default special tokens included)
        gets the word's weight added."""
        words = io.texts(request, "EMBEDDING_BIAS_WORDS")
        weights = io.get(request, "EMBEDDING_BIAS_WEIGHTS")
        if words is None or weights is None:
            return np.zeros((batch, 0), dtype=np.float32)
        bias = np.zeros((batch, self.tokenizer.vocab_size), dtype=np.float32)
        weights = weights.reshape(batch, -1)
        for b, row in enumerate(words):
            if len(row) != weights.shape[1]:
                raise io.RequestError("embedding_bias_words and embedding_bias_weights differ in length")
            for word, weight in zip(row, weights[b]):
                for token_id in self.tokenizer.encode(word):
                    bias[b, token_id] += float(weight)
        return bias
