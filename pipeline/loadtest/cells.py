"""The cells of a load test and their order: one cell is one Locust run (arm × level × repeat, and
draft length on a swept speculative arm), keyed ``<arm>[-k<K>]-<c<users>|q<rate>>-r<repeat>``.

Reads the config's ``loadtest`` section and the method's primary draft length; writes nothing. The
runner measures the plan in this order; :mod:`pipeline.loadtest.resume` re-plans a run from its
``run.json`` with the same function to tell which cells are still missing.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.config import DeploymentConfig
from pipeline.loadtest.inputs import primary_draft_len


@dataclass(frozen=True)
class RunSpec:
    arm: str
    concurrency: int  # closed loop: users; open loop: level index stands in (rate in target_rate)
    repeat: int
    draft_len: int | None
    target_rate: float | None = None
    level: str | None = None  # a ramp or a trace: one level of its own (loadtest.ramp, arrival: trace)

    @property
    def key(self) -> str:
        level = self.level or (f"q{self.target_rate:g}" if self.target_rate is not None else f"c{self.concurrency}")
        dl = f"-k{self.draft_len}" if self.draft_len is not None and self.arm == "speculative" else ""
        return f"{self.arm}{dl}-{level}-r{self.repeat}"


def plan_runs(cfg: DeploymentConfig, arms: tuple[str, ...], concurrency: list[int], repeats: int,
              sweep: list[int], *, aa: bool = False) -> list[RunSpec]:
    """Interleaved and counterbalanced: for each repeat, for each level, baseline then speculative (each
    draft length) in even repeats, speculative first in odd ones (A B, B A, ...), so a slow drift of
    the machine favours neither arm: in the paired intervals its effect alternates in sign and
    cancels over each two repeats instead of biasing every pair the same way.
    ``aa``: the second arm is the baseline measured again (no draft length)."""
    primary = primary_draft_len(cfg)
    spec_lens = [None] if aa else (sweep or [primary])
    open_loop = cfg.loadtest.mode == "open"
    levels: list[tuple[int, float | None]] = (
        [(i + 1, rate) for i, rate in enumerate(cfg.loadtest.request_rate)] if open_loop
        else [(c, None) for c in concurrency]
    )
    label = pattern_level(cfg)
    if label:  # a ramp or a trace is one level: its steps or arrivals run inside one Locust run
        levels = [(max((s.users or 1) for s in cfg.loadtest.ramp) if cfg.loadtest.ramp and not open_loop else 1, None)]
    out = []
    for rep in range(repeats):
        for level, rate in levels:
            for arm in (arms if rep % 2 == 0 else arms[::-1]):
                for dl in (spec_lens if arm == "speculative" else [None]):
                    out.append(RunSpec(arm, level, rep, dl, rate, label))
    return out


def pattern_level(cfg: DeploymentConfig) -> str | None:
    """``ramp`` or ``trace`` when one run holds the whole arrival pattern; None for plain levels."""
    lt = cfg.loadtest
    return "ramp" if lt.ramp else "trace" if lt.mode == "open" and lt.arrival == "trace" else None
