"""A standalone all-reduce on the symmetric heap, made of two_shot's pieces (``kernels/allreduce.py``).

The buffer to reduce, ``numel`` values, is laid out as the ``partials`` of a matrix ``rows x BLOCK_N`` with
one column of tiles: tile ``t`` is then ``BLOCK_M * BLOCK_N`` consecutive values, exactly the slot that
two_shot's GEMM programs fill. A launch is one kernel: it copies this rank's values into its ``partials``
(zeros past the end of the last tile), publishes them, then reduces, by one of two schemes (``SCHEMES``):

- ``two_shot``: two_shot's own reduction, the owner of each tile sums the W copies in rank order and
  writes the sum into every rank's ``out``; each value crosses the links ``2 (W - 1) / W`` times.
- ``one_shot``: every rank sums every tile's W copies itself; ``W - 1`` crossings, but one exchange.

Either way every rank gets the same bits. Back-to-back launches need no reset (the flags count launches)
and no barrier: a rank's launch ends only when no rank needs its partials any more.
"""

import contextlib
import hashlib

import torch

from ..config import SCHEMES
from ..errors import UsageError
from ..kernels import allreduce
from ..kernels.device import FLAG_WORDS, WATCHDOG_WORDS
from .compiled_launch import PreparedLaunch
from .heap import barrier_all
from .problem import EPSILON, scale_inputs
from .rank import _publish, check_all, errors_as_results, local_ranks
from .timing import median_ms, symm_mem_ms


# ``scheme="auto"``: one-shot below this size with a GPU per rank and more than one rank, else two-shot: the line
# lies between the measured sizes where one-shot's one exchange won and where it lost (docs/decisions.md,
# ONE_SHOT_BELOW_BYTES). At one rank the two do the same work; ranks sharing a GPU ran two-shot only.
ONE_SHOT_BELOW_BYTES = 2 << 20


def default_scheme(nbytes, device_type, world_size, ranks_on_device):
    """The scheme ``scheme="auto"`` runs for a buffer of ``nbytes`` (see ONE_SHOT_BELOW_BYTES)."""
    one_gpu_each = device_type == "cuda" and ranks_on_device == 1
    return "one_shot" if one_gpu_each and world_size > 1 and nbytes < ONE_SHOT_BELOW_BYTES else "two_shot"

# Buffers from this size up are copied into the heap by torch (every SM) before the launch, by a rank alone
# on its GPU; smaller ones by the kernel itself (one launch: at 1 MiB host time, not bytes, decides); the line
# lies below the smallest size where torch's copy measured faster (docs/decisions.md, COPY_IN_KERNEL_BELOW_BYTES).
COPY_IN_KERNEL_BELOW_BYTES = 8 << 20

# (BLOCK_M, BLOCK_N) of a tile: big on GPUs (wide vector loads, few flags), small under the interpreter.
BLOCKS = {"cuda": (64, 256), "cpu": (16, 64)}
# From this size up, tiles of 256 rows on GPUs: fewer tiles, fewer flags and longer runs of each program's loads,
# measured faster from here up; below it, not measured (docs/decisions.md, LARGE_TILES_FROM_BYTES).
LARGE_TILES_FROM_BYTES, LARGE_TILE_ROWS = 16 << 20, 256
# A tile of more rows is copied and summed this many rows at a time: a 64 x 256 fp32 sum is 64 registers a
# thread at 8 warps; a whole 256-row one would spill. (On cpu half a tile: the tests run the chunked code.)
SUM_ROWS = 64


def tile_layout(numel, element_size, device_type, block_m=None):
    """(BLOCK_M, BLOCK_N, rows, tiles) of ``numel`` values of ``element_size`` bytes laid out as one column of
    tiles (``block_m``: rows per tile, else the device's default for that many bytes)."""
    default_m, block_n = BLOCKS.get(device_type, BLOCKS["cuda"])
    if numel * element_size >= LARGE_TILES_FROM_BYTES:
        # (on cpu too, and the GPU's width: there a tile costs per operation, not per element; an all-reduce of
        # 8192 x 8192 fp16 took minutes in 16 x 64 tiles)
        default_m, block_n = LARGE_TILE_ROWS, BLOCKS["cuda"][1]
    block_m = block_m or default_m
    rows = -(-numel // block_n)
    return block_m, block_n, rows, -(-rows // block_m)


def all_reduce_heap_bytes(numel, dtype, device_type="cpu"):
    """Heap bytes one rank needs for a standalone all-reduce of ``numel`` values (generously aligned: room for
    tiles of the most rows allowed, whatever ``tile_rows`` the run takes)."""
    element_size = torch.tensor([], dtype=dtype).element_size()
    block_m, block_n, _, tiles = tile_layout(numel, element_size, device_type, LARGE_TILE_ROWS)
    values = 2 * tiles * block_m * block_n * element_size
    flags = 12 * tiles + 4 * FLAG_WORDS * 64 + 4 * 4096   # (64: the most ranks; 4096: the most programs)
    return values + flags + 8 * WATCHDOG_WORDS + 64 * 1024


def check_all_reduce_fits(numel, dtype, backend, world_size, heap_size):
    """Refuse, in one line and before anything is allocated, an all-reduce of ``numel`` values that the
    ranks' heaps (``heap_size`` bytes each) or (cpu) the memory they share cannot hold: each cpu rank holds
    its input, the float64 reference built from every rank's input, and its heap's used part. (The one check
    of an all-reduce's memory: ``Cluster.all_reduce``'s, and ``gemmar allreduce``'s before its engines start.)"""
    from ..errors import UsageError
    from . import memory
    from .heap import size_text

    heap_needed = all_reduce_heap_bytes(numel, dtype, backend)
    if heap_needed > heap_size:
        raise UsageError(f"numel={numel} needs a heap of {size_text(heap_needed)} per rank for the all-reduce; "
                         f"this cluster's is {size_text(heap_size)}: use a smaller numel, or a cluster with "
                         f"heap_size={heap_needed} or more")
    if backend == "cpu":
        element_size = torch.tensor([], dtype=dtype).element_size()
        memory.check_fits(world_size * (heap_needed + numel * (world_size * element_size + 3 * 8)),
                          f"an all-reduce of {numel} values on {world_size} rank(s)", "use a smaller numel")


def default_programs(heap):
    """Programs per rank when none are given. On a GPU of its own, two per SM: each program has one tile in
    flight at a time, so the bytes in flight, not the programs' work, set the speed (docs/decisions.md,
    programs per rank). Ranks that share a GPU: one per SM of the rank's share
    (its SMs divided among them), so that every rank's programs are on the GPU at once (they wait for each
    other's). On cpu 2: the interpreter runs a launch's programs one after another."""
    if heap.device.type != "cuda":
        return 2
    sms = torch.cuda.get_device_properties(heap.device).multi_processor_count
    return 2 * sms if heap.ranks_on_device == 1 else max(1, sms // heap.ranks_on_device)


class SymmetricAllReduce:
    """``out = sum over ranks of x`` for a fixed size and dtype, on this rank's heap; call once per launch.
    ``comm_sms``: its programs per rank (None: :func:`default_programs`)."""

    def __init__(self, heap, numel, dtype, comm_sms=None, timeout_s=60.0, scheme="auto", tile_rows=None):
        if tile_rows is not None and (isinstance(tile_rows, bool) or not isinstance(tile_rows, int) or
                                      tile_rows not in (1, 2, 4, 8, 16, 32, 64, 128, 256)):
            raise UsageError(f"tile_rows={tile_rows!r} is not allowed: use a power of two from 1 to 256")
        if comm_sms is None:
            comm_sms = default_programs(heap)
        if scheme not in (*SCHEMES, "auto"):
            raise UsageError(f"scheme {scheme!r} is not known: use one of {', '.join(SCHEMES)} or auto")
        if isinstance(numel, bool) or not isinstance(numel, int) or numel < 1:
            raise UsageError(f"numel={numel!r} is not allowed: use a whole number of values, at least 1")
        if isinstance(comm_sms, bool) or not isinstance(comm_sms, int) or not 1 <= comm_sms <= 4096:
            raise UsageError(f"comm_sms={comm_sms!r} is not allowed: use a whole number from 1 to 4096")
        element_size = torch.tensor([], dtype=dtype).element_size()
        if scheme == "auto":
            scheme = default_scheme(numel * element_size, heap.device.type, heap.world_size, heap.ranks_on_device)
        self.heap, self.numel, self.dtype, self.comm_sms, self.scheme = heap, numel, dtype, comm_sms, scheme
        self.block_m, self.block_n, self.rows, self.tiles = tile_layout(numel, element_size, heap.device.type,
                                                                        tile_rows)
        self.partials = heap.zeros((self.tiles, self.block_m * self.block_n), dtype)
        self.out = heap.zeros((self.rows, self.block_n), dtype)
        self.partial_ready = heap.zeros(self.tiles, torch.int32)
        self.results_in = heap.zeros(heap.world_size * FLAG_WORDS, torch.int32)   # two-shot: owners' tiles in
        self.partials_read = heap.zeros(self.tiles, torch.int32)  # one-shot: how many ranks read my tile
        self.watchdog = heap.zeros(WATCHDOG_WORDS, torch.int64)
        self.launch_counts = heap.zeros(comm_sms, torch.int32)   # program c's launches so far: its epoch
        self.no_trace = torch.zeros(1, dtype=torch.int64, device=heap.device)
        heap.name_all(self)
        self.timeout_ns = int(timeout_s * 1e9)
        self.launches = 0
        # (Ranks sharing a GPU always copy in the kernel: one rank's copy on every SM held back the other
        # ranks' reductions; docs/decisions.md, COPY_IN_KERNEL_BELOW_BYTES.)
        self.copy_in = (numel * self.partials.element_size() < COPY_IN_KERNEL_BELOW_BYTES
                        or heap.ranks_on_device > 1)
        self.prepared = {}     # copy_in -> the PreparedLaunch of the kernel
        self.out_views = {}    # x's shape -> the view of out returned for it
        self.input_view = None
        self.last_launch = None   # (x, its address, its PreparedLaunch) of the last launch, when x needed no copy

    @property
    def input(self):
        """This rank's input slot on the heap, ``numel`` values: write into it and call ``op(op.input)``,
        and the launch reduces it where it lies, with no copy (as torch's symmetric-memory all-reduce
        reduces its own buffer). Any other ``x`` is copied in first."""
        if self.input_view is None:   # (one view, made once: each torch call is host time, see __call__)
            self.input_view = self.partials.view(-1)[:self.numel]
        return self.input_view

    def _kernel_call(self, x, copy_in):
        """(kernel, grid, args, kwargs) of one launch reducing ``x`` (flat, 16-byte aligned); ``copy_in``: the
        kernel copies x into ``partials`` itself."""
        heap = self.heap
        gpu = {"num_warps": 8, "num_stages": 1} if heap.device.type == "cuda" else {}
        rows = min(self.block_m, SUM_ROWS) if heap.device.type == "cuda" else max(1, self.block_m // 2)
        common = dict(BLOCK_M=self.block_m, BLOCK_N=self.block_n, COMM_SMS=self.comm_sms,
                      PEER_CACHE=".cg" if gpu else "", COPY_IN=copy_in, ROWS=rows, **gpu)
        if self.scheme == "one_shot":
            return (allreduce.one_shot_all_reduce, (self.comm_sms,),
                    (x, self.numel, self.out, self.partials, self.partial_ready, self.partials_read, self.watchdog,
                     heap.heap_bases, heap.rank, heap.world_size, self.launch_counts, self.rows, self.block_n,
                     self.timeout_ns), common)
        return (allreduce.two_shot_all_reduce, (self.comm_sms,),
                (x, self.numel, self.out, self.partials, self.partial_ready, self.results_in, self.watchdog,
                 heap.heap_bases, heap.rank, heap.world_size, self.launch_counts, self.rows, self.block_n,
                 self.timeout_ns, self.no_trace), common)

    def prepare(self):
        """GPU: compile and load the kernel before any rank launches (see FusedGemmAllReduce.prepare)."""
        if self.heap.device.type != "cuda":
            return
        for copy_in in {self.copy_in, False}:
            kernel, grid, args, kwargs = self._kernel_call(self.partials.view(-1), copy_in)   # (x's stand-in)
            with self.heap.on_stream():
                kernel.warmup(*args, grid=grid, **kwargs)._init_handles()

    def __call__(self, x, wait=True):
        """Launch once on this rank's stream; return the reduced values (a view of the heap, ``x``'s shape,
        valid until the next launch). ``wait=False``: enqueue only; call :meth:`check` afterwards. ``x`` is
        read by the kernel on this rank's stream: it must be ready there (written before, or synchronised)."""
        last = self.last_launch
        if last is not None and x is last[0] and x.data_ptr() == last[1]:
            # The same tensor as last time, at the same address: checked then. (Each torch call here costs a
            # microsecond or more of host time, and at 1 MiB host time is what an all-reduce takes.)
            last[2].replay()   # (on a GPU: a CUDA graph, one driver call)
            return self._launched(x, wait)
        if not isinstance(x, torch.Tensor) or x.numel() != self.numel or x.dtype != self.dtype or \
                x.device != self.heap.device:
            raise UsageError(f"rank {self.heap.rank}: x must be a tensor of {self.numel} {self.dtype} values on "
                             f"{self.heap.device}, got {getattr(x, 'numel', lambda: '?')()} of "
                             f"{getattr(x, 'dtype', type(x).__name__)} on {getattr(x, 'device', '?')}")
        # The kernel reads x as numel values from its first: any contiguous x is already that. (Each torch call
        # here costs a microsecond or more of host time, and at 1 MiB host time is what an all-reduce takes.)
        flat = x if x.is_contiguous() and x.data_ptr() % 16 == 0 else x.reshape(-1).contiguous().clone()
        in_place = flat.data_ptr() == self.partials.data_ptr()   # op(op.input): already where the kernel reads
        copy_in = self.copy_in and not in_place
        if not copy_in and not in_place:
            with self.heap.on_stream():
                self.partials.view(-1)[:self.numel].copy_(flat.view(-1))
        prepared = self.prepared.get(copy_in)
        if prepared is None:   # built once: per launch only x may change (runtime/compiled_launch.py)
            prepared = self.prepared[copy_in] = PreparedLaunch(*self._kernel_call(flat, copy_in), self.heap.stream)
        prepared.at(0, x=flat)   # (no per-launch arguments: each program reads its launch number on the GPU)
        # Next time the same x can skip straight to the kernel, unless this launch copied x on the host first
        # (its values may change before the next launch, so the copy is made again).
        host_copied = flat is not x or not (copy_in or in_place)
        self.last_launch = None if host_copied else (x, x.data_ptr(), prepared)
        return self._launched(x, wait)

    def _launched(self, x, wait):
        self.launches += 1
        if wait:
            self.check()
        out = self.out_views.get(x.shape)
        if out is None:
            out = self.out_views[x.shape] = self.out.view(-1)[:self.numel].view(x.shape)
        return out

    def check(self):
        self.heap.synchronize()
        self.heap.raise_if_expired(self.watchdog, allreduce.WAIT_FLAGS)


# -- the rank side: what each engine runs for Cluster.all_reduce -----------------------------------------
def all_reduce_input(numel, dtype, seed, rank, device):
    """Rank ``rank``'s values for the all-reduce benchmark: the same on every engine that builds them."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + rank)
    return torch.randn(numel, generator=gen).to(dtype).to(device)


def _tolerance(reference, dtype, W):
    """One ulp of the result's dtype at the largest value (Triton's interpreter rounds toward zero), and
    fp32 summation of W values."""
    peak = float(reference.abs().max())
    return 2 * EPSILON[dtype] * peak + 1e-6 * W * peak


@errors_as_results
def run_all_reduce(config):
    """The standalone all-reduce (``config``: an AllReduceConfig, checked by the client) on this engine's ranks:
    ``iterations`` checked launches (every rank's result against the float64 sum of every rank's input; a
    digest of its bits, to compare across ranks); on GPUs, with ``reps``, the median time of back-to-back
    launches, and with ``baseline`` NCCL's all_reduce of the same values (and torch's symmetric-memory
    two-shot all-reduce where there is one). ``on_heap``: the values are written into each op's heap
    ``input`` once and reduced where they lie. ``sanitize`` (cpu): the checked launches are recorded for the
    sanitizer (``out["sanitizer"]``)."""
    from .. import sanitizer

    numel, dtype, iterations, seed, timeout_s, reps = (config.numel, config.torch_dtype, config.iterations,
                                                       config.seed, config.timeout_s, config.reps)
    group = local_ranks()
    heaps = [ctx.heap for ctx in group]
    device, W = heaps[0].device, heaps[0].world_size
    timed = bool(reps) and device.type == "cuda"
    if timed and config.baseline and len(group) > 1:   # refused before any work, not after it
        raise UsageError("the NCCL baseline needs one GPU per rank; these ranks share a GPU")
    reference = sum(all_reduce_input(numel, dtype, seed, r, "cpu").double() for r in range(W))
    allowed = _tolerance(reference, dtype, W)
    inputs = [all_reduce_input(numel, dtype, seed, ctx.rank, device) for ctx in group]
    outs = [dict(rank=ctx.rank, max_abs_diff=[], tolerance=allowed, digest=None) for ctx in group]
    with contextlib.ExitStack() as scopes:
        ops = [SymmetricAllReduce(scopes.enter_context(h.scope()), numel, dtype, config.comm_sms, timeout_s,
                                  config.scheme) for h in heaps]
        for out, op in zip(outs, ops):
            out["comm_sms"], out["scheme"] = op.comm_sms, op.scheme
        for op in ops:
            op.prepare()
        bases, inputs = inputs, [op.input for op in ops] if config.on_heap else [x.clone() for x in inputs]
        records = scopes.enter_context(sanitizer.recording(heaps[0], config.sanitize))
        barrier_all(heaps, timeout_s)

        def launch_all():
            return [op(x, wait=False) for op, x in zip(ops, inputs)]

        for iteration in range(iterations):
            times = scale_inputs(inputs, bases, iteration, iterations, heaps)   # (other values each launch)
            results = launch_all()
            check_all(ops)
            for out, result in zip(outs, results):
                out["max_abs_diff"].append(float((result.double().cpu() - times * reference).abs().max()) / abs(times))
                raw = result.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
                out["digest"] = hashlib.sha1(raw.numpy().tobytes()).hexdigest()   # the bits, to compare ranks
            _publish({ctx.rank: {"iteration": iteration + 1, "of": iterations} for ctx in group})   # (progress bars)
        if timed:
            _time_launches(launch_all, ops, heaps, outs, reps, one_process=len(group) > 1)
        barrier_all(heaps, timeout_s)
    if records:
        outs[0]["sanitizer"] = records[0]
    if timed and config.baseline:
        import torch.distributed as dist

        y = inputs[0].clone()
        outs[0]["nccl_ms"] = median_ms(lambda: dist.all_reduce(y), reps)
        outs[0].update(symm_mem_ms(inputs[0], reps))
    return outs


def _time_launches(launch_all, ops, heaps, outs, reps, one_process):
    """The median time of ``reps`` back-to-back launches (after 3 untimed), into every rank's ``gemmar_ms``;
    the results of the last one checked."""
    for _ in range(3):
        launch_all()
    ms = median_ms(launch_all, reps, [h.stream for h in heaps], one_process=one_process)
    check_all(ops)
    for out in outs:
        out["gemmar_ms"] = ms
