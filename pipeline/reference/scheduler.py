"""The decoding loop of the reference engine, without threads: admit a request (prefill, with
prefix reuse), then run batched speculative steps over every active sequence.

One step = propose (the proposer, batched; or the request's external ``draft_input_ids``) →
one target forward over ``[pending token] + drafts`` per sequence (ragged; causal or tree mask)
→ verify per sequence → roll back / compact the KV cache → emit tokens, applying end_id,
stop words and ``max_new_tokens``. The baseline is this same loop with no proposer (zero drafts).
Invariant: the target cache holds every token of the sequence except the last (the *pending*
token), so ``cache.length == len(tokens) - 1``. Reads and writes nothing on disk.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from pipeline.reference.api import (
    DraftTooLongError,
    FinishReason,
    GenerationRequest,
    RequestStats,
    SamplingParams,
)
from pipeline.reference.kv_cache import PrefixCache, SlotCache
from pipeline.reference.modeling import LlamaModel, StepInput
from pipeline.reference.proposers import Proposal, Proposer
from pipeline.reference.sampling import mask_position, to_probs
from pipeline.reference.verify import Verdict, verify_greedy_chain, verify_greedy_tree, verify_sampled_chain


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
    last_hidden: torch.Tensor | None = None  # [H] final hidden of the last cached position
    features: torch.Tensor | None = None  # [n, H] target features not yet consumed by EAGLE
    proposer_state: object = None
    finish_reason: FinishReason | None = None
    cancelled: bool = False
    single_step: bool = False  # external drafts: exactly one verification step

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


def make_generator(seed: int | None) -> torch.Generator:
    gen = torch.Generator()
    gen.manual_seed(seed if seed is not None else int(torch.randint(0, 2**62, ()).item()))
    return gen


def _ancestors(parents: list[int]) -> torch.Tensor:
    """[N+1, N+1] bool: row r attends to its ancestors and itself (row 0 = the pending token)."""
    n = len(parents) + 1
    mask = torch.zeros(n, n, dtype=torch.bool)
    mask[0, 0] = True
    for i, parent in enumerate(parents):
        mask[i + 1] = mask[parent]
        mask[i + 1, i + 1] = True
    return mask


def _depths(parents: list[int]) -> list[int]:
    depths = [0]
    for parent in parents:
        depths.append(depths[parent] + 1)
    return depths


def check_request(request: GenerationRequest, vocab_size: int, max_draft_len: int, max_seq_len: int) -> None:
    """Raise ValueError (or DraftTooLongError) for a request an engine with these limits cannot
    run (also checked in front of a worker process, :mod:`pipeline.reference.worker`)."""
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


class Scheduler:
    def __init__(self, target: LlamaModel, proposer: Proposer | None, max_batch_size: int,
                 max_seq_len: int, max_draft_len: int, prefix_cache_entries: int):
        self.target = target
        self.proposer = proposer
        self.max_batch_size = max_batch_size
        self.max_seq_len = max_seq_len
        self.max_draft_len = max_draft_len
        self.vocab_size = target.shape.vocab_size
        self.max_rows = max_seq_len + max(max_draft_len, 1) + 2
        self.pool = target.new_pool(max_batch_size, self.max_rows)
        self.prefix = PrefixCache(prefix_cache_entries)
        self.keep_features = proposer is not None and proposer.uses_features

    # -- admission -------------------------------------------------------------------------

    def check(self, request: GenerationRequest) -> None:
        """Raise ValueError (or DraftTooLongError) for a request this engine cannot run."""
        check_request(request, self.vocab_size, self.max_draft_len, self.max_seq_len)

    def admit(self, seq: SeqState) -> None:
        """Allocate a slot and prefill all prompt tokens but the last (it becomes pending)."""
        seq.stats.first_scheduled_time_ns = time.monotonic_ns()
        seq.cache = self.pool.allocate()
        seq.single_step = seq.request.draft_input_ids is not None
        prompt = seq.tokens
        limit = len(prompt) - 1
        if self.proposer is not None:
            limit = len(prompt) - 2 if self.proposer.prefix_reuse else 0  # features needed
        reused = self.prefix.restore(prompt, seq.cache, max(limit, 0))
        seq.stats.kv_cache_reused_tokens = reused
        seq.stats.kv_cache_new_tokens = len(prompt) - reused
        if self.proposer is not None:
            self.proposer.start(seq)
        todo = prompt[reused:-1]
        if todo:
            hidden = self.target.forward(self.pool, [StepInput(seq.cache, todo, list(range(reused, reused + len(todo))))])
            seq.last_hidden = hidden[0, -1]
            seq.features = hidden[0] if self.keep_features else None
        if seq.request.max_new_tokens == 0:
            seq.finish_reason = "length"

    def release(self, seq: SeqState) -> None:
        if seq.cache is not None:
            self.prefix.put(seq.tokens, seq.cache)
            self.pool.release(seq.cache)
            seq.cache = None
        if self.proposer is not None:
            self.proposer.release(seq)

    # -- one batched step ------------------------------------------------------------------

    def _draft_budget(self, seq: SeqState) -> int:
        remaining = seq.request.max_new_tokens - len(seq.output)
        wanted = seq.request.num_draft_tokens
        k = self.proposer.max_draft_len if wanted is None else wanted
        return max(0, min(k, self.proposer.max_draft_len, remaining - 1))

    def _proposals(self, seqs: list[SeqState]) -> list[Proposal]:
        proposals = [Proposal() for _ in seqs]
        internal = [i for i, s in enumerate(seqs) if not s.single_step]
        for i, seq in enumerate(seqs):
            if seq.single_step:
                proposals[i] = self._external(seq)
        if self.proposer is not None and internal:
            sub = [seqs[i] for i in internal]
            for i, prop in zip(internal, self.proposer.propose(sub, [self._draft_budget(s) for s in sub])):
                proposals[i] = prop
        return proposals

    def _external(self, seq: SeqState) -> Proposal:
        drafts = list(seq.request.draft_input_ids or [])
        probs = None
        if seq.request.draft_logits is not None and drafts and not seq.params.greedy:
            logits = torch.tensor(seq.request.draft_logits, dtype=self.target.dtype)
            probs = to_probs(logits, seq.params)
        return Proposal(drafts, None, probs)

    def step(self, seqs: list[SeqState]) -> None:
        """One speculative step for every sequence in ``seqs`` (all unfinished)."""
        proposals = self._proposals(seqs)
        inputs = []
        for seq, prop in zip(seqs, proposals):
            start = seq.cache.length
            if prop.parents is None:
                positions = list(range(start, start + 1 + len(prop.tokens)))
                tree = None
            else:
                positions = [start + d for d in _depths(prop.parents)]
                tree = _ancestors(prop.parents)
            inputs.append(StepInput(seq.cache, [seq.tokens[-1]] + prop.tokens, positions, tree))
        hidden = self.target.forward(self.pool, inputs)  # [B, T, H]
        logits = self.target.logits(hidden)  # [B, T, vocab]
        for b, (seq, prop) in enumerate(zip(seqs, proposals)):
            width = 1 + len(prop.tokens)
            self._finish_step(seq, prop, hidden[b, :width], logits[b, :width], inputs[b].positions[0])

    def _masked(self, seq: SeqState, prop: Proposal, logits: torch.Tensor) -> torch.Tensor:
        req = seq.request
        suppress_end = req.end_id is not None and len(seq.output) < req.min_tokens
        if not req.bad_words and not suppress_end:
            return logits
        logits = logits.clone()  # a view of the step's logits: mask a copy
        parents = prop.parents if prop.parents is not None else list(range(len(prop.tokens)))
        paths: list[list[int]] = [[]]
        for i, parent in enumerate(parents):
            paths.append(paths[parent] + [prop.tokens[i]])
        for row, path in enumerate(paths):
            mask_position(logits[row], seq.tokens + path, len(seq.output) + len(path), req.min_tokens,
                          req.end_id, req.bad_words)
        return logits

    def _verify(self, seq: SeqState, prop: Proposal, logits: torch.Tensor) -> Verdict:
        if seq.params.greedy:
            if prop.parents is not None:
                return verify_greedy_tree(logits, prop.tokens, prop.parents)
            return verify_greedy_chain(logits, prop.tokens)
        target_probs = to_probs(logits, seq.params)  # [K+1, vocab]
        draft_probs = prop.draft_probs
        if draft_probs is None:  # deterministic drafts: one-hot
            draft_probs = torch.nn.functional.one_hot(
                torch.tensor(prop.tokens, dtype=torch.long), logits.shape[-1]).to(target_probs.dtype)
        return verify_sampled_chain(target_probs, draft_probs.to(target_probs.dtype), prop.tokens, seq.generator)

    def _finish_step(self, seq: SeqState, prop: Proposal, hidden: torch.Tensor, logits: torch.Tensor,
                     start: int) -> None:
        logits = self._masked(seq, prop, logits)
        verdict = self._verify(seq, prop, logits)
        a = len(verdict.accepted)
        rows = [0] + verdict.accepted  # step rows now part of the sequence
        if prop.parents is None:
            seq.cache.rollback(start + 1 + a)
        else:
            seq.cache.compact(start, [start + r for r in rows])
        seq.last_hidden = hidden[rows[-1]]  # [H]
        if self.keep_features:
            kept = hidden[: a + 1] if prop.parents is None else hidden[rows]  # [a+1, H]
            seq.features = kept if seq.features is None else torch.cat([seq.features, kept])
        new_tokens = [prop.tokens[r - 1] for r in verdict.accepted] + [verdict.token]
        seq.tokens.extend(new_tokens)
        self._stats(seq, prop, a)
        self._emit(seq, new_tokens)
        if self.proposer is not None and not seq.single_step:
            self.proposer.accept(seq)
        if seq.single_step and not seq.finished:
            seq.finish_reason = "length"

    def _stats(self, seq: SeqState, prop: Proposal, accepted: int) -> None:
        st = seq.stats
        st.decode_steps += 1
        if not prop.tokens:
            return
        depth = prop.depth  # drafts offered, counted along one path (tree: its depth)
        st.verify_steps += 1
        st.draft_tokens += depth
        st.accepted_tokens += accepted
        while len(st.drafted_per_position) < depth:
            st.drafted_per_position.append(0)
            st.accepted_per_position.append(0)
        for i in range(depth):
            st.drafted_per_position[i] += 1
            if i < accepted:
                st.accepted_per_position[i] += 1

    def _emit(self, seq: SeqState, new_tokens: list[int]) -> None:
        req = seq.request
        for token in new_tokens:
            if req.end_id is not None and token == req.end_id and len(seq.output) >= req.min_tokens:
                seq.finish_reason = "end_id"
                break
            seq.output.append(token)
            if any(w and seq.output[-len(w):] == w for w in req.stop_words):
                seq.finish_reason = "stop_word"
                break
            if len(seq.output) >= req.max_new_tokens:
                seq.finish_reason = "length"
                break
        now = time.monotonic_ns()
        if seq.output and not seq.stats.first_token_time_ns:
            seq.stats.first_token_time_ns = now
        seq.stats.last_token_time_ns = now
