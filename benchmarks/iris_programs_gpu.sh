#!/usr/bin/env bash
# Iris-style programs through `gemmar run --backend cuda` on whatever GPUs there are (ranks beyond the GPU
# count share GPU 0, a process each): the 3b4c197-era ones (examples/iris_style) and today's
# (examples/iris_today: mp.spawn, torchrun, DeviceContext, ccl, ops, device tracing drawn by gemmar gantt). Prints every run's output and exit code;
# exits 1 if any run failed. With an Iris checkout as $1, also its examples (benchmarks/iris_examples.py).
#   bash benchmarks/iris_programs_gpu.sh [IRIS_CHECKOUT] 2>&1 | tee OUTDIR/1-gpu-iris-programs.log
set -u
cd "$(dirname "$0")/.."
E=examples/iris_style
failed=0
run() {
  echo "=== gemmar run $*"
  start=$(date +%s.%N)
  python3 -m gemmar run --backend cuda --timeout 120 "$@"
  rc=$?
  echo "=== exit $rc, $(python3 -c "print(f'{$(date +%s.%N) - $start:.1f}')") s"
  [ "$rc" = 0 ] || failed=1
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
for r in 1 2 3 4; do
  run -r $r $E/atomic_add.py --buffer_size 100000
  run -r $r $E/gemm_atomics_all_reduce.py -m 512 -n 384 -k 768 --BLK_M 64 --BLK_N 64 --BLK_K 32 --gemm_sms 16 --validate
  if [ $r -ge 2 ]; then
    run -r $r $E/message_passing_put.py --buffer_size 100000 --block_size 512
    run -r $r $E/message_passing_load_store.py --buffer_size 100000 --block_size 512
  fi
done
T=examples/iris_today
for r in 2 3; do
  run -r $r $T/spawn_device_context.py --buffer_size 100000 --block_size 1024 -r $r
  run -r $r $T/torchrun_ccl.py -m 1000 -n 1000 --iterations 3
  run -r $r $T/ops_matmul_all_reduce.py -m 500 -n 700 -k 900 --iterations 3
  run -r $r $T/device_tracing.py -s 100000 -b 1024 -o /tmp/gemmar-device-trace-$r.json
  python3 -m gemmar gantt /tmp/gemmar-device-trace-$r.json -o /tmp/gemmar-device-trace-$r.png || failed=1
done
if [ $# -ge 1 ]; then
  python3 benchmarks/iris_examples.py "$1" --backend cuda --ranks 2 --timeout 120 || failed=1
fi
echo "=== any failed: $failed"
exit $failed
