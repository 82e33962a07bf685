#!/usr/bin/env bash
# The training environment of scripts/train-draft-head.py: .venv-train with PyTorch, NumPy and
# safetensors from PyPI (the torch wheel there is the CUDA build, about 3 GB with its
# dependencies; it trains on the CPU too). Serving, the tests and CI never need it.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
venv="$root/.venv-train"
if "$venv/bin/python" -c "import torch, numpy, safetensors" 2>/dev/null; then exit 0; fi
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check torch numpy safetensors
