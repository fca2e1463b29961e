"""CPU pinning on a real tritonserver (``reference.cpu_pinning: auto``): a deployment with one
engine model runs tritonserver and every other model's stub on the other CPUs and the
engine's decode thread (in the worker process the ``tensorrt_llm`` stub starts) alone on the
highest one; a BLS draft-target deployment
(two engine models) has no spare CPU on two cores, so neither of its arms is pinned; a draft-target
deployment drafting in the engine keeps the BLS's draft engine in its repository, idle, and is
pinned like a one-engine deployment; the serve log says which."""

from __future__ import annotations

import os

import psutil
import pytest

pytestmark = [pytest.mark.triton, pytest.mark.slow]


def _stub(server, model: str) -> psutil.Process:
    """The Python-backend stub of ``model`` (its instance name is the stub's argument)."""
    for child in psutil.Process(server.pid).children(recursive=True):
        if f"{model}_0_0" in child.cmdline():
            return child
    raise AssertionError(f"no stub for {model}: {[c.cmdline() for c in psutil.Process(server.pid).children()]}")


def _worker(stub: psutil.Process) -> psutil.Process:
    """The engine worker process the ``tensorrt_llm`` stub started."""
    workers = [c for c in stub.children() if "pipeline.reference.worker" in c.cmdline()]
    assert len(workers) == 1, [c.cmdline() for c in stub.children()]
    return workers[0]


def _thread_cpus(proc: psutil.Process) -> list[set[int]]:
    return [os.sched_getaffinity(t.id) for t in proc.threads()]


def test_one_engine_deployment_gives_the_decode_thread_its_own_cpu(medusa_server):
    allowed = os.sched_getaffinity(0)
    if len(allowed) < 2:
        pytest.skip("pinning needs two CPUs (CI has two)")
    engine_cpu, others = max(allowed), allowed - {max(allowed)}
    plan = medusa_server.cpu_plan
    assert plan is not None and plan.engine_cpus == {"tensorrt_llm": (engine_cpu,)} and set(plan.other_cpus) == others
    assert set(psutil.Process(medusa_server.pid).cpu_affinity()) == others
    stub = _stub(medusa_server, "tensorrt_llm")
    assert all(cpus == others for cpus in _thread_cpus(stub))  # it sends responses; the engine is elsewhere
    worker = _worker(stub)  # reference.engine_process: own (the default)
    engine_threads = _thread_cpus(worker)
    assert engine_threads.count({engine_cpu}) == 1, engine_threads  # the decode thread, alone
    assert all(cpus == others for cpus in engine_threads if cpus != {engine_cpu})
    for model in ("preprocessing", "postprocessing"):
        assert all(cpus == others for cpus in _thread_cpus(_stub(medusa_server, model))), model
    assert f"# cpu pinning: engine decode threads: tensorrt_llm → [{engine_cpu}]" in medusa_server.log_path.read_text()


def test_bls_deployment_on_two_cpus_is_left_unpinned_in_both_arms(dt_server, baseline_server):
    allowed = os.sched_getaffinity(0)
    if len(allowed) != 2:
        pytest.skip("the two-CPU case (CI has two)")
    for server in (dt_server, baseline_server):
        assert server.cpu_plan is None
        assert set(psutil.Process(server.pid).cpu_affinity()) == allowed
        stub = _stub(server, "tensorrt_llm")
        assert all(cpus == allowed for cpus in _thread_cpus(stub) + _thread_cpus(_worker(stub)))
        assert "# cpu pinning: none (2 CPU(s) allowed; pinning 2 engine model(s)" in server.log_path.read_text()


def test_draft_target_in_the_engine_is_pinned_like_its_baseline(dt_engine_server):
    """The repository keeps tensorrt_llm_draft (for BLS calls) but the arm decodes with one engine:
    its decode thread gets the core, the idle draft engine's worker stays with the server."""
    from pipeline.serve.server import repository_models

    allowed = os.sched_getaffinity(0)
    if len(allowed) < 2:
        pytest.skip("pinning needs two CPUs (CI has two)")
    assert "tensorrt_llm_draft" in repository_models(dt_engine_server.repo)
    engine_cpu, others = max(allowed), allowed - {max(allowed)}
    assert dt_engine_server.cpu_plan.engine_cpus == {"tensorrt_llm": (engine_cpu,)}
    assert _thread_cpus(_worker(_stub(dt_engine_server, "tensorrt_llm"))).count({engine_cpu}) == 1
    idle = _thread_cpus(_worker(_stub(dt_engine_server, "tensorrt_llm_draft")))
    assert all(cpus == others for cpus in idle), idle
    assert "# cpu pinning: engine decode threads: tensorrt_llm → [" in dt_engine_server.log_path.read_text()
