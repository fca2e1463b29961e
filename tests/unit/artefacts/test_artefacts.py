"""Typed artefacts (pipeline.artefacts): round trips, schema name/version refusals, unknown keys,
defaults in one place, the schema command, and serve/loadtest working from the deployment
descriptor alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from pydantic import ValidationError

from pipeline.artefacts import ARTEFACTS, artefact_model
from pipeline.artefacts.base import ArtefactError
from pipeline.artefacts.deployment import descriptor_path, load_arm
from pipeline.artefacts.engine import EngineDescriptor, MedusaProposer
from pipeline.artefacts.manifest import BuildManifest
from pipeline.artefacts.records import RawRecord
from pipeline.artefacts.runs import RunResults
from pipeline.config import parse_config
from pipeline.errors import StaleInputError
from pipeline.paths import PROJECT_ROOT
from pipeline.render.arms import decide_arm

SAMPLES = {
    "engine": lambda: EngineDescriptor(model_dir="/m", role="speculative",
                                       proposer={"method": "medusa", "heads_dir": "/h", "num_heads": 2}),
    "manifest": lambda: BuildManifest(config_hash="abc", engines={"baseline": "/e"}, tokenizer_dir="/t"),
    "runs": lambda: RunResults(runs=[]),
}


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_round_trip(tmp_path, name):
    model = SAMPLES[name]()
    path = model.write(tmp_path / "a.json")
    data = json.loads(path.read_text())
    assert data["schema"] == model.SCHEMA and data["schema_version"] == model.VERSION
    assert type(model).load(path) == model


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_other_schema_name_or_version_is_refused_naming_file_expected_and_found(tmp_path, name):
    model = SAMPLES[name]()
    data = model.dump()
    for key, value in (("schema", "specdeploy-other/1"), ("schema_version", 2)):
        path = tmp_path / f"{key}.json"
        path.write_text(json.dumps({**data, key: value}))
        with pytest.raises(ArtefactError) as err:
            type(model).load(path)
        text = str(err.value)
        assert str(path) in text and repr(model.SCHEMA) in text and f"version {model.VERSION}" in text
        assert repr(value) in text and f"re-run `{model.WRITER}`" in text


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_unknown_key_is_an_error(tmp_path, name):
    path = tmp_path / "a.json"
    path.write_text(json.dumps({**SAMPLES[name]().dump(), "tokenizer_dri": "/t"}))
    with pytest.raises(ArtefactError, match="tokenizer_dri: Extra inputs are not permitted"):
        type(SAMPLES[name]()).load(path)


def test_file_without_a_schema_tag_is_refused(tmp_path):
    path = tmp_path / "engine.json"
    path.write_text(json.dumps({"model_dir": "/m"}))
    with pytest.raises(ArtefactError, match="carries no schema tag.*re-run `specdeploy build`"):
        EngineDescriptor.load(path)


def test_legacy_format_tag_is_the_same_schema(tmp_path):
    """Files written before ``schema`` existed carry ``format``; same family and version load."""
    path = tmp_path / "engine.json"
    path.write_text(json.dumps({"format": "specdeploy-reference-engine/1", "model_dir": "/m"}))
    assert EngineDescriptor.load(path).model_dir == "/m"
    path.write_text(json.dumps({"format": "specdeploy-reference-engine/2", "model_dir": "/m"}))
    with pytest.raises(ArtefactError, match="format 'specdeploy-reference-engine/2'"):
        EngineDescriptor.load(path)


def test_nested_typo_names_the_field_path():
    with pytest.raises(ValueError, match="proposer.medusa.num_head"):
        EngineDescriptor.checked({"model_dir": "/m", "proposer": {"method": "medusa", "heads_dir": "/h",
                                                                   "num_head": 2}})


def test_build_step_flags_take_their_defaults_from_the_descriptor(monkeypatch):
    from pipeline.build import reference_step as build_step

    base = ["engine", "--out", "o", "--role", "baseline", "--model-dir", "m", "--max-batch-size", "1",
            "--max-seq-len", "8", "--max-input-len", "4"]
    args = build_step.parser().parse_args(base)
    for flag in ("quantization", "max_draft_len", "compute_dtype", "threads", "prefix_cache_entries", "name"):
        assert getattr(args, flag) == EngineDescriptor.model_fields[flag].default, flag
    # change the model's default: the flag follows (one source)
    monkeypatch.setattr(EngineDescriptor.model_fields["prefix_cache_entries"], "default", 7)
    assert build_step.parser().parse_args(base).prefix_cache_entries == 7


def test_descriptor_defaults_fill_what_a_file_leaves_out():
    d = EngineDescriptor.model_validate({"model_dir": "/m", "role": "speculative",
                                         "proposer": {"method": "eagle", "head_dir": "/h"}})
    assert (d.max_batch_size, d.max_seq_len, d.prefix_cache_entries, d.threads) == (8, 512, 64, 1)
    assert d.proposer.num_layers == 4 and not d.proposer.draft_int8
    assert "draft_int8" not in d.dump()["proposer"]  # written only when on
    assert MedusaProposer(heads_dir="/h").num_heads is None


def test_the_raw_record_has_one_definition_the_locust_side_imports_without_pydantic():
    """The Locust users build records from pipeline.artefacts.records.RawRecordFields, the one
    definition; the pydantic model is generated from it on first use, so the Locust processes'
    start-up imports no pydantic (0.25-0.45 s each on this host)."""
    code = ("import sys, lt_common, pipeline.artefacts.records as r; assert 'pydantic' not in sys.modules, 'pydantic';"
            "assert lt_common.RawRecordFields is r.RawRecordFields; m = r.RawRecord; assert 'pydantic' in sys.modules;"
            "import dataclasses; assert [f.name for f in dataclasses.fields(r.RawRecordFields)] =="
            " [n for n in m.model_fields if n not in ('schema_name', 'schema_version')]")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=PROJECT_ROOT,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(PROJECT_ROOT), str(PROJECT_ROOT / "locustfiles")])})
    assert proc.returncode == 0, proc.stderr


def test_a_record_of_an_older_file_still_reads():
    """Fields added after specdeploy-raw/1 first shipped default to None when a file lacks them."""
    from locustfiles.lt_common import RequestState, RunSettings, build_record

    settings = RunSettings(run_id="r", arm="baseline", repeat=0, endpoint="127.0.0.1:1", model_name="ensemble",
                           prompts=[{"id": "p", "text": "hi"}])
    state = RequestState(request_id="q", prompt_id="p", category="c", prompt_index=0, prompt_text="hi",
                         t_scheduled=None)
    state.t_sent, state.status = 1, "ok"
    record = build_record(settings, state, worker_pid=1)
    assert list(record)[:3] == ["schema", "schema_version", "run_id"]
    older = {k: v for k, v in record.items() if k not in ("isl", "t_first_answer", "reasoning_text", "http_status")}
    assert RawRecord.model_validate(older).isl is None
    with pytest.raises(ValidationError):
        RawRecord.model_validate({k: v for k, v in record.items() if k != "osl"})


def test_every_artefact_prints_a_json_schema():
    from pipeline.cli import run

    for name in ARTEFACTS:
        schema = artefact_model(name).model_json_schema(by_alias=True)
        assert schema["properties"]["schema"]["const"] == artefact_model(name).SCHEMA
    assert run(["schema", "deployment"]) == 0


# ------------------------------------------------------------------------------------------------
# The deployment descriptor


def _cfg(method="draft_target", orchestration="bls"):
    spec = {"method": method}
    if method == "draft_target":
        spec.update(draft={"checkpoint": "/d"}, num_draft_tokens=3, orchestration=orchestration)
    return parse_config({"name": "x", "backend": "reference", "hardware": "cpu", "target": {"checkpoint": "/m"},
                         "speculation": spec})


def test_decide_arm_records_what_render_decided():
    bls = decide_arm(_cfg(), "speculative", {"tokenizer_dir": "/t"})
    assert (bls.model_name, bls.extra_inputs, bls.drafts, bls.per_request_draft_len) == (
        "tensorrt_llm_bls", {"num_draft_tokens": 3}, "bls", True)
    assert bls.tokenizer_dir == "/t" and bls.engine_models == 2 and bls.max_draft_len == 3
    engine = decide_arm(_cfg(orchestration="engine"), "speculative")
    assert (engine.model_name, engine.extra_inputs, engine.drafts, engine.engine_models) == ("ensemble", {}, "engine", 1)
    assert decide_arm(_cfg(), "baseline").drafts == "none"


def _rendered(tmp_path, monkeypatch, cfg):
    """What render leaves for one arm: a repository and its descriptor (no templates needed)."""
    from pipeline.paths import model_repo_dir

    monkeypatch.chdir(tmp_path)
    repo = model_repo_dir(cfg, "speculative")
    (repo / "tensorrt_llm").mkdir(parents=True)
    (repo / "tensorrt_llm" / "config.pbtxt").write_text('name: "tensorrt_llm"\n')
    return repo


def test_serve_and_loadtest_work_from_the_descriptor_alone(tmp_path, monkeypatch):
    """The descriptor, not the config, says what the arm is: a descriptor that differs from what
    the config would give is what serve's CPU plan and loadtest's endpoint follow."""
    from pipeline.infra.cpu_pinning import allowed_cpus, plan_pinning
    from pipeline.loadtest.cells import RunSpec
    from pipeline.loadtest.endpoints import ArmEndpoint
    from pipeline.loadtest.runner import run_settings
    from pipeline.serve.server import deployment_cpu_plan

    cfg = _cfg()
    repo = _rendered(tmp_path, monkeypatch, cfg)
    recorded = decide_arm(cfg, "speculative").model_copy(update={"model_name": "recorded_model",
                                                                   "per_request_draft_len": False})
    recorded.write(descriptor_path(repo))
    loaded_repo, loaded = load_arm(cfg, "speculative")
    assert loaded_repo == repo and loaded == recorded
    endpoint = ArmEndpoint("speculative", "127.0.0.1:1", loaded.model_name, dict(loaded.extra_inputs),
                           deployment=loaded)
    settings = run_settings(cfg, RunSpec("speculative", 1, 0, 2), endpoint, tmp_path, "r", [], 2.0, 0.2, None)
    assert settings["model_name"] == "recorded_model"
    assert settings["extra_inputs"] == {"num_draft_tokens": 3}  # per-request K off: the sweep's 2 not sent
    # serve pins by the repository's engine models and the descriptor's count, not the config's
    plan, note = deployment_cpu_plan(cfg, repo, loaded.engine_models)
    assert (plan, note) == plan_pinning(cfg.reference.cpu_pinning, ["tensorrt_llm"], cfg.reference.threads,
                                        allowed_cpus(), loaded.engine_models)
    assert note not in ("GPU backend", "no reference engine model in the repository")


def test_repository_rendered_without_a_descriptor_schema_says_re_run_render(tmp_path, monkeypatch):
    from pipeline.serve.server import start_deployment

    cfg = _cfg()
    repo = _rendered(tmp_path, monkeypatch, cfg)
    old_stamp = {"config_hash": "x", "variant": "speculative", "client_target": {"model_name": "ensemble"}}
    descriptor_path(repo).write_text(json.dumps(old_stamp))
    with pytest.raises(ArtefactError, match=r"carries no schema tag.*re-run `specdeploy render`"):
        start_deployment(cfg, "speculative")
    descriptor_path(repo).unlink()
    with pytest.raises(StaleInputError, match="run `specdeploy render` first"):
        load_arm(cfg, "speculative")
