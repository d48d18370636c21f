"""What the few-row rules were chosen from: two_shot's tile settings at inference shapes, and the standalone
all-reduce's tile rows and programs per message size, on one GPU at world size 1, in this process.

    python3 benchmarks/inference_sweep.py OUT.json [--quick] [--only allreduce --sizes 64 256 --tile_rows 64 128]

Every time is taken two ways in the same run (median of 5 trials of ``REPS`` back-to-back launches):
``wall`` as a user's loop sees it (each launch's host time included: when the host is slower than the GPU,
the GPU waits), and ``gpu`` with the host's work hidden (a sleep kernel holds the GPU while the host
enqueues every launch, so the events time the GPU's work alone). ``host_us`` is the host time of one launch.
Every kernel's result is checked against torch before timing.
"""

import argparse
import datetime
import json
import sys

import numpy as np
import torch
import triton

import gemmar
from gemmar.runtime import rank as rank_runtime
from gemmar.runtime.allreduce import SymmetricAllReduce
from gemmar.runtime.heap.cpu import make_heap_folder, remove_arenas
from gemmar.runtime.launch import FusedGemmAllReduce
from gemmar.runtime.timing import one_trial

REPS, TRIALS = 20, 5
SHAPES = [(4096, 8192, 1024), (1024, 8192, 3584), (256, 8192, 8192), (64, 8192, 3584), (16, 8192, 1024),
          (8192, 8192, 8192)]
# (BLK_M, BLK_N, BLK_K, num_warps, num_stages) tried per shape, by M
TILES = {
    "large": [(128, 256, 64, 8, 3), (128, 256, 64, 8, 4), (128, 128, 64, 8, 4), (128, 128, 64, 4, 4),
              (256, 128, 64, 8, 3)],
    "mid": [(128, 256, 64, 8, 3), (128, 128, 64, 8, 4), (128, 128, 64, 4, 4), (64, 128, 64, 4, 4),
            (64, 256, 64, 8, 3), (128, 128, 128, 8, 3), (64, 128, 128, 4, 4), (64, 64, 128, 4, 4)],
    "few": [(128, 256, 64, 8, 3), (64, 256, 64, 8, 3), (64, 128, 64, 4, 4), (64, 64, 64, 4, 4), (64, 64, 128, 4, 4),
            (32, 64, 128, 4, 4), (64, 128, 128, 4, 4), (32, 128, 128, 4, 4), (16, 64, 128, 4, 4),
            (16, 128, 128, 4, 4), (16, 64, 256, 4, 3), (16, 32, 256, 4, 3), (32, 32, 256, 4, 3)],
}


def timed(fn, streams=()):
    """(wall ms, gpu ms, host us) of one call of ``fn``, each the median of TRIALS trials of REPS calls."""
    wall = [one_trial(fn, REPS, streams)[0] for _ in range(TRIALS)]
    # (~400 us a launch held back: more than any host time)
    held = [one_trial(fn, REPS, streams, hold_ms=REPS * 0.4) for _ in range(TRIALS)]
    gpu, host = (float(np.median(column)) for column in zip(*held))
    return float(np.median(wall)), gpu, host / REPS * 1e6


def gemm_sweep(heap, quick):
    rows = []
    for m, n, k in SHAPES:
        A = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        B = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        C = A @ B
        ref = C.float()
        wall, gpu, host = timed(lambda: torch.matmul(A, B, out=C))
        row = dict(shape=[m, n, k], matmul=dict(wall_ms=wall, gpu_ms=gpu, host_us=host), tiles=[])
        print(f"{m} x {n} x {k}: torch.matmul wall {wall * 1e3:.1f} us, gpu {gpu * 1e3:.1f} us, host {host:.1f} us",
              flush=True)
        kind = "large" if m >= 1024 else "mid" if m >= 256 else "few"
        for blk_m, blk_n, blk_k, warps, stages in TILES[kind][:2 if quick else None]:
            cfg = gemmar.RunConfig(m=m, n=n, k=k, datatype="bf16", algorithm="two_shot", world_size=1, BLK_M=blk_m,
                                   BLK_N=blk_n, BLK_K=blk_k, num_warps=warps, num_stages=stages, gsize_m=8,
                                   num_sms=132, comm_sms=132)
            entry = dict(tile=[blk_m, blk_n, blk_k, warps, stages])
            try:
                with heap.scope():
                    fused = FusedGemmAllReduce(heap, cfg)
                    fused.prepare(A, B)
                    out = fused(A, B)
                    entry["max_abs_diff"] = float((out.float() - ref).abs().max())
                    for _ in range(3):
                        fused(A, B, wait=False)
                    w, g, h = timed(lambda: fused(A, B, wait=False), [heap.stream, heap.side_stream])
                    fused.check()
                    entry["max_abs_diff"] = max(entry["max_abs_diff"], float((fused(A, B).float() - ref).abs().max()))
                    entry.update(wall_ms=w, gpu_ms=g, host_us=h, wall_ratio=w / wall, gpu_ratio=g / gpu,
                                 registers=[r["registers"] for r in fused.kernel_resources],
                                 spills=[r["spills"] for r in fused.kernel_resources])
                print(f"  {entry['tile']}: wall {w * 1e3:.1f} us ({w / wall:.2f}x), gpu {g * 1e3:.1f} us "
                      f"({g / gpu:.2f}x), host {h:.1f} us, diff {entry['max_abs_diff']:.3g}", flush=True)
            except Exception as e:  # noqa: BLE001 - a setting that does not compile is a figure too
                entry["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
                print(f"  {entry['tile']}: {entry['error']}", flush=True)
            row["tiles"].append(entry)
        rows.append(row)
    return rows


def symm_mem_ms(x):
    import torch.distributed as dist
    import torch.distributed._symmetric_memory as symm_mem

    buffer = symm_mem.empty(x.numel(), dtype=x.dtype, device=x.device)
    symm_mem.rendezvous(buffer, dist.group.WORLD.group_name)
    buffer.copy_(x)
    op = torch.ops.symm_mem.two_shot_all_reduce_
    return timed(lambda: op(buffer, "sum", dist.group.WORLD.group_name))


def allreduce_sweep(heap, quick, sizes, tile_rows_tried, programs_tried):
    rows = []
    for mib in sizes:
        numel = int(mib * 2 ** 20) // 2
        x = torch.randn(numel, device="cuda", dtype=torch.bfloat16)
        wall, gpu, host = symm_mem_ms(x)
        # The floor at one rank: an all-reduce there reads the input and writes the result, as a copy does.
        copy_into = torch.empty_like(x)
        copy_wall, copy_gpu, _ = timed(lambda: copy_into.copy_(x))
        row = dict(mib=mib, symm_mem=dict(wall_ms=wall, gpu_ms=gpu, host_us=host),
                   torch_copy=dict(wall_ms=copy_wall, gpu_ms=copy_gpu), settings=[])
        print(f"all-reduce {mib:g} MiB: torch symm-mem two-shot wall {wall * 1e3:.1f} us, gpu {gpu * 1e3:.1f} us, "
              f"host {host:.1f} us; torch's copy of it gpu {copy_gpu * 1e3:.1f} us "
              f"({2 * mib * 2 ** 20 / (copy_gpu * 1e-3) / 1e12:.2f} TB/s of traffic)", flush=True)
        for tile_rows in tile_rows_tried if not quick else (64,):
            for programs in programs_tried:
                for in_place in (True, False):
                    with heap.scope():
                        op = SymmetricAllReduce(heap, numel, torch.bfloat16, programs, tile_rows=tile_rows)
                        op.prepare()
                        source = op.input if in_place else x
                        if in_place:
                            op.input.copy_(x)
                        ok = torch.equal(op(source), x)
                        w, g, h = timed(lambda: op(source, wait=False), [heap.stream])
                        op.check()
                        ok = ok and torch.equal(op(source), x)
                    entry = dict(tile_rows=tile_rows, programs=programs, in_place=in_place, wall_ms=w, gpu_ms=g,
                                 host_us=h, ok=ok, wall_speed=wall / w, gpu_speed=gpu / g)
                    row["settings"].append(entry)
            best = min((e for e in row["settings"] if e["in_place"] and e["tile_rows"] == tile_rows),
                       key=lambda e: e["wall_ms"])
            print(f"  rows {tile_rows}: best in place {best['programs']} programs wall {best['wall_ms'] * 1e3:.1f} us "
                  f"({best['wall_speed']:.2f}x symm-mem's speed), gpu {best['gpu_ms'] * 1e3:.1f} us, "
                  f"host {best['host_us']:.1f} us", flush=True)
        rows.append(row)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--quick", action="store_true", help="two settings a shape (a check that it runs)")
    parser.add_argument("--only", choices=("gemm", "allreduce"))
    parser.add_argument("--max_m", type=int, default=1 << 20, help="only shapes of at most this many rows")
    parser.add_argument("--sizes", type=float, nargs="+", default=[0.25, 1, 4, 16, 64, 256], help="all-reduce MiB")
    parser.add_argument("--tile_rows", type=int, nargs="+", default=[4, 8, 16, 32, 64], help="all-reduce tile rows")
    parser.add_argument("--programs", type=int, nargs="+", default=[32, 66, 132, 264], help="all-reduce programs")
    parser.add_argument("--no_tma", action="store_true",
                        help="the GEMM reads A and B through plain pointers, never tensor descriptors (at world "
                             "size 1 it already does for M <= tuning.FEW_ROWS)")
    args = parser.parse_args()
    if args.no_tma:
        from gemmar.runtime import launch

        launch.gemm_operands = lambda A, B, config, device: (A, B, False)
    SHAPES[:] = [shape for shape in SHAPES if shape[0] <= args.max_m]
    folder = make_heap_folder()
    ranks = rank_runtime.init_ranks([0], 1, "cuda", 8 << 30, folder, 30.0)
    if isinstance(ranks, list) and ranks and isinstance(ranks[0], Exception):
        sys.exit(f"could not start the rank: {ranks[0]}")
    heap = rank_runtime.local_ranks()[0].heap
    report = dict(date=datetime.datetime.now().isoformat(timespec="seconds"), torch=torch.__version__,
                  triton=triton.__version__, gpu=torch.cuda.get_device_name(0), reps=REPS, trials=TRIALS,
                  tma=not args.no_tma)
    try:
        if args.only != "allreduce":
            report["gemm"] = gemm_sweep(heap, args.quick)
        if args.only != "gemm":
            report["allreduce"] = allreduce_sweep(heap, args.quick, args.sizes, args.tile_rows, args.programs)
    finally:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
        print(f"wrote {args.out}")
        remove_arenas(folder)


if __name__ == "__main__":
    main()
