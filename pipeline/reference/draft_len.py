"""Draft length: the engine's names for it, and the one place upstream's names are read.

Inside the engine (scheduler, proposers, stats):

- ``num_draft_tokens`` — how many draft tokens one verify step carries for a sequence: the
  proposer's chain length by default, lowered per request by ``GenerationRequest.num_draft_tokens``
  and by what is left of ``max_new_tokens``;
- ``max_draft_len`` — the capacity: the most draft tokens a step may carry (a tree: its node
  count). The name is TensorRT-LLM's (``trtllm-build --max_draft_len``), and the Triton model and
  ``engine.json`` speak it, so it is kept rather than mapped;
- ``depth`` — the longest path of a tree (a chain: its length), what acceptance is counted along.

Upstream names, read only here (``engine.json``'s ``proposer`` block keeps the names the build
step and TensorRT-LLM use, so a descriptor reads like the upstream build it stands in for):

- draft-target: ``num_draft_tokens`` (the same name; TensorRT-LLM's draft-target examples too);
- Medusa: ``num_heads`` (``--num_medusa_heads``): one head per chain position;
- EAGLE: ``num_layers`` (``--num_eagle_layers``): the draft *depth*, not the head's layer count;
- lookahead: ``max_window_size`` W, ``max_ngram_size`` N, ``max_verification_set_size`` G
  (``LookaheadDecodingConfig``): ``max_draft_len`` as upstream computes it from the three;
- trees: ``choices`` (``medusa_choices`` / ``eagle_choices``): node count and deepest path;
- external drafts: the length of the request's ``draft_input_ids``.

Outside the engine the report's ``speculation_length`` and the load test's ``draft_len`` mean
``num_draft_tokens``. Reads and writes nothing.
"""

from __future__ import annotations

DEFAULT_CHAIN = 4  # a spec without its length field (create_engine in tests) drafts this many
DEFAULT_WINDOW, DEFAULT_NGRAM, DEFAULT_VERIFICATION_SET = 4, 3, 4  # upstream's kDefaultLookaheadDecoding*


def draft_model_chain(spec: dict) -> int:
    return int(spec.get("num_draft_tokens") or DEFAULT_CHAIN)


def medusa_heads(spec: dict) -> int | None:
    """How many Medusa heads draft (None: every head the checkpoint has)."""
    return int(spec["num_heads"]) if spec.get("num_heads") else None


def eagle_depth(spec: dict) -> int:
    """The EAGLE chain's length, or the deepest choice of a tree."""
    choices = spec.get("choices")
    return max(len(c) for c in choices) if choices else int(spec.get("num_layers") or DEFAULT_CHAIN)


def engine_max_draft_len(descriptor: dict, role: str, proposer_max: int | None) -> int:
    """The engine's capacity: what ``engine.json`` asks for (a target for external drafts: its
    ``max_draft_len``), never below what the proposer drafts; 0 without drafts."""
    asked = int(descriptor.get("max_draft_len") or 0)
    if role == "target":
        return asked
    if proposer_max is None:
        return 0
    return max(asked or proposer_max, proposer_max)


def check_lookahead_sizes(max_window_size: int, max_ngram_size: int, max_verification_set_size: int) -> None:
    """Upstream's ``LookaheadDecodingConfig::isLegal``, with a message naming the rule."""
    w, n, g = max_window_size, max_ngram_size, max_verification_set_size
    if n < 1 or w < 1 or g < 0:
        raise ValueError(f"lookahead needs max_ngram_size >= 1, max_window_size >= 1, "
                         f"max_verification_set_size >= 0 (got W={w}, N={n}, G={g})")
    if n == 1 and (w != 1 or g != 0):
        raise ValueError(f"max_ngram_size 1 allows only max_window_size 1 and max_verification_set_size 0 "
                         f"(got W={w}, G={g})")


def lookahead_max_draft_len(max_window_size: int, max_ngram_size: int, max_verification_set_size: int) -> int:
    """Draft tokens one step may carry: the window (its first column starts at the pending token)
    plus the guesses (upstream's ``calculateSpeculativeResourceTuple``)."""
    w, n, g = max_window_size, max_ngram_size, max_verification_set_size
    return (0 if n == 1 else n - 2) + (w - 1 + g) * (n - 1)
