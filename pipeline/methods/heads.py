"""Checks the head methods share: a head's hidden and vocabulary sizes against the target's.

Reads nothing itself (the caller passes what validate read from the head's directory); used by the
``check_head`` hooks of :mod:`pipeline.methods.medusa` and :mod:`pipeline.methods.eagle`.
"""

from __future__ import annotations

from typing import Any

from pipeline.validate.severity import ERROR


def check_head_dims(ctx: Any, role: str, field_path: str, dims: dict[str, int | None]) -> None:
    """``ctx``: validate's CheckContext (not named here: it would tie this module into the config ↔
    methods cycle that the registration is to remove)."""
    target = ctx.shapes.get("target")
    if target is None:
        return
    for key, expected in (("hidden_size", target.hidden_size), ("vocab_size", target.vocab_size)):
        if dims.get(key) is not None and dims[key] != expected:
            ctx.add(ERROR, "heads", f"{role} {key} {dims[key]} does not match the target's {expected}",
                    "use heads trained for this target", field_path)
