"""A speculation schedule in each engine's own form, and the files ``specdeploy schedule`` writes.

- TensorRT-LLM LLM API (``extra_llm_api_options.yaml``, the Triton ``llmapi`` model's
  ``model.yaml``): ``speculative_config`` fields per recorded release line
  (:mod:`pipeline.trtllm.schedule_forms`);
- vLLM ``--speculative-config``: ``num_speculative_tokens_per_batch_size``, a list of
  ``[start_bs, end_bs, K]`` (inclusive; the first starts at 1; K ≤ ``num_speculative_tokens``; K 0 =
  no drafts; batch sizes past the last range keep its K). Read in vllm-project/vllm
  ``docs/features/speculative_decoding/dynamic_speculative_decoding.md`` (015a47e) and
  ``vllm/v1/spec_decode/dynamic/utils.py`` (``validate_and_normalize_dynamic_sd_schedule``,
  14b450c; a later version adds 5-item entries with a context range); the field is
  ``SpeculativeConfig.num_speculative_tokens_per_batch_size`` in ``vllm/config/speculative.py``;
- the engine runtime (TensorRT-LLM 1.2.x C++ executor behind the Triton ``tensorrtllm`` backend):
  what it can and cannot express, in words.

Reads nothing; :func:`write_forms` writes ``RUN_DIR/schedule/``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from pipeline.artefacts.schedule import SpeculationSchedule
from pipeline.infra.atomic import write_text_atomic
from pipeline.methods import METHODS
from pipeline.trtllm.schedule_forms import trtllm_form

TRTLLM_LINES = ("1.2.1", "1.3.0rc29", "1.4.0rc4")  # the newest recorded version of each line (versions.yaml)
VLLM_SOURCE = ("vllm-project/vllm docs/features/speculative_decoding/dynamic_speculative_decoding.md @015a47e; "
               "vllm/v1/spec_decode/dynamic/utils.py @14b450c (validate_and_normalize_dynamic_sd_schedule)")


def vllm_form(schedule: SpeculationSchedule, max_batch_size: int | None = None) -> dict[str, Any]:
    """The ``--speculative-config`` keys of the schedule (merge with ``model`` as deployed)."""
    notes = []
    known = METHODS.get(schedule.method or "")
    method = known.vllm_method if known is not None else None  # vLLM's speculative_config.method
    if schedule.method and method is None:
        notes.append(f"vLLM has no {schedule.method} speculation: the form carries the schedule only")
    if schedule.max_draft_len == 0:
        return {"config": {}, "notes": notes + ["speculation pays at no batch size: serve without --speculative-config"],
                "source": VLLM_SOURCE}
    entries = []
    for lo, hi, k in schedule.triples():
        entries.append([lo, hi if hi is not None else max(lo, max_batch_size or lo), k])
    notes.append("batch sizes past the last range keep its K (utils.py build_dynamic_sd_schedule_lookup), so the "
                 "last range's K holds for every larger batch")
    notes.append("vLLM's docs list Eagle, Eagle-3 and DFlash as tested; with --data-parallel-size > 1 vLLM drops the "
                 "schedule and runs the static num_speculative_tokens")
    config: dict[str, Any] = {"num_speculative_tokens": schedule.max_draft_len,
                              "num_speculative_tokens_per_batch_size": entries}
    if method:
        config = {"method": method, **config}
    return {"config": config, "notes": notes, "source": VLLM_SOURCE}


def engine_runtime_text(schedule: SpeculationSchedule) -> list[str]:
    """What the 1.2.x executor (engine flow) can and cannot express of the schedule."""
    method = METHODS.get(schedule.method or "")
    lines = [
        "The engine runtime (trtllm-build engines, C++ executor, Triton tensorrtllm backend) has no batch-size "
        "switch: no max_concurrency and no draft length per batch size. The draft capacity is fixed at build time "
        "(--max_draft_len, Medusa/EAGLE choices), and the executor drafts at it for every request at every batch size.",
    ]
    if method is not None and method.per_request_draft_len:
        lines.append("draft-target: each request carries its own draft tokens (num_draft_tokens, up to the "
                     "target's --max_draft_len), so an orchestrator that knows the live concurrency (the BLS) could "
                     "send the schedule's K per request and target-only requests where K is 0; specdeploy's BLS does "
                     "not do this yet, so serving this schedule on the engine runtime is not possible today.")
    lines.append("What is possible: build with K = the schedule's K at concurrency 1 and route traffic above "
                 f"concurrency {schedule.off_from - 1 if schedule.off_from else '(none)'} to a baseline deployment, or "
                 "serve the LLM-API runtime (trtllm_runtime: llm_api) that loads the schedule natively.")
    return lines


def all_forms(schedule: SpeculationSchedule, max_batch_size: int | None = None) -> dict[str, Any]:
    method = METHODS.get(schedule.method or "")
    decoding = method.llmapi_decoding_type if method is not None else None
    return {"trtllm_llmapi": {version: trtllm_form(schedule.triples(), decoding, version) for version in TRTLLM_LINES},
            "decoding_type": decoding,
            "vllm": vllm_form(schedule, max_batch_size),
            "engine_runtime": engine_runtime_text(schedule)}


def write_forms(schedule: SpeculationSchedule, out_dir: Path, max_batch_size: int | None = None) -> list[Path]:
    """``out_dir/trtllm-<line>.speculative_config.yaml`` (merge into model.yaml /
    extra_llm_api_options.yaml), ``vllm-speculative-config.json``, ``engine-runtime.txt``."""
    forms = all_forms(schedule, max_batch_size)
    written = []
    for version, form in forms["trtllm_llmapi"].items():
        body = {"speculative_config": {"decoding_type": forms["decoding_type"], **form["fields"]}} if form["fields"] else {}
        head = "".join(f"# {n}\n" for n in [f"TensorRT-LLM {form['line']} ({version}): merge into speculative_config "
                                            "of model.yaml / extra_llm_api_options.yaml", *form["notes"]])
        path = out_dir / f"trtllm-{form['line']}.speculative_config.yaml"
        write_text_atomic(path, head + (yaml.safe_dump(body, sort_keys=False) if body else "# nothing to load\n"))
        written.append(path)
    path = out_dir / "vllm-speculative-config.json"
    write_text_atomic(path, json.dumps(forms["vllm"], indent=2) + "\n")
    written.append(path)
    path = out_dir / "engine-runtime.txt"
    write_text_atomic(path, "\n\n".join(forms["engine_runtime"]) + "\n")
    written.append(path)
    return written
