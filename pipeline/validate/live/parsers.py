"""Every script the build plan calls exists, and its own argument parser accepts every flag and
value the plan passes; ``trtllm-build`` likewise.

Reads the plan (:func:`pipeline.plan.planner.make_plan`) and runs each script's ``--help`` with the
interpreter the plan runs (``python3 SCRIPT --help``, ``trtllm-build --help``), then parses
argparse's help text: the option strings and, for ``{a,b}`` metavars, the choices. Why ``--help``
rather than building the parser in-process: the upstream scripts build their parser inside
``main``/``parse_arguments`` (not importable without running the script), ``--help`` exits before
any work in every one of them, and it runs the very file and interpreter the build will run.
Writes nothing.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.config import DeploymentConfig
from pipeline.plan.step import Step
from pipeline.validate.live.result import LiveCheck, failed, passed, skipped

HELP_TIMEOUT_S = 300.0  # the scripts import tensorrt_llm (and torch) before parsing
_OPTION_LINE = re.compile(r"^\s{1,24}(-{1,2}[A-Za-z0-9][\w-]*.*)$")
_OPTION = re.compile(r"^(-{1,2}[A-Za-z0-9][\w-]*)(?:[ =](\S.*))?$")


@dataclass
class ParserSpec:
    """What a parser's help text declares: option → choices (None: any value; () : no value)."""

    options: dict[str, tuple[str, ...] | None] = field(default_factory=dict)


def parse_help(text: str) -> ParserSpec:
    """Option strings and choices from argparse's ``--help`` output."""
    spec = ParserSpec()
    for line in text.splitlines():
        match = _OPTION_LINE.match(line)
        if not match:
            continue
        head = re.split(r"\s{2,}", match.group(1).strip())[0]
        for part in head.split(", "):
            option = _OPTION.match(part.strip())
            if not option:
                continue
            metavar = option.group(2)
            if metavar is None:
                spec.options[option.group(1)] = ()
            elif metavar.startswith("{") and "}" in metavar:
                spec.options[option.group(1)] = tuple(metavar[1:metavar.index("}")].split(","))
            else:
                spec.options[option.group(1)] = None
    return spec


def planned_flags(argv: list[str]) -> list[tuple[str, str | None]]:
    """(flag, value or None) pairs of an argv, from its first ``--flag`` on."""
    out: list[tuple[str, str | None]] = []
    args = argv[next((i for i, a in enumerate(argv) if a.startswith("--")), len(argv)):]
    i = 0
    while i < len(args):
        flag = args[i]
        value = args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("--") else None
        out.append((flag, value))
        i += 2 if value is not None else 1
    return out


def flag_problems(spec: ParserSpec, flags: list[tuple[str, str | None]]) -> list[str]:
    problems = []
    for flag, value in flags:
        if flag not in spec.options:
            problems.append(f"{flag} is not an option")
            continue
        choices = spec.options[flag]
        if choices == () and value is not None:
            problems.append(f"{flag} takes no value, got {value!r}")
        elif choices and value is not None and value not in choices:
            problems.append(f"{flag} {value}: not one of {{{','.join(choices)}}}")
        elif choices is not None and choices != () and value is None:
            problems.append(f"{flag} needs a value")
    return problems


@dataclass(frozen=True)
class Tool:
    """One program the plan runs: its display name, the argv prefix that runs it, its file."""

    name: str
    prefix: tuple[str, ...]
    path: Path | None  # None: a console script found on PATH
    steps: tuple[Step, ...]


def plan_tools(steps: list[Step]) -> list[Tool]:
    """The scripts and console commands of the plan's steps, each with the steps that call it."""
    found: dict[tuple[str, ...], list[Step]] = {}
    for step in steps:
        if step.kind in ("resolve", "engine") or not step.argv:
            continue
        script = next((i for i, a in enumerate(step.argv[:3]) if a.endswith(".py")), None)
        prefix = tuple(step.argv[:script + 1]) if script is not None else (step.argv[0],)
        found.setdefault(prefix, []).append(step)
    return [Tool(_display(p[-1]), p, Path(p[-1]) if p[-1].endswith(".py") else None, tuple(s))
            for p, s in found.items()]


def _display(program: str) -> str:
    """``/app/examples/quantization/quantize.py`` → ``examples/quantization/quantize.py``."""
    parts = Path(program).parts
    return "/".join(parts[parts.index("examples"):]) if "examples" in parts else Path(program).name


def _help(tool: Tool) -> tuple[str | None, str]:
    """The help text, read from both streams: argparse prints it on stdout, but a wrapper (an MPI
    launcher, a logging set-up that redirects stdout) can leave it on stderr."""
    cwd = str(tool.path.parent) if tool.path else None
    try:
        proc = subprocess.run([*tool.prefix, "--help"], capture_output=True, text=True, timeout=HELP_TIMEOUT_S,
                              check=False, cwd=cwd)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, str(exc)
    if proc.returncode != 0:
        tail = [line for line in (proc.stderr or proc.stdout).splitlines() if line.strip()][-2:]
        return None, f"`{' '.join(tool.prefix[-1:])} --help` exited {proc.returncode}: {' | '.join(tail)}"
    return "\n".join(part for part in (proc.stdout, proc.stderr) if part), ""


def check_tool(cfg: DeploymentConfig, tool: Tool, trtllm_problem: str = "") -> LiveCheck:
    """``trtllm_problem``: why ``import tensorrt_llm`` fails here, if it does (every script the plan
    runs imports it before parsing, so its parser cannot be asked)."""
    name = f"parser {tool.name}"
    steps = ", ".join(s.name for s in tool.steps)
    source = f"the plan's steps {steps} (pipeline/trtllm/commands.py for TensorRT-LLM {cfg.trtllm_version})"
    flags = sorted({flag for step in tool.steps for flag, _ in planned_flags(step.argv)})
    expected = f"accepts {', '.join(flags)}"
    if tool.path is not None and not tool.path.is_file():
        return failed(name, expected, source, f"{tool.path}: no such file",
                      "point --trtllm-root / trtllm_root / $SPECDEPLOY_TRTLLM_ROOT at a TensorRT-LLM checkout "
                      f"of v{cfg.trtllm_version} (inside the NGC image: /app)")
    # TensorRT-LLM's scripts and trtllm-build import tensorrt_llm first; ModelOpt's hf_ptq.py does not
    if trtllm_problem and (tool.path is None or "/examples/llm_ptq/" not in str(tool.path)):
        return skipped(name, expected, source, "not checked: the script imports tensorrt_llm, which does not import "
                       "here (row tensorrt_llm version)")
    if tool.path is None and shutil.which(tool.prefix[0]) is None:
        return failed(name, expected, source, f"no `{tool.prefix[0]}` on PATH",
                      f"run inside {cfg.triton.container_image} (the tensorrt_llm wheel installs it)")
    text, problem = _help(tool)
    if text is None:
        return failed(name, expected, source, problem, "install the script's requirements.txt, then run it by hand")
    spec = parse_help(text)
    if not spec.options:
        return failed(name, expected, source, f"`{tool.prefix[-1]} --help` printed no options on stdout or stderr",
                      "run it by hand: a wrapper or a broken install swallows its help")
    problems = sorted({p for step in tool.steps for p in flag_problems(spec, planned_flags(step.argv))})
    if not problems:
        return passed(name, expected, source, f"{len(spec.options)} options; all planned flags accepted")
    return failed(name, expected, source, "; ".join(problems),
                  f"use the TensorRT-LLM the plan was written for ({cfg.trtllm_version}), or report the difference",
                  "recorded fact 'this parser accepts the planned flags' (pipeline/trtllm/commands.py, stand-in "
                  "tests/gpu_sim/build_tools.py) is wrong for this install")


def check_plan_parsers(cfg: DeploymentConfig, steps: list[Step], trtllm_problem: str = "") -> list[LiveCheck]:
    return [check_tool(cfg, tool, trtllm_problem) for tool in plan_tools(steps)]
