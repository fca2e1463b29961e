"""Proposers: who drafts tokens for the target to verify, one module per method behind one
batched protocol (:class:`~pipeline.reference.proposers.base.Proposer`):

- :mod:`~pipeline.reference.proposers.draft_model` — a smaller Llama (draft-target);
- :mod:`~pipeline.reference.proposers.medusa` — Medusa heads on the target's hidden state;
- :mod:`~pipeline.reference.proposers.eagle` — the EAGLE-1 head on the target's features;
- :mod:`~pipeline.reference.proposers.eagle3` — the EAGLE-3 head on the target's low, middle
  and high hidden states (a chain);
- :mod:`~pipeline.reference.proposers.ngram` — n-gram (prompt-lookup) drafts from the
  sequence's own tokens, no model;
- :mod:`~pipeline.reference.proposers.lookahead` — lookahead decoding: a Jacobi window and an
  n-gram pool, no model; one tree of deterministic drafts, verified greedy or sampled;
- :mod:`~pipeline.reference.proposers.external` — drafts the request brings
  (``draft_input_ids``), one verification step.

Trees (Medusa/EAGLE ``choices``) are for greedy requests only; a sampled request gets the chain
(lossless rejection sampling needs the distribution each draft came from; multi-draft
SpecInfer-style tree sampling is implemented for deterministic drafts only, the lookahead tree).

A new method is a module with a class implementing the protocol and a
``build(spec, ctx: BuildContext) -> Proposer``, registered in :data:`BUILDERS` under the
``engine.json`` ``proposer.method`` name. Reads and writes nothing.
"""

from __future__ import annotations

from typing import Callable

from pipeline.reference.proposers import draft_model, eagle, eagle3, lookahead, medusa, ngram
from pipeline.reference.proposers.base import BuildContext, Proposal, Proposer

BUILDERS: dict[str, Callable[[dict, BuildContext], Proposer]] = {
    "draft_target": draft_model.build,
    "medusa": medusa.build,
    "eagle": eagle.build,
    "eagle3": eagle3.build,
    "ngram": ngram.build,
    "lookahead": lookahead.build,
}

__all__ = ["BUILDERS", "BuildContext", "Proposal", "Proposer"]
