#!/usr/bin/env bash
# benchmarks/gpu_check.py on a machine with one CUDA GPU, as one command:
#   bash benchmarks/gpu_check.sh
# On a machine with no package index, a .gpu_wheels/ folder of wheels beside it is installed
# first (for Python 3.12: optuna and its dependencies, which the check itself never imports,
# and torchao 0.16.0, the release built against torch 2.11 (pytorch/ao issue #2919's matrix:
# 0.13 -> 2.8, 0.14 -> 2.9, 0.15 -> 2.10), for the fp8 plan). Extra arguments go to
# gpu_check.py, e.g. `bash benchmarks/gpu_check.sh --budget-s 300` for a shorter run.
# Writes under $OUT (default /tmp/gpu_check_out): gpu_check.json, gpu_check.log, the measured
# profile (<name>-measured.yaml), to copy into profiles/ or $AUTOPLAN_PROFILES, and
# gemm_shapes.json/.log (benchmarks/gemm_shapes.py).
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

# Carried wheels, only where present and optuna or torchao is missing (torchao: the fp8 plan,
# which gpu_check.py skips with the runtime's own reason when it cannot run).
if [ -d .gpu_wheels ] && ! "$PY" -c "import optuna, torchao" 2>/dev/null; then
    if "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target /tmp/site .gpu_wheels/*.whl; then
        export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
    else
        echo "gpu_check.sh: warning: the carried wheels did not install; going on without" >&2
    fi
fi

# autoplan from this source tree (no install: pip could not fetch its build backend there).
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
# The SM clock and power under the check's sustained load, twice a second: whether the
# datasheet peak's clock holds under dense GEMMs (NVIDIA's HPL Rpeak for A100 used the
# 1305 MHz it sustains at its power limit, not the 1410 MHz the 312 TFLOP/s peak assumes) is
# what the cost model's systematic optimism on published runs turns on.
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu \
    --format=csv,noheader -lms 500 > "$OUTDIR/clocks.csv" 2>/dev/null &
CLOCKS=$!
# 465 s hard stop: gpu_check.py plans for --budget-s 420 and writes its JSON after every plan.
timeout -k 10 465 "$PY" benchmarks/gpu_check.py --budget-s 420 "$@" 2>&1 \
    | tee "$OUTDIR/gpu_check.log"
status=${PIPESTATUS[0]}
# the GEMMs of real blocks in their three passes, and causal attention over 512-16K tokens,
# against the cost model's shares (small models' short inner dimension; attention by length)
timeout -k 5 50 "$PY" benchmarks/gemm_shapes.py --budget-s 35 --json "$OUTDIR/gemm_shapes.json" \
    2>&1 | tee "$OUTDIR/gemm_shapes.log"
kill "$CLOCKS" 2>/dev/null
# median SM clock and power over the samples drawing more than half the power limit (busy)
"$PY" - "$OUTDIR/clocks.csv" <<'PYEOF' || true
import statistics, sys
rows = []
for line in open(sys.argv[1]):
    f = [x.strip().split()[0] for x in line.split(",")]
    try:
        rows.append((float(f[1]), float(f[2]), float(f[3]), float(f[4])))
    except (ValueError, IndexError):
        continue
busy = [r for r in rows if r[2] > 0.5 * r[3]]
if busy:
    print(f"sustained under load: SM clock median {statistics.median(r[0] for r in busy):.0f} MHz "
          f"of max {busy[0][1]:.0f} MHz, power median {statistics.median(r[2] for r in busy):.0f} W "
          f"of {busy[0][3]:.0f} W limit, over {len(busy)} samples")
else:
    print(f"no busy clock samples among {len(rows)}")
PYEOF
exit "$status"
