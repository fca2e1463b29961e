"""The BLS's draft-target rounds (docs/triton-contract.md, `tensorrt_llm_bls`; upstream's loop is tensorrtllm_backend@r25.05
``all_models/inflight_batcher_llm/tensorrt_llm_bls/1/lib/decode.py`` ``_spec_generate``), and
what happens when the draft fails.

Per round the draft proposes k = min(K, |P| + N − |C| − 1) tokens (``min_tokens`` = k) and the
target verifies them in one step (``draft_input_ids``, ``request_output_len`` = |d| + 1); the
target's ``output_ids`` (prompt included) become the next context C. Stops on length, no
progress (EOS), all drafts taken without a bonus token, a trailing stop word, or cancellation.
Non-streaming: one response, ``text_output`` = decode(C) (prompt included unless excluded), as
upstream. Our extension: with ``stream=true`` on a decoupled BLS each round's accepted tokens are
one delta response. Acceptance figures cover the whole generation, not only the last round.

Fallback (docs/triton-contract.md): when a draft call fails (an error response, or an answer
later than the request's ``draft_timeout_ms``) the request stops drafting and continues
target-only: the target then asks for every remaining token itself, so the output is what the
target alone produces. The request reports ``draft_fallbacks`` = 1 among its perf outputs, the
server log names the cause, and ``specdeploy_spec_decode_fallbacks_total{reason}`` counts it once
the target-only continuation has answered (a request that fails anyway is an error, not a
fallback). The timeout is checked when the draft's answer arrives: a Python-backend BLS call
cannot be abandoned while it runs, so a late answer is discarded rather than interrupted."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import triton_python_backend_utils as pb_utils

from pipeline.triton_models import io
from pipeline.triton_models.llm import parse_word_list

PERF_NAMES = (
    "kv_cache_alloc_new_blocks", "kv_cache_reused_blocks", "kv_cache_alloc_total_blocks",
    "arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns", "last_token_time_ns",
    "acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens",
)
FALLBACK_OUTPUT = "draft_fallbacks"


class SpecError(Exception):
    """The request cannot be served speculatively; the text goes back to the client."""


@dataclass
class SpecTotals:
    draft_tokens: int = 0
    accepted_tokens: int = 0
    verify_steps: int = 0
    first_scheduled_ns: int = 0
    first_token_ns: int = 0
    last_token_ns: int = 0
    last_perf: dict = field(default_factory=dict)
    fallback: str | None = None  # "error" | "timeout" once the draft has failed

    def add_round(self, perf: dict, had_drafts: bool) -> None:
        if had_drafts:
            self.draft_tokens += int(perf.get("total_draft_tokens", 0))
            self.accepted_tokens += int(perf.get("total_accepted_draft_tokens", 0))
            self.verify_steps += 1
        self.first_scheduled_ns = self.first_scheduled_ns or int(perf.get("first_scheduled_time_ns", 0))
        self.first_token_ns = self.first_token_ns or int(perf.get("first_token_time_ns", 0))
        self.last_token_ns = int(perf.get("last_token_time_ns", 0)) or self.last_token_ns
        self.last_perf = perf

    def perf_outputs(self, arrival_ns: int) -> dict:
        last = self.last_perf
        values = {
            "kv_cache_alloc_new_blocks": (last.get("kv_cache_alloc_new_blocks", 0), np.int32),
            "kv_cache_reused_blocks": (last.get("kv_cache_reused_blocks", 0), np.int32),
            "kv_cache_alloc_total_blocks": (last.get("kv_cache_alloc_total_blocks", 0), np.int32),
            "arrival_time_ns": (arrival_ns, np.int64),
            "first_scheduled_time_ns": (self.first_scheduled_ns, np.int64),
            "first_token_time_ns": (self.first_token_ns, np.int64),
            "last_token_time_ns": (self.last_token_ns, np.int64),
            "acceptance_rate": (self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0, np.float32),
            "total_accepted_draft_tokens": (self.accepted_tokens, np.int32),
            "total_draft_tokens": (self.draft_tokens, np.int32),
            FALLBACK_OUTPUT: (1 if self.fallback else 0, np.int32),
        }
        return {k: np.array([[v]], dtype=t) for k, (v, t) in values.items()}


class DraftTarget:
    """One speculative request through the BLS ``bls`` (its model calls and response sender)."""

    def __init__(self, bls, request: dict, sender, num_draft: int, streaming: bool):
        self.bls, self.request, self.sender = bls, request, sender
        self.num_draft, self.streaming = num_draft, streaming
        self.timeout_ms = float(io.scalar(request, "draft_timeout_ms", 0.0) or 0.0)
        self.use_draft_logits = io.flag(request, "use_draft_logits")
        self.totals = SpecTotals()
        self.arrival_ns = time.monotonic_ns()

    def run(self) -> None:
        self._refuse_unsupported()
        pre = self.bls.preprocess(self.request)
        prompt = [int(t) for t in pre["INPUT_ID"].reshape(-1)[: int(pre["REQUEST_INPUT_LEN"].reshape(-1)[0])]]
        self.limit = len(prompt) + int(pre["REQUEST_OUTPUT_LEN"].reshape(-1)[0])
        self.stop_words = parse_word_list(pre["STOP_WORDS_IDS"].reshape(1, 2, -1))
        self.common = self.bls.llm_common(self.request, pre)
        context = self._rounds(prompt)
        totals = self.totals
        self.bls.counters.add(totals.draft_tokens, totals.accepted_tokens, totals.verify_steps)
        if totals.fallback:
            self.bls.counters.fallback(totals.fallback)
        self.bls.latency.observe(self.arrival_ns, totals.first_token_ns, totals.last_token_ns, len(context) - len(prompt))
        if not self.streaming:
            ids = context[len(prompt):] if io.flag(self.request, "exclude_input_in_output") else context
            self.bls.send_text(self.sender, ids, self._extras(len(prompt), len(context) - len(prompt)), final=True)

    def _refuse_unsupported(self) -> None:
        """Upstream's refusals (model.py / decode.py), and K above the target's max_draft_len, which
        upstream would pass on until the engine asserts."""
        bls, request = self.bls, self.request
        if self.needs_draft_model() and not bls.draft_name:
            raise SpecError("cannot perform speculative decoding without draft model")
        if io.get(request, "text_input").reshape(-1).shape[0] > 1:
            raise SpecError("speculative decoding is not supported with batch size > 1")
        if io.flag(request, "return_context_logits"):
            raise SpecError("context logits are not supported with speculative decoding")
        limit = bls.target_max_draft_len
        if limit is not None and self.num_draft > limit:
            raise SpecError(
                f"num_draft_tokens {self.num_draft} refused: Number of draft tokens ({self.num_draft}) is larger "
                f"than maximum number of draft tokens ({limit}) (max_draft_len of {bls.target_name}); "
                f"send num_draft_tokens <= {limit}")

    def needs_draft_model(self) -> bool:
        """Whether the drafts come from ``tensorrt_llm_draft`` (the n-gram rounds draft without one)."""
        return True

    def _rounds(self, prompt: list[int]) -> list[int]:
        context = list(prompt)
        while True:
            previous = context
            drafts, context = self._round(context)
            done = (
                len(context) >= self.limit
                or (drafts and context == previous + drafts)
                or context == previous
                or any(w and context[-len(w):] == w for w in self.stop_words)
                or self.bls.cancelled(self.sender)
            )
            if self.streaming:
                delta = context[len(previous):]
                self.bls.send_text(self.sender, delta, self._extras(len(prompt), len(delta)), final=done)
            if done:
                return context

    def _round(self, context: list[int]) -> tuple[list[int], list[int]]:
        k = min(self.num_draft, self.limit - len(context) - 1)
        drafts, logits = [], None
        if k > 0 and not self.totals.fallback:
            drafts, logits = self._propose_or_fall_back(context, k)
        # after a fallback the target asks for every remaining token itself (target-only)
        new_tokens = self.limit - len(context) if self.totals.fallback else len(drafts) + 1
        context, perf = self._verify(context, drafts, logits, new_tokens)
        self.totals.add_round(perf, had_drafts=bool(drafts))
        return drafts, context

    def _propose_or_fall_back(self, context: list[int], k: int):
        started = time.monotonic()
        try:
            proposal = self._propose(context, k)
        except Exception as exc:  # noqa: BLE001 - any draft failure: continue with the target alone
            self._fall_back("error", str(exc))
            return [], None
        elapsed_ms = (time.monotonic() - started) * 1000.0
        if self.timeout_ms and elapsed_ms > self.timeout_ms:
            self._fall_back("timeout", f"it answered after {elapsed_ms:.3g} ms, over draft_timeout_ms {self.timeout_ms:g}")
            return [], None
        return proposal

    def _fall_back(self, reason: str, detail: str) -> None:
        self.totals.fallback = reason
        pb_utils.Logger.log_warn(
            f"{self.bls.draft_name or 'the n-gram lookup'} failed ({reason}: {detail}); this request "
            f"continues with {self.bls.target_name} alone (speculation fallback)")

    def _propose(self, context: list[int], k: int):
        inputs = dict(self.common)
        inputs.update({
            "input_ids": np.array([context], dtype=np.int32),
            "input_lengths": np.array([[len(context)]], dtype=np.int32),
            "request_output_len": np.array([[k]], dtype=np.int32),
            "min_tokens": np.array([[k]], dtype=np.int32),
            "streaming": np.array([[False]]), "exclude_input_in_output": np.array([[False]]),
        })
        if self.use_draft_logits:
            inputs["return_generation_logits"] = np.array([[True]])
        wanted = ["output_ids", "sequence_length"] + (["generation_logits"] if self.use_draft_logits else [])
        (out,) = self.bls.call(self.bls.draft_name, inputs, wanted, self.bls.draft_decoupled)
        length = int(out["sequence_length"].reshape(-1)[0])
        drafts = [int(t) for t in out["output_ids"].reshape(-1)[len(context):length]]
        logits = None
        if self.use_draft_logits and drafts and "generation_logits" in out:
            gen = out["generation_logits"]
            logits = gen.reshape(-1, gen.shape[-1])[-len(drafts):]
        return drafts, logits

    def _verify(self, context: list[int], drafts: list[int], draft_logits, new_tokens: int):
        inputs = dict(self.common)
        inputs.update({
            "input_ids": np.array([context], dtype=np.int32),
            "input_lengths": np.array([[len(context)]], dtype=np.int32),
            "request_output_len": np.array([[new_tokens]], dtype=np.int32),
            "streaming": np.array([[False]]), "exclude_input_in_output": np.array([[False]]),
            "return_perf_metrics": np.array([[True]]),
        })
        if drafts:
            inputs["draft_input_ids"] = np.array([drafts], dtype=np.int32)
        if draft_logits is not None:
            inputs["draft_logits"] = draft_logits.reshape(1, *draft_logits.shape)
        wanted = ["output_ids", "sequence_length", *PERF_NAMES]
        (out,) = self.bls.call(self.bls.target_name, inputs, wanted, self.bls.target_decoupled)
        length = int(out["sequence_length"].reshape(-1)[0])
        perf = {name: out[name].reshape(-1)[0].item() for name in PERF_NAMES if name in out}
        return [int(t) for t in out["output_ids"].reshape(-1)[:length]], perf

    def _extras(self, n_in: int, n_out: int) -> dict:
        request, extra = self.request, {}
        if io.flag(request, "return_perf_metrics"):
            extra.update(self.totals.perf_outputs(self.arrival_ns))
        if io.flag(request, "return_num_input_tokens"):
            extra["num_input_tokens"] = np.array([[n_in]], dtype=np.int32)
        if io.flag(request, "return_num_output_tokens"):
            extra["num_output_tokens"] = np.array([[n_out]], dtype=np.int32)
        return extra
