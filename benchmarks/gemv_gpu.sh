#!/bin/bash
# The few-rows kernel on one GPU (two_shot.one_rank_gemv; docs/decisions.md, the few-rows kernel), in one call:
#   1. issue 60's whole sweep, auto (the few-rows kernel up to 64 rows, the tile rules above);
#   2. the same shapes with M <= 64, auto with the tile GEMM there (--no_gemv): the A/B, minutes apart;
#   3. the compiled tests of the few-rows kernel and split-K (test_kernels -k "gemv or split_k");
#   4. gemmar bench's line at one row, and gemmar tune twice at two few-rows shapes (the second reads the cache).
#     bash benchmarks/gemv_gpu.sh OUTDIR
set -u
out=${1:?usage: bash benchmarks/gemv_gpu.sh OUTDIR}
mkdir -p "$out"
step() { echo "== $* ($(date -u +%H:%M:%S))"; }
step sweep; python3 benchmarks/shape_sweep.py "$out/sweep.json" --auto_only --max_seconds "${MAX_SECONDS:-200}" 2>&1 | tail -40
step no_gemv; python3 benchmarks/shape_sweep.py "$out/no-gemv.json" --auto_only --no_gemv --max_m 64 --max_seconds 120 2>&1 | tail -12
step tests; GEMMAR_TEST_BACKEND=cuda timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py -k "gemv or split_k" 2>&1 | tail -3
step bench; python3 -m gemmar bench --backend cuda -r 1 --algorithm two_shot -m 1 -n 8192 -k 2048 --datatype bf16 --iterations 3 2>&1 | tail -6
step tune; for i in 1 2; do python3 -m gemmar tune 1x8192x2048 16x5120x1280 --cache "$out/tuning.json" 2>&1 | tail -4; done
step done
