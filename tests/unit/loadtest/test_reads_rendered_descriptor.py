"""The load test reads what ``render`` wrote (issue 45): each arm's deployment descriptor, not a
decision made again from the config. A descriptor that says something other than the config would
is what the load test follows; a missing or stale one stops it before a run directory exists,
naming the stage to run; and the decision itself is render's, called elsewhere only where nothing
was rendered (the preflight's dry run, servers rendered on another host)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pipeline.artefacts.deployment import descriptor_path
from pipeline.config import parse_config
from pipeline.errors import SpecdeployError, StaleInputError
from pipeline.loadtest.endpoints import remote_endpoint
from pipeline.loadtest.runner import run_loadtest
from pipeline.paths import PROJECT_ROOT, model_repo_dir
from pipeline.render.arms import decide_arm

PROMPTS = PROJECT_ROOT / "tests" / "fixtures" / "prompts_small.jsonl"


def make_cfg(workdir: Path, **loadtest):
    return parse_config({
        "name": "descr", "backend": "reference",
        "target": {"checkpoint": "builtin:tiny-target", "dtype": "float32"},
        "speculation": {"method": "draft_target", "num_draft_tokens": 3, "orchestration": "bls",
                        "draft": {"checkpoint": "builtin:tiny-draft", "dtype": "float32"}},
        "loadtest": {"transport": "http", "concurrency": [1], "duration_s": 2, "warmup_s": 0.2, "repeats": 1,
                     "prompts": str(PROMPTS), **loadtest},
    }, workdir=workdir)


def write_descriptor(cfg, arm: str, **changes) -> Path:
    """The descriptor render leaves beside ``arm``'s repository (with ``changes``) and the repository's
    ``tensorrt_llm/config.pbtxt`` (what a server started here needs)."""
    repo = model_repo_dir(cfg, arm)
    (repo / "tensorrt_llm").mkdir(parents=True, exist_ok=True)
    (repo / "tensorrt_llm" / "config.pbtxt").write_text('name: "tensorrt_llm"\n')
    return decide_arm(cfg, arm).model_copy(update=changes).write(descriptor_path(repo))


def test_a_remote_arm_follows_the_descriptor_render_wrote_here(tmp_path):
    cfg = make_cfg(tmp_path)
    write_descriptor(cfg, "speculative", model_name="recorded_model", extra_inputs={"num_draft_tokens": 5})
    endpoint = remote_endpoint(cfg, "speculative", "127.0.0.1:1")
    assert (endpoint.model_name, endpoint.extra_inputs) == ("recorded_model", {"num_draft_tokens": 5})
    assert endpoint.deployment.model_name == "recorded_model"


def test_with_nothing_rendered_here_a_remote_arm_is_what_render_decides(tmp_path):
    """Servers rendered and run on another host: render's own rule for this config (as before)."""
    endpoint = remote_endpoint(make_cfg(tmp_path), "speculative", "127.0.0.1:1")
    assert (endpoint.model_name, endpoint.extra_inputs) == ("tensorrt_llm_bls", {"num_draft_tokens": 3})


def test_the_sweep_rule_reads_the_rendered_arm_not_the_config(tmp_path):
    """The config says orchestration bls; the arm render wrote drafts in its engine: the sweep is refused."""
    cfg = make_cfg(tmp_path)
    for arm in ("baseline", "speculative"):
        write_descriptor(cfg, arm, **({"drafts": "engine", "per_request_draft_len": False, "extra_inputs": {}}
                                      if arm == "speculative" else {}))
    with pytest.raises(SpecdeployError, match="orchestration 'engine' fixes num_draft_tokens"):
        run_loadtest(cfg, out_dir=tmp_path / "run", sweep_draft_len=[2], endpoint_baseline="127.0.0.1:1",
                     endpoint_speculative="127.0.0.1:1", progress=False)
    assert not (tmp_path / "run").exists()


def test_a_missing_descriptor_stops_the_load_test_before_a_run_dir(tmp_path):
    with pytest.raises(StaleInputError, match=re.escape("run `specdeploy render` first")):
        run_loadtest(make_cfg(tmp_path), out_dir=tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


def test_a_config_changed_after_render_is_refused_naming_render(tmp_path):
    rendered = make_cfg(tmp_path)
    for arm in ("baseline", "speculative"):
        write_descriptor(rendered, arm)
    changed = make_cfg(tmp_path, max_tokens=9)  # the same deployment name, another config hash
    with pytest.raises(StaleInputError, match=re.escape("rendered from another config: re-run `specdeploy render`")):
        run_loadtest(changed, out_dir=tmp_path / "run", endpoint_baseline="127.0.0.1:1",
                     endpoint_speculative="127.0.0.1:1", progress=False)
    assert not (tmp_path / "run").exists()


def test_the_draft_limit_is_the_method_hook(tmp_path, monkeypatch):
    """``max_draft_len`` has one owner, ``Method.engine_max_draft_len``."""
    cfg = make_cfg(tmp_path)
    monkeypatch.setattr(cfg.method_info, "engine_max_draft_len", lambda spec: 7)
    assert decide_arm(cfg, "speculative").max_draft_len == 7
    assert decide_arm(cfg, "baseline").max_draft_len is None


def test_only_render_decides_what_an_arm_is():
    """Outside ``pipeline/render/`` the decision is called only where nothing was rendered: the
    preflight's dry run (before render) and a load test of servers rendered on another host."""
    callers = {str(path.relative_to(PROJECT_ROOT)) for path in (PROJECT_ROOT / "pipeline").rglob("*.py")
               if "decide_arm(" in path.read_text(encoding="utf-8")
               and not path.is_relative_to(PROJECT_ROOT / "pipeline" / "render")}
    assert callers == {"pipeline/validate/preflight.py", "pipeline/loadtest/endpoints.py"}
