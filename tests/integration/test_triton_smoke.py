"""The quick tier's real-Triton smoke test: the shipped ``configs/tiny-cpu-medusa.yaml`` rendered
(no build: a manifest from the plan, the demo tokenizer where the build would convert it), its
``preprocessing`` and ``postprocessing`` models served by a real ``tritonserver`` through
``serve``'s own start (ports, readiness via tritonclient, the Python backend running our model
code), one request each way over gRPC, then the server and its stubs stopped with nothing left.
No engine, no torch: seconds, so it runs in every edit loop (``./run-tests -m "not slow"``);
the serving tests (``slow``) cover the engines.

Reads the shipped config and demo tokenizer; writes a working directory under tmp_path."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import psutil
import pytest
import yaml

from triton_clients import grpc_infer

pytestmark = [pytest.mark.triton, pytest.mark.budget(15)]  # CPU s of this process; the stubs are not ours to count

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "The quick brown"


def _repository(workdir: Path) -> tuple[Path, Path]:
    """(a repository of the rendered baseline arm's tokenizer models, the tokenizer directory)."""
    from pipeline.config import config_hash, parse_config
    from pipeline.plan.planner import make_plan
    from pipeline.render.renderer import render

    cfg = parse_config(yaml.safe_load((ROOT / "configs" / "tiny-cpu-medusa.yaml").read_text()), workdir=workdir)
    plan = make_plan(cfg)
    manifest = {"format": "specdeploy-manifest/1", "name": cfg.name, "config_hash": config_hash(cfg),
                "engines": plan.engines, "tokenizer_dir": plan.tokenizer_dir, "created": "t"}
    (workdir / "engines" / cfg.name).mkdir(parents=True)
    (workdir / "engines" / cfg.name / "manifest.json").write_text(json.dumps(manifest))
    rendered = render(cfg)["baseline"][0]
    tokenizer_dir = Path(plan.tokenizer_dir)  # where the build puts the converted checkpoint
    tokenizer_dir.mkdir(parents=True)
    for f in (ROOT / "pipeline" / "demo" / "artifacts" / "tiny-target").glob("tokenizer*.json"):
        shutil.copy(f, tokenizer_dir / f.name)
    repo = workdir / "smoke-repo"
    for model in ("preprocessing", "postprocessing"):
        shutil.copytree(rendered / model, repo / model)
    return repo, tokenizer_dir


def test_tokenizer_models_answer_on_a_real_tritonserver_and_stop_with_nothing_left(tmp_path):
    from pipeline.serve.server import start_server
    from pipeline.triton_models.tokenizer import TextTokenizer

    repo, tokenizer_dir = _repository(tmp_path)
    expected = TextTokenizer(tokenizer_dir).encode(PROMPT)
    server = start_server(repo, startup_timeout_s=120)
    try:
        family = [psutil.Process(server.pid), *psutil.Process(server.pid).children(recursive=True)]
        assert len(family) >= 3  # tritonserver and one Python-backend stub per model
        pre = grpc_infer(server.grpc_url, "preprocessing", {
            "QUERY": np.array([[PROMPT.encode()]], dtype=np.object_),
            "REQUEST_OUTPUT_LEN": np.array([[4]], dtype=np.int32)})
        assert pre["INPUT_ID"].tolist() == [expected] and pre["REQUEST_INPUT_LEN"].tolist() == [[len(expected)]]
        post = grpc_infer(server.grpc_url, "postprocessing", {
            "TOKENS_BATCH": np.array([[expected]], dtype=np.int32),
            "SEQUENCE_LENGTH": np.array([[len(expected)]], dtype=np.int32)})
        assert post["OUTPUT"].reshape(-1)[0].decode() == PROMPT
    finally:
        server.stop()
    assert not [p.pid for p in family if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
