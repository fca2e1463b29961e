"""The live preflight: on the GPU host (inside the container), every assumption the plan rests on
checked against the installed software rather than recorded facts.

Reads the config, its build plan and rendered files, the installed ``tensorrt_llm`` (in a child
interpreter), ``tritonserver``, the Triton backend directories, the scripts the plan runs (their
``--help``), installed package metadata and NVML. Writes nothing. :func:`run_live_preflight` returns
one :class:`~pipeline.validate.live.result.LiveCheck` per assumption (check, expected + where the
expectation comes from, found, verdict, fix); ``specdeploy validate --live`` and
``specdeploy doctor CONFIG`` print them (:mod:`.table`), and ``build`` / ``serve`` / ``run`` on
``backend: trtllm`` refuse to start when one fails (:mod:`.gate`).
"""

from __future__ import annotations

from pipeline.config import DeploymentConfig
from pipeline.validate.live.result import FAIL, PASS, SKIP, LiveCheck


def run_live_preflight(cfg: DeploymentConfig, trtllm_root: str | None = None) -> list[LiveCheck]:
    from pipeline.errors import SpecdeployError  # noqa: PLC0415 - keep the package import light
    from pipeline.plan.planner import make_plan  # noqa: PLC0415 - only this path needs it
    from pipeline.validate.live.gpus import check_gpus  # noqa: PLC0415 - import cycle: pipeline.validate.live.gpus imports pipeline.validate.live
    from pipeline.validate.live.llmapi import check_llm_args  # noqa: PLC0415 - import cycle: pipeline.validate.live.llmapi imports pipeline.validate.live
    from pipeline.validate.live.packages import check_packages  # noqa: PLC0415 - import cycle: pipeline.validate.live.packages imports pipeline.validate.live
    from pipeline.validate.live.parsers import check_plan_parsers  # noqa: PLC0415 - import cycle: pipeline.validate.live.parsers imports pipeline.validate.live
    from pipeline.validate.live.result import failed  # noqa: PLC0415 - only this path needs it
    from pipeline.validate.live.software import (  # noqa: PLC0415 - import cycle: pipeline.validate.live.software imports pipeline.validate.live
        check_backends,
        check_tritonserver,
        check_trtllm_version,
        installed_trtllm,
    )

    installed, found = installed_trtllm()
    checks = [check_trtllm_version(cfg, installed, found), check_tritonserver(cfg), *check_backends(cfg)]
    try:
        plan = make_plan(cfg, trtllm_root)
    except SpecdeployError as exc:
        checks.append(failed("build plan", "a plan", "specdeploy plan", str(exc), "run specdeploy validate CONFIG"))
    else:
        checks += check_plan_parsers(cfg, plan.steps)
    checks += check_llm_args(cfg, installed is not None)
    checks += check_packages()
    checks += check_gpus(cfg)
    return checks


def failures(checks: list[LiveCheck]) -> list[LiveCheck]:
    return [c for c in checks if c.failed]


__all__ = ["FAIL", "PASS", "SKIP", "LiveCheck", "failures", "run_live_preflight"]
