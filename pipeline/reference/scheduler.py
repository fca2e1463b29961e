"""The decoding loop of the reference engine, without threads: admit a request (prefill, with
prefix reuse), then run batched speculative steps over every active sequence.

One step = propose (each sequence's proposer, batched; a request with ``draft_input_ids`` has
:class:`~pipeline.reference.proposers.external.ExternalDraftProposer`) → one target forward
over ``[pending token] + drafts`` per sequence (ragged; causal or tree mask) → verify per
sequence (:mod:`pipeline.reference.verify`; its glossary names what is emitted) → roll back /
compact the KV cache → hand the proposer the target's hidden states of the rows kept (the final
ones, or for a proposer with ``capture_layers`` — EAGLE-3 — those decoder layers' outputs; a
proposer with ``observe`` — lookahead — also gets the step's target logits) → emit
tokens, applying end_id, stop words and ``max_new_tokens``. The baseline is this same loop with
no proposer (zero drafts). Invariant (:mod:`pipeline.reference.sequence`): the target cache
holds every token of the sequence except the last (the *pending* token), so
``cache.length == len(tokens) - 1``. Reads and writes nothing on disk.
"""

from __future__ import annotations

import time

import torch

from pipeline.artefacts.schedule import DraftLenRange, draft_len_at
from pipeline.reference.api import GenerationRequest, check_request
from pipeline.reference.kv_cache import PrefixCache
from pipeline.reference.modeling import LlamaModel, StepInput
from pipeline.reference.proposers.base import Proposal, Proposer, tree_depths
from pipeline.reference.proposers.external import ExternalDraftProposer
from pipeline.reference.sampling import mask_position, to_probs
from pipeline.reference.sequence import SeqState
from pipeline.reference.verify import (
    VerifyResult,
    verify_greedy_chain,
    verify_greedy_tree,
    verify_sampled_chain,
    verify_sampled_tree,
)


def _ancestors(parents: list[int]) -> torch.Tensor:
    """[N+1, N+1] bool: row r attends to its ancestors and itself (row 0 = the pending token)."""
    n = len(parents) + 1
    mask = torch.zeros(n, n, dtype=torch.bool)
    mask[0, 0] = True
    for i, parent in enumerate(parents):
        mask[i + 1] = mask[parent]
        mask[i + 1, i + 1] = True
    return mask


class Scheduler:
    def __init__(self, target: LlamaModel, proposer: Proposer | None, max_batch_size: int,
                 max_seq_len: int, max_draft_len: int, prefix_cache_entries: int,
                 draft_len_schedule: list[DraftLenRange] | None = None):
        self.target = target
        self.proposer = proposer
        # K per live batch size (None: the request's / proposer's K at every batch size); it caps
        # the engine's own proposer only: external drafts are verified as the request sent them
        self.draft_len_schedule = draft_len_schedule
        self.external = ExternalDraftProposer(max_draft_len, target.dtype)
        self.max_batch_size = max_batch_size
        self.max_seq_len = max_seq_len
        self.max_draft_len = max_draft_len
        self.vocab_size = target.shape.vocab_size
        self.max_rows = max_seq_len + max(max_draft_len, 1) + 2
        self.pool = target.new_pool(max_batch_size, self.max_rows)
        self.prefix = PrefixCache(prefix_cache_entries)

    # -- admission -------------------------------------------------------------------------

    def check(self, request: GenerationRequest) -> None:
        """Raise ValueError (or DraftTooLongError) for a request this engine cannot run."""
        check_request(request, self.vocab_size, self.max_draft_len, self.max_seq_len)

    def admit(self, seq: SeqState) -> None:
        """Allocate a slot and prefill all prompt tokens but the last (it becomes pending); the
        proposer gets the prefilled positions' hidden states."""
        seq.stats.first_scheduled_time_ns = time.monotonic_ns()
        seq.cache = self.pool.allocate()
        seq.proposer = self.external if seq.request.draft_input_ids is not None else self.proposer
        prompt = seq.tokens
        limit = len(prompt) - 1 if seq.proposer is None else seq.proposer.reusable_prefix(len(prompt))
        reused = self.prefix.restore(prompt, seq.cache, max(limit, 0))
        seq.stats.kv_cache_reused_tokens = reused
        seq.stats.kv_cache_new_tokens = len(prompt) - reused
        todo = prompt[reused:-1]
        hidden = None
        if todo:
            prefill = StepInput(seq.cache, todo, list(range(reused, reused + len(todo))))
            hidden = self._forward([prefill], [seq])[0][0]  # [n, H] (or the captured layers)
        if seq.proposer is not None:
            seq.proposer.start(seq, hidden)
        if seq.request.max_new_tokens == 0:
            seq.finish_reason = "length"

    def release(self, seq: SeqState) -> None:
        if seq.cache is not None:
            self.prefix.put(seq.tokens, seq.cache)
            self.pool.release(seq.cache)
            seq.cache = None
        if seq.proposer is not None:
            seq.proposer.release(seq)

    # -- one batched step ------------------------------------------------------------------

    def _draft_budget(self, seq: SeqState, cap: int | None = None) -> int:
        """``num_draft_tokens`` for this step: the request's (default: the proposer's most),
        within the proposer's capacity, the schedule's K for this batch (``cap``; 0: a plain
        target step, the proposer does no work) and what is left to generate after the next token."""
        remaining = seq.request.max_new_tokens - len(seq.output)
        wanted = seq.request.num_draft_tokens
        most = seq.proposer.max_draft_len if cap is None else min(seq.proposer.max_draft_len, cap)
        return max(0, min(most if wanted is None else wanted, most, remaining - 1))

    def _proposals(self, seqs: list[SeqState]) -> list[Proposal]:
        """Each proposer drafts for its sequences in one batched call, K per the schedule's range
        holding the live batch size (``len(seqs)``)."""
        proposals = [Proposal() for _ in seqs]
        cap = None if self.draft_len_schedule is None else draft_len_at(self.draft_len_schedule, len(seqs))
        for proposer in {id(s.proposer): s.proposer for s in seqs if s.proposer is not None}.values():
            rows = [i for i, s in enumerate(seqs) if s.proposer is proposer]
            own = cap if proposer is not self.external else None
            drafted = proposer.propose([seqs[i] for i in rows], [self._draft_budget(seqs[i], own) for i in rows])
            for i, prop in zip(rows, drafted):
                proposals[i] = prop
        return proposals

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
                positions = [start + d for d in tree_depths(prop.parents)]
                tree = _ancestors(prop.parents)
            inputs.append(StepInput(seq.cache, [seq.tokens[-1]] + prop.tokens, positions, tree))
        features, hidden = self._forward(inputs, seqs)  # per sequence [T, H] (or captured) ; [B, T, H]
        logits = self.target.logits(hidden)  # [B, T, vocab]
        for b, (seq, prop) in enumerate(zip(seqs, proposals)):
            width = 1 + len(prop.tokens)
            self._finish_step(seq, prop, features[b][:width], logits[b, :width], inputs[b].positions[0])

    def _forward(self, inputs: list[StepInput], seqs: list[SeqState]) -> tuple[list[torch.Tensor], torch.Tensor]:
        """The target forward → (what each sequence's proposer is handed: the final hidden states,
        or the outputs of the decoder layers its ``capture_layers`` names (EAGLE-3); the final
        hidden states ``[B, T, H]``)."""
        wanted = {getattr(s.proposer, "capture_layers", ()) for s in seqs} - {()}
        capture = next(iter(wanted)) if len(wanted) == 1 else ()  # one capturing proposer per engine
        hidden, aux = self.target.forward_capture(self.pool, inputs, capture)
        features = [aux[b] if capture and getattr(s.proposer, "capture_layers", ()) == capture else hidden[b]
                    for b, s in enumerate(seqs)]
        return features, hidden

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

    def _verify(self, seq: SeqState, prop: Proposal, logits: torch.Tensor) -> VerifyResult:
        if seq.params.greedy:
            if prop.parents is not None:
                return verify_greedy_tree(logits, prop.tokens, prop.parents)
            return verify_greedy_chain(logits, prop.tokens)
        target_probs = to_probs(logits, seq.params)  # [K+1, vocab]
        draft_probs = prop.draft_probs
        if prop.parents is not None:  # a sampled tree: deterministic drafts only (the lookahead proposer's)
            if draft_probs is not None:
                raise ValueError("a sampled draft tree needs deterministic drafts (draft_probs None)")
            return verify_sampled_tree(target_probs, prop.tokens, prop.parents, seq.generator)
        if draft_probs is None:  # deterministic drafts: one-hot
            draft_probs = torch.nn.functional.one_hot(
                torch.tensor(prop.tokens, dtype=torch.long), logits.shape[-1]).to(target_probs.dtype)
        return verify_sampled_chain(target_probs, draft_probs.to(target_probs.dtype), prop.tokens, seq.generator)

    def _finish_step(self, seq: SeqState, prop: Proposal, hidden: torch.Tensor, logits: torch.Tensor,
                     start: int) -> None:
        observe = getattr(seq.proposer, "observe", None)
        if observe is not None and prop.tokens:  # a proposer that learns from the step's logits (lookahead)
            observe(seq, prop, logits)
        logits = self._masked(seq, prop, logits)
        result = self._verify(seq, prop, logits)
        a = len(result.accepted)
        rows = [0] + result.accepted  # step rows now part of the sequence
        if prop.parents is None:
            seq.cache.rollback(start + 1 + a)
        else:
            seq.cache.compact(start, [start + r for r in rows])
        new_tokens = [prop.tokens[r - 1] for r in result.accepted] + [result.next_token]
        seq.tokens.extend(new_tokens)
        self._stats(seq, prop, a)
        self._emit(seq, new_tokens)
        if seq.proposer is not None:
            kept = hidden[: a + 1] if prop.parents is None else hidden[rows]  # [a+1, H]
            seq.proposer.accept(seq, kept)

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
