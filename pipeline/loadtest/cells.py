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


def arm_order(arms: tuple[str, ...], repeat: int) -> tuple[str, ...]:
    """The arms' order in ``repeat``: a Williams design, so a slow drift of the machine favours no arm.
    Two arms: A B, B A, ... Three (baseline, speculative, scheduled): the three rotations, then the
    three rotations reversed (A B C, B C A, C A B, C B A, A C B, B A C): every arm takes every position
    once in three repeats, and over six each arm follows each other arm equally often (for an odd
    number of arms a Latin square alone cannot balance who runs right after whom)."""
    n = len(arms)
    if n < 2:
        return arms
    period = 2 * n if n % 2 else n
    block = repeat % period
    rotated = arms[block % n:] + arms[:block % n]
    return rotated if block < n else rotated[::-1]


def plan_runs(cfg: DeploymentConfig, arms: tuple[str, ...], concurrency: list[int], repeats: int,
              sweep: list[int], *, aa: bool = False) -> list[RunSpec]:
    """Interleaved and counterbalanced: for each repeat, for each level, every arm once (the
    speculative one at each draft length) in :func:`arm_order`'s order — baseline then speculative
    in even repeats, speculative first in odd ones (A B, B A, ...); with the scheduled arm a
    Williams design of three — so a slow drift of the machine favours no arm: in the paired
    intervals its effect alternates in sign and cancels instead of biasing every pair the same way.
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
            for arm in arm_order(tuple(arms), rep):
                for dl in (spec_lens if arm == "speculative" else [None]):
                    out.append(RunSpec(arm, level, rep, dl, rate, label))
    return out


def pattern_level(cfg: DeploymentConfig) -> str | None:
    """``ramp`` or ``trace`` when one run holds the whole arrival pattern; None for plain levels."""
    lt = cfg.loadtest
    return "ramp" if lt.ramp else "trace" if lt.mode == "open" and lt.arrival == "trace" else None
