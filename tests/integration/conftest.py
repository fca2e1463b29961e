"""Session fixtures for the real-Triton serving tests: tiny CPU checkpoints, the rendered
deployments and as few server launches as possible (draft-target speculative orchestrated by the
BLS, draft-target drafting in the engine, Medusa speculative, draft-target baseline), each started
once, on first use, and stopped at the end of the session."""

from __future__ import annotations

from pathlib import Path

import pytest

import tiny_deploy

PROMPTS = ["The quick brown", "def add(a, b):", "1 + 2 = 3, 2 +"]
MAX_TOKENS = 24


@pytest.fixture(scope="session")
def serving_workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("serving")


@pytest.fixture(scope="session")
def tiny_models(serving_workdir) -> dict:
    return tiny_deploy.make_models(serving_workdir / "models")


def _deployment(workdir: Path, models: dict, method: str, **options):
    from pipeline.config import load_config
    from pipeline.render.renderer import render

    cfg_path = tiny_deploy.make_deployment(workdir, models, method, **options)
    cfg = load_config(cfg_path, workdir)
    render(cfg)
    return cfg


@pytest.fixture(scope="session")
def dt_cfg(serving_workdir, tiny_models):
    return _deployment(serving_workdir, tiny_models, "draft_target")


@pytest.fixture(scope="session")
def dt_engine_cfg(serving_workdir, tiny_models):
    """Draft-target with ``orchestration: engine``: tensorrt_llm drafts in its own engine."""
    return _deployment(serving_workdir, tiny_models, "draft_target", name="tiny-dt-engine", orchestration="engine")


@pytest.fixture(scope="session")
def medusa_cfg(serving_workdir, tiny_models):
    return _deployment(serving_workdir, tiny_models, "medusa")


def _served(workdir: Path, cfg, variant: str):
    """Start one deployment's server for a session fixture; stop it when the session ends."""
    from pipeline.serve.server import start_deployment

    server = start_deployment(cfg, variant)  # under the workdir the config was loaded with
    yield server
    server.stop()


@pytest.fixture(scope="session")
def dt_server(serving_workdir, dt_cfg):
    yield from _served(serving_workdir, dt_cfg, "speculative")


@pytest.fixture(scope="session")
def dt_engine_server(serving_workdir, dt_engine_cfg):
    yield from _served(serving_workdir, dt_engine_cfg, "speculative")


@pytest.fixture(scope="session")
def medusa_server(serving_workdir, medusa_cfg):
    yield from _served(serving_workdir, medusa_cfg, "speculative")


@pytest.fixture(scope="session")
def baseline_server(serving_workdir, dt_cfg):
    yield from _served(serving_workdir, dt_cfg, "baseline")


@pytest.fixture(scope="session")
def reference_outputs(serving_workdir, dt_cfg, tiny_models) -> dict:
    """Greedy in-process reference engine output (prompt + completion text) per prompt."""
    import torch

    from pipeline.reference.api import GenerationRequest, SamplingParams
    from pipeline.reference.engine import load_engine
    from pipeline.triton_models.tokenizer import TextTokenizer

    torch.set_num_threads(1)
    tokenizer = TextTokenizer(tiny_models["target"])
    engine = load_engine(serving_workdir / "engines" / dt_cfg.name / "engine" / "baseline")
    out = {}
    try:
        for prompt in PROMPTS:
            ids = tokenizer.encode(prompt)
            result = engine.generate(GenerationRequest(input_ids=ids, max_new_tokens=MAX_TOKENS, end_id=tokenizer.end_id,
                                                       pad_id=tokenizer.pad_id, sampling=SamplingParams(top_k=1)))
            out[prompt] = {"ids": ids + result.output_ids, "generated": result.output_ids,
                           "text": tokenizer.decode(ids + result.output_ids),
                           "completion": tokenizer.decode(result.output_ids)}
    finally:
        engine.shutdown()
    return out
