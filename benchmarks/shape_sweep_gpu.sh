#!/usr/bin/env bash
# Issue 60 on ONE NVIDIA GPU, from the repository root: the shape sweep with every candidate tile and the worst ten
# traced, the rules fitted from it (all models, and each model left out), a second run that times auto with the
# fitted rule and each shape with its model left out, and gemmar tune twice (the second reuses the cache).
# About 9 minutes on an H100 if the first run takes its whole --max_seconds; the second step needs no GPU.
#   bash benchmarks/shape_sweep_gpu.sh OUTDIR [first|second]   (two runs: first, then second)
set -uo pipefail
OUTDIR=${1:?usage: benchmarks/shape_sweep_gpu.sh OUTDIR [first|second]}
mkdir -p "$OUTDIR"
source benchmarks/gpu_session.sh "$OUTDIR/shape-sweep.log"
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
if [ "${2:-first}" = first ]; then
  timeout 560 python3 benchmarks/shape_sweep.py "$OUTDIR/sweep.json" --grid --trace_worst 10 --max_seconds 450 2>&1 | quiet
else
  python3 benchmarks/shape_sweep.py --analyse "$OUTDIR/sweep.json" --rules_out "$OUTDIR/rules.json" 2>&1 | quiet
  timeout 400 python3 benchmarks/shape_sweep.py "$OUTDIR/confirm.json" --auto_only --rule "$OUTDIR/rules-all.json" \
    --lomo "$OUTDIR/rules.json" --max_seconds 330 2>&1 | quiet
  for i in 1 2; do timeout 60 python3 -m gemmar.cli tune 128x5120x3456 2048x5120x1280 --cache "$OUTDIR/tuning.json" 2>&1 | quiet; done
fi
date -u
