"""The prompts a CPU calibration times the engine's steps on: the deployment's own load-test
prompts, so the acceptance the calibration sees (how many tokens each step accepts, rolls back,
catches up) is the deployment's, not that of synthetic token ids.

Reads the config's prompt set (``loadtest.prompts``, one ``<category>.jsonl`` per category, as the
load test reads it: :func:`pipeline.loadtest.inputs.load_prompt_set`) and the target checkpoint's
``tokenizer.json``; writes nothing. Returns token-id prompts grouped by category (the
``prompt_groups`` of :func:`pipeline.forecast.cpu.calibrate`) and a sentence saying which prompts
they are, for the calibration's ``prompts`` field. Without a usable prompt set or tokenizer the
groups are None (``calibrate`` then uses its synthetic prompts) and the sentence says why.

The prompts are held out from what ``specdeploy bench`` measures (the first few of each
category): index :data:`HELD_OUT` on, so ``benchmarks/bench_forecast_cpu.py`` never checks a
calibration against the prompts it was made on.
"""

from __future__ import annotations

from typing import Callable

from pipeline.engine_bench import _encode, resolve_checkpoint
from pipeline.loadtest.inputs import load_prompt_set

HELD_OUT = 30  # calibration prompts start here in each category; the bench measures the first ones
PER_CATEGORY = 3
# calibrate's engines hold 512 positions, a generation adds 48 tokens and a few drafts: longer
# prompts are cut to this many tokens
MAX_PROMPT_TOKENS = 384


def held_out_groups(prompts: dict[str, list[str]], encode: Callable[[str], list[int]],
                    per_category: int = PER_CATEGORY, start: int = HELD_OUT,
                    max_tokens: int | None = None, strict: bool = False) -> list[list[list[int]]]:
    """Per category, ``per_category`` prompts from index ``start`` on, as token ids (cut to
    ``max_tokens``). A category with no prompt at ``start`` gives its last ``per_category``
    instead, so a small prompt set still calibrates on its own text — unless ``strict`` (a check
    that measures the first prompts must never calibrate on them): then none."""
    groups = []
    for texts in prompts.values():
        chosen = texts[start:start + per_category] or ([] if strict else texts[-per_category:])
        group = [ids[:max_tokens] if max_tokens else ids for ids in map(encode, chosen)]
        group = [ids for ids in group if ids]
        if group:
            groups.append(group)
    return groups


def config_prompt_groups(cfg, per_category: int = PER_CATEGORY) -> tuple[list[list[list[int]]] | None, str]:
    """(token-id prompts per category of the config's load-test prompt set, what they are), or
    (None, why not) when the prompt set or the target's tokenizer cannot be used."""

    try:
        rows, dataset = load_prompt_set(cfg)
        encode = _encode(resolve_checkpoint(cfg.target.checkpoint))
        by_category: dict[str, list[str]] = {}
        for row in rows:
            by_category.setdefault(row["category"], []).append(row["prompt"])
        limit = min(cfg.build.max_input_len, MAX_PROMPT_TOKENS)
        groups = held_out_groups(by_category, encode, per_category, max_tokens=limit)
    except Exception as exc:  # noqa: BLE001 - any reason the prompts cannot be used means synthetic ones
        return None, f"synthetic token ids (the load-test prompts could not be used: {type(exc).__name__}: {exc})"
    if not groups:
        return None, f"synthetic token ids (no prompt of {dataset['path']} tokenizes to any token)"
    return groups, (f"load-test prompts {dataset['path']}, tokenized by the target's tokenizer: "
                    f"{len(groups)} categories × up to {per_category} prompts from index {HELD_OUT} on "
                    "(a shorter category: its last ones), one category per generation")
