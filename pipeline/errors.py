"""Errors every stage raises for *user* problems; the CLI prints them as one line (or one line per
problem) and exits non-zero, never with a traceback. Programming errors stay ordinary exceptions."""

from __future__ import annotations

# The one exit-code table every command follows (docs/ci.md). A CI job tells a losing
# speculation (1) from a broken pipeline (5) and a mistyped command or config (2).
EXIT_GO = 0
EXIT_NO_GO = 1
EXIT_USAGE = 2            # bad flag, config field, path, model name: fix the invocation
EXIT_INCONCLUSIVE = 3
EXIT_STOPPED_EARLY = 4    # the load test stopped early: the server refused every request
EXIT_FAILURE = 5          # environment or pipeline failure: a build step, a server, an endpoint, the load harness
EXIT_INTERRUPTED = 130

EXIT_CODE_TABLE: dict[int, str] = {
    EXIT_GO: "GO: speculation pays at the gated concurrency levels",
    EXIT_NO_GO: "NO-GO: measured, and speculation does not pay (or breaks a guardrail)",
    EXIT_USAGE: "usage or config error: bad flag, field, path or model name",
    EXIT_INCONCLUSIVE: "INCONCLUSIVE: the runs cannot support a decision",
    EXIT_STOPPED_EARLY: "stopped early: the server refused every request",
    EXIT_FAILURE: "environment or pipeline failure: build step, server, endpoint or load harness",
    EXIT_INTERRUPTED: "interrupted",
}


def exit_code_epilog() -> str:
    """The table as the epilog of every command's ``--help``: generated, so it cannot drift."""
    # "\b" stops Click from re-flowing the paragraph, so the table keeps one line per code.
    return "\b\nExit codes:\n" + "\n".join(f"  {code:<4} {text}" for code, text in EXIT_CODE_TABLE.items())


class SpecdeployError(Exception):
    """A user-facing failure: bad input, a failed external step, a missing dependency.

    Exits :data:`EXIT_FAILURE` unless its class (or ``exit_code=`` at the raise site, for a class
    whose sites differ) says otherwise: a failure is never NO-GO, which only a measurement may say."""

    exit_code = EXIT_FAILURE

    def __init__(self, *args: object, exit_code: int | None = None):
        super().__init__(*args)
        if exit_code is not None:
            self.exit_code = exit_code

    def lines(self) -> list[str]:
        return [str(self)]


class UsageError(SpecdeployError):
    """The invocation itself is wrong (flag, path, model name): nothing ran."""

    exit_code = EXIT_USAGE


class ConfigError(SpecdeployError):
    """An invalid config file: one ``field.path: message`` line per problem."""

    exit_code = EXIT_USAGE

    def __init__(self, source: str, problems: list[str]):
        self.source = source
        self.problems = problems
        super().__init__(f"{source}: " + "; ".join(problems))

    def lines(self) -> list[str]:
        return [f"{self.source}: {len(self.problems)} problem(s)"] + [f"  {p}" for p in self.problems]


class PreflightError(SpecdeployError):
    """Preflight found problems that would fail the build or the deployment. The static checks
    (config against checkpoints and hardware profile) are a config error; the live ones (this
    host's GPUs, driver, container) pass ``exit_code=EXIT_FAILURE``."""

    exit_code = EXIT_USAGE

    def __init__(self, problems: list[str], *, exit_code: int | None = None):
        self.problems = problems
        super().__init__("; ".join(problems), exit_code=exit_code)

    def lines(self) -> list[str]:
        return [f"preflight failed: {len(self.problems)} problem(s)"] + [f"  {p}" for p in self.problems]


class BuildError(SpecdeployError):
    """A build step failed or produced an engine that does not match the config (exit 5)."""


class ServeError(SpecdeployError):
    """The server did not start, or died (exit 5)."""


class StaleInputError(SpecdeployError):
    """A stage's input is missing or was produced from another config (config hash mismatch):
    run the earlier stage, a usage error (exit 2)."""

    exit_code = EXIT_USAGE
