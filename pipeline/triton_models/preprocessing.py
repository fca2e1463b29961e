"""``preprocessing`` model: text → token ids with the target's tokenizer (contract §2.2).
Outputs INPUT_ID (BOS first when ``add_special_tokens``), REQUEST_INPUT_LEN, word lists in the
upstream ``[2, L]`` format, EMBEDDING_BIAS, OUT_END_ID/OUT_PAD_ID (request value, else the
tokenizer's EOS / pad-or-EOS). Bad input (empty or non-UTF-8 text, max_tokens ≤ 0) is an error."""

from __future__ import annotations

import csv
import json

import numpy as np
import triton_python_backend_utils as pb_utils

from pipeline.triton_models import io
from pipeline.triton_models.tokenizer import TextTokenizer


def word_list_format(words_rows: list[list[str]], tokenizer: TextTokenizer) -> np.ndarray:
    """Per batch row a list of words → INT32 [batch, 2, L] (ids padded with 0, offsets with -1)."""
    per_row = []
    for row in words_rows:
        ids: list[int] = []
        offsets: list[int] = []
        for item in row:
            for word in next(csv.reader([item])) if item else []:
                if not word:
                    continue
                word_ids = tokenizer.encode(word, add_special_tokens=False)
                if not word_ids:
                    continue
                ids.extend(word_ids)
                offsets.append(len(ids))
        per_row.append((ids, offsets))
    width = max([len(ids) for ids, _ in per_row] + [0])
    out = np.zeros((len(per_row), 2, width), dtype=np.int32)
    for b, (ids, offsets) in enumerate(per_row):
        out[b, 0, : len(ids)] = ids
        out[b, 1, :] = -1
        out[b, 1, : len(offsets)] = offsets
    return out


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.tokenizer = TextTokenizer(io.param(config, "tokenizer_dir"))
        self.add_special_tokens = io.param_bool(config, "add_special_tokens", True)

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                responses.append(pb_utils.InferenceResponse(output_tensors=self._process(request)))
            except io.RequestError as exc:
                responses.append(io.error_response(str(exc)))
        return responses

    def _process(self, request) -> list:
        queries = io.texts(request, "QUERY")
        batch = len(queries)
        ids_rows = []
        for row in queries:
            if not row or not row[0].strip():
                raise io.RequestError("text_input is empty: send a non-empty prompt")
            ids_rows.append(self.tokenizer.encode(row[0], self.add_special_tokens))
        output_len = io.get(request, "REQUEST_OUTPUT_LEN").reshape(batch, -1).astype(np.int32)
        if (output_len <= 0).any():
            raise io.RequestError(f"max_tokens must be > 0, got {int(output_len.min())}")
        end_id = self._id_override(request, "END_ID", self.tokenizer.end_id, batch)
        pad_id = self._id_override(request, "PAD_ID", self.tokenizer.pad_id, batch)
        width = max(len(ids) for ids in ids_rows)
        input_ids = np.empty((batch, width), dtype=np.int32)
        for b, ids in enumerate(ids_rows):
            input_ids[b, :] = pad_id[b, 0]
            input_ids[b, : len(ids)] = ids
        lengths = np.array([[len(ids)] for ids in ids_rows], dtype=np.int32)
        outputs = [
            io.tensor("INPUT_ID", input_ids),
            io.tensor("REQUEST_INPUT_LEN", lengths),
            io.tensor("DECODER_INPUT_ID", pad_id.copy()),
            io.tensor("REQUEST_DECODER_INPUT_LEN", np.ones((batch, 1), dtype=np.int32)),
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
            outputs.append(io.tensor("OUT_PROMPT_TABLE_EXTRA_IDS", np.repeat(salts, width, axis=1)))
        return outputs

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
                ids = self.tokenizer.encode(word, add_special_tokens=False)
                if ids:
                    bias[b, ids[0]] += float(weight)
        return bias
