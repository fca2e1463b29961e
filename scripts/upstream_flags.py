#!/usr/bin/env python3
"""Extract the argparse flags (and literal choices) each TensorRT-LLM script declares, from an
upstream checkout at a tag, into the JSON that ties tests/gpu_sim/build_tools.py's stand-in parsers
to upstream (tests/gpu_sim/test_upstream_flags.py).

Reads ``git -C CHECKOUT show REF:PATH`` for each script (or a plain file with ``--file``) and parses
it with :mod:`ast` — nothing upstream is imported or run. Every ``*.add_argument("--x", ...)`` call
with literal option strings is recorded: ``{"--x": ["a", "b"]}`` for literal ``choices``, ``null``
for any value, ``[]`` for a switch (``store_true``/``store_false``); choices built at run time are
``"dynamic"``. Writes JSON to stdout. Usage::

    python scripts/upstream_flags.py --checkout TensorRT-LLM --ref v1.2.1 \
        examples/quantization/quantize.py tensorrt_llm/commands/build.py > flags.json
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
from typing import Any


def _literal(node: ast.AST) -> Any:
    try:
        return ast.literal_eval(node)
    except (ValueError, SyntaxError):
        return "dynamic"


def flags_of(source: str) -> dict[str, Any]:
    """``{"--flag": choices | None | [] | "dynamic"}`` for every literal add_argument call."""
    out: dict[str, Any] = {}
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"):
            continue
        names = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        names = [n for n in names if n.startswith("-")]
        if not names:
            continue
        keywords = {k.arg: k.value for k in node.keywords if k.arg}
        action = keywords.get("action")
        if isinstance(action, ast.Constant) and action.value in ("store_true", "store_false"):
            value: Any = []
        elif "choices" in keywords:
            choices = _literal(keywords["choices"])
            value = [str(c) for c in choices] if isinstance(choices, (list, tuple)) else "dynamic"
        else:
            value = None
        for name in names:
            out[name] = value
    return out


def _source(checkout: str | None, ref: str | None, path: str) -> str:
    if checkout is None:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    return subprocess.run(["git", "-C", checkout, "show", f"{ref}:{path}"], check=True, capture_output=True,
                          text=True).stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("paths", nargs="+")
    parser.add_argument("--checkout", help="a TensorRT-LLM git checkout (omit to read the paths as files)")
    parser.add_argument("--ref", default="v1.2.1")
    args = parser.parse_args(argv)
    scripts = {path: {"source": {"repo": "NVIDIA/TensorRT-LLM", "path": path, "ref": args.ref},
                      "flags": flags_of(_source(args.checkout, args.ref, path))} for path in args.paths}
    json.dump({"scripts": scripts}, sys.stdout, indent=2, sort_keys=True)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
