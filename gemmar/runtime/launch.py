"""The one launcher: buffers and launches of one fused GEMM + all-reduce configuration on one rank.

``FusedGemmAllReduce(heap, config)`` allocates everything the kernel needs on the symmetric heap (in the
same order on every rank, so offsets agree); calling it with this rank's ``A_r`` and ``B_r`` launches the
kernel once and returns this rank's all-reduced C. Call it again for back-to-back launches: nothing is
zeroed or reset on the host in between (see the kernels' docstrings for how each one manages that).
"""

import numpy as np
import torch

from ..config import RunConfig
from ..errors import UsageError
from ..kernels import atomics, events, ring, two_shot
from ..kernels.gemm import tile_coords
from ..kernels.device import FLAG_WORDS, WATCHDOG_WORDS
from .compiled_launch import PreparedLaunch
from .heap import ALIGN, HEADER_BYTES

MISTAKES = {"atomics": ("none",), "ring": ring.MISTAKES, "two_shot": two_shot.MISTAKES}


def heap_bytes_needed(config):
    """Symmetric heap bytes one rank needs for ``config`` (what FusedGemmAllReduce allocates, aligned)."""
    tiles_m, tiles_n = config.tiles
    tiles, tile = tiles_m * tiles_n, config.BLK_M * config.BLK_N
    if config.algorithm == "atomics":
        sizes = [2 * config.m * config.n * 4]
    elif config.algorithm == "ring":
        sizes = [config.m * config.n * 4, tiles * tile * 4, tiles * 4, tiles * 4]
    else:
        c_bytes, wire_bytes = config.c_dtype.itemsize, config.partial_dtype.itemsize
        sizes = [config.m * config.n * c_bytes, tiles * tile * wire_bytes, tiles * 4,
                 config.world_size * FLAG_WORDS * 4]
    sizes.append(WATCHDOG_WORDS * 8)
    return HEADER_BYTES + sum(-(-s // ALIGN) * ALIGN + ALIGN for s in sizes)


def gemm_operands(A, B, config, device):
    """(A, B, TMA): what the kernels' gemm_tile reads A and B through - the one place this is chosen.

    On Hopper and newer, when the tensors can be described (16-bit dtype, rows 16-byte aligned, a non-empty
    K-slice), tensor descriptors that the tensor-memory accelerator loads tiles from; otherwise (the
    interpreter, older GPUs, fp32, odd strides) the plain pointers.
    """
    if device.type != "cuda" or torch.cuda.get_device_capability(device) < (9, 0):
        return A, B, False
    k_r, elem = A.shape[1], A.element_size()
    aligned = all(t.is_contiguous() and t.data_ptr() % 16 == 0 for t in (A, B)) and \
        (k_r * elem) % 16 == 0 and (config.n * elem) % 16 == 0
    if elem != 2 or k_r == 0 or not aligned:
        return A, B, False
    from triton.tools.tensor_descriptor import TensorDescriptor

    return (TensorDescriptor.from_tensor(A, [config.BLK_M, config.BLK_K]),
            TensorDescriptor.from_tensor(B, [config.BLK_K, config.BLK_N]), True)


def check_co_resident(compiled, config, heap):
    """Ranks that share a GPU spin on each other's flags, so all their programs must be on the GPU at once;
    a grid that cannot be is refused here, before it could hang. Residency per SM is limited by threads,
    registers and shared memory, read from the loaded kernel (``prepare`` has filled in its register count)."""
    props = torch.cuda.get_device_properties(heap.device)
    threads = compiled.metadata.num_warps * 32
    registers = -(-compiled.n_regs // 8) * 8 * threads
    shared = compiled.metadata.shared + 1024   # the driver reserves 1 KB of shared memory per program
    shared_per_sm = getattr(props, "shared_memory_per_multiprocessor", 228 << 10)
    per_sm = min(props.max_threads_per_multi_processor // threads,
                 getattr(props, "regs_per_multiprocessor", 65536) // max(registers, 1), shared_per_sm // shared)
    slots, needed = per_sm * props.multi_processor_count, heap.ranks_on_device * config.programs
    if needed > slots:
        raise UsageError(f"{heap.ranks_on_device} ranks x {config.programs} programs = {needed} programs cannot all "
                         f"be resident on one {props.name} ({props.multi_processor_count} SMs x {per_sm} of these "
                         f"programs each: {compiled.n_regs} registers x {threads} threads, {compiled.metadata.shared} "
                         f"B shared memory), and ranks sharing a GPU wait on each other: use at most "
                         f"{slots // heap.ranks_on_device} programs per rank (num_sms + comm_sms)")


class FusedGemmAllReduce:
    def __init__(self, heap, config: RunConfig, mistake="none", parts=None):
        """``parts``: {name: @triton.jit function} that replace the kernel's own (``runtime/parts.py``)."""
        config.validate()
        if config.world_size != heap.world_size:
            raise UsageError(f"world_size={config.world_size} does not match the heap's {heap.world_size} ranks")
        known = MISTAKES[config.algorithm]
        if mistake not in known:
            every = sorted({m for names in MISTAKES.values() for m in names})
            if mistake in every:
                raise UsageError(f"mistake {mistake!r} does not exist in {config.algorithm!r}: use one of "
                                 f"{', '.join(known)}")
            raise UsageError(f"mistake {mistake!r} is not known: use one of {', '.join(every)}")
        self.heap, self.config, self.mistake = heap, config, known.index(mistake)
        # The kernel's swappable functions: its own, a mistake's, or a participant's (runtime/parts.py).
        own = dict(tile_coords=tile_coords, push_partial=atomics.push_partial, sum_partials=two_shot.sum_partials,
                   reduce_step=ring.forward_running_sum if mistake == "forward_accumulator" else ring.reduce_step)
        self.parts = {**own, **(parts or {})}
        M, N = config.m, config.n
        tiles_m, tiles_n = config.tiles
        self.total_tiles = tiles_m * tiles_n
        self.launches = 0
        slot = config.BLK_M * config.BLK_N
        if config.algorithm == "atomics":
            self.c_pair = heap.zeros((2, M, N), torch.float32)
        elif config.algorithm == "ring":
            self.c = heap.zeros((M, N), torch.float32)
            self.ring_buffer = heap.zeros((self.total_tiles, slot), torch.float32)
            self.data_ready = heap.zeros(self.total_tiles, torch.int32)
            self.slot_free = heap.zeros(self.total_tiles, torch.int32)
        else:
            self.c = heap.zeros((M, N), config.c_dtype)
            self.partials = heap.zeros((self.total_tiles, slot), config.partial_dtype)
            self.partial_ready = heap.zeros(self.total_tiles, torch.int32)
            self.results_in = heap.zeros(heap.world_size * FLAG_WORDS, torch.int32)   # per owner
        self.watchdog = heap.zeros(WATCHDOG_WORDS, torch.int64)
        # The trace buffers are local (nobody else writes them), so they need not live on the heap.
        self.trace_capacity = events.events_per_program(config.algorithm, heap.world_size, self.total_tiles,
                                                        config.num_sms, config.comm_sms) if config.trace else 0
        self.trace = torch.zeros(max(1, config.programs * self.trace_capacity * events.EVENT_WORDS),
                                 dtype=torch.int64, device=heap.device)
        self.trace_counts = torch.zeros(config.programs, dtype=torch.int64, device=heap.device)
        self.delays = np.random.default_rng(config.seed + 7919 * heap.rank)  # the straggler's draws
        self.kernel_resources = []   # GPU, after prepare(): each kernel's registers and spills
        self.prepared = None         # (A and B's key, [PreparedLaunch]) of the last A and B

    def check_inputs(self, A, B):
        cfg, rank = self.config, self.heap.rank
        for name, t, rows, cols in (("A", A, cfg.m, None), ("B", B, None, cfg.n)):
            if not isinstance(t, torch.Tensor) or t.dim() != 2:
                raise UsageError(f"rank {rank}: {name} must be a 2-D torch tensor, got {type(t).__name__}")
            if t.dtype != cfg.torch_dtype:
                raise UsageError(f"rank {rank}: {name} has dtype {t.dtype}, the run is {cfg.datatype}")
            if t.device.type != self.heap.device.type:
                raise UsageError(f"rank {rank}: {name} is on {t.device}, this rank computes on {self.heap.device}")
        if A.shape[0] != cfg.m or B.shape[1] != cfg.n or A.shape[1] != B.shape[0]:
            raise UsageError(f"rank {rank}: A is {tuple(A.shape)} and B is {tuple(B.shape)}; "
                             f"need A: {cfg.m} x K_r and B: K_r x {cfg.n}")

    def __call__(self, A, B, wait=True):
        """Launch once, on this rank's stream; return this rank's C (M x N, ``config.c_dtype``). Atomics:
        valid until the next launch.

        ``wait=False`` (GPU timing loops, and ranks that share a GPU, which must all launch before any
        waits) only enqueues the work, with no host synchronisation and no watchdog check: call
        :meth:`check` afterwards.
        """
        self.check_inputs(A, B)
        return self._launch(A, B, wait)

    def prepare(self, A, B):
        """GPU: compile and load this launch's kernels before any rank launches. Ranks that share a GPU
        must never compile or load a kernel while another rank's kernel spins (loading a module can wait
        for the kernels already running); call this for every rank first. Also refuses a grid whose
        programs could not all be resident at once."""
        if self.heap.device.type != "cuda":
            return
        self.check_inputs(A, B)
        launches = self._kernel_calls(A, B)
        self.kernel_resources = []
        for kernel, grid, args, kwargs, stream in launches:
            with torch.cuda.stream(stream):
                compiled = kernel.warmup(*args, grid=grid, **kwargs)
                compiled._init_handles()
                self.kernel_resources.append(dict(kernel=kernel.__name__, registers=int(compiled.n_regs),
                                                  spills=int(compiled.n_spills)))
                if self.heap.ranks_on_device > 1 and kernel is launches[0][0]:
                    check_co_resident(compiled, self.config, self.heap)
        if self.config.delay_rank == self.heap.rank and self.config.delay_us > 0:
            self.heap.delay(0)

    def _launch(self, A, B, wait):
        cfg, heap = self.config, self.heap
        if cfg.delay_rank == heap.rank and cfg.delay_us > 0:
            heap.delay(self.delays.uniform(0.5, 1.0) * cfg.delay_us * 1e-6)
        # Prepared once per pair of input tensors (runtime/compiled_launch.py); per launch only the epoch
        # (ring, two_shot) or the parity (atomics) changes.
        key = tuple((t.data_ptr(), t.dtype, tuple(t.shape), t.stride()) for t in (A, B))
        if self.prepared is None or self.prepared[0] != key:
            self.prepared = (key, [PreparedLaunch(*launch) for launch in self._kernel_calls(A, B)])
        per_launch = {"epoch": self.launches, "parity": self.launches % 2}
        for launch in self.prepared[1]:
            launch(**{name: value for name, value in per_launch.items() if name in launch.index})
        out = self.c_pair[self.launches % 2] if cfg.algorithm == "atomics" else self.c
        if len(self.prepared[1]) > 1:
            # two_shot: whatever this rank runs next (its next GEMM overwrites the partials) waits for
            # this launch's reduction, which ends only when every owner has read them.
            heap.join_side_stream()
        self.launches += 1
        if cfg.algorithm == "atomics":
            # Remote adds into our C may still be in flight from other ranks until all have finished.
            heap.barrier(cfg.timeout_s, wait=wait)
        if wait:
            self.check()
        return out

    def _kernel_calls(self, A, B):
        """[(kernel, grid, args, kwargs, stream)] of this rank's next launch (stream: None on cpu)."""
        cfg, heap = self.config, self.heap
        K_r, (A_ptr, B_ptr) = A.shape[1], (A, B)
        A, B, tma = gemm_operands(A, B, cfg, heap.device)
        gemm_kw = dict(BLOCK_M=cfg.BLK_M, BLOCK_N=cfg.BLK_N, BLOCK_K=cfg.BLK_K, GROUP_SIZE_M=cfg.gsize_m,
                       NUM_SMS=cfg.num_sms, DOT_PRECISION="ieee" if cfg.datatype == "fp32" else "tf32",
                       TRACE_CAPACITY=self.trace_capacity, EVEN_K=K_r % cfg.BLK_K == 0, TMA=tma)
        gpu = heap.device.type == "cuda"
        if gpu:
            gemm_kw.update(num_warps=cfg.num_warps, num_stages=cfg.num_stages)
        a_b_strides = (A_ptr.stride(0), A_ptr.stride(1), B_ptr.stride(0), B_ptr.stride(1))
        strides = a_b_strides + (cfg.n, 1)
        peer_cache = ".cg" if gpu else ""  # read what peers wrote from L2, not L1
        timeout_ns = int(cfg.timeout_s * 1e9)
        grid = (cfg.num_sms,)
        if cfg.algorithm == "two_shot":
            split = cfg.num_sms * self.trace_capacity * events.EVENT_WORDS   # the reduce kernel's trace region
            gemm = (two_shot.two_shot_gemm, grid, (
                A, B, self.partials, self.partial_ready, heap.heap_bases, heap.rank, heap.world_size, cfg.m, cfg.n,
                K_r, *a_b_strides, self.trace, self.trace_counts),
                gemm_kw, heap.stream)
            reduce_kw = dict(BLOCK_M=cfg.BLK_M, BLOCK_N=cfg.BLK_N, GROUP_SIZE_M=cfg.gsize_m, COMM_SMS=cfg.comm_sms,
                             TRACE_CAPACITY=self.trace_capacity, MISTAKE=self.mistake, PEER_CACHE=peer_cache,
                             SUM_PARTIALS=self.parts["sum_partials"])
            if gpu:
                reduce_kw.update(num_warps=cfg.num_warps, num_stages=1)
            reduce = (two_shot.two_shot_reduce, (cfg.comm_sms,), (
                self.c, self.partials, self.partial_ready, self.results_in, self.watchdog, heap.heap_bases,
                heap.rank, heap.world_size, self.launches, cfg.m, cfg.n, cfg.n, 1, timeout_ns,
                self.trace[split:] if self.trace_capacity else self.trace, self.trace_counts[cfg.num_sms:]),
                reduce_kw, heap.side_stream)
            return [gemm, reduce]
        if cfg.algorithm == "atomics":
            return [(atomics.gemm_all_reduce_atomics, grid, (
                A, B, self.c_pair, heap.heap_bases, heap.rank, heap.world_size, self.launches % 2,
                cfg.m, cfg.n, K_r, *strides, self.trace, self.trace_counts),
                dict(gemm_kw, TILE_COORDS=self.parts["tile_coords"], PUSH_PARTIAL=self.parts["push_partial"]),
                heap.stream)]
        return [(ring.gemm_all_reduce_ring, grid, (
            A, B, self.c, self.ring_buffer, self.data_ready, self.slot_free, self.watchdog, heap.heap_bases,
            heap.rank, heap.world_size, self.launches, cfg.m, cfg.n, K_r, *strides, timeout_ns,
            self.trace, self.trace_counts), dict(gemm_kw, MISTAKE=self.mistake, SLOT_CACHE=peer_cache,
                                                 TILE_COORDS=self.parts["tile_coords"],
                                                 REDUCE_STEP=self.parts["reduce_step"]), heap.stream)]

    def check(self):
        """Wait for this rank's work; raise DeadlockError if a wait (or the barrier) expired."""
        self.heap.synchronize()
        self.heap.raise_if_expired(self.watchdog)
        self.heap.check_barrier()

    def events(self, iteration):
        """The last launch's events as trace rows (``events.COLUMNS``), and how many were dropped (0 unless
        the trace room was sized wrong)."""
        if not self.trace_capacity:
            return np.zeros((0, len(events.COLUMNS)), np.int64), 0
        return events.rows(self.trace.cpu().numpy(), self.trace_counts.cpu().tolist(), self.trace_capacity,
                           self.heap.rank, iteration)
