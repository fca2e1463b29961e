"""What demo training and its evaluation share (so neither imports the other): the builtin
model names, the target's features and its LM head, and plain KV-cached decoding with the
target. Reads and writes nothing.
"""

from __future__ import annotations

import contextlib

TARGET, DRAFT, MEDUSA, EAGLE, EAGLE3 = "tiny-target", "tiny-draft", "tiny-medusa", "tiny-eagle", "tiny-eagle3"
MODEL_NAMES = (TARGET, DRAFT, MEDUSA, EAGLE, EAGLE3)


def one_thread_torch():
    """torch, on one thread (deterministic training; imported late: the CLI starts without it)."""
    import torch

    torch.set_num_threads(1)
    with contextlib.suppress(RuntimeError):  # only settable before the first parallel op
        torch.set_num_interop_threads(1)
    return torch


def target_features(target, ids):
    """ids [batch, seq] → final hidden states AFTER the final norm [batch, seq, H] (fp32, no grad)."""
    torch = one_thread_torch()
    with torch.no_grad():
        return target.model(input_ids=ids).last_hidden_state.float()


def lm_logits(features, embed_weight):
    """Tied LM head: features [.., H] @ embed[V, H]ᵀ → logits [.., V]."""
    return features @ embed_weight.t()


def generate_greedy_or_sampled(target, prompts, new_tokens: int, sample: bool, generator):
    """Plain KV-cached decoding with the target (no EOS stop): prompts [batch, P] → [batch, P+new]."""
    torch = one_thread_torch()
    from transformers import DynamicCache

    with torch.no_grad():
        cache = DynamicCache()
        out = target(input_ids=prompts, cache=cache, use_cache=True)
        seq = prompts
        for _ in range(new_tokens):
            logits = out.logits[:, -1].float()  # [batch, V]
            if sample:
                nxt = torch.multinomial(torch.softmax(logits, -1), 1, generator=generator)
            else:
                nxt = logits.argmax(-1, keepdim=True)
            seq = torch.cat([seq, nxt], dim=1)
            out = target(input_ids=nxt, cache=cache, use_cache=True)
    return seq
