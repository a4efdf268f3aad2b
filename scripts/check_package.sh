#!/usr/bin/env bash
# The package as users get it: `python -m build` (an sdist, then a wheel built from
# that sdist), the wheel installed into a fresh venv (no system site-packages, its
# dependencies lark, z3-solver and jinja2 from PyPI, no torch: verify, simulate and
# codegen do not need it), then `pipeforge verify`, `simulate` and `codegen` run
# from a folder outside the repository, and their results checked. Then torch alone is added
# (pinned, the CPU wheel; no numpy, which torch's wheels do not require) and what a user runs with it
# is run from there too: `pipeforge run` on 4 local processes, the line `--print-torchrun --nnodes 2`
# prints as two torchrun agents on 127.0.0.1, and examples/train_gpt.py copied out of the repository
# under torchrun with a module generated at startup.
#
#     bash scripts/check_package.sh          (PYTHON=python3.12 to pick the interpreter)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

fail() { echo "check_package: $*" >&2; exit 1; }

"$PYTHON" -m venv "$WORK/venv"
VENV_PY="$WORK/venv/bin/python"
"$VENV_PY" -m pip install --quiet --upgrade pip
"$VENV_PY" -m pip install --quiet "build>=1.2,<2"
"$VENV_PY" -m build --outdir "$WORK/dist" "$ROOT" >"$WORK/build.log" 2>&1 || { tail -40 "$WORK/build.log"; fail "python -m build failed"; }
ls "$WORK/dist"/pipeforge-*.tar.gz >/dev/null || fail "no sdist was built"
WHEEL="$(ls "$WORK/dist"/pipeforge-*.whl)"
"$VENV_PY" -m pip install --quiet "$WHEEL"

# From outside the repository, so nothing can come from the checkout.
mkdir "$WORK/elsewhere"
cd "$WORK/elsewhere"
PIPEFORGE="$WORK/venv/bin/pipeforge"
export PYTHONPATH=  # only what the wheel installed

"$VENV_PY" - "$ROOT" <<'EOF' || fail "pipeforge is imported from the checkout, not from the wheel"
import sys, pathlib, pipeforge
root = pathlib.Path(sys.argv[1]).resolve()
assert root not in pathlib.Path(pipeforge.__file__).resolve().parents, pipeforge.__file__
EOF
if "$VENV_PY" -c "import torch" 2>/dev/null; then fail "torch is installed in the fresh venv; the check needs it absent"; fi

"$PIPEFORGE" verify 1f1b >"$WORK/verify.txt" || { cat "$WORK/verify.txt"; fail "pipeforge verify 1f1b did not exit 0"; }
grep -q "^valid" "$WORK/verify.txt" || { cat "$WORK/verify.txt"; fail "pipeforge verify 1f1b did not say valid"; }

"$PIPEFORGE" simulate 1f1b -D P=4 -D M=8 --json >"$WORK/simulate.json" || fail "pipeforge simulate 1f1b failed"
"$VENV_PY" - "$WORK/simulate.json" <<'EOF' || fail "pipeforge simulate 1f1b gave a wrong timeline"
import json, sys
timeline = json.load(open(sys.argv[1]))
# 1F1B, P=4, M=8, unit costs (F=1, B=2): makespan (M + P - 1) * 3 = 33
assert timeline["makespan"] == 33, timeline["makespan"]
assert len(timeline["peak_memory"]) == 4, timeline["peak_memory"]
EOF

"$PIPEFORGE" codegen 1f1b -o "$WORK/generated" >"$WORK/codegen.txt" || { cat "$WORK/codegen.txt"; fail "pipeforge codegen 1f1b failed"; }
"$VENV_PY" - "$WORK/generated" <<'EOF' || fail "pipeforge codegen 1f1b wrote no valid module"
import ast, pathlib, sys
modules = sorted(pathlib.Path(sys.argv[1]).glob("*.py"))
assert len(modules) == 1, modules
tree = ast.parse(modules[0].read_text(encoding="utf-8"))
compile(tree, str(modules[0]), "exec")
imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
imported |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
assert imported <= {"torch", "pipeforge", "__future__"}, imported
assert any(isinstance(node, ast.FunctionDef) and node.name == "make_pipeline" for node in tree.body)
EOF

"$PIPEFORGE" verify 1f1b -D Q=3 2>"$WORK/usage.txt" && fail "an unknown -D was accepted" || status=$?
[ "${status:-0}" -eq 2 ] || fail "an unknown -D exited ${status:-0}, not 2"
grep -q "^error: -D Q: " "$WORK/usage.txt" || { cat "$WORK/usage.txt"; fail "an unknown -D is not worded as a flag"; }

# -- with torch: what generated code and `pipeforge run` need -------------------------------------
# torch first and pinned: an unpinned resolve would fetch a multi-GB CUDA build.
"$VENV_PY" -m pip install --quiet "torch==2.13.0" || fail "pip install torch==2.13.0 failed"
if "$VENV_PY" -c "import numpy" 2>/dev/null; then fail "numpy is installed in the fresh venv; the check needs it absent"; fi
export PYTHONWARNINGS="ignore::UserWarning"  # torch's "Failed to initialize NumPy" on every import

"$PIPEFORGE" run 1f1b --nproc 4 --json >"$WORK/run.json" 2>"$WORK/run.err" || { tail -20 "$WORK/run.err"; fail "pipeforge run 1f1b --nproc 4 did not match"; }
"$VENV_PY" -c 'import json, sys; r = json.load(open(sys.argv[1])); assert r["match"] and r["nproc"] == 4, r' \
    "$WORK/run.json" || fail "pipeforge run 1f1b --nproc 4 gave a wrong verdict"

# two "machines": the printed torchrun line, twice, joined by c10d rendezvous on a free port of 127.0.0.1
LINE="$("$PIPEFORGE" run zbv -D P=2 -D M=4 --print-torchrun --nnodes 2 | tail -1)"
PORT="$("$VENV_PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
LINE="${LINE//\$RDZV_HOST:29500/127.0.0.1:$PORT}"
LINE="${LINE//\$JOB_ID/check-package-$$}"
read -r -a WORDS <<<"$LINE"
[ "${WORDS[0]}" = torchrun ] || fail "--print-torchrun printed no torchrun line: $LINE"
AGENT=("$WORK/venv/bin/torchrun" --local-addr=127.0.0.1 "${WORDS[@]:1}" --json)
timeout 180 "${AGENT[@]}" >"$WORK/agent0.out" 2>"$WORK/agent0.err" & first=$!
timeout 180 "${AGENT[@]}" >"$WORK/agent1.out" 2>"$WORK/agent1.err" || { tail -20 "$WORK/agent1.err"; fail "a torchrun agent failed"; }
wait "$first" || { tail -20 "$WORK/agent0.err"; fail "a torchrun agent failed"; }
cat "$WORK/agent0.out" "$WORK/agent1.out" >"$WORK/agents.json"
"$VENV_PY" -c 'import json, sys; r = json.loads(open(sys.argv[1]).read()); assert r["match"] and r["nproc"] == 2, r' \
    "$WORK/agents.json" || { cat "$WORK/agents.json"; fail "two torchrun agents did not match the unpipelined model"; }

# the README's example, out of the repository: its own folder (train_gpt.py beside gpt.py) and the wheel
cp -r "$ROOT/examples" "$WORK/examples"
timeout 300 "$WORK/venv/bin/torchrun" --nproc-per-node 4 --local-addr=127.0.0.1 "$WORK/examples/train_gpt.py" \
    --schedule zbv --steps 4 >"$WORK/train.out" 2>"$WORK/train.err" || { tail -20 "$WORK/train.err"; fail "examples/train_gpt.py --schedule zbv failed"; }
grep -q "after 4 steps" "$WORK/train.out" || { tail -5 "$WORK/train.out"; fail "examples/train_gpt.py printed no result"; }

echo "check_package: ok ($(basename "$WHEEL"): verify, simulate and codegen from a fresh venv; with torch alone, run on 4 processes, two torchrun agents and examples/train_gpt.py)"
