"""Session fixtures for the real-Triton serving tests: tiny CPU checkpoints, the rendered
deployments and one server per repository layout, shared by every module that needs it: the
ensemble/BLS layouts (draft-target orchestrated by the BLS, draft-target drafting in the engine,
Medusa, the draft-target baseline), the llmapi layout (draft-target speculative and baseline arms)
and the n-gram engine layout. Each starts on first use and stops right after the last test of the
session that needs it (``shared_server``); docs/testing.md says how a new test gets one.

Reads the tiny models it writes under a session temporary directory; writes the deployments,
engines' descriptors, repositories and server logs there.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from server_stops import join_all, stop_later

import tiny_deploy
from tests.xdist_scheduler import GROUPS_DIR, needed_fixtures
from tests.xdist_scheduler import SHARED_SERVERS as SHARED_SERVERS_KEY

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


# -- shared servers: one per repository layout, stopped after the last test that needs it -------
# A test needs a shared server when the fixture is in its closure, or when a parametrized fixture
# asks for it at run time and names it with ``pytest.param(..., marks=pytest.mark.shares(name))``.

_SHARED: dict[str, object] = {}  # fixture name -> running server
SHARED_SERVERS: list[str] = []  # every shared server fixture (``shared_server``)
_LAST_USER = pytest.StashKey[dict]()


def shared_server(func):
    """A session server fixture shared across modules: its tests form one xdist group
    (tests/xdist_scheduler.py) and it stops after its last user."""
    SHARED_SERVERS.append(func.__name__)
    return pytest.fixture(scope="session")(func)


def _served(request, cfg, variant: str):
    """Start one deployment's server for a session fixture (under the workdir the config was
    loaded with); :func:`pytest_runtest_teardown` stops it after its last user, the session's end
    at the latest."""
    from pipeline.serve.server import start_deployment

    yield from _shared(request, lambda: start_deployment(cfg, variant))


def _shared(request, start):
    server = start()
    _SHARED[request.fixturename] = server
    yield server
    if _SHARED.pop(request.fixturename, None) is not None:
        stop_later(server)


def pytest_sessionfinish(session):
    join_all()  # the servers stop_later stopped in threads (server_stops.py)


@pytest.hookimpl(trylast=True)  # after tests/conftest.py deselected the tiers not asked for
def pytest_collection_modifyitems(config, items):
    """Remember, per fixture, the last test in run order that needs it."""
    last = {}
    for item in items:
        for name in needed_fixtures(item):
            last[name] = item.nodeid
    config.stash[_LAST_USER] = last


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    # pytest-xdist: with tests/xdist_scheduler.py every test needing a server is on one worker, in
    # collection order, so the last one collected is this worker's last user; under another
    # scheduler the run order is unknown here, so the servers stay up to the worker's end
    workerinput = getattr(item.config, "workerinput", None)
    if workerinput is not None and GROUPS_DIR not in workerinput:
        return
    last = item.config.stash.get(_LAST_USER, {})
    for name in [n for n, nodeid in last.items() if nodeid == item.nodeid and n in _SHARED]:
        stop_later(_SHARED.pop(name))


def pytest_configure(config):
    config.stash[SHARED_SERVERS_KEY] = frozenset(SHARED_SERVERS)
    config.addinivalue_line("markers", "shares(*fixtures): the test needs these shared server fixtures, "
                                       "asked for at run time (tests/integration/conftest.py)")


@shared_server
def dt_server(request, dt_cfg):
    yield from _served(request, dt_cfg, "speculative")


@shared_server
def dt_engine_server(request, dt_engine_cfg):
    """Draft-target drafting in the engine: the engine (ensemble) layout of the llmapi tests too."""
    yield from _served(request, dt_engine_cfg, "speculative")


@shared_server
def medusa_server(request, medusa_cfg):
    yield from _served(request, medusa_cfg, "speculative")


@shared_server
def baseline_server(request, dt_cfg):
    yield from _served(request, dt_cfg, "baseline")


# -- built with `build` (not tiny_deploy's descriptors): the llmapi layout and n-gram -----------


@pytest.fixture(scope="session")
def dt_llmapi_cfg(serving_workdir, tiny_models):
    return tiny_deploy.built_deployment(serving_workdir, tiny_models, "tiny-llmapi-dt",
                                        tiny_deploy.draft_target_spec(tiny_models), llmapi=True)


@shared_server
def dt_llmapi_server(request, dt_llmapi_cfg):
    yield from _served(request, dt_llmapi_cfg, "speculative")


@shared_server
def dt_llmapi_baseline_server(request, dt_llmapi_cfg):
    yield from _served(request, dt_llmapi_cfg, "baseline")


@pytest.fixture(scope="session")
def ngram_cfg(serving_workdir, tiny_models):
    """n-gram drafted in the engine (the default orchestration), ensemble layout."""
    return tiny_deploy.built_deployment(serving_workdir, tiny_models, "tiny-ngram", tiny_deploy.NGRAM)


@shared_server
def ngram_server(request, ngram_cfg):
    yield from _served(request, ngram_cfg, "speculative")


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


# -- the rendered GPU llmapi repository with the stand-in model (TensorRT-LLM's needs a GPU) -------

@shared_server
def llmapi_standin_server(request, tmp_path_factory):
    """The speculative arm of ``tiny_deploy.render_llmapi_standin`` (decoupled, perf metrics on)."""
    from pipeline.serve.server import start_server

    _, repos = tiny_deploy.render_llmapi_standin(tmp_path_factory.mktemp("llmapi-standin"))
    yield from _shared(request, lambda: start_server(repos["speculative"], startup_timeout_s=120))
