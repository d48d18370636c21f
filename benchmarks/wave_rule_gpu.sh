#!/bin/bash
# The wave rule (tuning_cache.RULE above 64 rows) and one-rank launches as CUDA graphs, on one GPU, in one call:
#   1. issue 60's whole sweep, auto as shipped now;
#   2. the shapes above 64 rows with the rule before (a tile a bucket of rows) and no CUDA graphs: the A/B;
#   3. the shapes up to 64 rows without CUDA graphs (the few-rows kernel either way): the graphs' share.
#     bash benchmarks/wave_rule_gpu.sh OUTDIR
set -u
out=${1:?usage: bash benchmarks/wave_rule_gpu.sh OUTDIR}
mkdir -p "$out"
here=$(dirname "$0")
step() { echo "== $* ($(date -u +%H:%M:%S))"; }
step sweep; python3 "$here/shape_sweep.py" "$out/sweep.json" --auto_only --max_seconds 200 2>&1 | tail -16
step before; GEMMAR_CUDA_GRAPHS=0 python3 "$here/shape_sweep.py" "$out/before.json" --auto_only --min_m 65 \
    --rule "$here/../lab/data/wave-rule-2026-12-07/rule-before.json" --max_seconds 140 2>&1 | tail -14
step no_graphs; GEMMAR_CUDA_GRAPHS=0 python3 "$here/shape_sweep.py" "$out/no-graphs.json" --auto_only --max_m 64 \
    --max_seconds 75 2>&1 | tail -5
step done
