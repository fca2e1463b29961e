"""`specdeploy render --schedule FILE`: a speculation schedule written into the rendered
speculative arm where its runtime loads one.

Reads the schedule (``RUN_DIR/schedule.json``, :class:`~pipeline.artefacts.schedule.SpeculationSchedule`)
and the files ``render`` just wrote; rewrites, in the speculative arm only:

- the Triton ``llmapi`` model's ``tensorrt_llm/1/model.yaml`` and (GPU) trtllm-serve's
  ``extra_llm_api_options.yaml``: ``speculative_config`` gets the TensorRT-LLM form of the
  configured ``trtllm_version`` (:func:`pipeline.trtllm.schedule_forms.trtllm_form`: ``max_draft_len``
  and ``max_concurrency`` or ``draft_len_schedule``), checked against that version's recorded facts;
  the CPU llmapi model reads the same fields (:mod:`pipeline.triton_models.llmapi_spec`), and
  ``validate --live`` loads them into the installed classes on a GPU host.

Runtimes that cannot load a schedule are refused, saying why: the engine runtime (1.2.x executor,
:func:`pipeline.schedule.forms.engine_runtime_text` words it) and the reference backend's own
Triton model, whose engine takes the schedule from its ``engine.json`` (``draft_len_schedule``),
which ``build`` writes, not ``render``.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from pipeline.artefacts.schedule import SpeculationSchedule
from pipeline.config import DeploymentConfig
from pipeline.errors import UsageError
from pipeline.infra.atomic import write_text_atomic
from pipeline.paths import engine_root, model_repo_dir
from pipeline.render.triton_rules import RenderError
from pipeline.trtllm.llmapi_args import decoding_problems
from pipeline.trtllm.schedule_forms import trtllm_form

ENGINE_RUNTIME = ("the engine runtime (trtllm-build engines, C++ executor) has no batch-size switch: no "
                  "max_concurrency and no draft length per batch size (docs/schedule.md); serve the LLM-API runtime "
                  "(trtllm_runtime: llm_api) to load a schedule")
REFERENCE_ENGINE = ("the reference backend's Triton model runs the built engine.json, whose draft_len_schedule `build` "
                    "writes; render the llmapi layout (trtllm_runtime: llm_api) to load the schedule from model.yaml")


def schedule_files(cfg: DeploymentConfig) -> list[Path]:
    """The speculative arm's files that carry ``speculative_config``."""
    files = [model_repo_dir(cfg, "speculative") / "tensorrt_llm" / "1" / "model.yaml"]
    serve = engine_root(cfg) / "trtllm-serve" / "speculative" / "extra_llm_api_options.yaml"
    return files + ([serve] if serve.is_file() else [])


def schedule_form(cfg: DeploymentConfig, schedule_path: Path) -> dict:
    """The TensorRT-LLM form of the schedule for ``cfg`` (checked before anything is rendered)."""
    schedule = SpeculationSchedule.load(schedule_path)
    if not cfg.speculative:
        raise UsageError(f"render --schedule: {cfg.name} has no speculative arm")
    if not cfg.llmapi_layout:
        raise UsageError("render --schedule: " + (ENGINE_RUNTIME if cfg.backend == "trtllm" else REFERENCE_ENGINE))
    if schedule.method and schedule.method != cfg.method:
        raise UsageError(f"render --schedule: {schedule_path} was derived for {schedule.method}, the config runs {cfg.method}")
    form = trtllm_form(schedule.triples(), cfg.method_info.llmapi_decoding_type, cfg.trtllm_version)
    if not form["expressible"]:
        raise UsageError("render --schedule: " + "; ".join(form["notes"]))
    return {**form, "path": str(schedule_path)}


def apply_schedule(cfg: DeploymentConfig, form: dict) -> list[str]:
    """Merge :func:`schedule_form`'s fields into the rendered speculative arm; the notes to print."""
    notes = [f"schedule {form['path']}: speculative_config {form['fields']}", *form["notes"]]
    for path in schedule_files(cfg):
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        spec = dict(data.get("speculative_config") or {})
        spec.pop("max_concurrency", None)
        spec.pop("draft_len_schedule", None)
        spec.update(form["fields"])
        problems = decoding_problems(cfg, spec, f"{path}: speculative_config")
        if problems:
            raise RenderError(problems)
        data["speculative_config"] = spec
        write_text_atomic(path, yaml.safe_dump(data, sort_keys=False))
        notes.append(f"wrote the schedule into {path}")
    return notes
