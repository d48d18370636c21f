#!/usr/bin/env bash
# Issue 50, item 1: everything measured on a machine of W GPUs in one run of under 10 minutes (ratios are only
# compared within a run). Run from the repository root with gemmar's dependencies (ipyparallel among them)
# importable:
#     bash benchmarks/multi_gpu.sh OUTDIR W
# 1. the standalone all-reduce at 1 KiB - 1 GiB (x4 steps), two_shot, one_shot and auto, each checked against
#    the float64 sum and bit for bit across ranks, against NCCL and torch symmetric memory's one-shot and
#    two-shot (gemmar allreduce --baseline: timed beside the first scheme, auto, whose line ends with its
#    speed against the best of them);
# 2. on 2 GPUs, a copy-engine peer copy, the link's floor (benchmarks/peer_copy.py);
# 3. two_shot and one_shot against cuBLAS then NCCL (and overlapped) at the five inference shapes and the three
#    large ones (benchmarks/fused_vs_unfused.py), every kernel checked against torch.
# Writes JSON and log.txt to OUTDIR. Not yet run on W >= 2 GPUs: BENCHMARKS.md's 4- and 8-GPU row is a prediction.
set -uo pipefail
OUTDIR=${1:?usage: bash benchmarks/multi_gpu.sh OUTDIR W}
W=${2:?usage: bash benchmarks/multi_gpu.sh OUTDIR W}
GPUS=$(nvidia-smi -L 2>/dev/null | wc -l)
if ! [[ "$W" =~ ^[0-9]+$ ]] || [ "$W" -lt 2 ] || [ "$W" -gt "$GPUS" ]; then
  echo "benchmarks/multi_gpu.sh: W=$W: give a number of GPUs from 2 to this machine's $GPUS" >&2; exit 2
fi
source benchmarks/gpu_session.sh "$OUTDIR/log.txt"
nvidia-smi topo -m 2>/dev/null | head -n $((W + 1))
SIZES="0.0009765625 0.00390625 0.015625 0.0625 0.25 1 4 16 64 256 1024"
echo "== 1. all-reduce, $W ranks, 1 KiB - 1 GiB"; date -u
timeout 270 python3 -m gemmar allreduce -r "$W" --backend cuda --baseline --schemes auto two_shot one_shot \
  --sizes $SIZES --output_file "$OUTDIR/allreduce-$W-gpus.json" 2>&1 | quiet
if [ "$W" = 2 ]; then
  echo "== 2. peer copy GPU 0 <-> 1 (the link's floor)"; date -u
  timeout 60 python3 benchmarks/peer_copy.py "$OUTDIR/peer-copy.json" 2>&1 | quiet
fi
echo "== 3. two_shot and one_shot against the unfused pair, inference and large shapes"; date -u
timeout 240 python3 benchmarks/fused_vs_unfused.py "$OUTDIR" --world_size "$W" --algorithms two_shot one_shot \
  --shapes inference large --no_traces 2>&1 | quiet
date -u
