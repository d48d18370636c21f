"""``iris.ccl`` on gemmar: Iris's collectives (``shmem.ccl.all_reduce(out, x, config=)`` and the rest), run by
gemmar's kernels.

- ``all_reduce``: gemmar's standalone all-reduce (``runtime/allreduce.py``), two-shot by tile owner or
  one-shot, whichever ``Config.all_reduce_variant`` names. Both give every rank the same bits (each sum is
  taken in fp32 in rank order) and need no reset between calls (their flags count launches). Iris's other
  variants (``atomic``, ``ring``, ``spinlock``) are accepted and run two-shot; the first call says so.
- ``all_gather``, ``all_to_all``, ``reduce_scatter``: small kernels over gemmar's device API, below.

Each call checks its tensors (shape, dtype, device, on the heap where a peer must reach them) and says what
is wrong in one line. Every rank must make the same calls in the same order, as with Iris. What a call
allocates comes from the heap's end and lives as long as the program (reused by the next call of the same
size). Each collective ends with every rank's part done (a barrier where peers write into our output).
"""

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..errors import UsageError
from ..kernels.device import load, put

ALL_REDUCE_VARIANTS = ("two_shot", "one_shot", "atomic", "ring", "spinlock")
GEMMAR_ALL_REDUCE = ("two_shot", "one_shot")   # the variants gemmar has; the rest run two_shot


@dataclass
class Config:
    """Iris's ``iris.ccl.Config``, the fields gemmar reads marked: ``all_reduce_variant``; ``comm_sms``
    (None: gemmar's default, 2 programs on cpu, 16 on GPUs); ``block_size_m`` / ``block_size_n`` (the tiles of
    reduce_scatter's split between ranks). The others are accepted and not used."""

    block_size_m: int = 32
    block_size_n: int = 64
    swizzle_size: int = 4
    comm_sms: int = None
    num_xcds: int = None
    chunk_size: int = None
    use_gluon: bool = False
    all_gather_variant: str = "persistent"
    all_reduce_variant: str = "two_shot"
    all_reduce_distribution: int = 1
    all_reduce_num_rings: int = 1
    all_reduce_ring_slice_n: int = None
    reduce_scatter_variant: str = "two_shot"
    num_stages: int = 1
    num_warps: int = 4
    threads_per_warp: int = 64
    waves_per_eu: int = 0

    def __post_init__(self):
        if self.all_reduce_variant not in ALL_REDUCE_VARIANTS:
            raise UsageError(f"all_reduce_variant={self.all_reduce_variant!r} is not known: use one of "
                             f"{', '.join(ALL_REDUCE_VARIANTS)}")
        if self.use_gluon:
            raise UsageError("Config(use_gluon=True): Gluon kernels are AMD-only; gemmar runs Triton kernels")
        for name in ("block_size_m", "block_size_n"):   # (reduce_scatter's tiles must be powers of two: it says so)
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UsageError(f"Config {name}={value!r} is not allowed: use a whole number >= 1")
        if self.comm_sms is not None and (isinstance(self.comm_sms, bool) or not isinstance(self.comm_sms, int)
                                          or not 1 <= self.comm_sms <= 4096):
            raise UsageError(f"Config comm_sms={self.comm_sms!r} is not allowed: use 1 to 4096 programs")


@dataclass
class Workspace:
    """What Iris's ``*_preamble`` calls return. gemmar's kernels keep their own flags (counting launches, never
    reset), so a workspace only remembers the number of tiles it was made for; a call with more is refused, as
    Iris refuses an undersized lock (or, for its ring, flags) array. ``prepared`` as in Iris."""

    tiles: int
    array: str = "Lock"
    prepared: bool = False

    def check(self, what, tiles):
        if tiles > self.tiles:
            raise UsageError(f"{what}: {self.array} array too small: the workspace was made for {self.tiles} tiles "
                             f"and this call has {tiles} (smaller blocks): make it again with {what}_preamble")


class Collectives:
    """``shmem.ccl``: the collectives of one ``iris.iris()`` (its heap, its all-reduces by size)."""

    def __init__(self, shmem):
        self._shmem = shmem
        self._all_reduces = {}   # (numel, dtype, scheme, programs) -> SymmetricAllReduce, reused call after call

    # -- checks ---------------------------------------------------------------------------------------
    def _check(self, what, output, input, on_heap=()):
        shmem = self._shmem
        for name, t in (("output", output), ("input", input)):
            if not isinstance(t, torch.Tensor):
                raise UsageError(f"ccl.{what}: {name} must be a torch tensor, got {type(t).__name__}")
            if t.device != shmem.get_device():
                raise UsageError(f"ccl.{what}: {name} is on {t.device}, this rank's heap is on {shmem.get_device()}")
            if not t.is_contiguous():
                raise UsageError(f"ccl.{what}: {name} is not contiguous: pass a contiguous tensor")
        if output.dtype != input.dtype:
            raise UsageError(f"ccl.{what}: output is {output.dtype} and input {input.dtype}: use one dtype")
        for name in on_heap:
            t = output if name == "output" else input
            if not shmem.is_symmetric(t):
                raise UsageError(f"ccl.{what}: {name} is not on the symmetric heap (the other ranks reach it there): "
                                 f"allocate it with shmem.zeros/empty")

    @staticmethod
    def _no_group(what, op=None, group=None, async_op=False):
        if group is not None:
            raise UsageError(f"ccl.{what}(group=...): gemmar's collectives run over all ranks: use group=None")
        if async_op:
            raise UsageError(f"ccl.{what}(async_op=True): gemmar's collectives return when done: use async_op=False")
        import torch.distributed as dist

        if op is not None and op != dist.ReduceOp.SUM:
            raise UsageError(f"ccl.{what}(op={op}): gemmar's reduction is a sum: use op=None or ReduceOp.SUM")


    # -- collectives ----------------------------------------------------------------------------------
    def all_reduce(self, output_tensor, input_tensor, op=None, group=None, async_op=False, config=None,
                   workspace=None, prepare_only=False):
        """``output = sum over ranks of input`` on every rank, the same bits everywhere."""
        from ..runtime.allreduce import SymmetricAllReduce, default_programs

        self._no_group("all_reduce", op, group, async_op)
        self._check("all_reduce", output_tensor, input_tensor)
        if output_tensor.shape != input_tensor.shape:
            raise UsageError(f"ccl.all_reduce: output is {tuple(output_tensor.shape)} and input "
                             f"{tuple(input_tensor.shape)}: use one shape")
        config = config or Config()
        if workspace is not None:
            workspace.check("ccl.all_reduce", self._tiles(input_tensor, config))
        scheme = config.all_reduce_variant if config.all_reduce_variant in GEMMAR_ALL_REDUCE else "two_shot"
        if scheme != config.all_reduce_variant:
            self._shmem.info_once(f"ccl.all_reduce: variant {config.all_reduce_variant!r} runs gemmar's two_shot "
                                  f"(the same sum, the same bits on every rank)")
        heap = self._shmem._heap
        programs = config.comm_sms or default_programs(heap)
        key = (input_tensor.numel(), input_tensor.dtype, scheme, programs)
        if key not in self._all_reduces:
            with heap.allocating_for_program():
                self._all_reduces[key] = SymmetricAllReduce(heap, input_tensor.numel(), input_tensor.dtype, programs,
                                                            heap.timeout_s, scheme)
            self._all_reduces[key].prepare()
            # Its flags were just zeroed on this rank: no peer may signal into them before every rank has
            # done so (a signal that arrives first is wiped, and the launch waits for it forever).
            self._shmem.barrier()
            self._shmem.info_once(f"ccl.all_reduce: gemmar's {scheme} all-reduce, {programs} programs per rank")
        if not prepare_only:
            output_tensor.copy_(self._all_reduces[key](input_tensor))
        return None

    @staticmethod
    def _tiles(tensor, config):
        """Iris's tile count of a call: ``block_size_m x block_size_n`` tiles of the 2-D view of ``tensor``."""
        rows, cols = (tensor.shape[0], tensor[0].numel()) if tensor.dim() > 1 else (1, tensor.numel())
        return triton.cdiv(rows, config.block_size_m) * triton.cdiv(cols, config.block_size_n)

    def all_reduce_preamble(self, output_tensor, input_tensor, config=None, workspace=None):
        """Iris's preamble: a :class:`Workspace` for this call's tiles (an existing one checked and given back).
        gemmar's all-reduce of this size is made now, its flags zeroed, and the ranks meet."""
        config = config or Config()
        tiles = self._tiles(input_tensor, config)
        if workspace is not None:
            workspace.check("ccl.all_reduce", tiles)
            return workspace
        self.all_reduce(output_tensor, input_tensor, config=config, prepare_only=True)
        return Workspace(tiles, "Flags" if config.all_reduce_variant == "ring" else "Lock")

    def all_gather(self, output_tensor, input_tensor, group=None, async_op=False, config=None):
        """``output[r * M:(r + 1) * M] = rank r's input`` on every rank (output is W x M rows of input's)."""
        self._no_group("all_gather", group=group, async_op=async_op)
        self._check("all_gather", output_tensor, input_tensor, on_heap=("output",))
        shmem, numel = self._shmem, input_tensor.numel()
        if output_tensor.numel() != shmem.num_ranks * numel:
            raise UsageError(f"ccl.all_gather: output has {output_tensor.numel()} values; it needs world size x "
                             f"input's = {shmem.num_ranks} x {numel}")
        heap = shmem._heap
        block = _block(heap, 1024)
        shmem.barrier()   # every rank's output is ready (allocated, zeroed) before peers write into it
        with heap.on_stream():
            _all_gather_kernel[(_programs(numel, block),)](input_tensor, output_tensor, numel, shmem.cur_rank,
                                                           shmem.num_ranks, heap.heap_bases, BLOCK=block)
        shmem.barrier()   # every rank's pieces have arrived before anyone reads its output

    def all_to_all(self, output_tensor, input_tensor, group=None, async_op=False, config=None):
        """Rank r's ``input[:, q*N:(q+1)*N]`` becomes rank q's ``output[:, r*N:(r+1)*N]`` (2-D, W x N columns)."""
        self._no_group("all_to_all", group=group, async_op=async_op)
        self._check("all_to_all", output_tensor, input_tensor, on_heap=("output",))
        shmem = self._shmem
        W = shmem.num_ranks
        if input_tensor.dim() != 2 or output_tensor.shape != input_tensor.shape or input_tensor.shape[1] % W:
            raise UsageError(f"ccl.all_to_all: input and output must be one 2-D shape whose columns divide by the "
                             f"world size {W}; got {tuple(input_tensor.shape)} and {tuple(output_tensor.shape)}")
        rows, cols = input_tensor.shape
        heap = shmem._heap
        shmem.barrier()   # every rank's output is ready before peers write into it
        block_m, block_n = _block(heap, 16), _block(heap, 64, 1024)
        with heap.on_stream():
            _all_to_all_kernel[(triton.cdiv(rows, block_m),)](input_tensor, output_tensor, rows, cols // W,
                                                              shmem.cur_rank, W, heap.heap_bases, BLOCK_M=block_m,
                                                              BLOCK_N=block_n)
        shmem.barrier()

    def reduce_scatter(self, output_tensor, input_tensor, op=None, group=None, async_op=False, config=None):
        """Iris's reduce-scatter: the tiles of a 2-D tensor (``Config.block_size_m x block_size_n``) are split
        between the ranks in blocks (rank r: tiles ``[r T, (r + 1) T)``, ``T = ceil(tiles / W)``); each rank's
        output holds the sum over ranks of input on its own tiles, summed in fp32 in rank order."""
        self._no_group("reduce_scatter", op, group, async_op)
        self._check("reduce_scatter", output_tensor, input_tensor, on_heap=("input",))
        if input_tensor.dim() != 2 or output_tensor.shape != input_tensor.shape:
            raise UsageError(f"ccl.reduce_scatter: input and output must be one 2-D shape; got "
                             f"{tuple(input_tensor.shape)} and {tuple(output_tensor.shape)}")
        config = config or Config()
        reduce_scatter_tiles(self._shmem, output_tensor, input_tensor, config.block_size_m, config.block_size_n)


def reduce_scatter_tiles(shmem, output_tensor, input_tensor, block_m, block_n, last_takes_rest=False):
    """The reduce-scatter of ``ccl.reduce_scatter`` (``ceil(T / W)`` tiles a rank) and of
    ``ops.matmul_reduce_scatter`` (``last_takes_rest``: ``T // W`` a rank, the last rank the rest)."""
    for name, value in (("block_size_m", block_m), ("block_size_n", block_n)):
        if value & (value - 1):
            raise UsageError(f"reduce_scatter: {name}={value} is not allowed: its tiles are Triton blocks, so use a "
                             f"power of two")
    heap = shmem._heap
    rows, cols = input_tensor.shape
    tiles = triton.cdiv(rows, block_m) * triton.cdiv(cols, block_n)
    shmem.barrier()   # every rank's input is written before anyone reads it
    with heap.on_stream():
        _reduce_scatter_kernel[(min(tiles, 64),)](input_tensor, output_tensor, rows, cols, shmem.cur_rank,
                                                  shmem.num_ranks, heap.heap_bases, BLOCK_M=block_m,
                                                  BLOCK_N=block_n, LAST_TAKES_REST=last_takes_rest)
    shmem.barrier()   # nobody overwrites its input while another rank reads it


def _block(heap, on_gpu, on_cpu=None):
    """A block size: ``on_gpu`` on GPUs; under the interpreter (cpu ranks) a larger one (default 64 x), since there
    a launch costs per operation, not per element (an all-gather of 8192 x 8192 took minutes in blocks of
    1024). The result is the same either way: these kernels copy."""
    return on_gpu if heap.backend != "cpu" else (on_cpu or 64 * on_gpu)


def _programs(numel, block=1024, most=64):
    return max(1, min(most, triton.cdiv(numel, block)))


@triton.jit
def _all_gather_kernel(x, out, numel, rank, world_size, heap_bases, BLOCK: tl.constexpr):
    for start in range(tl.program_id(0) * BLOCK, numel, tl.num_programs(0) * BLOCK):
        offsets = start + tl.arange(0, BLOCK)
        mask = offsets < numel
        for peer in range(world_size):
            put(x + offsets, out + rank * numel + offsets, rank, peer, heap_bases, mask=mask)


@triton.jit
def _all_to_all_kernel(x, out, rows, cols_per_rank, rank, world_size, heap_bases, BLOCK_M: tl.constexpr,
                       BLOCK_N: tl.constexpr):
    row = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)[:, None]
    stride = cols_per_rank * world_size
    for peer in range(world_size):
        for col_start in range(0, cols_per_rank, BLOCK_N):
            col = col_start + tl.arange(0, BLOCK_N)[None, :]
            mask = (row < rows) & (col < cols_per_rank)
            put(x + row * stride + peer * cols_per_rank + col, out + row * stride + rank * cols_per_rank + col,
                rank, peer, heap_bases, mask=mask)


@triton.jit
def _reduce_scatter_kernel(x, out, rows, cols, rank, world_size, heap_bases, BLOCK_M: tl.constexpr,
                           BLOCK_N: tl.constexpr, LAST_TAKES_REST: tl.constexpr):
    tiles_n = tl.cdiv(cols, BLOCK_N)
    tiles = tl.cdiv(rows, BLOCK_M) * tiles_n
    if LAST_TAKES_REST:
        per_rank = tiles // world_size
        first = rank * per_rank
        last = tl.where(rank == world_size - 1, tiles, first + per_rank)
    else:
        per_rank = tl.cdiv(tiles, world_size)
        first = rank * per_rank
        last = tl.minimum(first + per_rank, tiles)
    for tile in range(first + tl.program_id(0), last, tl.num_programs(0)):
        row = (tile // tiles_n) * BLOCK_M + tl.arange(0, BLOCK_M)[:, None]
        col = (tile % tiles_n) * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
        mask = (row < rows) & (col < cols)
        total = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        for peer in range(world_size):   # rank order: the same sum wherever it is taken
            total += load(x + row * cols + col, rank, peer, heap_bases, mask=mask).to(tl.float32)
        tl.store(out + row * cols + col, total.to(out.dtype.element_ty), mask=mask)
