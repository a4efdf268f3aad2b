#!/usr/bin/env bash
# Device check for the generated pipelines: NCCL on the GPU machine, against the
# unpipelined model (pipeforge run) and against torch's own schedules (ratios).
#
#   bash scripts/device_check.sh
#
# Self-contained and time-bounded (about 3.5 minutes at most): installs nothing
# but `pip install -e .` when pipeforge's dependencies are missing; prints the
# ratios; exits 1 when any pipelined run differs from the unpipelined model or
# from torch, 2 when the environment cannot run the check.
#
# NCCL runs one rank per GPU. With one GPU the script first tries two ranks on
# it (NCCL normally refuses: "Duplicate GPU detected"), reports the outcome, and
# then checks single-rank NCCL pipelines on the GPU (every stage on one rank:
# same-rank hand-over and the I/W split on CUDA tensors), several ranks sharing
# the GPU with gloo moving activations through host memory (Chimera's
# cross-chain sum included), and benchmarks single-rank NCCL against torch;
# multi-rank ratios then come from gloo on the machine's CPUs.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
if [ -x .venv/bin/python ] && .venv/bin/python -c 'import torch' 2>/dev/null; then PY=.venv/bin/python; fi
BUDGET=${DEVICE_CHECK_SECONDS:-210}
deadline=$((SECONDS + BUDGET))
failures=0

run_step() {  # NAME LIMIT_SECONDS COMMAND...: runs within the remaining budget
    local name=$1 limit=$2; shift 2
    local left=$((deadline - SECONDS))
    if [ "$left" -lt "$limit" ]; then limit=$left; fi
    if [ "$limit" -le 5 ]; then echo "== $name: skipped, time budget spent"; return 0; fi
    echo "== $name (limit ${limit}s)"
    timeout --kill-after=5 "$limit" "$@"
    local rc=$?
    echo "== $name: exit $rc"
    return $rc
}

check() {  # NAME LIMIT COMMAND...: a mismatch or failure counts against the run
    if ! run_step "$@"; then failures=$((failures + 1)); fi
}

echo "== environment"
if ! $PY -c 'import torch' 2>/dev/null; then echo "no python with torch ($PY)"; exit 2; fi
$PY - <<'EOF'
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(),
      "devices", torch.cuda.device_count())
if torch.cuda.is_available():
    print("nccl", torch.cuda.nccl.version(), "gpu", torch.cuda.get_device_name(0))
EOF
if ! $PY -c 'import jinja2, lark, z3, pipeforge.generator, pipeforge.verifier' 2>/dev/null; then
    echo "pipeforge's dependencies are missing: pip install -e . (no torch change)"
    timeout 120 $PY -m pip install -q --no-build-isolation -e . || true
    $PY -c 'import jinja2, lark, z3, pipeforge.generator, pipeforge.verifier' || { echo "cannot import pipeforge"; exit 2; }
fi
GPUS=$($PY -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)')
PF="$PY -m pipeforge"

if [ "$GPUS" -ge 2 ]; then
    N=2; [ "$GPUS" -ge 4 ] && N=4
    for spec in "1f1b -D M=8" "interleaved-1f1b -D M=8" "zbv -D M=8" "dualpipev -D M=8" "chimera -D M=8"; do
        check "nccl run $spec on $N GPUs" 60 $PF run $spec -D P=$N --nproc $N --backend nccl --model tuple --timeout 30
    done
    check "bench nccl, $N GPUs" 90 $PY -m benchmarks.runtime.mlp --backend nccl --nproc 2 $([ "$N" -ge 4 ] && echo 4) \
        --width 4096 --rows 2048 --steps 8 --timeout 30
elif [ "$GPUS" -eq 1 ]; then
    if run_step "nccl: two ranks sharing the one GPU" 45 $PF run 1f1b -D P=2 -D M=4 --backend nccl --timeout 15; then
        echo "NCCL accepted two ranks on one GPU: multi-rank NCCL check passed"
    else
        echo "NCCL did not run two ranks on one GPU (expected: one rank per GPU); single-rank NCCL follows"
    fi
    for spec in "1f1b -D P=1 -D M=4" "interleaved-1f1b -D P=1 -D V=4 -D M=4" "zbv -D P=1 -D M=4" \
                "gpipe -D P=1 -D M=4"; do
        check "nccl run $spec on the GPU" 40 $PF run $spec --nproc 1 --backend nccl --model tuple --timeout 30
    done
    # several ranks sharing the GPU: compute on CUDA, activations through host memory (gloo)
    for spec in "1f1b -D P=4 -D M=8" "zbv -D P=2 -D M=4" "chimera -D P=2 -D M=4" "dualpipev -D P=2 -D M=4"; do
        check "gloo run $spec, CUDA tensors, ranks sharing the GPU" 40 $PF run $spec --backend gloo --device cuda \
            --model tuple --timeout 30
    done
    check "bench nccl, one rank on the GPU" 60 $PY -m benchmarks.runtime.mlp --backend nccl --nproc 1 \
        --width 4096 --rows 2048 --steps 8 --timeout 30
else
    echo "no GPU visible: NCCL checks skipped"
fi

check "gloo run 1f1b on 4 processes (the README's main job)" 40 $PF run 1f1b -D P=4 -D M=8
check "bench gloo on the CPUs, 2 and 4 processes" 90 $PY -m benchmarks.runtime.mlp --nproc 2 4 --steps 8

echo "== done in ${SECONDS}s: $failures failed step(s)"
[ "$failures" -eq 0 ] || exit 1
