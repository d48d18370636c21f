#!/usr/bin/env bash
# On ONE NVIDIA H200 (issue 36; its run: lab/data/h200x1-graphs-2026-12-05.log): the standalone all-reduce
# launched as a CUDA graph (GEMMAR_CUDA_GRAPHS=1) against Triton's launcher, its tiles of 128 and 256 rows at
# 16-256 MiB, and the compiled all-reduce tests with graphs on. Run from the repository root with gemmar's
# dependencies (ipyparallel among them) importable. Writes JSON and log.txt to $1. In two parts of about 6 minutes
# each: part 1 (tests, host time, 1-4 MiB), part 2 (tile rows, every inference shape).
set -uo pipefail
OUTDIR=${1:?usage: benchmarks/allreduce_graphs.sh OUTDIR [1|2]}
PART=${2:-1}
source benchmarks/gpu_session.sh "$OUTDIR/log-part$PART.txt"
if [ "$PART" = 1 ]; then
echo "== compiled all-reduce tests, graphs on"
GEMMAR_CUDA_GRAPHS=1 GEMMAR_TEST_BACKEND=cuda timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_allreduce.py 2>&1 | tail -2
echo "== host time, graph and Triton's launcher alternated (benchmarks/host_time.py)"
timeout 100 python3 benchmarks/host_time.py --rounds 3 2>&1 | quiet
for graphs in 1 0 1 0; do   # alternated: a host's speed drifts within minutes
  echo "== all-reduce 1-4 MiB, GEMMAR_CUDA_GRAPHS=$graphs"; date -u
  GEMMAR_CUDA_GRAPHS=$graphs timeout 75 python3 benchmarks/inference_shapes.py "$OUTDIR/allreduce-graphs$graphs-$RANDOM.json" \
    --no_gemm --sizes 1 4 2>&1 | quiet
done
fi
if [ "$PART" = 2 ]; then
echo "== tile rows 64-256 at 16-256 MiB, with torch's copy as the floor"; date -u
GEMMAR_CUDA_GRAPHS=1 timeout 150 python3 benchmarks/inference_sweep.py "$OUTDIR/sweep-tile-rows.json" --only allreduce \
  --sizes 16 64 256 --tile_rows 64 128 256 --programs 132 264 2>&1 | quiet
echo "== every inference shape and size, graphs on"; date -u
GEMMAR_CUDA_GRAPHS=1 timeout 240 python3 benchmarks/inference_shapes.py "$OUTDIR/inference-shapes.json" 2>&1 | quiet
date -u
fi
