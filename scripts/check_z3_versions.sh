#!/usr/bin/env bash
# The verifier loads libz3 from the z3-solver package's folder by path (a start-up 50-80 ms below
# importing z3's bindings). That depends on the wheel's layout, so check it against the oldest and
# the newest z3-solver pyproject.toml allows, each installed alone into a temporary folder.
#     bash scripts/check_z3_versions.sh      (PYTHON=... to pick the interpreter)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
for requirement in "z3-solver==4.12.0.0" "z3-solver>=4.12,<6"; do
    target="$WORK/$(echo "$requirement" | tr -c 'A-Za-z0-9.' _)"
    "$PYTHON" -m pip install --quiet --no-deps --target "$target" "$requirement"
    PYTHONPATH="$target:$ROOT" "$PYTHON" "$ROOT/scripts/z3_route_check.py" "$target" \
        || { echo "check_z3_versions: $requirement failed" >&2; exit 1; }
done
