"""What the client prints: the one progress-line format and the benchmark table."""

import sys


def log(rank, world_size, message, file=None):
    """The one progress-line format: ``[gemmar] [r/W] message`` (rank '-' for the client)."""
    print(f"[gemmar] [{rank}/{world_size}] {message}", file=file or sys.stdout, flush=True)


def print_figures(f, configs, problem=None):
    """The benchmark lines: baseline times, then each fused kernel with its ratios and tile settings
    (``problem``: the run's config when ``configs`` is empty, the unfused path alone)."""
    c = problem or next(iter(configs.values()))
    W = c.world_size
    log("-", W, f"per-rank {c.m} x {c.n} x {-(-c.k // W)} {c.datatype}: torch.matmul {f['matmul_ms']:.3f} ms | "
                f"NCCL all_reduce(C) {f['allreduce_ms']:.3f} ms | sequential {f['sequential_ms']:.3f} ms | "
                f"overlapped in {f['overlap_chunks']} row blocks {f['overlap_ms']:.3f} ms "
                f"(max|C - ref| {f['overlap_max_abs_diff']:.3g}) | bound max(mm, ar) {f['bound_ms']:.3f} ms")
    for alg, c in configs.items():
        ms = f[f"{alg}_ms"]
        log("-", W, f"fused {alg:8s} {ms:.3f} ms  fused/sequential {ms / f['sequential_ms']:.3f}  "
                    f"fused/best unfused {ms / f['unfused_ms']:.3f}  "
                    f"fused/bound {ms / f['bound_ms']:.3f}  max|C - ref| {f[f'{alg}_max_abs_diff']:.3g}  "
                    f"({c.BLK_M}x{c.BLK_N}x{c.BLK_K}, {c.num_warps} warps, {c.num_stages} stages, "
                    f"{c.num_sms} programs)")
