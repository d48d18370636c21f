#!/usr/bin/env bash
# On ONE NVIDIA Hopper GPU, issue 23's figures in one go (BENCHMARKS.md): two_shot with ranks sharing the GPU
# (traced: the tail, the ranks' start gaps, each phase's time), the host time of a launch, two_shot at one
# rank against torch.matmul, the standalone all-reduce at 1-256 MiB, then the compiled correctness tests.
# Run from the repository root with ipyparallel importable. Writes traces and logs to $1.
set -uo pipefail
OUTDIR=${1:?usage: benchmarks/two_shot_one_gpu.sh OUTDIR}
mkdir -p "$OUTDIR"
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
step() { echo "=== $(date -u +%H:%M:%S) $*"; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
step tail; timeout 240 python3 benchmarks/two_shot_tail.py "$OUTDIR" --world_sizes 2 4
for w in 1 2 4; do step launch $w; timeout 120 python3 benchmarks/launch_cost.py --world_size $w; done
step profile; timeout 120 python3 benchmarks/launch_cost.py --world_size 2 --profile | head -60
step bench; timeout 300 python3 benchmarks/fused_vs_unfused.py "$OUTDIR/bench" --world_size 1 --algorithms two_shot --no_traces
step allreduce 1; timeout 200 python3 -m gemmar.cli allreduce --backend cuda -r 1 --baseline --sizes 1 4 16 64 256
for r in 2 4; do step allreduce $r; timeout 200 python3 -m gemmar.cli allreduce --backend cuda -r $r --sizes 1 4 16 64 256; done
step tests; GEMMAR_TEST_BACKEND=cuda timeout 400 python3 -m pytest -q -p no:cacheprovider tests/test_allreduce.py \
  tests/test_kernels.py tests/test_trace.py -k "(two_shot or every_rank or back_to_back or shared or trace) and not command and not killed"
step done
