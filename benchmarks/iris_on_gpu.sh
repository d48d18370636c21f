#!/usr/bin/env bash
# The real Iris on NVIDIA through `gemmar run --iris` (issue 58 item 4): a GPU per rank (1 rank on 1 GPU, and N on N
# where there are N GPUs) and 2 ranks sharing GPU 0 (a process each). Runs Iris's own launcher on a slice of its
# tests, Iris's examples 06 and 24, gemmar's examples/iris_real programs, and benchmarks/iris_vs_gemmar.py.
# Prints every run's output and exit code; exits 1 if a run that should pass failed.
#   bash benchmarks/iris_on_gpu.sh IRIS_CHECKOUT OUTDIR [TRITONBLAS_FOLDER]
# RANKS="1 2" picks the layouts; ONLY=1 runs only the all-reduce variants and Iris's launcher; SUITE="tests/ccl ..."
# runs only Iris's launcher on those folders whole (SUITE_TIMEOUT seconds a folder, default 200): it prints their
# tables and never fails the script (Iris's own failures are expected there; the tables sort them).
# IRIS_CHECKOUT: a checkout of Iris (not part of gemmar); TRITONBLAS_FOLDER: where `import tritonblas` is found
# (Iris's ops need it; without it they say so in one line).
set -u
cd "$(dirname "$0")/.."
IRIS=$1 OUT=$2
mkdir -p "$OUT"
source benchmarks/gpu_session.sh "$OUT/iris-on-gpu.log"
[ $# -ge 3 ] && export PYTHONPATH="$3:$PYTHONPATH"
GPUS=$(nvidia-smi -L | wc -l)
failed=0
run() {   # run EXPECTED_EXIT ARGS...: gemmar run ARGS, said as failed when its exit code is not EXPECTED_EXIT
  expected=$1; shift
  echo "=== gemmar run $* (expect exit $expected)"
  start=$(date +%s)
  timeout 150 python3 -m gemmar run --backend cuda --iris "$IRIS" --heap_size 4G --timeout 120 "$@" 2>&1 | quiet
  rc=${PIPESTATUS[0]}
  echo "=== exit $rc, $(( $(date +%s) - start )) s"
  [ "$rc" = "$expected" ] || failed=1
}
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
for R in ${RANKS:-1 2 $([ "$GPUS" -gt 2 ] && echo "$GPUS")}; do
  if [ -n "${SUITE:-}" ]; then
    echo "=== Iris's launcher, $SUITE at $R rank(s)"
    # shellcheck disable=SC2086
    timeout $(( ${SUITE_TIMEOUT:-200} * $(echo $SUITE | wc -w) + 60 )) python3 benchmarks/iris_tests.py "$IRIS" --real \
      --ranks $R --folders $SUITE --out "$OUT/iris-suite-$R" --timeout "${SUITE_TIMEOUT:-200}" 2>&1 | grep -v "cases reported"
    continue
  fi
  run 0 -r $R examples/iris_real/all_reduce_variants.py --dtype bf16 -m 256 -n 1024 --calls 3 --comm_sms 16 --block 32 64
  [ -n "${ONLY:-}" ] || run 0 -r $R "$IRIS/examples/24_ccl_all_reduce/example.py" -m 512 -n 512 --validate
  [ $R -ge 2 ] && [ -z "${ONLY:-}" ] && run 0 -r $R "$IRIS/examples/06_message_passing/message_passing_device_context.py"
  [ $R -ge 2 ] && [ -z "${ONLY:-}" ] && run 1 -r $R examples/iris_real/stale_ready_flag.py
  [ $R -ge 2 ] && [ -z "${ONLY:-}" ] && run 0 -r $R examples/iris_real/stale_ready_flag.py --fix per_call
  echo "=== Iris's launcher, tests/unittests (get, put, atomic_add, device_context) at $R rank(s)"
  timeout 150 python3 benchmarks/iris_tests.py "$IRIS" --real --ranks $R --folders tests/unittests \
    --out "$OUT/iris-tests-$R" --timeout 130 -- -k "get_triton or put_triton or atomic_add_triton or device_context" \
    2>&1 | grep -v "cases reported" | tail -12
  [ -n "${ONLY:-}" ] || run 0 -r $R benchmarks/iris_vs_gemmar.py --sizes 1K 64K 1M 16M 256M --out "$OUT/iris-vs-gemmar-$R.json"
done
echo "=== any failed: $failed"
exit $failed
