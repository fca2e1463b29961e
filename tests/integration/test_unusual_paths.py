"""Checkpoints at a path with spaces and non-ASCII characters serve (issue 44). The Python
backend's stub runs an interpreter whose filesystem encoding is ASCII (pipeline/triton_models/fs_paths.py),
so such a tokenizer directory "did not exist" in preprocessing and the server never became ready,
after validate, build and render had all passed. A model repository at such a path cannot be
served at all (the stub itself fails): validate and serve refuse it at once, naming it.

The built-in tiny models are linked file by file under ``<tmp>/模型 dir/ü/``; the workdir is plain
ASCII. Build and render run through the CLI; the speculative arm (draft in the engine) is served
by a real tritonserver and answers one generation."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest
import yaml

from pipeline.demo import ARTIFACTS_DIR
from tests.unit.cli_inproc import specdeploy
from triton_clients import http_generate

ROOT = Path(__file__).resolve().parents[2]
UNUSUAL = "模型 dir/ü"


def _linked(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True)
    for f in src.iterdir():
        (dst / f.name).symlink_to(f)
    return dst


def _config(workdir: Path, target: Path, draft: Path, name: str = "unusual") -> Path:
    data = {
        "name": name, "backend": "reference", "hardware": "cpu",
        "target": {"checkpoint": str(target), "dtype": "float32"},
        "speculation": {"method": "draft_target", "num_draft_tokens": 3, "orchestration": "engine",
                        "draft": {"checkpoint": str(draft), "dtype": "float32"}},
        "build": {"max_batch_size": 2, "max_input_len": 64, "max_seq_len": 128},
        "triton": {"startup_timeout_s": 240},
        "loadtest": {"prompts": str(ROOT / "prompts/tiny")},
    }
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    return path


@pytest.mark.slow
@pytest.mark.triton
def test_checkpoints_at_a_non_ascii_path_with_spaces_serve_a_generation(tmp_path):
    from pipeline.config import load_config
    from pipeline.serve.server import start_deployment

    models = tmp_path / UNUSUAL
    target = _linked(ARTIFACTS_DIR / "tiny-target", models / "target")
    draft = _linked(ARTIFACTS_DIR / "tiny-draft", models / "draft")
    workdir = tmp_path / "work"
    workdir.mkdir()
    config = _config(workdir, target, draft)
    for stage in ("validate", "build", "render"):
        argv = [stage, config] + ([] if stage == "validate" else ["--workdir", workdir])
        result = specdeploy(*argv)
        assert result.returncode == 0, (stage, result.stderr)

    cfg = load_config(config, workdir)
    server = start_deployment(cfg, "speculative")
    try:
        family = server.family()
        status, answer = http_generate(server.http_url, "ensemble", {"text_input": "The quick brown", "max_tokens": 8})
        assert status == 200, answer
        assert answer["text_output"].startswith("The quick brown") and len(answer["text_output"]) > len("The quick brown")
    finally:
        server.stop()
    assert [p for p in family if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE] == []


def test_a_repository_path_the_stub_cannot_load_is_refused_before_serving(tmp_path):
    from pipeline.config import load_config
    from pipeline.errors import UsageError
    from pipeline.serve.server import start_server
    from pipeline.validate.preflight import errors_of, run_preflight

    workdir = tmp_path / "a b"  # a space: the stub aborts (stol) and the server waits forever
    workdir.mkdir()
    cfg = load_config(_config(workdir, ARTIFACTS_DIR / "tiny-target", ARTIFACTS_DIR / "tiny-draft"), workdir)
    (error,) = [f for f in errors_of(run_preflight(cfg)) if f.check == "output-root"]
    assert f"the model repository {workdir}/engines/unusual/model_repo/baseline has a space" in error.message

    repo = workdir / "repo"
    (repo / "m" / "1").mkdir(parents=True)
    (repo / "m" / "config.pbtxt").write_text('backend: "python"\n')
    with pytest.raises(UsageError, match="has a space or a non-ASCII character"):
        start_server(repo, startup_timeout_s=30)
    assert not (repo.parent / "serve-repo.log").exists()  # nothing launched
