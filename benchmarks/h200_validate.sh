#!/usr/bin/env bash
# GPU validation on a machine with >= 2 NVIDIA GPUs: the CPU suite's kernel and device-API tests, compiled.
# Run from the repository root; gemmar importable (pip install -e . or PYTHONPATH=.).
set -euo pipefail
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, "gpus", torch.cuda.device_count())'
for alg in ring atomics; do
  python3 -m gemmar.cli bench --backend cuda -r 2 --algorithm $alg -m 1000 -n 777 -k 1999 --datatype bf16 -v --iterations 5
done
GEMMAR_TEST_BACKEND=cuda python3 -m pytest -q -p no:cacheprovider tests/test_device_api.py tests/test_kernels.py tests/test_mistakes.py
