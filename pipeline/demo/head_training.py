"""The one training loop of the demo models (target, draft, Medusa, EAGLE and EAGLE-3 heads) and
its recipe pieces: AdamW β=(0.9, 0.95), warm-up then cosine to 10 %, grad-clip 1.0, bf16
autocast over fp32 master weights where the CPU multiplies bf16 fast (:func:`autocast_mode`), and the batches the draft and heads learn from (half corpus
windows, half target-generated sequences). The heads' training-time-test unroll (pass p feeds the
head its own outputs of pass p − 1) is :func:`unrolled_loss`.

Imported by :mod:`pipeline.demo.train` and :mod:`pipeline.demo.eagle3`; imports neither (torch
comes late, on one thread, through :func:`pipeline.demo.models.one_thread_torch`). Reads and
writes nothing.
"""

from __future__ import annotations

import contextlib
import math
import os
from functools import lru_cache
from typing import Callable, Iterable

from pipeline.demo.models import one_thread_torch as _torch
from pipeline.infra.measured_choice import best_seconds, forced


def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    """Linear warm-up, then cosine from ``peak`` down to 10 % of it."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))


def make_optimizer(params, lr: float, weight_decay: float):
    torch = _torch()
    return torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=weight_decay)


def optimizer_step(optimizer, params, loss, lr: float) -> None:
    torch = _torch()
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    optimizer.step()


AUTOCAST_ENV = "SPECDEPLOY_TRAIN_AUTOCAST"
AUTOCAST_MODES = ("bf16", "off")


@lru_cache(maxsize=1)
def autocast_mode() -> str:
    """``bf16`` (autocast) or ``off`` (float32 throughout): ``$SPECDEPLOY_TRAIN_AUTOCAST`` if set,
    else ``bf16`` only where a bf16 matmul is not slower than float32's. Why: a CPU without native
    bf16 (AVX2, no AVX-512 BF16) multiplies bf16 in a fallback that was a hundred times slower than
    float32 there, so the same recipe took minutes instead of seconds. The choice is exported to the
    environment, so a training's second process (the EAGLE head) makes the same one."""
    chosen = forced(AUTOCAST_ENV, AUTOCAST_MODES)
    if chosen:
        return chosen
    mode = "bf16" if _bf16_matmul_seconds() <= 2.0 * _bf16_matmul_seconds(float32=True) else "off"
    os.environ[AUTOCAST_ENV] = mode
    return mode


def _bf16_matmul_seconds(float32: bool = False) -> float:
    torch = _torch()
    gen = torch.Generator().manual_seed(0)
    dtype = torch.float32 if float32 else torch.bfloat16
    a, b = (torch.randn(64, 256, generator=gen).to(dtype), torch.randn(256, 256, generator=gen).to(dtype))
    return best_seconds(lambda: a @ b, repeats=3)


def autocast():
    """The training's mixed precision (:func:`autocast_mode`): bf16 autocast, or nothing."""
    torch = _torch()
    if autocast_mode() == "off":
        return contextlib.nullcontext()
    return torch.autocast("cpu", dtype=torch.bfloat16)


def pool_batches(pool, batch: int, steps: int, seed: int):
    """Each batch: half corpus windows, half generated sequences (indices into the pool)."""
    torch = _torch()
    ids, feats, is_generated = pool
    generator = torch.Generator().manual_seed(seed)
    corpus_idx = torch.nonzero(~is_generated).flatten()
    gen_idx = torch.nonzero(is_generated).flatten()
    for _ in range(steps):
        pick_c = corpus_idx[torch.randint(0, len(corpus_idx), (batch // 2,), generator=generator)]
        pick_g = gen_idx[torch.randint(0, len(gen_idx), (batch - batch // 2,), generator=generator)]
        pick = torch.cat([pick_c, pick_g])
        yield ids[pick], feats[pick]


def tail_mean(values: list[float], n: int = 20) -> float:
    tail = values[-n:]
    return round(sum(tail) / len(tail), 4)


def unrolled_loss(unroll: int, first: Callable, again: Callable):
    """Training-time test: ``first() -> (outputs, loss)`` is pass 0; ``again(p, outputs) ->
    (outputs, loss)`` pass p, fed the head's own outputs of pass p − 1; the losses summed."""
    outputs, loss = first()
    for extra in range(1, unroll):
        outputs, more = again(extra, outputs)
        loss = loss + more
    return loss


def train_loop(params, lr: float, weight_decay: float, warmup: int, steps: int, batches: Iterable, label: str,
               progress, loss_of: Callable, metric: str = "loss") -> list[float]:
    """``steps`` optimizer steps, one per batch, ``loss_of(batch)`` each (the progress bar shows
    ``metric``); returns the losses."""
    optimizer = make_optimizer(params, lr, weight_decay)
    losses = []
    for step, (batch, info) in enumerate(zip(batches, progress.steps(label, steps))):
        loss = loss_of(batch)
        optimizer_step(optimizer, params, loss, lr_at(step, steps, lr, warmup))
        losses.append(loss.item())
        info(f"{metric} {loss.item():.3f}")
    return losses
