#!/usr/bin/env bash
# GPU validation on any machine with NVIDIA GPUs (ranks share them when there are fewer GPUs than ranks):
# a small run of every kernel, then the CPU suite's device-API, kernel, mistake and stress tests, compiled.
# Run from the repository root; gemmar importable (pip install -e . or PYTHONPATH=.).
set -euo pipefail
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, "gpus", torch.cuda.device_count())'
for alg in two_shot ring atomics; do
  python3 -m gemmar.cli bench --backend cuda -r 2 --algorithm $alg -m 1000 -n 777 -k 1999 --datatype bf16 -v --iterations 5
done
# The killed-rank test runs on CPU whatever the backend; the rest are compiled.
GEMMAR_TEST_BACKEND=cuda python3 -m pytest -q -p no:cacheprovider tests/test_device_api.py tests/test_mistakes.py \
  tests/test_reliability.py tests/test_kernels.py -k "not killed"
