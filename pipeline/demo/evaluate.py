"""Quality figures of the trained demo models, on held-out text only (never training samples).

Reads the in-memory models + held-out prompts; returns a JSON-able dict for
``training_report.json``: target held-out loss per category and a greedy sample per category;
then, on the target's own greedy continuations of held-out prompts (what speculation sees), the
draft's top-1 agreement with the target, each Medusa head's agreement with the token it
predicts (head i: t+2+i) and the EAGLE head's one-step agreement — per category and overall.
"""

from __future__ import annotations

from pipeline.demo import corpus
from pipeline.demo.models import DRAFT, EAGLE, MEDUSA, TARGET, generate_greedy_or_sampled, target_features
from pipeline.demo.tokenizer import EOS_ID

HELDOUT_TEXT_SEED = corpus.HELDOUT_SEED + 2


def _ratio(hits: int, total: int) -> float:
    return round(hits / total, 4) if total else 0.0


def heldout_loss(target, data, recipe) -> dict[str, float]:
    import torch

    losses = {}
    for category in corpus.IN_DOMAIN:
        texts = corpus.samples(category, max(4, recipe.eval_prompts_per_category), HELDOUT_TEXT_SEED)
        ids = [tok for text in texts for tok in data.tokenizer.encode(text).ids + [EOS_ID]]
        batch = torch.tensor(ids[: (len(ids) // recipe.seq_len) * recipe.seq_len]).view(-1, recipe.seq_len)
        with torch.no_grad():
            logits = target(input_ids=batch).logits.float()
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        losses[category] = round(loss.item(), 4)
    return losses


def continuations(target, heldout: dict[str, list[list[int]]], recipe) -> dict[str, list[tuple]]:
    """The target's greedy continuation of every held-out prompt, with its features:
    {category: [(seq [1, end], features [1, end, H]) per prompt]} — the slow part of
    :func:`evaluate` (demo training computes it in its second process, beside head training)."""
    import torch

    out: dict[str, list[tuple]] = {}
    for category, prompts in heldout.items():
        out[category] = []
        for prompt in prompts:
            seq = generate_greedy_or_sampled(target, torch.tensor([prompt]), recipe.eval_new_tokens, False, None)
            out[category].append((seq, target_features(target, seq)))
    return out


def evaluate(models: dict, data, recipe, continued: dict[str, list[tuple]] | None = None) -> dict:
    """``continued``: :func:`continuations` computed elsewhere (computed here when None)."""
    import torch

    target = models[TARGET]
    if continued is None:
        continued = continuations(target, data.heldout, recipe)
    embed = target.model.embed_tokens.weight.detach()
    result: dict = {"target_heldout_loss": heldout_loss(target, data, recipe), "target_greedy_sample": {}}
    counts: dict[str, dict[str, list[int]]] = {}  # metric → category → [hits, total]

    def add(metric: str, category: str, hits: int, total: int) -> None:
        cell = counts.setdefault(metric, {}).setdefault(category, [0, 0])
        cell[0] += hits
        cell[1] += total

    for category, prompts in data.heldout.items():
        for index, (prompt, (seq, feats)) in enumerate(zip(prompts, continued[category], strict=True)):
            start = len(prompt)
            end = seq.shape[1]
            if index == 0:
                result["target_greedy_sample"][category] = {
                    "prompt": data.tokenizer.decode(prompt),
                    "continuation": data.tokenizer.decode(seq[0, start:].tolist()),
                }
            greedy_next = seq[0, start:]  # tokens the target chose at positions start-1 … end-2
            with torch.no_grad():
                if DRAFT in models:
                    draft_top1 = models[DRAFT](input_ids=seq).logits[0, start - 1 : end - 1].argmax(-1)
                    add("draft_top1_agreement", category, int((draft_top1 == greedy_next).sum()), len(greedy_next))
                if MEDUSA in models:
                    head_logits = models[MEDUSA](feats)[:, 0]  # [heads, end, V]
                    for i in range(head_logits.shape[0]):
                        lo, hi = start - 1, end - 2 - i  # head i at t predicts t+2+i
                        if hi > lo:
                            pred = head_logits[i, lo:hi].argmax(-1)
                            add(f"medusa_head{i}_agreement", category, int((pred == seq[0, lo + 2 + i : hi + 2 + i]).sum()), hi - lo)
                if EAGLE in models:
                    h = models[EAGLE](seq[:, 1:], feats[:, :-1])[0]  # h_t for t = 0 … end-2
                    lo, hi = start - 1, end - 2
                    pred = (h[lo:hi] @ embed.t()).argmax(-1)
                    add("eagle_one_step_agreement", category, int((pred == seq[0, lo + 2 : hi + 2]).sum()), hi - lo)
    for metric, per_category in counts.items():
        hits = sum(c[0] for c in per_category.values())
        total = sum(c[1] for c in per_category.values() if True)
        in_domain = [per_category[c] for c in corpus.IN_DOMAIN if c in per_category]
        result[metric] = {
            "in_domain": _ratio(sum(c[0] for c in in_domain), sum(c[1] for c in in_domain)),
            "all": _ratio(hits, total),
            "per_category": {c: _ratio(*v) for c, v in per_category.items()},
        }
    return result
