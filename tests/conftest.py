"""Tiers and the quick tier's time budget (docs/testing.md).

- ``e2e`` tests (whole load-test runs beyond the one ``specdeploy run`` the full tier keeps) are
  deselected unless ``-m`` is given: ``./run-tests`` is the full tier, ``./run-tests -m e2e`` the
  end-to-end tier, and CI (``.ci/run``) runs both.
- A test not marked ``slow`` (nor ``e2e``) must stay within a budget, or it fails with a message
  saying so: CPU seconds of this process and of the subprocesses it reaped (what the test costs,
  which a loaded machine does not inflate much) over setup + call, and a wall-clock ceiling
  several times larger (a test that waits, sleeps or hangs). ``@pytest.mark.budget(cpu_s)`` gives
  one test its own CPU budget (the real-Triton smoke test); ``SPECDEPLOY_TEST_BUDGET_S`` changes
  the default, ``0`` turns the check off. One-time per-process caches (the shared random
  checkpoints) are not charged to the test that fills them (tests/budget.py).

Under pytest-xdist (``./run-tests`` runs three workers) the groups of tests.xdist_scheduler decide
which worker runs what: the hooks at the end hand the workers a directory for their groups and the
controller the scheduler. The scheduler module is imported only inside those hooks, so this file
loads where xdist is not installed (scripts/ngc-pinned-env.sh).

Reads the markers, the environment and the process clocks; writes nothing (but the workers'
groups, under the session's base temporary directory).
"""

from __future__ import annotations

import gc
import os
import time

import pytest

from tests.budget import cpu_s, session_cost, uncharged_cpu_s

DEFAULT_BUDGET_CPU_S = 2.0
WALL_FACTOR = 20.0  # the wall ceiling, as a multiple of the CPU budget: a loaded machine stays green
_START = pytest.StashKey[tuple]()
_GROUPS_DIR = pytest.StashKey[str]()


def _budget_cpu_s(item) -> float | None:
    if item.get_closest_marker("slow") or item.get_closest_marker("e2e"):
        return None
    marker = item.get_closest_marker("budget")
    default = float(os.environ.get("SPECDEPLOY_TEST_BUDGET_S", DEFAULT_BUDGET_CPU_S))
    if default <= 0:
        return None
    return float(marker.args[0]) if marker else default


def _cpu_s() -> float:
    """The process's CPU (tests/budget.py) less what one-time caches took (``session_cost``)."""
    return cpu_s() - uncharged_cpu_s()


# imported by the report's statistics and plots, and (transformers) by the tokenizer models and
# preflight's tokenizer checks; seconds of CPU the first time in a process
# transformers is lazy: its top-level import costs nothing, and the first AutoTokenizer load paid
# ~3 CPU s (AutoConfig imports configuration_llama, which pulls torch.distributed.tensor), so a
# SentencePiece tokenizer test went over budget or not by the order the scheduler chose
HEAVY_IMPORTS = ("scipy.stats", "matplotlib.pyplot", "transformers.models.auto.tokenization_auto",
                 "transformers.models.llama.configuration_llama")


@pytest.fixture(scope="session", autouse=True)
def _heavy_imports_are_not_charged_to_one_test():
    """Whichever test first imported scipy.stats, matplotlib or transformers' tokenizer loading in a worker paid for it, so the
    budget failed a test by the order the scheduler chose (seen on a slower host). Imported here
    once per process, as a one-time cost (tests/budget.py); an environment without them (the
    pinned GPU-container one) skips what it lacks."""
    import importlib

    with session_cost():
        for name in HEAVY_IMPORTS:
            try:
                if name == "matplotlib.pyplot":
                    import matplotlib

                    matplotlib.use("Agg")  # what the report's plots use; no display here
                importlib.import_module(name)
            except ImportError:
                continue
    yield


def pytest_configure(config):
    # registered here, not in pyproject.toml, whose hash makes scripts/setup.sh reinstall the venv
    config.addinivalue_line("markers", "weight(n): this slow test costs about n ordinary slow ones; the xdist "
                                       "scheduler hands its group out earlier (tests/xdist_scheduler.py)")


def pytest_collection_modifyitems(config, items):
    if config.option.markexpr:  # -m chooses the tier
        return
    e2e = [item for item in items if item.get_closest_marker("e2e")]
    if e2e:
        config.hook.pytest_deselected(items=e2e)
        items[:] = [item for item in items if not item.get_closest_marker("e2e")]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    item.stash[_START] = (time.perf_counter(), _cpu_s())
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if call.when != "call" or not report.passed or _START not in item.stash:
        return
    budget = _budget_cpu_s(item)
    if budget is None:
        return
    wall0, cpu0 = item.stash[_START]
    wall, cpu = time.perf_counter() - wall0, _cpu_s() - cpu0
    if cpu > budget or wall > budget * WALL_FACTOR:
        report.outcome = "failed"
        report.longrepr = (f"over the quick tier's per-test budget: {cpu:.1f} CPU s (budget {budget:g}), "
                           f"{wall:.1f} s wall (ceiling {budget * WALL_FACTOR:g}) over setup + call; "
                           "make it cheaper or mark it @pytest.mark.slow (docs/testing.md)")


# -- pytest-xdist: whole server groups per worker (tests/xdist_scheduler.py) ----------------------

def _our_dist(config) -> bool:
    """Our scheduler replaces xdist's plain ``load`` (what ``-n`` alone gives); any other ``--dist``
    the user asks for is left to xdist."""
    return config.getvalue("dist") == "load"


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    config = node.config
    if not _our_dist(config):
        return
    if _GROUPS_DIR not in config.stash:
        config.stash[_GROUPS_DIR] = str(config._tmp_path_factory.mktemp("xdist-groups"))
    from tests.xdist_scheduler import GROUPS_DIR  # only under xdist (module docstring)

    node.workerinput[GROUPS_DIR] = config.stash[_GROUPS_DIR]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if not _our_dist(config) or _GROUPS_DIR not in config.stash:
        return None
    from tests.xdist_scheduler import make_scheduler  # only under xdist (module docstring)

    return make_scheduler(config, log, config.stash[_GROUPS_DIR])


@pytest.hookimpl(tryfirst=True)  # before xdist's worker sends its collection to the controller
def pytest_collection_finish(session):
    # What is alive now (imported modules, their classes and functions, the collected tests) stays
    # alive to the end: frozen, no later full garbage collection walks it again, neither the
    # automatic ones nor the two pytest's unraisable-exception check makes at exit (there, ~1 CPU s
    # per test process with torch and transformers loaded). What tests create is collected as before.
    gc.freeze()
    from tests import xdist_scheduler as xs  # imports no xdist itself (its module docstring)

    workerinput = getattr(session.config, "workerinput", None)
    if not workerinput or xs.GROUPS_DIR not in workerinput:
        return

    servers = session.config.stash.get(xs.SHARED_SERVERS, frozenset())
    groups, weights = xs.group_items([(item.nodeid, xs.needs(item, servers), xs.module_fixtures(item),
                                       xs.item_weight(item)) for item in session.items])
    xs.write_groups(workerinput[xs.GROUPS_DIR], workerinput["workerid"], groups, weights)
