"""The one launcher: buffers and launches of one fused GEMM + all-reduce configuration on one rank.

``FusedGemmAllReduce(heap, config)`` allocates everything the kernel needs on the symmetric heap (in the
same order on every rank, so offsets agree); calling it with this rank's ``A_r`` and ``B_r`` launches the
kernel once and returns this rank's all-reduced C. Call it again for back-to-back launches: nothing is
zeroed or reset on the host in between (see the kernels' docstrings for how each one manages that).
"""

import numpy as np
import torch

from ..config import RunConfig
from ..tuning import FEW_ROWS
from ..errors import UsageError
from ..kernels import events
from ..kernels.device import WATCHDOG_WORDS
from ..kernels.spec import CountingAllocator, LaunchContext
from ..sanitizer import on_stream
from .compiled_launch import PreparedLaunch
from .heap import ALIGN, HEADER_BYTES


def heap_bytes_needed(config):
    """Symmetric heap bytes one rank needs for ``config``: the algorithm's own ``buffers`` called with an
    allocator that only counts, plus the watchdog - what FusedGemmAllReduce allocates, aligned."""
    count = CountingAllocator(ALIGN, HEADER_BYTES)
    config.spec.buffers(count, config, config.world_size)
    count((WATCHDOG_WORDS,), torch.int64)
    return count.bytes


def gemm_operands(A, B, config, device):
    """(A, B, TMA): what the kernels' gemm_tile reads A and B through - the one place this is chosen.

    On Hopper and newer, when the tensors can be described (16-bit dtype, rows 16-byte aligned, a non-empty
    K-slice), tensor descriptors that the tensor-memory accelerator loads tiles from; otherwise (the
    interpreter, older GPUs, fp32, odd strides) the plain pointers. Also the plain pointers for few rows at
    world size 1 (``tuning.FEW_ROWS``): there the GEMM waits on memory either way, and Triton encodes both
    descriptors again on every launch, host time that a short launch cannot hide (measured:
    docs/decisions.md, plain pointers for few rows).
    """
    if device.type != "cuda" or torch.cuda.get_device_capability(device) < (9, 0):
        return A, B, False
    if config.world_size == 1 and config.m <= FEW_ROWS:
        return A, B, False
    k_r, elem = A.shape[1], A.element_size()
    aligned = all(t.is_contiguous() and t.data_ptr() % 16 == 0 for t in (A, B)) and \
        (k_r * elem) % 16 == 0 and (config.n * elem) % 16 == 0
    if elem != 2 or k_r == 0 or not aligned:
        return A, B, False
    from triton.tools.tensor_descriptor import TensorDescriptor

    return (TensorDescriptor.from_tensor(A, [config.BLK_M, config.BLK_K]),
            TensorDescriptor.from_tensor(B, [config.BLK_K, config.BLK_N]), True)


def gemm_constexprs(config, k_r, trace_capacity, tma):
    """The persistent GEMM's constexprs (``LaunchContext.gemm``) for a rank whose K-slice is ``k_r`` long."""
    return dict(BLOCK_M=config.BLK_M, BLOCK_N=config.BLK_N, BLOCK_K=config.BLK_K, GROUP_SIZE_M=config.gsize_m,
                NUM_SMS=config.num_sms, DOT_PRECISION="ieee" if config.datatype == "fp32" else "tf32",
                TRACE_CAPACITY=trace_capacity, EVEN_K=k_r % config.BLK_K == 0, TMA=tma)


def check_co_resident(kernels, heap):
    """Refuse a launch whose programs could not all be resident on the GPU at once, before it could hang.

    ``kernels``: [(loaded kernel, programs per rank)]. Waiting programs need the programs they wait for on
    the GPU beside them: two_shot's communication programs wait for the GEMM's (of every rank, when ranks
    share the GPU). When there are no more programs than SMs, each can have an SM of its own; with more,
    they must share SMs, and the check assumes the GPU deals each kernel's programs out evenly over its SMs
    (what the Hopper GPUs it ran on did), so each SM must hold its share of every kernel at once. Residency per SM is limited
    by threads, registers and shared memory, read from the loaded kernels (``prepare`` has filled in their
    register counts)."""
    props = torch.cuda.get_device_properties(heap.device)
    sms, ranks = props.multi_processor_count, heap.ranks_on_device
    total = sum(programs for _, programs in kernels) * ranks
    if total <= sms:
        return
    used = dict(threads=0, registers=0, shared=0)
    for compiled, programs in kernels:
        per_sm = -(-programs * ranks // sms)
        threads = compiled.metadata.num_warps * 32
        used["threads"] += per_sm * threads
        used["registers"] += per_sm * -(-compiled.n_regs // 8) * 8 * threads
        used["shared"] += per_sm * (compiled.metadata.shared + 1024)   # the driver keeps 1 KB per program
    room = dict(threads=props.max_threads_per_multi_processor,
                registers=getattr(props, "regs_per_multiprocessor", 65536),
                shared=getattr(props, "shared_memory_per_multiprocessor", 228 << 10))
    short = [f"{used[k]} {k} of {room[k]}" for k in room if used[k] > room[k]]
    if short:
        programs = " + ".join(str(p) for _, p in kernels)
        raise UsageError(f"{ranks} rank(s) x ({programs}) programs cannot all be resident on one {props.name} "
                         f"({sms} SMs; each SM would need {', '.join(short)}), and these programs wait on each "
                         f"other: use at most {sms // ranks} programs per rank (num_sms + comm_sms), or a "
                         f"smaller tile")


_PREFERRED_SHARED_CARVEOUT, _CACHE_PREFER_SHARED = 9, 1   # CUfunction_attribute, CUfunc_cache (cuda.h)


def share_sms(compiled):
    """Let this kernel's programs run on an SM beside programs of kernels that use most of its shared memory.

    An SM splits its on-chip memory between L1 and shared memory one way at a time, and runs programs only
    of kernels that agree with the split. Triton asks for the largest shared part only for kernels that
    use more than 48 KiB of it, so two_shot's communication programs (a few KiB) could not share an SM with
    the GEMM's: they took every SM first and the GEMM never started (the watchdog's deadlock), or slowed the
    launch (docs/decisions.md, one shared-memory split). Every kernel asks for the
    largest shared part here, so all of them agree. (NVIDIA only: nothing to do on ROCm.)"""
    if torch.version.hip:
        return
    import ctypes

    libcuda = ctypes.CDLL("libcuda.so.1")
    function = ctypes.c_void_p(compiled.function)
    for name, status in (("cuFuncSetAttribute", libcuda.cuFuncSetAttribute(function, _PREFERRED_SHARED_CARVEOUT, 100)),
                         ("cuFuncSetCacheConfig", libcuda.cuFuncSetCacheConfig(function, _CACHE_PREFER_SHARED))):
        if status != 0:
            raise RuntimeError(f"{name} failed with CUDA error {status}")


class FusedGemmAllReduce:
    def __init__(self, heap, config: RunConfig, parts=None):
        """``config``: checked where it came in (``RunConfig.validate``), used as it is. ``parts``: {name:
        @triton.jit function} that replace the kernel's own (a teaching mistake's, ``kernels/mistakes.py``, or a
        participant's, ``runtime/shipping.py``)."""
        if config.world_size != heap.world_size:
            raise UsageError(f"world_size={config.world_size} does not match the heap's {heap.world_size} ranks")
        self.spec = spec = config.spec
        self.heap, self.config = heap, config
        self.parts = spec.parts_for(parts)   # the kernel's swappable functions, with those given in their place
        self.launches = 0   # launches so far: the next one's epoch
        self.buffers = spec.buffers(heap.zeros, config, config.world_size)
        self.watchdog = heap.zeros(WATCHDOG_WORDS, torch.int64)
        heap.name_all(self.buffers)
        heap.name(self.watchdog, "watchdog")
        # The trace buffers are local (nobody else writes them), so they need not live on the heap.
        self.trace_capacity = spec.trace_room(config) if config.trace else 0
        self.trace = torch.zeros(max(1, config.programs * self.trace_capacity * events.EVENT_WORDS),
                                 dtype=torch.int64, device=heap.device)
        self.trace_counts = torch.zeros(config.programs, dtype=torch.int64, device=heap.device)
        self.delays = np.random.default_rng(config.seed + 7919 * heap.rank)  # the straggler's draws
        self.kernel_resources = []   # GPU, after prepare(): each kernel's registers and spills
        self.prepared = None         # (A and B's key, [PreparedLaunch]) of the last A and B
        self.prepared_for = None     # the key of the A and B prepare() last compiled and checked for
        self.last_inputs = None      # (A, B, their addresses) of the last launch, checked then

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

        ``wait=False`` (GPU timing loops) only enqueues the work, with no host synchronisation and no
        watchdog check: call :meth:`check` afterwards. Ranks that share a GPU launch through
        :func:`launch_ranks` instead.
        """
        return launch_ranks([self], [(A, B)], wait)[0]

    def prepare(self, A, B):
        """GPU: compile and load this launch's kernels before any rank launches. Ranks that share a GPU
        must never compile or load a kernel while another rank's kernel spins (loading a module can wait
        for the kernels already running); call this for every rank first. Also refuses a grid whose
        programs could not all be resident at once."""
        if self.heap.device.type != "cuda":
            return
        self.check_inputs(A, B)
        launches = self._kernel_calls(A, B)
        self.kernel_resources, loaded = [], []
        for launch in launches:
            with torch.cuda.stream(self._stream(launch)):
                compiled = launch.kernel.warmup(grid=launch.grid, **launch.kwargs)
                compiled._init_handles()
                self.kernel_resources.append(dict(kernel=launch.kernel.__name__, registers=int(compiled.n_regs),
                                                  spills=int(compiled.n_spills)))
                # A kernel alone whose programs wait for nobody may run them in turns, and keeps the driver's
                # shared-memory split: the few-rows kernel's loads go through L1, which the largest shared part
                # leaves small (docs/decisions.md, one shared-memory split).
                if launch.waits:
                    share_sms(compiled)
                    loaded.append((compiled, launch.grid[0]))
        check_co_resident(loaded, self.heap)
        self.prepared_for = self._inputs_key(A, B)
        if self.config.delay_rank == self.heap.rank and self.config.delay_us > 0:
            self.heap.delay(0)

    def _prepared_launches(self, A, B):
        """This launch's kernels, prepared once per pair of input tensors (runtime/compiled_launch.py): each
        launched with ``.at(launch count)``, which sets the arguments the spec names in ``Launch.per_launch``."""
        cfg, heap = self.config, self.heap
        last = self.last_inputs
        if last is not None and A is last[0] and B is last[1] and A.data_ptr() == last[2] and B.data_ptr() == last[3]:
            # The same tensors as last time, at the same addresses: checked then. (Every check costs host time,
            # and at few rows the host's time per launch is longer than the GPU's.)
            key = self.prepared[0]
        else:
            self.check_inputs(A, B)
            key = self._inputs_key(A, B)
        if self.prepared_for != key and (self.prepared is None or self.prepared[0] != key):
            self.prepare(A, B)   # (GPU: compiled, loaded and checked before the first launch, and any delay)
        if cfg.delay_rank == heap.rank and cfg.delay_us > 0:
            heap.delay(self.delays.uniform(0.5, 1.0) * cfg.delay_us * 1e-6)
        if self.prepared is None or self.prepared[0] != key:
            launches = self._kernel_calls(A, B)
            self.joins_side_stream = any(launch.stream == "side" for launch in launches)
            self.stream_names = [launch.stream or "main" for launch in launches]
            self.prepared = (key, [PreparedLaunch(launch.kernel, launch.grid, (), launch.kwargs, self._stream(launch),
                                                  launch.per_launch) for launch in launches])
        self.last_inputs = (A, B, A.data_ptr(), B.data_ptr())
        return self.prepared[1]

    @staticmethod
    def _inputs_key(A, B):
        return tuple((t.data_ptr(), t.dtype, tuple(t.shape), t.stride()) for t in (A, B))

    def _launched(self, wait):
        """After this launch's kernels are enqueued: order the streams, count the launch, return C."""
        out = self.spec.output(self.buffers, self.launches)
        if self.joins_side_stream:
            # Whatever this rank runs next waits for the side stream's kernels (two_shot: its next GEMM
            # overwrites the partials, which the reduction reads until every owner has them).
            self.heap.join_side_stream()
        self.launches += 1
        if self.spec.barrier_after_launch:
            # Remote writes into our C may still be in flight from other ranks until all have finished.
            self.heap.barrier(self.config.timeout_s, wait=wait)
        if wait:
            self.check()
        return out

    def _stream(self, launch):
        return self.heap.side_stream if launch.stream == "side" else self.heap.stream

    def _kernel_calls(self, A, B):
        """This rank's launch, as the spec builds it: [Launch] with every argument by keyword."""
        cfg, heap = self.config, self.heap
        K_r, (A_ptr, B_ptr) = A.shape[1], (A, B)
        A, B, tma = gemm_operands(A, B, cfg, heap.device)
        gemm = gemm_constexprs(cfg, K_r, self.trace_capacity, tma)
        strides = dict(stride_am=A_ptr.stride(0), stride_ak=A_ptr.stride(1), stride_bk=B_ptr.stride(0),
                       stride_bn=B_ptr.stride(1))
        ctx = LaunchContext(config=cfg, heap=heap, buffers=self.buffers, A=A, B=B, K=K_r, strides=strides, gemm=gemm,
                            trace=self.trace, trace_counts=self.trace_counts, parts=self.parts,
                            watchdog=self.watchdog, gpu=heap.device.type == "cuda")
        return self.spec.launches(ctx)

    def check(self):
        """Wait for this rank's work; raise DeadlockError if a wait (or the barrier) expired."""
        self.heap.synchronize()
        self.heap.raise_if_expired(self.watchdog, self.spec.wait_flags)
        self.heap.check_barrier()

    def events(self, iteration):
        """The last launch's events as trace rows (``events.COLUMNS``), and how many were dropped (0 unless
        the trace room was sized wrong)."""
        if not self.trace_capacity:
            return np.zeros((0, len(events.COLUMNS)), np.int64), 0
        return events.rows(self.trace.cpu().numpy(), self.trace_counts.cpu().tolist(), self.trace_capacity,
                           self.heap.rank, iteration)


def launch_ranks(fused, inputs, wait=False):
    """Launch each rank of ``fused`` (this process's ranks: one, or several sharing a GPU) once, with its
    ``(A, B)`` from ``inputs``; return each rank's C.

    Kernel by kernel across the ranks: every rank's first kernel, then every rank's second. Ranks that share
    a GPU start as far apart as the host time between their first kernels; rank by rank, that was a whole
    launch (two kernels and the stream bookkeeping): docs/decisions.md, Kernel by kernel across ranks.
    ``wait=True`` (one rank) waits for the work and checks the watchdog, as ``fused(A, B)`` does.
    """
    calls = [f._prepared_launches(A, B) for f, (A, B) in zip(fused, inputs)]
    for step in range(max(map(len, calls))):
        for f, prepared in zip(fused, calls):
            if step < len(prepared):
                with on_stream(f.stream_names[step]):
                    if f.config.world_size == 1 and not prepared[step].per_launch:
                        # Nothing of a one-rank launch changes between launches with the same A and B: replayed
                        # as a CUDA graph, one driver call, where Triton's launcher would encode both tensor
                        # descriptors again (docs/decisions.md, CUDA graphs).
                        prepared[step].replay()
                    else:
                        prepared[step].at(f.launches)
    return [f._launched(wait) for f in fused]

