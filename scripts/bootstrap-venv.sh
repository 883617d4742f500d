#!/usr/bin/env bash
# Creates .venv with mlakit's pinned dependencies.
# Where the system Python already has torch (e.g. a CUDA build), the venv reuses it
# through --system-site-packages instead of downloading another torch/triton; if the
# package index cannot be reached there (a GPU machine without network), the system's
# own versions of the other requirements serve, with a warning naming them (only then: where the
# index answers, a failed install stops the set-up).
set -euo pipefail
PYTHON="${PYTHON:-python3}"
VENV="${VENV:-.venv}"
# The packages pinned in requirements/base.txt (each imports under its own name).
REQUIRED_MODULES=$(sed -n 's/^\([A-Za-z0-9_.-]*\)==.*/\1/p' requirements/base.txt)

if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "bootstrap: $PYTHON is Python $("$PYTHON" -c 'import platform; print(platform.python_version())'); mlakit's" \
        "pinned requirements need Python >= 3.11 (set PYTHON=python3.11 or newer)" >&2
    exit 1
fi

pip_install() {
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$@"
}

if "$PYTHON" -c "import torch" >/dev/null 2>&1; then
    echo "bootstrap: reusing the system torch $("$PYTHON" -c 'import torch; print(torch.__version__)')"
    "$PYTHON" -m venv --system-site-packages "$VENV"
    # A PYTHON that is itself a venv (torch installed there) lends its packages through a .pth file:
    # --system-site-packages only reaches the base interpreter's.
    "$PYTHON" -c 'import site, sys; print("\n".join(site.getsitepackages()) if sys.prefix != sys.base_prefix else "")' \
        > "$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/_python_site.pth"
    if ! pip_install -r requirements/base.txt; then
        if "$VENV/bin/python" -m pip index versions pip --retries 0 --timeout 5 >/dev/null 2>&1; then
            echo "bootstrap: the package index answers, so requirements/base.txt failed for another reason (above)" >&2
            exit 1
        fi
        missing=$("$VENV/bin/python" -c "
import importlib.util, sys
print(' '.join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))" $REQUIRED_MODULES)
        if [ -n "$missing" ]; then
            echo "bootstrap: could not install requirements/base.txt and the system lacks: $missing" >&2
            exit 1
        fi
        versions=$("$VENV/bin/python" -c "
import importlib.metadata as md, sys
def version(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return '(version unknown)'
print(', '.join(f'{m} {version(m)}' for m in sys.argv[1:]))" $REQUIRED_MODULES)
        echo "bootstrap: WARNING: requirements/base.txt could not be installed (no package index?); using the system's $versions" >&2
    fi
    if ! pip_install --no-deps -e .; then
        site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
        echo "$PWD/src" > "$site/mlakit-src.pth"
        echo "bootstrap: WARNING: mlakit could not be installed in editable mode; src/ is on the venv's path instead" >&2
    fi
else
    "$PYTHON" -m venv "$VENV"
    pip_install -r requirements/torch-cpu.txt -r requirements/base.txt
    pip_install --no-deps -e .
fi
