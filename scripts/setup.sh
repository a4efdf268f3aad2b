#!/usr/bin/env bash
# Creates .venv (once) with torch's pinned CPU wheel and pipeforge in editable mode.
# Sourced by scripts/demo and scripts/test; safe to run again.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${PIPEFORGE_VENV:-$ROOT/.venv}"
PYTHON3="python3"  # the venv's where it exists
[ -x "$VENV/bin/python" ] && PYTHON3="$VENV/bin/python"
if ! "$PYTHON3" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    # the dev extra's transformers==5.23.0 and torchtitan 0.3.0 need 3.11; the package itself runs on 3.10
    echo "scripts/setup.sh: the development set-up needs Python 3.11 or newer ($PYTHON3 is $("$PYTHON3" -V 2>&1));" \
        "pip install . works on 3.10" >&2
    exit 2
fi
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi
stamp="$VENV/.pipeforge-installed"
if [ ! -f "$stamp" ] || [ "$ROOT/pyproject.toml" -nt "$stamp" ]; then
    # torch first and pinned: an unpinned resolve would fetch a multi-GB CUDA build.
    "$VENV/bin/python" -m pip install --quiet "torch==2.13.0"
    "$VENV/bin/python" -m pip install --quiet -e "$ROOT[dev]"
    # torchtitan's schedule building, for verify --as torchtitan and export torchtitan's tests; --no-deps:
    # its metadata asks for a torch nightly and training dependencies (docs/torch.md)
    "$VENV/bin/python" -m pip install --quiet --no-deps "torchtitan==0.3.0" "spmd_types==0.2.3" "tyro==1.0.17" \
        "docstring_parser==0.18.0"
    touch "$stamp"
fi
export PATH="$VENV/bin:$PATH"
