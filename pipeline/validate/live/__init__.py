"""The live preflight: on the GPU host (inside the container), every assumption the plan rests on
checked against the installed software and hardware rather than recorded facts or labels.

Reads the config, its build plan and rendered files, the checkpoints (through ``validate``'s own
checks), the installed ``tensorrt_llm`` and package metadata in the interpreter that runs it (a
child process), the ``tritonserver`` that serve launches and its release file, the Triton backend
directories, the scripts the plan runs (their ``--help``) and NVML. Writes nothing.
:func:`run_host_preflight` is the one entry point of ``specdeploy validate CONFIG --live`` and
``specdeploy doctor CONFIG``: validate's findings plus one :class:`~pipeline.validate.live.result.LiveCheck`
per assumption (check, expected + where the expectation comes from, found, verdict, fix), printed by
:mod:`.table`; ``build`` / ``serve`` / ``run`` on ``backend: trtllm`` refuse to start when a check
fails (:mod:`.gate`). No check raises: an unexpected error becomes its own failed row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from pipeline.config import DeploymentConfig
from pipeline.validate.findings import Finding
from pipeline.validate.live.result import FAIL, PASS, SKIP, LiveCheck, failed


@dataclass
class HostPreflight:
    """What ``validate --live`` and ``doctor CONFIG`` report: validate's findings and the live rows."""

    findings: list[Finding]
    checks: list[LiveCheck]

    def problems(self) -> list[str]:
        from pipeline.validate.preflight import errors_of  # noqa: PLC0415 - import cycle: preflight imports the plan

        return [f.line() for f in errors_of(self.findings)] + [f"live preflight: {c.line()}" for c in failures(self.checks)]


def _guarded(name: str, check: Callable[[], list[LiveCheck]]) -> list[LiveCheck]:
    """The rows of ``check``, or one failed row naming the exception: a preflight never tracebacks."""
    try:
        return check()
    except Exception as exc:  # noqa: BLE001 - the point: whatever a broken host makes a check raise becomes a row
        return [failed(name, "the check runs", "specdeploy", f"the check itself raised {type(exc).__name__}: {exc}",
                       "report this with the output of `specdeploy doctor --json`")]


def _plan_need(findings: list[Finding]) -> tuple[float | None, str]:
    from pipeline.validate.preflight import memory_estimate_of  # noqa: PLC0415 - import cycle: preflight imports the plan

    estimate = memory_estimate_of(findings)
    if estimate is None:
        return None, "the plan's memory is not estimated (model shapes unknown: see validate's findings)"
    return float(estimate["total_gib"]), ""


def run_live_preflight(cfg: DeploymentConfig, trtllm_root: str | None = None,
                       findings: list[Finding] | None = None) -> list[LiveCheck]:
    """The live rows (``findings``: validate's, when the caller already ran it)."""
    from pipeline.errors import SpecdeployError  # noqa: PLC0415 - keep the package import light
    from pipeline.plan.planner import make_plan  # noqa: PLC0415 - only this path needs it
    from pipeline.validate.live.checkpoints import check_checkpoints  # noqa: PLC0415 - import cycle: the live modules import this package
    from pipeline.validate.live.gpus import check_gpus  # noqa: PLC0415 - import cycle: the live modules import this package
    from pipeline.validate.live.llmapi import check_llm_args  # noqa: PLC0415 - import cycle: the live modules import this package
    from pipeline.validate.live.packages import check_packages  # noqa: PLC0415 - import cycle: the live modules import this package
    from pipeline.validate.live.parsers import check_plan_parsers  # noqa: PLC0415 - import cycle: the live modules import this package
    from pipeline.validate.live.software import (  # noqa: PLC0415 - import cycle: the live modules import this package
        Trtllm,
        check_backends,
        check_mpirun,
        check_tritonserver,
        check_trtllm_version,
        installed_trtllm,
    )
    from pipeline.validate.preflight import run_preflight  # noqa: PLC0415 - import cycle: preflight imports the plan

    if findings is None:
        findings = run_preflight(cfg, offline=False, trtllm_root=trtllm_root)
    image = cfg.triton.container_image
    trtllm_rows: list[Trtllm] = []

    def trtllm_version() -> list[LiveCheck]:
        trtllm_rows.append(installed_trtllm(image))
        return [check_trtllm_version(cfg, trtllm_rows[0])]

    checks = _guarded("tensorrt_llm version", trtllm_version)
    trtllm = trtllm_rows[0] if trtllm_rows else Trtllm(None, "unknown", "")
    checks += _guarded("tritonserver", lambda: [check_tritonserver(cfg), check_mpirun(cfg)])
    checks += _guarded("backends", lambda: check_backends(cfg))

    def parsers() -> list[LiveCheck]:
        try:
            plan = make_plan(cfg, trtllm_root)
        except SpecdeployError as exc:
            return [failed("build plan", "a plan", "specdeploy plan", str(exc), "run specdeploy validate CONFIG")]
        return check_plan_parsers(cfg, plan.steps, "" if trtllm.version else trtllm.found)

    checks += _guarded("parsers", parsers)
    checks += _guarded("LLM args", lambda: check_llm_args(cfg, trtllm.version is not None))
    checks += _guarded("packages", lambda: check_packages(image))
    checks += _guarded("checkpoints", lambda: check_checkpoints(cfg, findings))
    need, why = _plan_need(findings)
    checks += _guarded("GPUs", lambda: check_gpus(cfg, need, why))
    return checks


def run_host_preflight(cfg: DeploymentConfig, trtllm_root: str | None = None) -> HostPreflight:
    """validate's findings (with the checkpoints) and the live rows: the one preflight of
    ``validate --live`` and ``doctor CONFIG``."""
    from pipeline.validate.preflight import run_preflight  # noqa: PLC0415 - import cycle: preflight imports the plan

    findings = run_preflight(cfg, offline=False, trtllm_root=trtllm_root)
    return HostPreflight(findings, run_live_preflight(cfg, trtllm_root, findings))


def failures(checks: list[LiveCheck]) -> list[LiveCheck]:
    return [c for c in checks if c.failed]


__all__ = ["FAIL", "PASS", "SKIP", "HostPreflight", "LiveCheck", "failures", "run_host_preflight",
           "run_live_preflight"]
