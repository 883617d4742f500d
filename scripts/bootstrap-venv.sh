#!/usr/bin/env bash
# Creates .venv with mlakit's pinned dependencies.
# Where the system Python already has torch (e.g. a CUDA build), the venv reuses it
# through --system-site-packages instead of downloading another torch/triton.
set -euo pipefail
PYTHON="${PYTHON:-python3}"
VENV="${VENV:-.venv}"

if "$PYTHON" -c "import torch" >/dev/null 2>&1; then
    echo "bootstrap: reusing the system torch $("$PYTHON" -c 'import torch; print(torch.__version__)')"
    "$PYTHON" -m venv --system-site-packages "$VENV"
    torch_requirements=()
else
    "$PYTHON" -m venv "$VENV"
    torch_requirements=(-r requirements/torch-cpu.txt)
fi
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
    "${torch_requirements[@]}" -r requirements/base.txt
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps -e .
