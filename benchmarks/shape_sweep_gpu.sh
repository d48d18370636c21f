#!/usr/bin/env bash
# Issue 60 on ONE NVIDIA GPU, from the repository root: the shape sweep with every candidate tile and the worst
# traced, in pieces that each fit one call (`first`, then `more` until every shape is measured: each piece starts
# where the pieces before it stopped), then `second`: the rules fitted from every piece (all models, and each model
# left out; no GPU needed), a run that times auto with the fitted rule and each shape with its model left out, and
# gemmar tune twice (the second reuses the cache).
#   bash benchmarks/shape_sweep_gpu.sh OUTDIR [first|more|second|split]   (MAX_SECONDS=450 bounds a piece)
# `split`: one run with split-K (auto with tuning.split_k_rule's K slices, and auto's tile at each of SPLITS where its
# tiles are fewer than the SMs), analysed by wall time and by GPU time.
set -uo pipefail
OUTDIR=${1:?usage: benchmarks/shape_sweep_gpu.sh OUTDIR [first|more|second|split]}
STEP=${2:-first}
mkdir -p "$OUTDIR"
source benchmarks/gpu_session.sh "$OUTDIR/shape-sweep.log"
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
MAX=${MAX_SECONDS:-450}
pieces() { ls "$OUTDIR"/sweep-*.json 2>/dev/null | grep -E '/sweep-[0-9]+\.json$'; }   # (not their -summary.json)
measured() {   # how many shapes the pieces so far measured (they run in the same order)
  python3 -c 'import json, sys; print(sum(len(json.load(open(f))["results"]) for f in sys.argv[1:]))' $(pieces)
}
case "$STEP" in
  first|more)
    [ "$STEP" = first ] && rm -f "$OUTDIR"/sweep-*.json
    start=$(measured); piece=$(( $(pieces | wc -l) + 1 ))
    echo "=== piece $piece from shape $start"
    timeout $(( MAX + 110 )) python3 benchmarks/shape_sweep.py "$OUTDIR/sweep-$piece.json" --grid --trace_worst 5 \
      --start "$start" --max_seconds "$MAX" 2>&1 | quiet ;;
  second)
    [ -n "$(pieces)" ] || { echo "no sweep-N.json in $OUTDIR: run the first step first"; exit 2; }
    python3 benchmarks/shape_sweep.py --analyse $(pieces) --rules_out "$OUTDIR/rules.json" 2>&1 | quiet
    timeout $(( MAX + 70 )) python3 benchmarks/shape_sweep.py "$OUTDIR/confirm.json" --auto_only \
      --rule "$OUTDIR/rules-all.json" --lomo "$OUTDIR/rules.json" --max_seconds "$MAX" 2>&1 | quiet
    for i in 1 2; do timeout 60 python3 -m gemmar.cli tune 128x5120x3456 2048x5120x1280 --cache "$OUTDIR/tuning.json" 2>&1 | quiet; done ;;
  split)   # split-K: auto (its rule's K slices) and auto's tile at every number of slices, judged by wall and GPU time
    timeout $(( MAX + 110 )) python3 benchmarks/shape_sweep.py "$OUTDIR/split.json" --split --trace_worst 5 \
      --max_seconds "$MAX" 2>&1 | quiet
    python3 benchmarks/shape_sweep.py --analyse "$OUTDIR/split.json" --how gpu 2>&1 | quiet ;;
  *) echo "usage: benchmarks/shape_sweep_gpu.sh OUTDIR [first|more|second|split]"; exit 2 ;;
esac
date -u
