"""Lookahead decoding: no draft model; a Jacobi window of W future positions, each iterated N−1
steps, fills an n-gram pool, and up to G pooled n-grams that start with the last token are verified
in the same forward pass (TensorRT-LLM ``LookaheadDecodingConfig``: max_window_size W,
max_ngram_size N, max_verification_set_size G).

Reads and writes nothing; registered in :mod:`pipeline.methods` as ``lookahead``. Where it runs:

- **engine runtime** (TensorRT-LLM ≤ 1.2.x): the target built with ``trtllm-build
  --speculative_decoding_mode lookahead_decoding --max_draft_len f(W, N, G)`` and served with
  ``decoding_mode lookahead`` plus the ``lookahead_window_size``/``lookahead_ngram_size``/
  ``lookahead_verification_set_size`` parameters (tensorrtllm_backend r25.05
  inflight_batcher_llm/src/model_instance_state.cc reads all three when decoding_mode is lookahead
  and fails without them). A request may send smaller (w, n, g) as the ``lookahead_*`` inputs of
  ``tensorrt_llm``; the ensemble and the BLS have no such inputs.
- **CPU reference engine**: the ``lookahead`` proposer (pipeline/reference/proposers/lookahead.py)
  with the same three parameters.
- **LLM-API runtime**: none. ``LookaheadDecodingConfig.supports_backend`` returns False for
  ``pytorch`` (NVIDIA/TensorRT-LLM v1.2.1 tensorrt_llm/llmapi/llm_args.py) and the LLM-API runtime
  here is the PyTorch backend, so validate refuses it there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field

from pipeline.config_base import Section, described
from pipeline.methods.base import ENGINE, REFERENCE, Method
from pipeline.methods.drafting import DraftPlan
from pipeline.validate.severity import WARNING

if TYPE_CHECKING:
    from pipeline.methods.base import CheckContext

# Upstream's defaults (the C++ executor's LookaheadDecodingConfig, read through
# get_default_lookahead_decoding_{window,ngram,verification_set} in tensorrt_llm/llmapi/llm_args.py).
DEFAULT_WINDOW, DEFAULT_NGRAM, DEFAULT_VERIFICATION_SET = 4, 3, 4
LLM_API_REASON = ("LookaheadDecodingConfig.supports_backend returns False for 'pytorch' "
                  "(NVIDIA/TensorRT-LLM v1.2.1 tensorrt_llm/llmapi/llm_args.py)")


def lookahead_max_draft_len(window: int, ngram: int, verification_set: int) -> int:
    """Draft tokens per step of a lookahead engine, as TensorRT-LLM computes them
    (``LookaheadDecodingConfig::calculateSpeculativeResourceTuple``, read through
    ``LookaheadDecodingConfig.calculate_speculative_resource`` in tensorrt_llm/llmapi/llm_args.py):
    (W − 1 + G) n-grams of N − 1 tokens each, plus N − 2 for the window's last column when N > 1.
    The engine's ``--max_draft_len`` must equal it for the server's (W, N, G), or the lookahead
    layer fails its assertion at load (triton-inference-server/tensorrtllm_backend#710)."""
    tail = 0 if ngram == 1 else ngram - 2
    return tail + (window - 1 + verification_set) * (ngram - 1)


class LookaheadSpec(Section):
    """Lookahead decoding: Jacobi iteration over a window of W positions, an n-gram pool, G n-grams
    verified per step; no draft model, no heads."""

    method: Literal["lookahead"] = described("Speculation method: lookahead decoding (Jacobi window + n-gram pool).")
    max_window_size: Annotated[int, Field(ge=1, le=64)] = described(
        "W: future positions of the Jacobi window, each producing one n-gram per step (lookahead_window_size).",
        default=DEFAULT_WINDOW,
    )
    max_ngram_size: Annotated[int, Field(ge=1, le=16)] = described(
        "N: tokens per n-gram (lookahead_ngram_size); the window keeps N − 1 steps of history.",
        default=DEFAULT_NGRAM,
    )
    max_verification_set_size: Annotated[int, Field(ge=1, le=64)] = described(
        "G: pooled n-grams verified per step (lookahead_verification_set_size).",
        default=DEFAULT_VERIFICATION_SET,
    )

    @property
    def engine_max_draft_len(self) -> int:
        return lookahead_max_draft_len(self.max_window_size, self.max_ngram_size, self.max_verification_set_size)


class LookaheadMethod(Method):
    name = "lookahead"
    section = LookaheadSpec
    title = "lookahead decoding"
    runtimes = frozenset({ENGINE, REFERENCE})
    proposer = "lookahead"
    engine_mode = "lookahead_decoding"
    engine_from_target = True
    triton_decoding_mode = "lookahead"
    required_triton_parameters = ("lookahead_window_size", "lookahead_ngram_size", "lookahead_verification_set_size")
    engine_only_decoding_type = "Lookahead"
    engine_only_reason = LLM_API_REASON
    min_engine_version = (0, 13)

    def draft_plan(self, spec: LookaheadSpec) -> DraftPlan:
        """No proposer (the default 0 s), a wider verify: lookahead and verification branches ride in
        the target's forward. Upstream's LookaheadDecodingConfig names: window W, n-gram N, verification set G."""
        w, n, g = spec.max_window_size, spec.max_ngram_size, spec.max_verification_set_size
        return DraftPlan(self.name, n - 1, (w + g) * (n - 1) + 1, params={"W": w, "N": n, "G": g})

    def primary_draft_len(self, spec: LookaheadSpec) -> int:
        return spec.engine_max_draft_len

    def triton_parameters(self, spec: LookaheadSpec) -> dict[str, str]:
        return {"lookahead_window_size": str(spec.max_window_size), "lookahead_ngram_size": str(spec.max_ngram_size),
                "lookahead_verification_set_size": str(spec.max_verification_set_size)}

    def check(self, ctx: CheckContext) -> None:
        cfg, spec = ctx.cfg, ctx.cfg.speculation
        k = spec.engine_max_draft_len
        if spec.max_ngram_size == 1:
            ctx.add(WARNING, "method", "max_ngram_size 1 drafts nothing: every n-gram is the token already known",
                    "use max_ngram_size ≥ 2 (upstream's default is 3)", "speculation.max_ngram_size")
        if cfg.backend == "trtllm" and cfg.build.max_num_tokens < cfg.build.max_batch_size * (k + 1):
            ctx.add(WARNING, "build", f"max_num_tokens ({cfg.build.max_num_tokens}) is below max_batch_size × "
                    f"(max_draft_len + 1) = {cfg.build.max_batch_size * (k + 1)}: a full batch of lookahead steps "
                    f"(max_draft_len {k} from W, N, G) does not fit one engine step",
                    f"raise build.max_num_tokens to ≥ {cfg.build.max_batch_size * (k + 1)}", "build.max_num_tokens")

    def proposer_fields(self, spec: LookaheadSpec) -> dict[str, Any]:
        return {"max_window_size": spec.max_window_size, "max_ngram_size": spec.max_ngram_size,
                "max_verification_set_size": spec.max_verification_set_size}


METHOD = LookaheadMethod()
