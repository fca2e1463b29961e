"""Per-sequence state of the reference engine, shared by the scheduler and the proposers (so
neither imports the other): the request, its sampling generator, its tokens and target KV slot,
what was emitted, its statistics, and an opaque slot its proposer owns. Reads and writes nothing.

Invariant (kept by :mod:`pipeline.reference.scheduler`): the target cache holds every token of the
sequence except the last (the *pending* token), so ``cache.length == len(tokens) - 1``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from pipeline.reference.api import FinishReason, GenerationRequest, RequestStats, SamplingParams
from pipeline.reference.kv_cache import SlotCache


@dataclass
class SeqState:
    request: GenerationRequest
    params: SamplingParams
    generator: torch.Generator
    tokens: list[int]  # prompt + generated (internal; the last one is pending)
    cache: SlotCache | None = None
    output: list[int] = field(default_factory=list)  # emitted tokens
    emitted: int = 0  # how many of ``output`` were streamed already
    stats: RequestStats = field(default_factory=RequestStats)
    proposer: Any = None  # the Proposer drafting for this sequence (set at admission; None: no drafts)
    proposer_state: Any = None  # that proposer's own per-sequence state (draft cache, features...)
    finish_reason: FinishReason | None = None
    cancelled: bool = False

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


def make_generator(seed: int | None) -> torch.Generator:
    gen = torch.Generator()
    gen.manual_seed(seed if seed is not None else int(torch.randint(0, 2**62, ()).item()))
    return gen
