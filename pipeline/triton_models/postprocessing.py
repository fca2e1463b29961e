"""``postprocessing`` model: TOKENS_BATCH INT32 [batch, beam, T] + SEQUENCE_LENGTH INT32
[batch, beam] → OUTPUT, a 1-D STRING tensor with one string per (batch row × beam), row-major:
``decode(tokens[b, k, :length[b, k]])`` with the target's tokenizer, special tokens skipped unless
configured otherwise. That is the shape upstream's model sends (tensorrtllm_backend@r25.05
``all_models/inflight_batcher_llm/postprocessing/1/model.py``), so ``as_numpy("OUTPUT")[0]`` — and
the ensemble's ``text_output[0]`` — is the first beam's bytes. A zero-length chunk (streaming)
decodes to the empty string. A request without either input is an error naming it."""

from __future__ import annotations

import json

import numpy as np

from pipeline.triton_models import io
from pipeline.triton_models.tokenizer import TextTokenizer


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.tokenizer = TextTokenizer(io.param(config, "tokenizer_dir"),
                                       trust_remote_code=io.param_bool(config, "trust_remote_code", False))
        self.skip_special_tokens = io.param_bool(config, "skip_special_tokens", True)

    def execute(self, requests):
        return io.answer_each(requests, self._process, "postprocessing")

    def _process(self, request) -> list:
        tokens = io.required(request, "TOKENS_BATCH")
        lengths = io.required(request, "SEQUENCE_LENGTH")
        if tokens.ndim != 3 or lengths.size != tokens.shape[0] * tokens.shape[1]:
            raise io.RequestError(f"TOKENS_BATCH must be [batch, beam, tokens] with SEQUENCE_LENGTH [batch, beam]; "
                                  f"got {list(tokens.shape)} and {list(lengths.shape)}")
        lengths = lengths.reshape(tokens.shape[0], tokens.shape[1])
        texts = []
        for b in range(tokens.shape[0]):
            for beam in range(tokens.shape[1]):
                ids = [int(t) for t in tokens[b, beam, : int(lengths[b, beam])] if t >= 0]
                texts.append(self.tokenizer.decode(ids, self.skip_special_tokens).encode("utf-8"))
        return [io.tensor("OUTPUT", np.array(texts, dtype=np.object_))]
