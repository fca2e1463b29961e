"""The suite's one "poll until a condition holds or a timeout passes" (it was written out about a
dozen times): :func:`wait_until`. Used by unit and integration tests alike (``tests.polling``).

Reads only what the predicate reads; writes nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], what: str, timeout: float = 60.0, *, interval: float = 0.05,
               detail: Callable[[], Any] | None = None) -> T:
    """Call ``predicate`` every ``interval`` seconds until it returns something truthy, and return
    that. After ``timeout`` seconds the test fails with ``not within <timeout> s: <what>``, the
    predicate's last value unless it was ``None`` or ``False``, and ``detail()`` (a log tail, the
    last counters) when given. An exception from the predicate is not caught: it fails the test at
    once (a server that died, a process that ended too early)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            break
        time.sleep(interval)
    message = f"not within {timeout:g} s: {what}"
    if value is not None and value is not False:
        message += f" (last: {value!r})"
    if detail is not None:
        message += f"\n{detail()}"
    pytest.fail(message)
