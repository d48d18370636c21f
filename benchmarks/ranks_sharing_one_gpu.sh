#!/usr/bin/env bash
# On a machine with ONE NVIDIA Hopper GPU: the GEMM core against cuBLAS, then every fused kernel compiled with
# 2-4 ranks sharing the GPU (validated), and traced two_shot runs. Run from the repository root with
# gemmar's dependencies (ipyparallel among them) importable. Writes figures and traces to $1.
set -euo pipefail
OUTDIR=${1:?usage: benchmarks/ranks_sharing_one_gpu.sh OUTDIR}
mkdir -p "$OUTDIR"
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, "gpus", torch.cuda.device_count())'
python3 benchmarks/gemm_core.py "$OUTDIR"
for r in 2 3 4; do
  for alg in two_shot ring atomics; do
    python3 -m gemmar.cli bench --backend cuda -r $r --algorithm $alg -m 1000 -n 777 -k 1999 --datatype bf16 -v --iterations 5
  done
done
for alg in two_shot ring atomics; do   # an aligned shape: TMA operands, the tuned tiles
  python3 -m gemmar.cli bench --backend cuda -r 2 --algorithm $alg -m 4096 -n 4096 -k 8192 --datatype bf16 -v -b --iterations 10
done
python3 -m gemmar.cli bench --backend cuda -r 2 --algorithm two_shot -m 4096 -n 4096 -k 8192 --datatype bf16 -v -t \
  --iterations 3 --output_file "$OUTDIR/1-gpu-two_shot-2ranks-4096x4096x8192.json"
python3 -m gemmar.cli bench --backend cuda -r 4 --algorithm two_shot -m 4096 -n 4096 -k 16384 --datatype bf16 -v -t \
  --iterations 3 --output_file "$OUTDIR/1-gpu-two_shot-4ranks-4096x4096x16384.json"
