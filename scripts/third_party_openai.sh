#!/usr/bin/env bash
# Install a third-party OpenAI-compatible server for the load-test check against a server this project
# did not write: Hugging Face `transformers serve` (transformers[serving], from the package registry),
# in its own virtual environment (.venv-tfserve), so the project's .venv keeps exactly its pins.
# Idempotent. The slow test tests/integration/test_third_party_openai.py starts two servers from it
# (baseline, and prompt-lookup speculation through a generation config) on the demo target.
# Quirks of this server and how the test meets them: docs/openai-endpoints.md.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${SPECDEPLOY_TFSERVE_VENV:-.venv-tfserve}
PINS=("torch==2.13.0" "transformers[serving]==5.25.0")
stamp=$VENV/.installed
want=$(printf '%s\n' "${PINS[@]}" | sha256sum | cut -c1-16)
if [[ -f $stamp && $(cat "$stamp") == "$want" ]]; then
  exit 0
fi
started=$(date +%s)
[[ -x $VENV/bin/python ]] || "${PYTHON:-python3}" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q "${PINS[@]}"
"$VENV/bin/python" -c 'from transformers.utils.import_utils import is_serve_available as ok; assert ok(), "transformers serve: serving extras missing"'
echo "$want" > "$stamp"
echo "third-party OpenAI server (transformers serve) installed in $VENV in $(( $(date +%s) - started ))s" >&2
