"""One row of the live preflight: what was checked, what was expected and where that expectation
comes from, what this install has, the verdict and the fix. Reads and writes nothing."""

from __future__ import annotations

from dataclasses import asdict, dataclass

PASS, FAIL, SKIP = "pass", "FAIL", "skip"


@dataclass(frozen=True)
class LiveCheck:
    check: str  # e.g. "tensorrt_llm version"
    expected: str
    source: str  # where the expectation comes from (config field, recorded fact + its upstream source)
    found: str
    verdict: str  # pass | FAIL | skip
    fix: str = ""
    wrong_fact: str = ""  # "recorded fact X is wrong for this install", when a recorded fact is contradicted

    @property
    def failed(self) -> bool:
        return self.verdict == FAIL

    def line(self) -> str:
        text = f"{self.check}: expected {self.expected} ({self.source}), found {self.found}"
        if self.wrong_fact:
            text += f"; {self.wrong_fact}"
        return text + (f" (fix: {self.fix})" if self.fix else "")

    def to_dict(self) -> dict[str, str]:
        return {k: v for k, v in asdict(self).items() if v != ""}


def passed(check: str, expected: str, source: str, found: str) -> LiveCheck:
    return LiveCheck(check, expected, source, found, PASS)


def failed(check: str, expected: str, source: str, found: str, fix: str, wrong_fact: str = "") -> LiveCheck:
    return LiveCheck(check, expected, source, found, FAIL, fix, wrong_fact)


def skipped(check: str, expected: str, source: str, why: str) -> LiveCheck:
    return LiveCheck(check, expected, source, why, SKIP)
