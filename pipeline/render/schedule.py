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

- the reference backend's own Triton model (ensemble or BLS layout): a third repository
  ``model_repo/scheduled/`` (:func:`render_scheduled`), the speculative arm's models whose engine is a
  copy of the speculative engine descriptor carrying the schedule as ``draft_len_schedule``
  (``engines/NAME/scheduled/engine.json``: the engine drafts the K of the range holding its live
  batch), with its deployment descriptor ``scheduled.render.json`` (arm ``scheduled``). The
  baseline and speculative arms are left as they are, so one load test measures all three.

Runtimes that cannot load a schedule are refused, saying why: the engine runtime (1.2.x executor,
:func:`pipeline.schedule.forms.engine_runtime_text` words it), and on the reference backend a BLS
that sends its own drafts (draft-target or n-gram orchestrated by the BLS: the engine verifies
external drafts as the request sent them, so a schedule in the engine would not cut them).
"""

from __future__ import annotations

from pathlib import Path

import yaml

from pipeline.artefacts.deployment import SCHEDULED, descriptor_path
from pipeline.artefacts.engine import EngineDescriptor
from pipeline.artefacts.names import ENGINE_DESCRIPTOR
from pipeline.artefacts.schedule import SpeculationSchedule
from pipeline.config import DeploymentConfig
from pipeline.errors import UsageError
from pipeline.infra.atomic import write_text_atomic
from pipeline.paths import engine_root, model_repo_dir
from pipeline.render.arms import decide_arm
from pipeline.render.monitoring import write_operations_view
from pipeline.render.renderer import (
    TEMPLATES_DIR,
    _check_runtime_knobs,
    arm_layout,
    load_manifest,
    model_contexts,
    render_model,
)
from pipeline.render.templating import jinja_environment, render_atomically
from pipeline.render.triton_rules import RenderError, validate_repository
from pipeline.trtllm.llmapi_args import decoding_problems
from pipeline.trtllm.schedule_forms import trtllm_form

ENGINE_RUNTIME = ("the engine runtime (trtllm-build engines, C++ executor) has no batch-size switch: no "
                  "max_concurrency and no draft length per batch size (docs/schedule.md); serve the LLM-API runtime "
                  "(trtllm_runtime: llm_api) to load a schedule")
BLS_DRAFTS = ("the BLS sends its own drafts (speculation.orchestration: bls) and the engine verifies external drafts "
              "as sent, so a schedule in the engine would not cut them; use orchestration: engine (draft-target) or "
              "the engine's own n-gram proposer to serve a scheduled arm")


def schedule_files(cfg: DeploymentConfig) -> list[Path]:
    """The speculative arm's files that carry ``speculative_config``."""
    files = [model_repo_dir(cfg, "speculative") / "tensorrt_llm" / "1" / "model.yaml"]
    serve = engine_root(cfg) / "trtllm-serve" / "speculative" / "extra_llm_api_options.yaml"
    return files + ([serve] if serve.is_file() else [])


def serves_scheduled_arm(cfg: DeploymentConfig) -> bool:
    """The reference backend's own layout can serve a scheduled arm: the engine makes the drafts it
    verifies (not a BLS sending its own)."""
    return (cfg.backend == "reference" and not cfg.llmapi_layout and cfg.speculative
            and decide_arm(cfg, "speculative").drafts != "bls")


def schedule_form(cfg: DeploymentConfig, schedule_path: Path) -> dict:
    """The TensorRT-LLM form of the schedule for ``cfg`` (checked before anything is rendered)."""
    schedule = SpeculationSchedule.load(schedule_path)
    if not cfg.speculative:
        raise UsageError(f"render --schedule: {cfg.name} has no speculative arm")
    if not cfg.llmapi_layout and cfg.backend == "trtllm":
        raise UsageError("render --schedule: " + ENGINE_RUNTIME)
    if schedule.method and schedule.method != cfg.method:
        raise UsageError(f"render --schedule: {schedule_path} was derived for {schedule.method}, the config runs {cfg.method}")
    if not cfg.llmapi_layout:  # the reference backend's own model: a scheduled arm beside the A/B arms
        if not serves_scheduled_arm(cfg):
            raise UsageError("render --schedule: " + BLS_DRAFTS)
        return {"kind": "reference", "schedule": schedule, "path": str(schedule_path)}
    form = trtllm_form(schedule.triples(), cfg.method_info.llmapi_decoding_type, cfg.trtllm_version)
    if not form["expressible"]:
        raise UsageError("render --schedule: " + "; ".join(form["notes"]))
    return {**form, "kind": "llmapi", "path": str(schedule_path)}


def apply_schedule(cfg: DeploymentConfig, form: dict) -> list[str]:
    """Merge :func:`schedule_form`'s fields into the rendered speculative arm (llmapi layout), or
    render the scheduled arm (reference backend); the notes to print."""
    if form["kind"] == "reference":
        repo = render_scheduled(cfg, form["schedule"], Path(form["path"]))
        ranges = ", ".join(f"{r.min_concurrency}-{'' if r.max_concurrency is None else r.max_concurrency}: K {r.draft_len}"
                           for r in form["schedule"].ranges)
        return [f"schedule {form['path']}: draft_len_schedule {ranges}",
                f"rendered the scheduled arm {repo} (serve it: specdeploy serve CONFIG --variant scheduled)"]
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


def scheduled_engine_dir(cfg: DeploymentConfig) -> Path:
    """``engines/NAME/scheduled/``: the speculative engine's descriptor with the schedule, beside the built engines."""
    return engine_root(cfg) / SCHEDULED


def write_scheduled_engine(cfg: DeploymentConfig, speculative_engine: Path, schedule: SpeculationSchedule) -> Path:
    """The speculative engine descriptor again, its directories made absolute (the copy lives
    elsewhere) and ``draft_len_schedule`` set: the same weights and proposer, K per live batch."""
    source = EngineDescriptor.load(Path(speculative_engine) / ENGINE_DESCRIPTOR)
    data = source.dump()

    def absolute(value: str) -> str:
        path = Path(value)
        return value if path.is_absolute() else str((Path(speculative_engine) / path).resolve())

    data["model_dir"] = absolute(data["model_dir"])
    for key in ("draft_dir", "heads_dir", "head_dir"):
        if data["proposer"].get(key):
            data["proposer"][key] = absolute(data["proposer"][key])
    data["draft_len_schedule"] = [r.model_dump() for r in schedule.ranges]
    out = scheduled_engine_dir(cfg)
    EngineDescriptor.model_validate(data).write(out / ENGINE_DESCRIPTOR)
    return out


def render_scheduled(cfg: DeploymentConfig, schedule: SpeculationSchedule, schedule_path: Path) -> Path:
    """``model_repo/scheduled/``: the speculative arm's models (ensemble or BLS layout) on the
    scheduled engine, validated and swapped in like every repository, and its descriptor."""
    manifest = load_manifest(cfg)
    engines = dict(manifest.get("engines") or {})
    if "speculative" not in engines:
        raise RenderError([f"manifest has no speculative engine (engines: {sorted(engines)}); re-run `specdeploy build`"])
    engines["speculative"] = str(write_scheduled_engine(cfg, Path(engines["speculative"]), schedule))
    layout = arm_layout(cfg)
    placement = layout.arms.get("speculative")
    contexts = model_contexts(cfg, {**manifest, "engines": engines}, "speculative", placement)
    env = jinja_environment(TEMPLATES_DIR)
    dest = model_repo_dir(cfg, SCHEDULED)

    def fill(tmp: Path) -> list[str]:
        for model_name, (template_dir, context) in contexts.items():
            render_model(env, TEMPLATES_DIR, template_dir, context, model_name, tmp)
        warnings = validate_repository(tmp, backend=cfg.backend)
        _check_runtime_knobs(cfg, tmp)
        return warnings

    render_atomically(dest, fill)
    write_operations_view(cfg, SCHEDULED, dest)
    decide_arm(cfg, SCHEDULED, manifest, layout.summary("speculative"), schedule,
               str(Path(schedule_path).resolve())).write(descriptor_path(dest))
    return dest
