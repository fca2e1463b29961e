#!/usr/bin/env bash
# Create .venv with everything the CPU default needs (idempotent; re-run after pulling).
# Python 3.10-3.13: the bundled tritonserver ships a Python-backend stub per Python version and
# none newer than 3.13. torch is installed first, pinned to 2.13.0 (docs/install.md):
#   SPECDEPLOY_TORCH_INDEX_URL set and reachable -> torch from that index (e.g. the CPU build from
#     https://download.pytorch.org/whl/cpu);
#   otherwise -> torch==2.13.0 from pip's configured indexes; on PyPI for Linux x86-64 that is the
#     CUDA build with its nvidia-* wheels, unless a local +cpu wheel (find-links) is offered too.
# PYTHON names the interpreter a new .venv is created with (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv
TORCH_PIN="torch==2.13.0"
INDEX=${SPECDEPLOY_TORCH_INDEX_URL:-}
stamp=$VENV/.specdeploy-installed
want=$( (cat pyproject.toml scripts/setup.sh; echo "$INDEX") | sha256sum | cut -c1-16)
if [[ -f $stamp && $(cat "$stamp") == "$want" ]]; then
  exit 0
fi
if [[ ! -x $VENV/bin/python ]]; then
  if ! "$PY" -c 'import sys; sys.exit(not ((3, 10) <= sys.version_info[:2] <= (3, 13)))'; then
    echo "specdeploy: $PY is $("$PY" --version 2>&1); needs Python 3.10-3.13 (set PYTHON=...)" >&2
    exit 2
  fi
  echo "specdeploy: creating $VENV with $("$PY" --version)" >&2
  "$PY" -m venv "$VENV"
fi
VPY=$VENV/bin/python
"$VPY" -m pip install -q --upgrade pip

index_reachable() {  # the index answers for torch's project page within 15 s
  "$VPY" - "$1" <<'EOF'
import sys, urllib.request
url = sys.argv[1].rstrip("/") + "/torch/"
try:
    with urllib.request.urlopen(url, timeout=15) as response:
        sys.exit(0 if response.status == 200 else 1)
except Exception as exc:  # DNS, refused, timeout, HTTP error: all mean "not usable"
    print(f"specdeploy: {url}: {exc}", file=sys.stderr)
    sys.exit(1)
EOF
}

if [[ -n $INDEX ]] && index_reachable "$INDEX"; then
  echo "specdeploy: installing $TORCH_PIN from $INDEX" >&2
  "$VPY" -m pip install -q --index-url "$INDEX" "$TORCH_PIN"
else
  if [[ -n $INDEX ]]; then
    echo "specdeploy: SPECDEPLOY_TORCH_INDEX_URL=$INDEX is not reachable; falling back to pip's indexes" >&2
  fi
  echo "specdeploy: installing $TORCH_PIN from pip's configured indexes (on PyPI for Linux x86-64:" \
       "the CUDA build and its nvidia-* wheels, several GB; set SPECDEPLOY_TORCH_INDEX_URL for a CPU build)" >&2
  "$VPY" -m pip install -q "$TORCH_PIN"
fi
"$VPY" -c 'import torch; build = "CUDA " + torch.version.cuda if torch.version.cuda else "CPU-only"
print("specdeploy: torch", torch.__version__, "installed,", build, "build")' >&2
"$VPY" -m pip install -q -e ".[cpu,dev]"
echo "$want" > "$stamp"
echo "specdeploy: environment ready in $VENV" >&2
