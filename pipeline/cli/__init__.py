"""The ``specdeploy`` command line: thin commands over the library.

``run(argv)`` executes one command and returns its exit code, raising on user errors
(:class:`pipeline.errors.SpecdeployError`) and usage errors so tests can assert on them; ``main()`` is the console
script: it prints a user error as one line per problem (no traceback) and exits non-zero.
Command modules import heavy libraries (torch, scipy, matplotlib) inside their functions only, so
``validate`` and ``plan`` stay fast.
"""

from __future__ import annotations

import sys
from typing import Sequence

import typer

from pipeline.errors import EXIT_FAILURE, SpecdeployError

try:  # typer >= 0.20 vendors its own click; older typer uses click itself
    from typer._click.exceptions import ClickException as _ClickException
except ImportError:  # pragma: no cover
    from click import ClickException as _ClickException

app = typer.Typer(
    name="specdeploy",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    help=(
        "Take a target LLM and a draft (draft model, Medusa heads or EAGLE head) to a measured "
        "speculative-decoding deployment on Triton + TensorRT-LLM, and decide from evidence "
        "whether to roll it out.\n\n"
        "Pipeline: validate -> plan -> build -> render -> serve -> loadtest -> report "
        "(`run` does all of it). Every command takes the config YAML; outputs go to "
        "engines/NAME/ and reports/NAME/ under --workdir (default: the current directory)."
    ),
)


def _register_commands() -> None:
    from pipeline.cli import (
        bench_cmd,
        build_cmd,
        demo_cmd,
        doctor_cmd,
        forecast_cmd,
        loadtest_cmd,
        plan_cmd,
        render_cmd,
        report_cmd,
        run_cmd,
        schema_cmd,
        serve_cmd,
        validate_cmd,
    )

    for module in (
        validate_cmd,
        plan_cmd,
        forecast_cmd,
        build_cmd,
        render_cmd,
        serve_cmd,
        loadtest_cmd,
        report_cmd,
        run_cmd,
        bench_cmd,
        demo_cmd,
        doctor_cmd,
        schema_cmd,
    ):
        module.register(app)


_register_commands()


def run(argv: Sequence[str]) -> int:
    """Run one CLI invocation in-process. Returns the exit code; raises SpecdeployError and
    Click usage errors instead of printing them."""
    result = app(args=list(argv), prog_name="specdeploy", standalone_mode=False)
    return int(result) if isinstance(result, int) else 0


def main(argv: Sequence[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    try:
        code = run(argv)
    except SpecdeployError as exc:
        lines = exc.lines()
        print(f"error: {lines[0]}", file=sys.stderr)
        for line in lines[1:]:
            print(line, file=sys.stderr)
        code = exc.exit_code
    except _ClickException as exc:
        exc.show()
        code = exc.exit_code
    except OSError as exc:  # disk full, permission denied, …: one line naming the path (cli/os_errors.py)
        from pipeline.cli.os_errors import os_error_line, stage_of  # here: only a failed command needs it

        commands = [c.name for c in app.registered_commands] + [g.name for g in app.registered_groups]
        print(f"error: {os_error_line(stage_of(argv, commands), exc)}", file=sys.stderr)
        code = EXIT_FAILURE
    except typer.Abort:
        print("aborted", file=sys.stderr)
        code = 130
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        code = 130
    sys.exit(code)
