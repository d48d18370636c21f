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
from ..kernels import events
from ..kernels.atomics import gemm_all_reduce_atomics
from ..kernels.device import WATCHDOG_WORDS
from ..kernels.ring import MISTAKES, gemm_all_reduce_ring
from .heap import ALIGN, HEADER_BYTES


def heap_bytes_needed(config):
    """Symmetric heap bytes one rank needs for ``config`` (what FusedGemmAllReduce allocates, aligned)."""
    tiles_m, tiles_n = config.tiles
    if config.algorithm == "atomics":
        sizes = [2 * config.m * config.n * 4]
    else:
        tiles = tiles_m * tiles_n
        sizes = [config.m * config.n * 4, tiles * config.BLK_M * config.BLK_N * 4, tiles * 4, tiles * 4]
    sizes.append(WATCHDOG_WORDS * 8)
    return HEADER_BYTES + sum(-(-s // ALIGN) * ALIGN + ALIGN for s in sizes)


class FusedGemmAllReduce:
    def __init__(self, heap, config: RunConfig, mistake="none"):
        config.validate()
        if config.world_size != heap.world_size:
            raise UsageError(f"world_size={config.world_size} does not match the heap's {heap.world_size} ranks")
        if mistake not in MISTAKES:
            raise UsageError(f"mistake {mistake!r} is not known: use one of {', '.join(MISTAKES)}")
        if mistake != "none" and config.algorithm != "ring":
            raise UsageError(f"mistake {mistake!r} exists only in the ring kernel, not in {config.algorithm!r}")
        self.heap, self.config, self.mistake = heap, config, MISTAKES.index(mistake)
        M, N = config.m, config.n
        tiles_m, tiles_n = config.tiles
        self.total_tiles = tiles_m * tiles_n
        self.launches = 0
        if config.algorithm == "atomics":
            self.c_pair = heap.zeros((2, M, N), torch.float32)
        else:
            self.c = heap.zeros((M, N), torch.float32)
            self.ring_buffer = heap.zeros((self.total_tiles, config.BLK_M * config.BLK_N), torch.float32)
            self.data_ready = heap.zeros(self.total_tiles, torch.int32)
            self.slot_free = heap.zeros(self.total_tiles, torch.int32)
        self.watchdog = heap.zeros(WATCHDOG_WORDS, torch.int64)
        # The trace buffers are local (nobody else writes them), so they need not live on the heap.
        tiles_per_program = -(-self.total_tiles // config.num_sms)
        self.trace_capacity = tiles_per_program * events.events_per_tile(config.algorithm, heap.world_size) \
            if config.trace else 0
        self.trace = torch.zeros(max(1, config.num_sms * self.trace_capacity * events.EVENT_WORDS), dtype=torch.int64,
                                 device=heap.device)
        self.trace_counts = torch.zeros(config.num_sms, dtype=torch.int64, device=heap.device)

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
        """Launch once; return this rank's C (fp32, M x N). Atomics: valid until the next launch.

        ``wait=False`` (GPU timing loops) only enqueues the work, with no host synchronisation and no
        watchdog check: call :meth:`check` after the loop.
        """
        self.check_inputs(A, B)
        cfg, heap = self.config, self.heap
        common = dict(BLOCK_M=cfg.BLK_M, BLOCK_N=cfg.BLK_N, BLOCK_K=cfg.BLK_K, GROUP_SIZE_M=cfg.gsize_m,
                      NUM_SMS=cfg.num_sms, DOT_PRECISION="ieee" if cfg.datatype == "fp32" else "tf32",
                      TRACE_CAPACITY=self.trace_capacity, EVEN_K=A.shape[1] % cfg.BLK_K == 0)
        if heap.device.type == "cuda":
            common.update(num_warps=cfg.num_warps, num_stages=cfg.num_stages)
        grid = (cfg.num_sms,)
        if cfg.algorithm == "atomics":
            parity = self.launches % 2
            out = self.c_pair[parity]
            gemm_all_reduce_atomics[grid](
                A, B, self.c_pair, heap.heap_bases, heap.rank, heap.world_size, parity,
                cfg.m, cfg.n, A.shape[1], A.stride(0), A.stride(1), B.stride(0), B.stride(1), out.stride(0),
                out.stride(1), self.trace, self.trace_counts, **common)
            self.launches += 1
            # Remote adds into our C may still be in flight from other ranks until all have finished.
            heap.barrier(cfg.timeout_s, wait=wait)
        else:
            out = self.c
            gemm_all_reduce_ring[grid](
                A, B, self.c, self.ring_buffer, self.data_ready, self.slot_free, self.watchdog, heap.heap_bases,
                heap.rank, heap.world_size, self.launches,
                cfg.m, cfg.n, A.shape[1], A.stride(0), A.stride(1), B.stride(0), B.stride(1), out.stride(0),
                out.stride(1), int(cfg.timeout_s * 1e9), self.trace, self.trace_counts,
                MISTAKE=self.mistake, SLOT_CACHE=".cg" if heap.device.type == "cuda" else "", **common)
            self.launches += 1
        if wait:
            self.check()
        return out

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
