"""``postprocessing`` model: TOKENS_BATCH [batch, beam, T] + SEQUENCE_LENGTH [batch, beam] →
OUTPUT (one string per beam): decode ``tokens[:len]`` with the target's tokenizer, special tokens
skipped (contract §2.4). A zero-length chunk decodes to the empty string."""

from __future__ import annotations

import json

import numpy as np
import triton_python_backend_utils as pb_utils

from pipeline.triton_models import io
from pipeline.triton_models.tokenizer import TextTokenizer


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.tokenizer = TextTokenizer(io.param(config, "tokenizer_dir"))
        self.skip_special_tokens = io.param_bool(config, "skip_special_tokens", True)

    def execute(self, requests):
        return [self._process(request) for request in requests]

    def _process(self, request):
        tokens = io.get(request, "TOKENS_BATCH")
        lengths = io.get(request, "SEQUENCE_LENGTH")
        if tokens.ndim == 1:  # [T]
            tokens = tokens[None, None, :]
        elif tokens.ndim == 2:  # [batch, T]
            tokens = tokens[:, None, :]
        lengths = lengths.reshape(tokens.shape[0], tokens.shape[1])
        texts = []
        for b in range(tokens.shape[0]):
            row = []
            for beam in range(tokens.shape[1]):
                length = int(lengths[b, beam]) if beam < lengths.shape[1] else tokens.shape[2]
                ids = [int(t) for t in tokens[b, beam, :length] if t >= 0]
                row.append(self.tokenizer.decode(ids, self.skip_special_tokens).encode("utf-8"))
            texts.append(row)
        return pb_utils.InferenceResponse(output_tensors=[io.tensor("OUTPUT", np.array(texts, dtype=object))])
