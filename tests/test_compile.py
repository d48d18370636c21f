"""The compiled path, checked without a GPU: every kernel compiles to Hopper machine code (sm_90).

The interpreter runs the same source, but only the compiler sees the GPU branches (the %globaltimer
clock, cache modifiers, release/acquire lowering); this keeps them from breaking silently on CPU-only CI.
"""

import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent('''
    import inspect
    import os

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from gemmar.kernels import allreduce, atomics, barrier, device, gemm, mistakes, one_shot, ring, two_shot
    from gemmar.runtime.shipping import load_parts

    # A participant's kernel part (the notebooks' puzzles) and a teaching mistake's compile into the kernel
    # like the package's own.
    mine = load_parts({"reduce_step": dict(
        function="mine", sources={"mine": "@triton.jit\\ndef mine(total, received):\\n    return total + received, received\\n"},
        imports={"triton": ("triton", None)}, values={}, digest="a-hand-made-part")})["reduce_step"]

    target = GPUTarget("cuda", 90, 32)
    ints = ["M", "N", "K", "stride_am", "stride_ak", "stride_bk", "stride_bn", "stride_cm", "stride_cn"]

    # The builds are shared out among SHARDS processes (the test runs them side by side): build number i is
    # this process's when i % SHARDS == SHARD.
    SHARD, SHARDS = (int(v) for v in os.environ.get("GEMMAR_COMPILE_SHARD", "0/1").split("/"))
    builds = 0

    def build(fn, signature, constexprs, ones=(), aligned=False):
        global builds
        builds += 1
        if (builds - 1) % SHARDS != SHARD:
            return
        # ``ones``: int arguments given as 1, which Triton turns into constants (a 1 x 1 x 1 problem, one rank).
        ones = {k: 1 for k in ones if k in signature}
        # ``aligned``: what Triton's launcher tells the compiler at a shape whose sizes are multiples of 16 with
        # contiguous A, B and C - the unit strides are constants, the pointers and the other sizes and strides
        # divisible by 16. Without it plain-pointer loads cannot be vectorized, and are not software-pipelined.
        attrs = {}
        if aligned:
            ones.update({k: 1 for k in ("stride_ak", "stride_bn", "stride_cn") if k in signature})
            names = list(inspect.signature(fn.fn).parameters)
            attrs = {(names.index(k),): [["tt.divisibility", 16]] for k, kind in signature.items()
                     if k not in ones and k not in constexprs and (kind.startswith("*") or k in ints)}
        signature = dict(signature, **{k: "constexpr" for k in list(constexprs) + list(ones)})
        constexprs = dict(constexprs, **ones)
        compiled = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs),
                                  target=target)
        ptx = compiled.asm["ptx"]
        # A software-pipelined K loop keeps one wgmma group in flight while the next tiles load.
        pipelined = "wgmma.wait_group.sync.aligned 1" in ptx
        print(fn.__name__, constexprs.get("TRACE_CAPACITY"), "globaltimer" in ptx, len(compiled.asm["cubin"]), pipelined,
              bool(constexprs.get("TMA")), 0 if aligned else len(ones), aligned)

    def kernels(dtype, cap):
        tiles = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_SIZE_M=8, NUM_SMS=132, DOT_PRECISION="tf32",
                     TRACE_CAPACITY=cap, EVEN_K=cap == 0)
        yield (ring.gemm_all_reduce_ring,
               {"A": "*" + dtype, "B": "*" + dtype, "C": "*fp32", "ring_buffer": "*fp32", "data_ready": "*i32",
                "slot_free": "*i32", "watchdog": "*i64", "heap_bases": "*i64", "rank": "i32", "world_size": "i32",
                "epoch": "i32", **{k: "i32" for k in ints}, "timeout_ns": "i64", "trace": "*i64",
                "trace_counts": "*i64"}, dict(tiles, SLOT_CACHE=".cg", TMA=False, TILE_COORDS=gemm.tile_coords,
                                             REDUCE_STEP=mine if cap else ring.reduce_step,
                                             SLOT_FREE_WAIT=mistakes.skip_the_wait if cap else device.wait_for_tile,
                                             DATA_READY_WAIT=mistakes.wait_one_too_many if cap else device.wait_for_tile))
        yield (atomics.gemm_all_reduce_atomics,
               {"A": "*" + dtype, "B": "*" + dtype, "C_pair": "*fp32", "heap_bases": "*i64", "rank": "i32",
                "world_size": "i32", "parity": "i32", **{k: "i32" for k in ints}, "trace": "*i64",
                "trace_counts": "*i64"}, dict(tiles, TMA=False, TILE_COORDS=gemm.tile_coords,
                                             PUSH_PARTIAL=atomics.push_partial))
        yield (gemm.persistent_gemm,
               {"A": "*" + dtype, "B": "*" + dtype, "C": "*" + dtype, **{k: "i32" for k in ints},
                "trace": "*i64", "trace_counts": "*i64"}, dict(tiles, TMA=False, FLATTEN=True))
        # two_shot as the launcher runs it on Hopper: A and B as TMA tensor descriptors.
        descriptors = {"A": f"tensordesc<{dtype}[128, 64]>", "B": f"tensordesc<{dtype}[64, 256]>"}
        # two_shot's and one_shot's GEMM kernels, and the one both run at world size 1
        heap = {"C": "*" + dtype, "partials": "*" + dtype, "partial_ready": "*i32", "results_in": "*i32",
                "taken": "*i32", "heap_bases": "*i64", "rank": "i32", "world_size": "i32", "epoch": "i32"}
        for kernel in (two_shot.two_shot_gemm, one_shot.one_shot_gemm):
            yield (kernel, {**descriptors, **heap, **{k: "i32" for k in ints}, "trace": "*i64", "trace_counts": "*i64"},
                   dict(tiles, BLOCK_N=256, NUM_SMS=116, TMA=True, HELP=True, SUM_PARTIALS=two_shot.sum_partials,
                        PEER_CACHE=".cg", REDUCE_ROWS=128))
        yield (two_shot.one_rank_gemm,
               {**descriptors, "C": "*" + dtype, "partials": "*" + dtype, **{k: "i32" for k in ints}, "trace": "*i64",
                "trace_counts": "*i64"}, dict(tiles, BLOCK_N=256, NUM_SMS=116, TMA=True))
        for kernel in (two_shot.two_shot_reduce, one_shot.one_shot_reduce):
            yield (kernel,
                   {"C": "*" + dtype, "partials": "*" + dtype, "partial_ready": "*i32", "results_in": "*i32",
                    "taken": "*i32", "watchdog": "*i64", "heap_bases": "*i64", "rank": "i32", "world_size": "i32",
                    "epoch": "i32", "M": "i32", "N": "i32", "stride_cm": "i32", "stride_cn": "i32", "timeout_ns": "i64",
                    "trace": "*i64", "trace_counts": "*i64"},
                   dict(BLOCK_M=128, BLOCK_N=256, GROUP_SIZE_M=8, COMM_SMS=16, TRACE_CAPACITY=cap,
                        WAIT_FOR_PARTIALS=device.wait_for_tile, SUM_PARTIALS=two_shot.sum_partials, PEER_CACHE=".cg",
                        CLAIM=True, REDUCE_ROWS=32))

    # Traced and untraced in bf16; fp16 changes only the element type, so it is compiled untraced only.
    for dtype, cap in (("bf16", 0), ("bf16", 64), ("fp16", 0)):
        for kernel in kernels(dtype, cap):
            build(*kernel)
    # Triton compiles an int argument that is 1 as a constant: the kernels must not call tensor methods on
    # one (M.to(...) broke the atomics kernel at M = 1, on a GPU only).
    for kernel in kernels("bf16", 0):
        build(*kernel, ones=("M", "N", "K", "rank", "world_size", "epoch", "parity"))
    # split-K at world size 1, untraced bf16 only (its trace events are two_shot's): few rows read through plain
    # pointers (every tile cut), more through descriptors (a wave of whole tiles, then the last wave's cut)
    split = {"C": "*bf16", "partials": "*bf16", "slices": "*fp32", "slices_in": "*i32", **{k: "i32" for k in ints}, "trace": "*i64",
             "trace_counts": "*i64"}
    split_tiles = dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, GROUP_SIZE_M=8, NUM_SMS=132, DOT_PRECISION="tf32",
                       TRACE_CAPACITY=0, EVEN_K=True)
    build(two_shot.one_rank_split_gemm, {"A": "*bf16", "B": "*bf16", **split},
          dict(split_tiles, BLOCK_M=16, BLOCK_N=64, BLOCK_K=256, TMA=False, WHOLE_TILES=0, SPLIT_K=4, SUM_ROWS=16))
    build(two_shot.one_rank_split_gemm, {"A": "tensordesc<bf16[128, 64]>", "B": "tensordesc<bf16[64, 256]>", **split},
          dict(split_tiles, TMA=True, WHOLE_TILES=132, SPLIT_K=3, SUM_ROWS=32))
    # The same through plain pointers (up to tuning.FEW_ROWS rows at world size 1), at an aligned shape as a launch
    # compiles them: the tile GEMM whole, and split.
    build(two_shot.one_rank_gemm, {"A": "*bf16", "B": "*bf16", "C": "*bf16", "partials": "*bf16",
                                   **{k: "i32" for k in ints}, "trace": "*i64", "trace_counts": "*i64"},
          dict(split_tiles, TMA=False), aligned=True)
    build(two_shot.one_rank_split_gemm, {"A": "*bf16", "B": "*bf16", **split},
          dict(split_tiles, TMA=False, WHOLE_TILES=132, SPLIT_K=3, SUM_ROWS=32), aligned=True)
    # The standalone all-reduce's own kernels (one launch each: copy in, publish, reduce).
    common = {"x": "*bf16", "numel": "i32", "out": "*bf16", "partials": "*bf16", "partial_ready": "*i32"}
    rest = {"watchdog": "*i64", "heap_bases": "*i64", "rank": "i32", "world_size": "i32", "launch_counts": "*i32",
            "M": "i32", "N": "i32", "timeout_ns": "i64"}
    for ones in ((), ("M", "rank", "world_size")):
        build(allreduce.two_shot_all_reduce, {**common, "results_in": "*i32", **rest, "no_trace": "*i64"},
              dict(BLOCK_M=64 if ones else 256, BLOCK_N=256, COMM_SMS=16, PEER_CACHE=".cg", COPY_IN=not ones,
                   ROWS=64), ones=ones)
        build(allreduce.one_shot_all_reduce, {**common, "partials_read": "*i32", **rest},
              dict(BLOCK_M=64 if ones else 128, BLOCK_N=256, COMM_SMS=16, PEER_CACHE=".cg", COPY_IN=bool(ones),
                   ROWS=64), ones=ones)
    build(barrier.barrier_kernel, {"counter": "*i64", "watchdog": "*i64", "exit_time": "*i64", "heap_bases": "*i64", "rank": "i32",
                                   "target": "i64", "timeout_ns": "i64"}, {})
''')


def test_kernels_compile_for_hopper():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    shards = max(1, min(4, os.cpu_count() or 1))   # (compiling is all CPU: one process per core)
    procs = [subprocess.Popen([sys.executable, "-c", SCRIPT], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=dict(env, GEMMAR_COMPILE_SHARD=f"{i}/{shards}")) for i in range(shards)]
    outs = [p.communicate(timeout=600) + (p.returncode,) for p in procs]
    for stdout, stderr, returncode in outs:
        if "ptxas" in stderr and "not found" in stderr:  # pragma: no cover - wheel without ptxas
            pytest.skip("this Triton wheel carries no ptxas, so it cannot compile for NVIDIA here")
        assert returncode == 0, stderr[-3000:]
    lines = [line.split() for stdout, _, _ in outs for line in stdout.splitlines()]
    assert len(lines) == 3 * 8 + 8 + 2 + 2 + 4 + 1   # (dtype, tracing) pairs x kernels, the 1 x 1 x 1 builds, split-K,
    #                                                the aligned plain-pointer ones, the all-reduce's own, the barrier
    assert sum(int(line[-2]) > 0 for line in lines) == 10   # the kernels given arguments of 1 really had some
    assert sum(aligned == "True" for *_, aligned in lines) == 2   # (both plain-pointer GEMM builds were made)
    for name, capacity, has_timer, cubin_bytes, pipelined, tma, ones, aligned in lines:
        assert int(cubin_bytes) > 0
        # (with K = 1 there is no loop to pipeline) A flattened tile loop once cost it its pipelining: 3x slower
        # on an H200. Through plain pointers (few rows) the K loop is pipelined where the launch tells the compiler
        # the shape is aligned (``aligned``); the other pointer builds carry no such hints, as a launch at odd sizes.
        if name in ("two_shot_gemm", "one_shot_gemm", "one_rank_gemm", "one_rank_split_gemm") and ones == "0" and \
                (tma == "True" or aligned == "True"):
            assert pipelined == "True", f"{name} (trace capacity {capacity}, TMA {tma}) is not software-pipelined"
        # The GPU timer is in the code exactly when tracing is on (and always in the barrier's watchdog).
        if name in ("two_shot_all_reduce", "one_shot_all_reduce"):
            continue   # (no trace; both wait, so they have the watchdog's clock)
        if name not in ("barrier_kernel", "gemm_all_reduce_ring", "two_shot_reduce", "one_shot_reduce"):   # these wait
            assert has_timer == str(capacity == "64")
