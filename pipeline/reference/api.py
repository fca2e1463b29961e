"""The in-process API of the CPU reference engine: what the Triton ``tensorrt_llm`` Python model
(and ``specdeploy bench``, and the tests) call. It mirrors the ``tensorrt_llm`` tensor contract
(shared/reference/triton-repo-contract.md §5) in plain Python types, so the Triton model only
adapts tensors. Nothing here imports torch.

Semantics (contract §5):
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
    """Per-request speculation and timing figures (perf metrics, contract §5.7)."""

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

    def shutdown(self) -> None: ...


class DraftTooLongError(ValueError):
    def __init__(self, num_draft: int, max_draft: int):
        super().__init__(
            f"Number of draft tokens ({num_draft}) is larger than maximum number of draft tokens ({max_draft})"
        )


# ----------------------------------------------------------------------------------------------
# Engine descriptor: ``<engine_dir>/engine.json``, written by ``specdeploy build`` for the
# reference backend (pipeline/reference/build_step.py) and read by ``load_engine(engine_dir)``
# (pipeline/reference/engine.py). The reference counterpart of a TRT-LLM engine dir.
#
# {
#   "format": "specdeploy-reference-engine/1",
#   "role": "baseline" | "target" | "draft" | "speculative",
#       baseline    – target only, no proposer (the A/B control)
#       target      – draft-target verifier: accepts external draft_input_ids (≤ max_draft_len)
#       draft       – the draft model as an ordinary generator (tensorrt_llm_draft)
#       speculative – target + internal proposer (medusa / eagle / ngram; draft_target for `bench`)
#   "model_dir": "<abs path: HF Llama checkpoint (config.json, model.safetensors, tokenizer.json)>",
#   "quantization": "none" | "int8_wo",          # int8_wo: model_dir holds the quantized weights
#   "proposer": {"method": "none"}
#             | {"method": "draft_target", "draft_dir": "...", "num_draft_tokens": 4}
#             | {"method": "medusa", "heads_dir": "...", "num_heads": 4, "choices": [[0],[0,0],...]}
#             | {"method": "eagle", "head_dir": "...", "num_layers": 4, "choices": [[0],[0,0],...]}
#             | {"method": "ngram", "max_draft_len": 4, "max_matching_ngram_size": 2,
#                "min_matching_ngram_size": 1, "is_keep_all": true, "is_use_oldest": true,
#                "is_public_pool": true},   # no checkpoint (pipeline.reference.ngram)
#       optional in any proposer: "draft_int8": true — draft-side weights int8 at load (output unchanged)
#       Trees (Medusa/EAGLE choices) serve greedy requests; sampled requests get the chain
#       (depth = num_heads / num_layers, or the deepest choice).
#   "max_draft_len": 4,          # 0 for baseline/draft; K for target; node count for trees
#   "max_batch_size": 8, "max_seq_len": 512, "max_input_len": 256,
#   "compute_dtype": "float32",
#   "threads": 1,
#   "prefix_cache_entries": 64,
#   "config_hash": "…", "name": "…"
# }
# Construction: ``pipeline.reference.engine.load_engine(dir)`` or, without a file,
# ``pipeline.reference.engine.create_engine(model_dir, role=..., proposer={...}, ...)``.
ENGINE_DESCRIPTOR = "engine.json"
ENGINE_FORMAT = "specdeploy-reference-engine/1"
# where a served engine runs (``reference.engine_process``; ``serve`` sets it for the stubs):
# "own" = a worker process of its own (pipeline.reference.worker, the default), "stub" = inside
# the Python-backend stub
ENGINE_PROCESS_ENV = "SPECDEPLOY_ENGINE_PROCESS"
