"""The in-process API of the CPU reference engine: what the Triton ``tensorrt_llm`` Python model
(and ``specdeploy bench``, and the tests) call. It mirrors the ``tensorrt_llm`` tensor contract
(docs/triton-contract.md, `tensorrt_llm`) in plain Python types, so the Triton model only
adapts tensors. Nothing here imports torch.

Semantics (docs/triton-contract.md, `tensorrt_llm`):
- ``input_ids`` is the whole context; ``max_new_tokens`` counts new tokens only.
- Generation stops at ``max_new_tokens``, at ``end_id`` (never included in the output; no EOS
  stop when ``end_id`` is None), when a stop word completes, or on cancellation.
- ``min_tokens``: ``end_id`` is suppressed until that many new tokens exist.
- Default sampling is greedy: ``top_k`` in (0, 1) with ``top_p`` <= 0, whatever the temperature.
- ``draft_input_ids`` (external drafts, draft-target target): ONE verification step over
  context + drafts; the result holds accepted + 1 tokens (correction or bonus), capped by
  ``max_new_tokens``, EOS and stop words. More drafts than ``max_draft_len`` is an error with
  upstream's text (``DraftTooLongError``).
- Streaming: each :class:`Chunk` carries only the tokens new since the previous chunk; the last
  chunk has ``finished=True`` (it may carry zero tokens).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterator, Literal, Protocol

FinishReason = Literal["length", "end_id", "stop_word", "cancelled", "error"]


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 0.0
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.top_k == 1 or (self.top_k <= 0 and self.top_p <= 0.0)


@dataclass
class GenerationRequest:
    input_ids: list[int]
    max_new_tokens: int
    end_id: int | None = None
    pad_id: int | None = None
    min_tokens: int = 0
    stop_words: list[list[int]] = field(default_factory=list)
    bad_words: list[list[int]] = field(default_factory=list)
    sampling: SamplingParams = SamplingParams()
    draft_input_ids: list[int] | None = None  # external drafts → one verify step
    draft_logits: list[list[float]] | None = None  # [K, vocab], probability-based acceptance
    num_draft_tokens: int | None = None  # per-request override of the proposer's K (≤ max)
    request_id: str = ""


@dataclass
class RequestStats:
    """Per-request speculation and timing figures (the backend's perf-metric outputs, docs/triton-contract.md)."""

    draft_tokens: int = 0  # Σ drafts offered (capped at the max draft path length)
    accepted_tokens: int = 0  # Σ drafts accepted
    verify_steps: int = 0  # target passes that verified drafts
    decode_steps: int = 0  # target passes in total (prefill excluded)
    accepted_per_position: list[int] = field(default_factory=list)  # [K] accepted at position i
    drafted_per_position: list[int] = field(default_factory=list)  # [K] drafted at position i
    arrival_time_ns: int = 0  # time.monotonic_ns() (a steady clock, like TRT-LLM's)
    first_scheduled_time_ns: int = 0
    first_token_time_ns: int = 0
    last_token_time_ns: int = 0
    kv_cache_reused_tokens: int = 0  # prefix-cache hit length
    kv_cache_new_tokens: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """τ = 1 + accepted / verify steps (tokens per target pass while speculating)."""
        return 1.0 + self.accepted_tokens / self.verify_steps if self.verify_steps else 1.0


@dataclass
class Chunk:
    tokens: list[int]  # new tokens since the previous chunk
    finished: bool
    finish_reason: FinishReason | None = None
    stats: RequestStats | None = None  # cumulative, present on every chunk
    error: str | None = None
    payload: object = None  # what the submitter's ``on_chunk`` made of it (in the engine thread)


@dataclass
class GenerationResult:
    prompt_ids: list[int]
    output_ids: list[int]  # generated tokens only (end_id excluded)
    finish_reason: FinishReason
    stats: RequestStats


class RequestHandle(Protocol):
    request_id: str

    def chunks(self, timeout: float | None = None) -> Iterator[Chunk]:
        """Yield chunks as the engine produces them, ending with the finished one."""

    def result(self, timeout: float | None = None) -> GenerationResult:
        """Block until finished; return the whole generation."""

    def cancel(self) -> None:
        """Stop generating; the stream ends with finish_reason 'cancelled'."""


class Engine(Protocol):
    """A loaded reference engine (target + optional proposer) with an in-flight batching loop.

    Thread-safe: ``submit`` may be called from any thread; a background thread runs the loop
    (requests join and leave between iterations)."""

    vocab_size: int
    max_draft_len: int  # 0 when no proposer / not a draft-tokens-external target
    max_batch_size: int
    max_seq_len: int

    def submit(self, request: GenerationRequest, on_chunk: Callable[[Chunk], object] | None = None) -> RequestHandle:
        """Queue a request. ``on_chunk`` runs in the engine thread on every chunk before it is
        handed over, its result stored as ``chunk.payload`` (an exception leaves it None): the
        Triton model builds its responses there, so the thread that sends them holds the
        interpreter lock only briefly while the engine decodes."""

    def generate(self, request: GenerationRequest) -> GenerationResult: ...

    def cancel(self, request_id: str) -> bool: ...

    def stats(self) -> dict | None:
        """The :data:`ENGINE_STATS` numbers now (None: not known, e.g. a worker that is down)."""

    def shutdown(self) -> None: ...


# what Engine.stats() reports: after every request ended, the *_in_use ones and open_requests
# are back at 0 and prefix_cache_entries ≤ prefix_cache_capacity (the soak's leak check);
# kv_slots × kv_tokens_per_slot is the KV capacity in tokens the engine holds
ENGINE_STATS = ("kv_slots_in_use", "kv_slots", "draft_kv_slots_in_use", "prefix_cache_entries",
                "prefix_cache_capacity", "open_requests", "kv_tokens_per_slot")


class PromptTooLongError(ValueError):
    """A prompt longer than the engine's ``max_input_len`` (``build.max_input_len``), in
    TensorRT-LLM's words: ``LlmRequest::validate`` in cpp/tensorrt_llm/batch_manager/llmRequest.cpp
    (NVIDIA/TensorRT-LLM @119c6e60) throws "Prompt length (%d) exceeds maximum input length
    (%d)." before any other length check; its second sentence points at TRTGptModel logs, which
    the CPU engine has none of, so ours names the setting instead."""

    def __init__(self, prompt_len: int, max_input_len: int):
        super().__init__(f"Prompt length ({prompt_len}) exceeds maximum input length ({max_input_len}). "
                         "The engine's max_input_len is build.max_input_len")


def check_prompt_length(prompt_len: int, max_input_len: int | None) -> None:
    """Raise :class:`PromptTooLongError` for a prompt the engine's ``max_input_len`` refuses."""
    if max_input_len and prompt_len > max_input_len:
        raise PromptTooLongError(prompt_len, max_input_len)


class DraftTooLongError(ValueError):
    def __init__(self, num_draft: int, max_draft: int):
        super().__init__(
            f"Number of draft tokens ({num_draft}) is larger than maximum number of draft tokens ({max_draft})"
        )


def check_request(request: GenerationRequest, vocab_size: int, max_draft_len: int, max_seq_len: int) -> None:
    """Raise ValueError (or DraftTooLongError) for a request an engine with these limits cannot
    run (the scheduler's rule, also checked in front of a worker process, :mod:`pipeline.reference.worker`)."""
    if not request.input_ids:
        raise ValueError("input_ids is empty")
    if request.max_new_tokens < 0:
        raise ValueError("max_new_tokens must be >= 0")
    bad = [t for t in request.input_ids if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"input_ids contain ids outside the vocabulary [0, {vocab_size}): {bad[:5]}")
    drafts = request.draft_input_ids
    if drafts is not None and len(drafts) > max_draft_len:
        raise DraftTooLongError(len(drafts), max_draft_len)
    total = len(request.input_ids) + len(drafts or []) + request.max_new_tokens
    if total > max_seq_len:
        raise ValueError(
            f"prompt ({len(request.input_ids)}) + new tokens ({request.max_new_tokens}) exceed "
            f"max_seq_len ({max_seq_len})"
        )
    if request.draft_logits is not None and len(request.draft_logits) != len(drafts or []):
        raise ValueError("draft_logits must have one row per draft token")


# ----------------------------------------------------------------------------------------------
# Engine descriptor ``<engine_dir>/engine.json``: the model, its fields and their defaults are
# :class:`pipeline.artefacts.engine.EngineDescriptor` (written by ``specdeploy build``, read by
# ``pipeline.reference.engine.load_engine``; ``specdeploy schema engine`` prints its JSON schema).
from pipeline.artefacts.names import ENGINE_DESCRIPTOR, ENGINE_FORMAT  # noqa: E402, F401 - re-exported (no pydantic)

# where a served engine runs (``reference.engine_process``; ``serve`` sets it for the stubs):
# "own" = a worker process of its own (pipeline.reference.worker, the default), "stub" = inside
# the Python-backend stub
ENGINE_PROCESS_ENV = "SPECDEPLOY_ENGINE_PROCESS"
