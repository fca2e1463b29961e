"""Errors every stage raises for *user* problems; the CLI prints them as one line (or one line per
problem) and exits non-zero, never with a traceback. Programming errors stay ordinary exceptions."""

from __future__ import annotations


class SpecdeployError(Exception):
    """A user-facing failure: bad input, a failed external step, a missing dependency."""

    exit_code = 1

    def lines(self) -> list[str]:
        return [str(self)]


class ConfigError(SpecdeployError):
    """An invalid config file: one ``field.path: message`` line per problem."""

    def __init__(self, source: str, problems: list[str]):
        self.source = source
        self.problems = problems
        super().__init__(f"{source}: " + "; ".join(problems))

    def lines(self) -> list[str]:
        return [f"{self.source}: {len(self.problems)} problem(s)"] + [f"  {p}" for p in self.problems]


class PreflightError(SpecdeployError):
    """Preflight found problems that would fail the build or the deployment."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("; ".join(problems))

    def lines(self) -> list[str]:
        return [f"preflight failed: {len(self.problems)} problem(s)"] + [f"  {p}" for p in self.problems]


class BuildError(SpecdeployError):
    """A build step failed or produced an engine that does not match the config."""


class ServeError(SpecdeployError):
    """The server did not start, or died."""


class StaleInputError(SpecdeployError):
    """A stage's input was produced from another config (config hash mismatch)."""
