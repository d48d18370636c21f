"""A fourth algorithm, written outside gemmar with its public APIs only (device, trace, spec): one-shot push.

Every rank pushes each finished partial tile into its own slot of every rank's inbox (remote stores), then
counts it in there (a release-add after a block barrier); each rank then waits until all W partials of the
tile are in its inbox and sums them itself, in rank order, so every rank gets the same bits: one exchange
instead of two_shot's two, W - 1 copies of every partial on the links.

Back-to-back launches need no reset: ``arrived`` grows by W per launch, and the inbox has two halves used
by alternate launches, so a rank that runs ahead into launch e + 1 writes the other half. (It cannot get
two launches ahead: launch e + 1 of a tile waits for every rank's push of it, which a rank makes only after
its launch e has ended.)

Protocol, per tile of a GEMM program:
  1. the partial (the persistent GEMM's tile);
  2. store it into our slot of every rank's inbox, barrier, release-add 1 to ``arrived[tile]`` there;
  3. acquire-wait until our ``arrived[tile] >= W * (epoch + 1)``;
  4. sum the W slots in rank order, in fp32;
  5. store the sum into our C.
Under the interpreter each rank runs its programs one after another, in the same tile order on every rank,
and every rank pushes a tile before it waits for it: no wait can close a circle.
"""

import dataclasses
import types

import torch
import triton
import triton.language as tl

from gemmar.kernels import device
from gemmar.kernels.events import event, finish_trace
from gemmar.kernels.gemm import GEMM_PHASE, tile_coords, tile_offsets, traced_gemm_tile
from gemmar.kernels.spec import AlgorithmSpec, Done, Launch, Phase

PHASES = (GEMM_PHASE,
          Phase(20, "push", "comm"),
          Phase(21, "arrival_wait", "wait", "tile {tile} waits for arrived (all {world_size} ranks' partials in "
                                            "this rank's inbox)"),
          Phase(22, "sum", "reduce"),
          Phase(23, "store", "store"))
PUSH, ARRIVAL_WAIT, SUM, STORE = (tl.constexpr(p.kind_id) for p in PHASES[1:])
WAIT_FLAGS = {"arrived": 1}   # the id its wait passes to wait_at_least, named in a DeadlockError
ARRIVED_FLAG = tl.constexpr(WAIT_FLAGS["arrived"])


@triton.jit
def inbox_slot(inbox, half, source, total_tiles, tile_id, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Rank ``source``'s slot for tile ``tile_id`` in the inbox half ``half`` (a dense BLOCK_M x BLOCK_N tile)."""
    first = (tl.cast(half + source, tl.int64) * total_tiles + tile_id) * (BLOCK_M * BLOCK_N)
    return inbox + first + tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]


@triton.jit
def store_tile(C, total, pid_m, pid_n, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    offsets, mask = tile_offsets(pid_m, pid_n, M, N, N, 1, BLOCK_M, BLOCK_N)
    tl.store(C + offsets, total, mask=mask)


@triton.jit
def store_tile_rows_masked_by_columns(C, total, pid_m, pid_n, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """A participant's mistake (workshop dry run 3): the row mask built from the column offsets, so an edge tile
    writes its rows past C's last one into whatever the heap holds next."""
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.store(C + rm[:, None] * N + rn[None, :], total, mask=(rn[None, :] < M) & (rn[None, :] < N))


@triton.jit(do_not_specialize=["rank", "epoch", "timeout_ns"])
def one_shot_push_kernel(
        A, B, C, inbox, arrived, watchdog, heap_bases, rank, world_size, epoch, M, N, K,
        stride_am, stride_ak, stride_bk, stride_bn, timeout_ns, trace, trace_counts,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_SIZE_M: tl.constexpr,
        NUM_SMS: tl.constexpr, DOT_PRECISION: tl.constexpr, TRACE_CAPACITY: tl.constexpr, EVEN_K: tl.constexpr,
        TMA: tl.constexpr, STORE_C: tl.constexpr, EXTRA_ARRIVALS: tl.constexpr, WAIT_SHIFT: tl.constexpr,
        SUM_DTYPE: tl.constexpr):
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    total_tiles = num_pid_m * num_pid_n
    half = (epoch % 2) * world_size
    gemm = (A, B, M, N, K, stride_am, stride_ak, stride_bk, stride_bn)   # (see gemm.traced_gemm_tile)
    n_events = tl.zeros((), tl.int32)
    for tile_id in range(tl.program_id(0), total_tiles, NUM_SMS):
        # 1. Our partial.
        acc, pid_m, pid_n, n_events, t = traced_gemm_tile(gemm, tile_id, trace, n_events, tile_coords, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_SIZE_M,
                                                           DOT_PRECISION, EVEN_K, TMA, TRACE_CAPACITY)
        # 2. Into our slot of every rank's inbox; then count it in there, after every thread's store.
        mine = inbox_slot(inbox, half, rank, total_tiles, tile_id, BLOCK_M, BLOCK_N)
        for step in range(world_size):
            device.store(mine, acc, rank, (rank + step) % world_size, heap_bases)
        tl.debug_barrier()
        for step in range(world_size):
            device.atomic_add(arrived + tile_id, 1, rank, (rank + step) % world_size, heap_bases, sem="release",
                              scope="sys")
        n_events, t = event(trace, n_events, t, PUSH, tile_id, pid_m, pid_n, 0, -1, TRACE_CAPACITY)
        # 3. Every rank's partial of this launch is in our inbox.
        #    (WAIT_SHIFT: a participant's wait on another tile's flag, named as such by the DeadlockError.)
        device.wait_at_least(arrived + (tile_id + WAIT_SHIFT) % total_tiles, world_size * (epoch + 1) + EXTRA_ARRIVALS,
                             timeout_ns, watchdog, rank, tile_id, ARRIVED_FLAG, tile_id)
        tl.debug_barrier()
        n_events, t = event(trace, n_events, t, ARRIVAL_WAIT, tile_id, pid_m, pid_n, 0, -1, TRACE_CAPACITY)
        # 4. Their sum, in rank order.
        total = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        for source in range(world_size):   # (SUM_DTYPE fp16: a participant's partials rounded as they are added)
            total += tl.load(inbox_slot(inbox, half, source, total_tiles, tile_id, BLOCK_M, BLOCK_N)).to(SUM_DTYPE)
        n_events, t = event(trace, n_events, t, SUM, tile_id, pid_m, pid_n, 0, -1, TRACE_CAPACITY)
        # 5. Into our C.
        STORE_C(C, total, pid_m, pid_n, M, N, BLOCK_M, BLOCK_N)
        n_events, t = event(trace, n_events, t, STORE, tile_id, pid_m, pid_n, 0, rank, TRACE_CAPACITY)
    finish_trace(trace_counts, n_events, TRACE_CAPACITY)


def buffers(alloc, config, world_size):
    tiles = config.tile_count
    return types.SimpleNamespace(C=alloc((config.m, config.n), torch.float32),
                                 inbox=alloc((2 * world_size * tiles, config.BLK_M * config.BLK_N), torch.float32),
                                 arrived=alloc(tiles, torch.int32))


def launches(ctx):
    return launches_storing_with(ctx, store_tile)


def launches_waiting_for_one_too_many(ctx):
    return launches_storing_with(ctx, store_tile, extra_arrivals=1)


def launches_waiting_on_the_next_tiles_flag(ctx):
    return launches_storing_with(ctx, store_tile, wait_shift=1)


def launches_rounding_the_partials_to_fp16(ctx):
    return launches_storing_with(ctx, store_tile, sum_dtype=tl.float16)


def launches_storing_with(ctx, store_c, extra_arrivals=0, wait_shift=0, sum_dtype=tl.float32):
    cfg, buf = ctx.config, ctx.buffers
    return [Launch(one_shot_push_kernel, (cfg.num_sms,), ctx.tuning(
        A=ctx.A, B=ctx.B, C=buf.C, inbox=buf.inbox, arrived=buf.arrived, watchdog=ctx.watchdog,
        heap_bases=ctx.heap.heap_bases, rank=ctx.rank, world_size=ctx.world_size, epoch=0, M=cfg.m, N=cfg.n,
        K=ctx.K, **ctx.strides, timeout_ns=ctx.timeout_ns, trace=ctx.trace, trace_counts=ctx.trace_counts,
        STORE_C=store_c, EXTRA_ARRIVALS=extra_arrivals, WAIT_SHIFT=wait_shift, SUM_DTYPE=sum_dtype, **ctx.gemm),
        per_launch=("epoch",))]


def launches_with_rows_masked_by_columns(ctx):
    return launches_storing_with(ctx, store_tile_rows_masked_by_columns)


def output(buffers, epoch):
    return buffers.C


def events_per_program(config, world_size):
    return -(-config.tile_count // config.num_sms) * 5   # gemm, push, arrival_wait, sum, store per tile


def events_per_launch(config, world_size, rank):
    return config.tile_count * 5


SPEC = AlgorithmSpec(
    name="one_shot_push", summary="every rank pushes each partial tile to every rank, and every rank sums them",
    buffers=buffers, launches=launches, output=output, phases=PHASES, done=Done("store"),
    events_per_program=events_per_program, events_per_launch=events_per_launch, wait_flags=WAIT_FLAGS)

# The same algorithm with a participant's wrong store mask (tests/test_user_algorithm.py).
SPEC_ROWS_MASKED_BY_COLUMNS = dataclasses.replace(SPEC, name="one_shot_push_rows_masked_by_columns",
                                                  launches=launches_with_rows_masked_by_columns)
# ... and with a wait for one arrival more than there will ever be (a participant's wrong count).
SPEC_WAITING_FOR_ONE_TOO_MANY = dataclasses.replace(SPEC, name="one_shot_push_waiting_for_one_too_many",
                                                    launches=launches_waiting_for_one_too_many)
# ... and with a wait on the next tile's flag (notebook 7's `WAIT_READY(ready + (tile_id + 1) % tiles, ...)`).
SPEC_WAITING_ON_THE_NEXT_TILES_FLAG = dataclasses.replace(SPEC, name="one_shot_push_waiting_on_the_next_tiles_flag",
                                                          launches=launches_waiting_on_the_next_tiles_flag)
# ... and with each partial rounded to fp16 as it is added (notebook 7's precision mistake).
SPEC_ROUNDING_THE_PARTIALS_TO_FP16 = dataclasses.replace(SPEC, name="one_shot_push_rounding_the_partials_to_fp16",
                                                         launches=launches_rounding_the_partials_to_fp16)
