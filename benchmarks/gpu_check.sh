#!/usr/bin/env bash
# benchmarks/gpu_check.py on a machine with one CUDA GPU, as one command for the device tool:
#   run(command="bash benchmarks/gpu_check.sh", timeout_s=540)
# optionally with carry=[".gpu_wheels"] (optuna and its missing dependencies as Python 3.12
# wheels; the check itself imports no optuna). Extra arguments go to gpu_check.py, e.g.
# `bash benchmarks/gpu_check.sh --budget-s 300` for a shorter run.
# Writes under $OUT: gpu_check.json, gpu_check.log and the measured profile (<name>-measured.yaml);
# the lead copies that profile into profiles/.
set -uo pipefail
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.." || exit 2
PY=${PYTHON:-python3}
OUTDIR=${OUT:-/tmp/gpu_check_out}
mkdir -p "$OUTDIR"
export OUT=$OUTDIR

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv || true
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda,
'available', torch.cuda.is_available())" || exit 2

# Carried wheels, only where present and optuna is missing (never needed by this check).
if [ -d .gpu_wheels ] && ! "$PY" -c "import optuna" 2>/dev/null; then
    if "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target /tmp/site .gpu_wheels/*.whl; then
        export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
    else
        echo "gpu_check.sh: warning: the carried wheels did not install; going on without" >&2
    fi
fi

# autoplan from this source tree (no install: pip could not fetch its build backend there).
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
# 465 s hard stop: gpu_check.py plans for --budget-s 420 and writes its JSON after every plan.
timeout -k 10 465 "$PY" benchmarks/gpu_check.py --budget-s 420 "$@" 2>&1 \
    | tee "$OUTDIR/gpu_check.log"
