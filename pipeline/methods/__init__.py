"""The speculation methods on the deployment side: one module per method, one registry.

Reads and writes nothing. ``METHODS`` maps each method's name (the ``speculation.method`` of a
config) to its :class:`~pipeline.methods.base.Method` object, in the order the CLI and the schema
list them; :func:`get_method` looks one up. The config (:mod:`pipeline.config.deployment`) reads its
``speculation`` union from here; the method modules import only the config's building blocks
(:mod:`pipeline.config_base`), never the config, so either package may be imported first.
"""

from __future__ import annotations

from pipeline.methods import draft_target, eagle, eagle3, lookahead, medusa, mtp, ngram, none
from pipeline.methods.base import ENGINE, LLM_API, REFERENCE, Method

METHODS: dict[str, Method] = {m.METHOD.name: m.METHOD for m in (none, draft_target, medusa, eagle, eagle3, ngram, mtp, lookahead)}

__all__ = ["ENGINE", "LLM_API", "METHODS", "REFERENCE", "Method", "get_method", "method_for_engine_mode", "method_for_proposer"]


def get_method(name: str) -> Method:
    """The method called ``name`` (KeyError names the valid ones)."""
    try:
        return METHODS[name]
    except KeyError:
        raise KeyError(f"unknown speculation method {name!r}; valid: {', '.join(METHODS)}") from None


def method_for_proposer(proposer: str) -> Method:
    """The method whose CPU reference proposer is registered as ``proposer``."""
    return next(m for m in METHODS.values() if (m.proposer or m.name) == proposer)


def method_for_engine_mode(mode: str) -> Method | None:
    """The method whose engine is built with ``--speculative_decoding_mode mode`` and served with
    its own ``decoding_mode`` (draft_tokens_external serves two methods and has none)."""
    return next((m for m in METHODS.values() if m.engine_mode == mode and m.triton_decoding_mode), None)
