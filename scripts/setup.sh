#!/usr/bin/env bash
# Create .venv with everything the CPU default needs (idempotent; re-run after pulling).
# torch is installed first and pinned to 2.13.0, the CPU build; an unpinned torch would pull a
# multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
stamp=.venv/.specdeploy-installed
want=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)
if [[ -f $stamp && $(cat "$stamp") == "$want" ]]; then
  exit 0
fi
if [[ ! -x .venv/bin/python ]]; then
  echo "specdeploy: creating .venv with $($PY --version)" >&2
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "torch==2.13.0"
.venv/bin/python -m pip install -q -e ".[cpu,dev]"
echo "$want" > "$stamp"
echo "specdeploy: environment ready in .venv" >&2
