"""A choice between kernels that the environment can force and is otherwise measured on this
machine: the engine's int8 product (:mod:`pipeline.reference.int8_gemm`) and the demo training's
mixed precision (:mod:`pipeline.demo.head_training`). Reads the environment variable it is given;
writes nothing."""

from __future__ import annotations

import os
import time
from typing import Callable


def forced(env: str, choices: tuple[str, ...]) -> str | None:
    """``$env`` when set (it must be one of ``choices``: a typo is an error naming the variable),
    else None: measure."""
    value = os.environ.get(env, "").strip()
    if not value:
        return None
    if value not in choices:
        raise ValueError(f"{env}={value!r}: expected one of {', '.join(choices)} (or unset, to measure)")
    return value


def best_seconds(fn: Callable[[], object], repeats: int = 5) -> float:
    """The fastest of ``repeats`` timed calls of ``fn``, after one untimed call (allocation, kernel
    selection): the kernel's own cost, not a slow moment of the host."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best
