"""The ``specdeploy`` command line: thin commands over the library.

``run(argv)`` executes one command and returns its exit code, raising on user errors
(:class:`pipeline.errors.SpecdeployError`) and usage errors so tests can assert on them; ``main()`` is the console
script: it prints a user error as one line per problem (no traceback) and exits with the error's
code from the one table in :mod:`pipeline.errors` (docs/ci.md): 2 for a usage or config error
(Click's included), 5 for a failure, and 5 with the traceback for an unexpected exception, so a
crash never reads as NO-GO.
Command modules import heavy libraries (torch, scipy, matplotlib) inside their functions only, so
``validate`` and ``plan`` stay fast.
"""

from __future__ import annotations

import sys
import traceback
from typing import Sequence

import typer

from pipeline.errors import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_USAGE, SpecdeployError, exit_code_epilog

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
    epilog=exit_code_epilog(),
)


def _register_commands() -> None:
    from pipeline.cli import (
        bench_cmd,
        build_cmd,
        capacity_cmd,
        demo_cmd,
        doctor_cmd,
        forecast_cmd,
        loadtest_cmd,
        plan_cmd,
        render_cmd,
        report_cmd,
        run_cmd,
        schedule_cmd,
        schema_cmd,
        serve_cmd,
        validate_cmd,
    )

    for module in (
        validate_cmd,
        plan_cmd,
        forecast_cmd,
        capacity_cmd,
        build_cmd,
        render_cmd,
        serve_cmd,
        loadtest_cmd,
        report_cmd,
        schedule_cmd,
        run_cmd,
        bench_cmd,
        demo_cmd,
        doctor_cmd,
        schema_cmd,
    ):
        module.register(app)
    # Every command's --help ends with the one exit-code table (pipeline/errors.py), generated
    # from EXIT_CODE_TABLE so help, README and docs/ci.md cannot drift apart.
    for info in app.registered_commands:
        info.epilog = info.epilog or exit_code_epilog()
    for group in app.registered_groups:  # `demo train|info|prompts`
        group.typer_instance.info.epilog = exit_code_epilog()
        for info in group.typer_instance.registered_commands:
            info.epilog = info.epilog or exit_code_epilog()


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
        # Click's own usage errors exit 2 already; its other exceptions (a file option it cannot
        # open) exit 1, which is NO-GO in our table: every one of them is a bad invocation.
        code = EXIT_USAGE
    except OSError as exc:  # disk full, permission denied, …: one line naming the path (cli/os_errors.py)
        from pipeline.cli.os_errors import os_error_line, stage_of  # here: only a failed command needs it

        commands = [c.name for c in app.registered_commands] + [g.name for g in app.registered_groups]
        print(f"error: {os_error_line(stage_of(argv, commands), exc)}", file=sys.stderr)
        code = EXIT_FAILURE
    except typer.Abort:
        print("aborted", file=sys.stderr)
        code = EXIT_INTERRUPTED
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        code = EXIT_INTERRUPTED
    except Exception:  # noqa: BLE001 - a bug: its traceback, and the failure code, never NO-GO's 1 (Python's default)
        traceback.print_exc()
        code = EXIT_FAILURE
    sys.exit(code)
