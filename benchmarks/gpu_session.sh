# Sourced by the GPU benchmark scripts, from the repository root: `source benchmarks/gpu_session.sh LOGFILE`.
# Everything after it is also written to LOGFILE; the NVLink multicast paths stay off (every GPU figure in
# BENCHMARKS.md was measured with them off); the project is importable; `quiet` drops the warnings torch and Triton print on every start; the
# log starts with the date and the GPUs.
mkdir -p "$(dirname "$1")"
exec > >(tee -a "$1") 2>&1
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
quiet() { grep -v -e Warn -e enable_symm -e warn; }
date -u; nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
