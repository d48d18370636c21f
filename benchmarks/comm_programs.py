"""two_shot's communication programs per shape: the default layout (``tuning.tuned_defaults``: on Hopper one
beside each GEMM program) against fixed counts on SMs of their own, at world size 1 on one GPU, each as a ratio
to torch.matmul of the same per-rank shape in the same run.

    python3 benchmarks/comm_programs.py [OUT.json]

bf16, the tuned 128 x 256 x 64 tile, median of 5 trials of 20 back-to-back launches, every run validated
before and after timing (``Cluster.compare_to_unfused``).
"""

import json
import sys

import torch

import gemmar
from gemmar.tuning import tuned_defaults
from gemmar.runtime.backends import gpu_properties

SHAPES = [(8192, 8192, 8192), (4096, 8192, 14336), (8192, 8192, 2048)]
FIXED = (4, 8, 16)


def main(out_path=None):
    _, capability, sms = gpu_properties("cuda")
    rows = []
    with gemmar.Cluster(world_size=1, backend="cuda", heap_size=3 << 30) as cluster:
        for m, n, k in SHAPES:
            default = tuned_defaults("cuda", "two_shot", capability, sms, shape=(m, n, k, 1))
            problem = gemmar.RunConfig(m=m, n=n, k=k, datatype="bf16", world_size=1, algorithm="two_shot")
            matmul = cluster.compare_to_unfused({}, problem=problem)["matmul_ms"]
            # The default (on Hopper: one communication program beside each GEMM program), then fixed counts
            # of communication programs on SMs of their own, the rest to the GEMM.
            layouts = [default] + [tuned_defaults("cuda", "two_shot", capability, sms, given={"comm_sms": comm})
                                   for comm in FIXED]
            for knobs in layouts:
                config = gemmar.RunConfig(m=m, n=n, k=k, datatype="bf16", algorithm="two_shot", world_size=1, **knobs)
                f = cluster.compare_to_unfused(config, baseline=False)
                ratio = f["two_shot_ms"] / matmul
                chosen = knobs is default
                rows.append(dict(shape=(m, n, k), num_sms=config.num_sms, comm_sms=config.comm_sms, chosen=chosen,
                                 ms=f["two_shot_ms"], matmul_ms=matmul, ratio=ratio,
                                 max_abs_diff=f["two_shot_max_abs_diff"]))
                print(f"[comm] {m} x {n} x {k}: {config.num_sms} GEMM + {config.comm_sms:3d} communication programs "
                      f"{f['two_shot_ms']:.3f} ms = {ratio:.3f} x torch.matmul ({matmul:.3f} ms)"
                      f"{'   <- the default' if chosen else ''}", flush=True)
    if out_path:
        with open(out_path, "w") as f:
            json.dump(dict(gpu=torch.cuda.get_device_name(0), torch=torch.__version__, rows=rows), f, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:2])
