"""No speculation: the baseline alone, one arm, no speculative engine.

Reads and writes nothing; registered in :mod:`pipeline.methods` as ``none``.
"""

from __future__ import annotations

from typing import Literal

from pipeline.config_base import Section, described
from pipeline.methods.base import ENGINE, LLM_API, REFERENCE, Method


class NoSpeculation(Section):
    """Baseline only: no speculative arm."""

    method: Literal["none"] = described("Speculation method.", default="none")

class NoneMethod(Method):
    name = "none"
    section = NoSpeculation
    title = "no speculation"
    speculative = False
    runtimes = frozenset({ENGINE, LLM_API, REFERENCE})

METHOD = NoneMethod()
