#!/bin/bash
# The wave rule (tuning_cache.RULE above 64 rows) and one-rank launches as CUDA graphs, on one GPU, in one call:
#   1. issue 60's whole sweep, auto as shipped now;
#   2. the shapes above 64 rows with the rule before (a tile a bucket of rows), CUDA graphs on: the rule's A/B;
#   3. the same without CUDA graphs (GEMMAR_CUDA_GRAPHS=0): the graphs' A/B.
# Each run stops at its --max_seconds; the sweep goes through every other shape first, so the runs compare on the
# shapes they share (shape_sweep.py --analyse of each).
#     bash benchmarks/wave_rule_gpu.sh OUTDIR
set -u
out=${1:?usage: bash benchmarks/wave_rule_gpu.sh OUTDIR}
mkdir -p "$out"
here=$(dirname "$0")
before="$here/../lab/data/wave-rule-2026-12-07/rule-before.json"
step() { echo "== $* ($(date -u +%H:%M:%S))"; }
step sweep; python3 "$here/shape_sweep.py" "$out/sweep.json" --auto_only --max_seconds 170 2>&1 | tail -16
step rule_before; python3 "$here/shape_sweep.py" "$out/rule-before.json" --auto_only --min_m 65 --rule "$before" \
    --max_seconds 90 2>&1 | tail -14
step rule_before_no_graphs; GEMMAR_CUDA_GRAPHS=0 python3 "$here/shape_sweep.py" "$out/rule-before-no-graphs.json" \
    --auto_only --min_m 65 --rule "$before" --max_seconds 90 2>&1 | tail -14
step done
