"""Where a world-size-1 launch's GPU time goes beyond its kernel's, on one GPU: the same setting timed through the
package's launcher with and without ``launch.share_sms`` (every kernel asks for the largest shared-memory split,
so that two_shot's communication programs fit beside the GEMM's), and, for the few-rows kernel, launched straight
by Triton with its buffers in torch's memory and on the symmetric heap. Rounds alternate, each figure / torch.matmul's
GPU time in the same round. (Since the few-rows kernel keeps the driver's split, its two "split" figures are the
same launch: the A/B of docs/decisions.md, one shared-memory split, ran at 80adfd6.)

    python3 benchmarks/launch_ab.py OUT.json [--rounds 2]
"""

import argparse
import ctypes
import datetime
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SHAPES = [(1, 8192, 2048), (1, 4096, 2048), (1, 7168, 2304), (16, 5120, 1280), (32, 4096, 1792), (64, 4096, 3584)]
MORE_SHAPES = [(128, 5120, 3200), (512, 5120, 4352), (1024, 2048, 96), (2048, 4096, 192), (512, 6144, 768),
               (4096, 4096, 384), (8192, 8192, 3584)]
_CARVEOUT, _CACHE_PREFER_NONE = 9, 0


def default_split(compiled):
    """Undo share_sms on a compiled kernel: the driver's own shared-memory split and cache preference."""
    libcuda = ctypes.CDLL("libcuda.so.1")
    function = ctypes.c_void_p(compiled.function)
    assert libcuda.cuFuncSetAttribute(function, _CARVEOUT, -1) == 0
    assert libcuda.cuFuncSetCacheConfig(function, _CACHE_PREFER_NONE) == 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--shapes", nargs="+", type=lambda t: tuple(int(x) for x in t.split("x")),
                        help="MxNxK ...: these shapes instead of SHAPES")
    parser.add_argument("--after", action="store_true", help="with --pool: streams after a barrier or a spin kernel")
    parser.add_argument("--pool", action="store_true", help="torch.matmul on every stream of torch's pool")
    parser.add_argument("--streams", action="store_true", help="matmul and the launch on three kinds of stream")
    parser.add_argument("--more", action="store_true", help="also shapes above 64 rows (the tile GEMM)")
    parser.add_argument("--taint", action="store_true", help="which first work on a fresh stream makes it slow")
    args = parser.parse_args()
    import torch
    import triton

    from gemmar.kernels.two_shot import one_rank_gemv
    from gemmar.runtime import launch
    from gemmar.runtime.backends import gpu_properties
    from gemmar.runtime.compiled_launch import PreparedLaunch
    from gemmar.tuner import config_for, inputs, one_gpu_rank, time_call, time_config, time_matmul
    from gemmar.tuning import tuned_defaults

    gpu, capability, sms = gpu_properties("cuda")
    if args.streams:
        return streams(args)
    if args.taint:
        return taint(args)
    if args.pool:
        return pool(args)
    shared_split = launch.share_sms
    report = dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), gpu=gpu,
                  torch=torch.__version__, triton=triton.__version__, command=" ".join(sys.argv), results=[])
    dummy = torch.zeros(8, dtype=torch.int64, device="cuda")
    with one_gpu_rank(4 << 30) as heap:
        for round_ in range(args.rounds):
            for m, n, k in args.shapes or SHAPES + (MORE_SHAPES if args.more else []):
                A, B, ref = inputs(m, n, k, "bf16")
                mm = time_matmul(A, B)
                knobs = tuned_defaults("cuda", "two_shot", capability, sms, shape=(m, n, k, 1), given={}, gpu=gpu,
                                       datatype="bf16")
                config = config_for(m, n, k, "bf16", "two_shot", knobs)
                row = dict(round=round_, m=m, n=n, k=k, matmul=mm, gemv=knobs["gemv"], split_k=config.split_k,
                           tile=[knobs[x] for x in ("BLK_M", "BLK_N", "BLK_K", "num_warps", "num_stages")])
                for name, split in (("largest_shared", shared_split), ("driver_split", default_split)):
                    launch.share_sms = split
                    row[name] = time_config(heap, config, A, B, ref, mm["gpu_ms"])
                launch.share_sms = shared_split
                if knobs["gemv"]:
                    rows = 1 if m == 1 else config.BLK_M
                    blocks = config.tile_count
                    for where, alloc in (("straight_torch_memory", lambda shape, dt: torch.zeros(shape, dtype=dt,
                                                                                                  device="cuda")),
                                         ("straight_heap_memory", heap.zeros)):
                        with heap.scope():
                            C = alloc((m, n), torch.bfloat16)
                            slices = alloc((config.num_sms * config.BLK_M, config.BLK_N), torch.float32)
                            slices_in = alloc((blocks,), torch.int32)

                            def go(A=A, B=B, C=C, slices=slices, slices_in=slices_in):
                                one_rank_gemv[(config.num_sms,)](
                                    A, B, C, C, slices, slices_in, m, n, k, A.stride(0), A.stride(1), B.stride(0),
                                    B.stride(1), n, 1, config.split_k, dummy, dummy, BLOCK_M=rows,
                                    BLOCK_N=config.BLK_N, BLOCK_K=config.BLK_K, DOT_PRECISION="tf32",
                                    TRACE_CAPACITY=0, EVEN_K=k % config.BLK_K == 0, BY_DOT=rows > 1,
                                    num_warps=config.num_warps, num_stages=config.num_stages)
                            go()
                            torch.cuda.synchronize()
                            err = float((C.float() - ref).norm() / ref.norm())
                            row[where] = dict(time_call(go, mm["gpu_ms"]), rel_err=err)
                            if where == "straight_heap_memory":
                                # The same kernel and arguments on the heap's stream, then through PreparedLaunch
                                # (what the package's launcher calls) on the default stream and on the heap's.
                                def on_heap_stream(go=go):
                                    with torch.cuda.stream(heap.stream):
                                        go()
                                row["straight_heap_stream"] = time_call(on_heap_stream, mm["gpu_ms"], [heap.stream])
                                kwargs = dict(A=A, B=B, C=C, partials=C, slices=slices, slices_in=slices_in, M=m, N=n,
                                              K=k, stride_am=A.stride(0), stride_ak=A.stride(1),
                                              stride_bk=B.stride(0), stride_bn=B.stride(1), stride_cm=n, stride_cn=1,
                                              split_k=config.split_k, trace=dummy, trace_counts=dummy, BLOCK_M=rows,
                                              BLOCK_N=config.BLK_N, BLOCK_K=config.BLK_K, DOT_PRECISION="tf32",
                                              TRACE_CAPACITY=0, EVEN_K=k % config.BLK_K == 0, BY_DOT=rows > 1,
                                              num_warps=config.num_warps, num_stages=config.num_stages)
                                for name, stream in (("prepared_default_stream", torch.cuda.current_stream()),
                                                     ("prepared_heap_stream", heap.stream)):
                                    prepared = PreparedLaunch(one_rank_gemv, (config.num_sms,), (), kwargs, stream)
                                    prepared.at(0)
                                    row[name] = time_call(lambda prepared=prepared: prepared.at(0), mm["gpu_ms"],
                                                          [stream])
                report["results"].append(row)
                parts = "  ".join(f"{key} {row[key]['gpu_ms'] / mm['gpu_ms']:.2f}" for key in
                                  ("largest_shared", "driver_split", "straight_torch_memory", "straight_heap_memory",
                                   "straight_heap_stream", "prepared_default_stream", "prepared_heap_stream")
                                  if key in row and "gpu_ms" in row[key])
                print(f"round {round_} {m}x{n}x{k} matmul {mm['gpu_ms'] * 1e3:.1f} us  {parts}", flush=True)
                with open(args.out, "w") as f:
                    json.dump(report, f)
                del A, B, ref


def driver_stream():
    """A stream of the driver's own making (not torch's pool), wrapped for torch."""
    import torch

    libcuda = ctypes.CDLL("libcuda.so.1")
    handle = ctypes.c_void_p()
    assert libcuda.cuStreamCreate(ctypes.byref(handle), 1) == 0   # CU_STREAM_NON_BLOCKING
    return torch.cuda.ExternalStream(handle.value)


def pool(args):
    """torch.matmul at 1 x 8192 x 2048 on each stream of torch's pool (40 asked for: the pool's 32 and round again),
    the heap's two, and one of the driver's own making: which streams cost a launch more?"""
    import torch

    from gemmar.tuner import inputs, one_gpu_rank

    A, B, _ = inputs(1, 8192, 2048, "bf16")
    C = A @ B
    with one_gpu_rank(1 << 30) as heap:
        named = [("heap", heap.stream), ("side", heap.side_stream), ("driver", driver_stream())] + \
            [(f"pool{i}", torch.cuda.Stream()) for i in range(40 if not args.after else 4)] + \
            [("default", torch.cuda.current_stream())]
        if args.after:
            # Streams that have run the heap's barrier kernel, a spin kernel, or a few launches of the package's own
            # kernel: is a stream slow after one of them?
            from gemmar.kernels.barrier import spin_kernel

            kept = heap.stream
            for what in ("barrier", "spin", "barrier_then_sync"):
                stream = torch.cuda.Stream()
                heap.stream = stream
                if what.startswith("barrier"):
                    heap.barrier()
                else:
                    with torch.cuda.stream(stream):
                        spin_kernel[(1,)](1000)
                torch.cuda.synchronize()
                named.append((what, stream))
            heap.stream = kept
            # A kernel's first launch in the process on stream Z itself, and on a companion ordered around Z.
            import triton
            import triton.language as tl

            @triton.jit
            def first_a(x):
                tl.store(x, 1)

            @triton.jit
            def first_b(x):
                tl.store(x, 2)

            word = torch.zeros(1, dtype=torch.int32, device="cuda")
            on_z = torch.cuda.Stream()
            with torch.cuda.stream(on_z):
                first_a[(1,)](word)
            beside, companion = torch.cuda.Stream(), torch.cuda.Stream()
            companion.wait_stream(beside)
            with torch.cuda.stream(companion):
                first_b[(1,)](word)
            beside.wait_stream(companion)
            torch.cuda.synchronize()
            named += [("first_launch_on_it", on_z), ("first_launch_beside", beside), ("the_companion", companion)]
        for name, stream in named:
            print(f"{name:>8} {hex(stream.cuda_stream):>14} {matmul_us_on(stream, A, B, C):.2f} us", flush=True)


def matmul_us_on(stream, A, B, C):
    """GPU microseconds of torch.matmul(A, B, out=C) launched back to back on ``stream``."""
    import torch

    from gemmar.tuner import time_call

    def matmul():
        with torch.cuda.stream(stream):
            torch.matmul(A, B, out=C)
    return time_call(matmul, 0.01, [stream])["gpu_ms"] * 1e3


def streams(args):
    """torch.matmul and the package's launch of the same setting, each on the default stream, on a stream of its
    own (as the heap's) and on a high-priority one: is a second stream's cost the kernel's or any kernel's?"""
    import torch

    from gemmar.runtime.backends import gpu_properties
    from gemmar.tuner import config_for, inputs, one_gpu_rank, time_call
    from gemmar.tuning import tuned_defaults
    from gemmar.runtime.launch import FusedGemmAllReduce

    gpu, capability, sms = gpu_properties("cuda")
    ours = {"default": torch.cuda.current_stream(), "own": torch.cuda.Stream(),
            "high_priority": torch.cuda.Stream(priority=-1)}
    results = []
    with one_gpu_rank(2 << 30) as heap:
        ours["heap_stream"] = heap.stream
        print("streams:", {name: hex(s.cuda_stream) for name, s in ours.items()}, "side", hex(heap.side_stream.cuda_stream))
        for round_ in range(args.rounds):
            for m, n, k in SHAPES + (MORE_SHAPES if args.more else []):
                A, B, ref = inputs(m, n, k, "bf16")
                C = A @ B
                knobs = tuned_defaults("cuda", "two_shot", capability, sms, shape=(m, n, k, 1), given={}, gpu=gpu,
                                       datatype="bf16")
                row = dict(round=round_, m=m, n=n, k=k)
                with heap.scope():
                    fused = FusedGemmAllReduce(heap, config_for(m, n, k, "bf16", "two_shot", knobs))
                    fused(A, B)
                    for name, stream in ours.items():
                        def matmul(stream=stream, A=A, B=B, C=C):
                            with torch.cuda.stream(stream):
                                torch.matmul(A, B, out=C)
                        row["matmul_" + name] = time_call(matmul, 0.01, [stream])
                        heap.stream = stream   # (the launch's stream, for this one figure)
                        fused.prepared = fused.last_inputs = None
                        fused(A, B)
                        row["fused_" + name] = time_call(lambda A=A, B=B: fused(A, B, wait=False), 0.01, [stream])
                        # (as the tuner times it: the side stream joined too)
                        row["fused_" + name + "+side"] = time_call(lambda A=A, B=B: fused(A, B, wait=False), 0.01,
                                                                   [stream, heap.side_stream])
                    heap.stream = ours["heap_stream"]
                results.append(row)
                print(f"round {round_} {m}x{n}x{k}  " + "  ".join(
                    f"{key} {row[key]['gpu_ms'] * 1e3:.1f}/{row[key]['wall_ms'] * 1e3:.1f}" for key in row
                    if isinstance(row[key], dict)), flush=True)
                del A, B, ref, C
    with open(args.out, "w") as f:
        json.dump(dict(gpu=gpu, results=results), f)


def taint(args):
    """torch.matmul at 1 x 8192 x 2048 on fresh streams of the driver's making, each given a different first work
    (a kernel's first launch in the process, a loaded kernel, an event, a wait, a module loaded before its launch):
    which first work leaves a stream a launch slower? Each variant's kernels are new Triton functions (their own
    first launch), so the variants do not share one."""
    import torch
    import triton
    import triton.language as tl

    from gemmar.tuner import inputs, one_gpu_rank

    def new_kernel(value):
        @triton.jit
        def store(x, v: tl.constexpr):
            tl.store(x, v)
        return lambda: store[(1,)](word, value), store

    word = torch.zeros(1, dtype=torch.int32, device="cuda")
    A, B, _ = inputs(1, 8192, 2048, "bf16")
    C = A @ B
    loaded, _ = new_kernel(0)
    loaded()
    torch.cuda.synchronize()
    named = []

    def fresh(name, *works):
        stream = driver_stream()
        with torch.cuda.stream(stream):
            for work in works:
                work(stream)
        torch.cuda.synchronize()
        named.append((name, stream))

    def first(i):   # (a work: the first launch of a new kernel)
        return lambda stream: new_kernel(i)[0]()
    other = driver_stream()
    fresh("first_launch_first", first(1))
    fresh("loaded_then_first_launch", lambda s: loaded(), first(2))
    fresh("event_then_first_launch", lambda s: torch.cuda.Event().record(s), first(3))
    fresh("wait_other_then_first_launch", lambda s: s.wait_stream(other), first(4))
    fresh("wait_default_then_first_launch", lambda s: s.wait_stream(torch.cuda.default_stream()), first(5))
    fresh("matmul_then_first_launch", lambda s: torch.matmul(A, B, out=C), first(6))
    fresh("loaded_only", lambda s: loaded())

    def preloaded(s):   # compiled and its module loaded on the host first, then launched first on this stream
        go, kernel = new_kernel(7)
        with torch.cuda.stream(torch.cuda.default_stream()):
            go()
        torch.cuda.synchronize()
        go()
    fresh("launched_elsewhere_first_then_here", preloaded)
    fresh("first_launch_first_again", first(8))
    # the default stream after a first launch on it
    new_kernel(9)[0]()
    torch.cuda.synchronize()
    named.append(("default_after_first_launch", torch.cuda.default_stream()))
    named.append(("other_untouched_until_now", other))
    with one_gpu_rank(1 << 30) as heap:
        named.append(("heap", heap.stream))
        named.append(("heap_side", heap.side_stream))
        for round_ in range(2):
            for name, stream in named:
                print(f"round {round_} {name:>36} {matmul_us_on(stream, A, B, C):.2f} us", flush=True)


if __name__ == "__main__":
    main()
