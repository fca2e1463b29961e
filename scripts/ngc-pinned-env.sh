#!/usr/bin/env bash
# The served Python models' tests at the packages the GPU container pins (transformers 4.x, numpy 1.x,
# Python 3.12; pipeline/validate/ngc_image_packages.yaml records each pin and its source).
# 1. creates .venv-ngc with the container's Python (python3.12; python3.11 if none, said in the output);
# 2. installs the container's pins, then the project exactly as docs/install.md tells a GPU host
#    (`pip install ".[gpu-host]"`), and fails if that changed transformers, tokenizers, numpy or
#    sentencepiece, or brought in torch;
# 3. runs the served models' unit tests there (pre/postprocessing over tokenizer.json and SentencePiece,
#    the BLS, request rules, the llmapi helpers).
# Needs .venv (scripts/setup.sh) to read the pins. Usage: scripts/ngc-pinned-env.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-ngc
want_py=$(.venv/bin/python -m pipeline.validate.served_packages --python)
PY=""
for candidate in "python$want_py" "$HOME/.pyenv/versions/$want_py"*/bin/"python$want_py" /root/.pyenv/versions/"$want_py"*/bin/"python$want_py"; do
  if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c 'import venv' 2>/dev/null; then PY=$candidate; break; fi
done
if [[ -z $PY ]]; then
  PY=python3.11
  echo "ngc-pinned-env: no python$want_py here; using $($PY --version) (the container has Python $want_py)" >&2
fi
rm -rf "$VENV"
"$PY" -m venv "$VENV"
VPY=$VENV/bin/python
echo "ngc-pinned-env: $($VPY --version) in $VENV" >&2
mapfile -t pins < <(.venv/bin/python -m pipeline.validate.served_packages --requirements)
"$VPY" -m pip install -q "${pins[@]}"
freeze() { "$VPY" -m pip list --format=freeze 2>/dev/null | grep -iE '^(transformers|tokenizers|numpy|sentencepiece|torch|protobuf)==' | sort; }
before=$(freeze)
"$VPY" -m pip install -q ".[gpu-host]" "pytest>=8" "pytest-timeout>=2.3"
after=$(freeze)
echo "ngc-pinned-env: container pins installed:" $before >&2
guarded() { grep -viE '^protobuf==' <<<"$1" || true; }
if [[ $(guarded "$before") != $(guarded "$after") ]]; then
  echo "ngc-pinned-env: installing .[gpu-host] changed the container's packages:" >&2
  diff <(echo "$before") <(echo "$after") >&2 || true
  exit 1
fi
if [[ $before != "$after" ]]; then
  echo "ngc-pinned-env: note: .[gpu-host] moved protobuf (tritonclient's range):" $(diff <(echo "$before") <(echo "$after") | grep '^[<>]') >&2
fi
# the tests import the checkout (pytest's pythonpath puts it first), not the installed copy
SPECDEPLOY_NGC_ENV=1 exec "$VPY" -m pytest -q -p no:cacheprovider \
  tests/unit/triton_models/test_served_models_in_process.py \
  tests/unit/triton_models/test_tokenizer_sentencepiece.py \
  tests/unit/triton_models/test_bls_embedding_bias.py \
  tests/unit/triton_models/test_request_rules.py \
  tests/unit/render/test_llmapi_cpu.py \
  tests/unit/validate/test_served_packages.py \
  "$@"
