"""The stand-in parsers of tests/gpu_sim/build_tools.py stay tied to upstream's: every flag a
stand-in declares is one the upstream script declares (tests/gpu_sim/upstream_flags.json, with the
upstream file and revision it was recorded from), with choices upstream accepts; and every flag the
project's plans pass is one the stand-in declares. scripts/upstream_flags.py writes that JSON from
an upstream checkout; its extraction is tested here on a parser written for the test."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.paths import PROJECT_ROOT
from tests.gpu_sim import build_tools

RECORDED = json.loads((Path(__file__).parent / "upstream_flags.json").read_text())
STAND_INS = {"quantization/quantize.py": build_tools._quantize_parser, "trtllm-build": build_tools._build_parser}


def stand_in_flags(parser: argparse.ArgumentParser) -> dict[str, list[str] | None]:
    out = {}
    for action in parser._actions:
        for option in action.option_strings:
            if option in ("-h", "--help"):
                continue
            out[option] = [str(c) for c in action.choices] if action.choices else (None if action.nargs != 0 else [])
    return out


def drift_problems(script: str, parser: argparse.ArgumentParser) -> list[str]:
    recorded = RECORDED["scripts"][script]
    upstream = dict(recorded["flags"])
    upstream.update(dict.fromkeys(recorded.get("dynamic", {}).get("flags", []), "dynamic"))
    problems = []
    for flag, choices in stand_in_flags(parser).items():
        if flag not in upstream:
            problems.append(f"{flag}: not declared by {recorded['source']['path']} at {recorded['source']['ref']}")
        elif isinstance(upstream[flag], list) and upstream[flag] and choices and not set(choices) <= set(upstream[flag]):
            problems.append(f"{flag}: stand-in choices {sorted(set(choices) - set(upstream[flag]))} not upstream's")
        elif upstream[flag] == [] and choices != []:
            problems.append(f"{flag}: a switch upstream, takes a value in the stand-in")
    return problems


@pytest.mark.parametrize("script", sorted(STAND_INS))
def test_every_stand_in_flag_is_upstreams(script):
    assert drift_problems(script, STAND_INS[script]()) == []


def test_a_drifted_stand_in_is_caught():
    """The check can fail: a renamed flag, a choice upstream lacks, a switch that takes a value."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--quant_format")
    parser.add_argument("--qformat", choices=["fp8", "fp4_magic"])
    parser.add_argument("--quantize_lm_head", default="no")
    problems = drift_problems("quantization/quantize.py", parser)
    assert [p.split(":")[0] for p in problems] == ["--quant_format", "--qformat", "--quantize_lm_head"]


def test_the_extraction_script_reads_add_argument_calls(tmp_path):
    source = tmp_path / "tool.py"
    source.write_text("import argparse\nCHOICES = ['x']\np = argparse.ArgumentParser()\n"
                      "p.add_argument('--a', type=int)\np.add_argument('--b', '--bee', choices=['p', 'q'])\n"
                      "p.add_argument('--c', action='store_true')\np.add_argument('--d', choices=CHOICES)\n"
                      "p.add_argument('positional')\n")
    proc = subprocess.run([sys.executable, str(PROJECT_ROOT / "scripts" / "upstream_flags.py"), str(source)],
                          capture_output=True, text=True, check=True)
    flags = json.loads(proc.stdout)["scripts"][str(source)]["flags"]
    assert flags == {"--a": None, "--b": ["p", "q"], "--bee": ["p", "q"], "--c": [], "--d": "dynamic"}
