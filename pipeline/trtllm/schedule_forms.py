"""A speculation schedule as TensorRT-LLM's LLM API loads it: the ``speculative_config`` fields
``max_concurrency`` and ``draft_len_schedule`` (``DecodingBaseConfig``,
``tensorrt_llm/llmapi/llm_args.py``), per recorded release line (``llmapi_facts.yaml``).

Takes the schedule as ``(min, max, K)`` triples (max None: open) so it imports nothing above
this layer; returns plain dicts and notes; writes nothing.

What upstream does with the two fields, as read (NVIDIA/TensorRT-LLM):

- ``max_concurrency``: ``Drafter.should_use_spec_decode`` (``tensorrt_llm/_torch/speculative/drafter.py``)
  speculates while min(requests, max_batch_size, max_num_tokens // (1 + max_draft_len)) <=
  max_concurrency. Present in every stored ``drafter.py`` version and in every recorded line
  (1.2: ``ge=0``; 1.3.0rc27 / 1.4.0rc4: ``gt=0``).
- ``draft_len_schedule`` (``dict[int, int]``): its keys changed meaning between builds. One stored
  ``drafter.py`` (with ``bisect_right``) and its ``llm_args.py`` validator take a key as the *lowest*
  batch size of its K, require key 1 and ``schedule[1] == max_draft_len``; PR #10860 (merged
  2026-03-13, "dynamic draft length on the one-model path") reads a key as the *highest* batch size
  of its K and resolves batch sizes above the largest key to 0. The form emitted here names both
  ends of every range (``{lo: K, hi: K, …, off: 0}``), which resolves to the same K per batch size
  under either reading; its K never rise with the batch and start at ``max_draft_len``, which the
  older validator demands.
- One-engine drafters (EAGLE-3 one-model, the default, and MTP) carry drafter state across steps
  that only a draft forward refreshes; PR #16888 (open, 2026-07-27) reports that a schedule or
  ``max_concurrency`` resolving to 0 leaves it stale and acceptance collapses silently once
  speculation resumes, and floors such schedules at 1. Until a release with that fix is pinned, the
  form for those decoding types floors K at 1 and leaves ``max_concurrency`` out, and says so.
"""

from __future__ import annotations

from typing import Any

from pipeline.trtllm.llmapi_facts import facts_for

Triple = tuple[int, "int | None", int]
ONE_ENGINE = ("Eagle3", "Eagle", "MTP")  # decoding types whose drafter runs inside the target's engine (one model)

SOURCES = {
    "max_concurrency": "NVIDIA/TensorRT-LLM tensorrt_llm/_torch/speculative/drafter.py (Drafter.should_use_spec_decode); "
                       "tensorrt_llm/llmapi/llm_args.py DecodingBaseConfig.max_concurrency",
    "draft_len_schedule": "NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/llm_args.py DecodingBaseConfig.draft_len_schedule "
                          "(validate_draft_len_schedule_and_sort); drafter.py get_draft_len_for_batch_size; PR #10860",
    "one_engine_floor": "NVIDIA/TensorRT-LLM PR #16888 (open): a schedule resolving to 0 leaves one-engine drafter state stale",
}


def monotone(triples: list[Triple]) -> tuple[list[Triple], bool]:
    """K made non-increasing with the batch size (each K at most every K before it); True when one changed."""
    out, cap, changed = [], None, False
    for lo, hi, k in triples:
        new = k if cap is None else min(k, cap)
        changed |= new != k
        out.append((lo, hi, new))
        cap = new
    return out, changed


def schedule_dict(triples: list[Triple], floor: int = 0) -> dict[int, int]:
    """``{lo: K, hi: K, …}`` over the ranges (an open last range: its ``lo`` only); K below
    ``floor`` raised to it."""
    out: dict[int, int] = {}
    for lo, hi, k in triples:
        k = max(k, floor)
        out[lo] = k
        if hi is not None:
            out[hi] = k
    return out


def trtllm_form(triples: list[Triple], decoding_type: str | None, trtllm_version: str,
                one_model: bool = True) -> dict[str, Any]:
    """``speculative_config`` fields (``fields``) for ``trtllm_version``'s line, the ``notes`` that
    say where the form is not the schedule itself, and ``expressible`` (False: not at all)."""
    facts = facts_for(trtllm_version)
    line = facts.line if facts else trtllm_version
    notes: list[str] = []
    if decoding_type is None:
        return {"line": line, "fields": {}, "expressible": False, "sources": SOURCES,
                "notes": ["this method has no LLM-API decoding config: the LLM API cannot run it (see the engine runtime)"]}
    spec_fields = facts.decoding_type(decoding_type)["fields"] if facts and facts.decoding_type(decoding_type) else {}
    triples, changed = monotone(triples)
    if changed:
        notes.append("K made non-increasing with the batch size (TensorRT-LLM's schedule starts at max_draft_len)")
    k_first = triples[0][2]
    if k_first == 0:
        return {"line": line, "fields": {}, "expressible": False, "sources": SOURCES,
                "notes": notes + ["speculation pays at no batch size: deploy the baseline, no speculative_config"]}
    on = [t for t in triples if t[2] > 0]
    off_from = next((lo for lo, _, k in triples if k == 0), None)
    one_engine = decoding_type in ONE_ENGINE and (one_model or decoding_type == "MTP")
    floor = 1 if one_engine and off_from is not None else 0
    fields: dict[str, Any] = {"max_draft_len": k_first}
    varies = len({k for _, _, k in on}) > 1
    if floor:
        notes.append(f"{decoding_type} runs its drafter inside the target's engine: K is floored at 1 above "
                     f"concurrency {off_from - 1} instead of 0 and max_concurrency is left out, because a schedule "
                     "resolving to 0 leaves the drafter's state stale and acceptance collapses once speculation "
                     "resumes (NVIDIA/TensorRT-LLM PR #16888, open); drop the floor on a release that carries the fix")
    if varies or floor:
        if "draft_len_schedule" not in spec_fields:
            notes.append(f"TensorRT-LLM {line} records no draft_len_schedule: only max_concurrency is emitted, "
                         f"with K {k_first} below it (the schedule's lower K are not expressible)")
            if off_from is not None and not floor:
                fields["max_concurrency"] = off_from - 1
        else:
            fields["draft_len_schedule"] = schedule_dict(triples, floor)
            notes.append("draft_len_schedule names both ends of each range, so it means the same K per batch size "
                         "whether a build reads a key as the lowest batch size of its K (llm_args.py validator) or the "
                         "highest (PR #10860)")
    elif off_from is not None:
        fields["max_concurrency"] = off_from - 1
    if facts and facts.line == "1.2" and "draft_len_schedule" in fields:
        notes.append("1.2: draft_len_schedule is in the read pre-1.3 llm_args.py, not verified at the v1.2.x tags; "
                     "`specdeploy validate --live` loads it into the installed classes; if that refuses it, use "
                     f"max_concurrency: {off_from - 1 if off_from else '(none)'} with max_draft_len {k_first}")
    return {"line": line, "fields": fields, "expressible": True, "notes": notes, "sources": SOURCES}


def _lowest_key(schedule: dict[int, int], batch: int) -> int:
    """The read llm_args.py / bisect_right drafter: the K of the largest key <= batch (0 below the first)."""
    keys = [k for k in sorted(schedule) if k <= batch]
    return schedule[keys[-1]] if keys else 0


def _highest_key(schedule: dict[int, int], batch: int) -> int:
    """PR #10860: the K of the smallest key >= batch (0 above the largest)."""
    keys = [k for k in sorted(schedule) if k >= batch]
    return schedule[keys[0]] if keys else 0


def triples_from_fields(spec: dict[str, Any], max_batch_size: int) -> list[Triple] | None:
    """The ``(min, max, K)`` ranges a ``speculative_config``'s ``max_concurrency`` /
    ``draft_len_schedule`` describe for batch sizes 1..``max_batch_size`` (None: neither given).
    ValueError for a schedule whose K differs between the two key readings at some batch size
    (the engine cannot know which build's meaning was intended) or that exceeds ``max_draft_len``."""
    top = int(spec.get("max_draft_len") or 0)
    schedule, limit = spec.get("draft_len_schedule"), spec.get("max_concurrency")
    if schedule is None and limit is None:
        return None
    per_batch = []
    for batch in range(1, max_batch_size + 2):  # one past the largest batch: what any larger batch gets
        k = top
        if schedule:
            table = {int(key): int(value) for key, value in schedule.items()}
            k, other = _lowest_key(table, batch), _highest_key(table, batch)
            if k != other:
                raise ValueError(f"draft_len_schedule {schedule} gives batch size {batch} K {k} read by its lowest "
                                 f"key and K {other} by its highest (builds differ): name both ends of every range")
            if k > top:
                raise ValueError(f"draft_len_schedule: K {k} exceeds max_draft_len {top}")
        if limit is not None and batch > int(limit):
            k = 0
        per_batch.append(k)
    triples: list[Triple] = []
    for batch, k in enumerate(per_batch, start=1):
        if triples and triples[-1][2] == k:
            triples[-1] = (triples[-1][0], batch, k)
        else:
            triples.append((batch, batch, k))
    triples[-1] = (triples[-1][0], None, triples[-1][2])
    return triples
