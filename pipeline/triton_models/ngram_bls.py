"""The BLS's n-gram rounds: prompt-lookup drafts made in ``tensorrt_llm_bls`` itself (no draft
model) and verified by a target engine built for external drafts
(``--speculative_decoding_mode draft_tokens_external``), as TensorRT-LLM's V1 n-gram workflow
runs it in orchestrator mode (NVIDIA/TensorRT-LLM ``examples/ngram/README.md``,
``examples/ngram/run_dtm_ngram.py``: a per-request pool, drafts sent with the target call, one
target call per round).

Reads the BLS's ``ngram_*`` parameters (:mod:`.ngram_params`, rendered from the config's ``speculation``
block) once at start-up, and per request the tokens of its context; the rounds, stop rules, streaming and
acceptance figures are those of :mod:`.draft_target`, with the draft call replaced by a lookup in
the request's own pool (:mod:`pipeline.reference.ngram_match`, torch-free). Writes nothing.

Where this differs from upstream's V1 loop: a round with no match verifies no drafts (upstream
sends ``[end_id]`` as a one-token draft), and the pool is always private to the request (the
BLS's instances are separate processes; a shared pool is the in-engine method's)."""

from __future__ import annotations

from pipeline.reference.ngram_match import NgramMatcher, NgramPool
from pipeline.triton_models.draft_target import DraftTarget, SpecError
from pipeline.triton_models.ngram_params import NgramSettings, ngram_settings

__all__ = ["NgramDraftTarget", "ngram_settings"]


class NgramDraftTarget(DraftTarget):
    """One speculative request whose drafts come from its own prompt and output (K per round is
    the request's ``num_draft_tokens``, at most ``ngram_max_draft_len``)."""

    def __init__(self, bls, request: dict, sender, num_draft: int, streaming: bool):
        super().__init__(bls, request, sender, num_draft, streaming)
        settings: NgramSettings = bls.ngram
        self.use_draft_logits = False  # one-hot drafts: the target verifies them as such
        self.matcher = NgramMatcher(settings.max_matching_ngram_size, settings.min_matching_ngram_size,
                                    settings.is_use_oldest)
        self.pool = NgramPool(settings.is_keep_all)
        # one growing list: pool entries read their continuation from it at lookup time, so a
        # match near the end lengthens as the output grows (the target returns a new list per round)
        self.tokens: list[int] = []
        self.indexed = 1
        self.cap = settings.max_draft_len

    def needs_draft_model(self) -> bool:
        return False

    def _propose(self, context: list[int], k: int):
        known = len(self.tokens)
        if context[:known] != self.tokens:
            raise SpecError("the target's output does not extend the context it was sent")
        self.tokens.extend(context[known:])
        self.indexed = self.matcher.index(self.pool, self.tokens, self.indexed)
        return self.matcher.lookup(self.pool, self.tokens, min(k, self.cap)), None
