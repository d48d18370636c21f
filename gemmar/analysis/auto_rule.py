"""``--algorithm auto``'s measured rule: what to run by where it runs, when the performance model
(``model.py``, beside it) does not speak for the shape. ``cli.choose_auto`` asks the model first."""

# --algorithm auto: what to run, by where it runs. The rule follows the figures in BENCHMARKS.md ("The
# rule behind --algorithm auto"); change it only with new figures.
AUTO_RULE = {
    # One GPU per rank, W >= 2, where the shape is not known or the performance model does not speak
    # (cli.choose_auto asks the model first): on 2 x H200 atomics and ring were 1.05-1.08x and more slower than
    # cuBLAS then NCCL at the three large shapes (2026-12-01); two_shot, measured twice (2026-12-04), was
    # 0.61-0.96x at 8 shapes of 16-8192 rows with the few-rows tiles, and the ring 0.55-0.80x at 16 and 64 rows.
    # Two runs on two machines: without the shape, the library path stays the choice.
    "gpus": ("unfused", "without the shape there is no telling: on 2 x H200 two_shot measured 0.63-0.93x cuBLAS "
                        "then NCCL's time at three large shapes and 0.69-0.96x at five of 16-4096 rows, atomics "
                        "1.04x and more, the ring from 0.55x at 16 rows to 1.55x at 4096 (BENCHMARKS.md)"),
    # One rank on one GPU: nothing to reduce, so torch.matmul alone is the whole job; a fused kernel can only
    # match it (on an H200, 2026-12-04, the current figures of BENCHMARKS.md: two_shot within 4 % of torch.matmul's
    # host time per launch since the launch hands Triton addresses, its figures spread by the host's; atomics and
    # ring slower still).
    "one_gpu": ("unfused", "with one rank there is nothing to reduce, so torch.matmul alone is the whole job and a "
                           "fused kernel is only a GEMM there too (on an H200 two_shot measured 0.90-1.06x "
                           "torch.matmul's time at 16-8192 rows in one run, atomics and ring slower: BENCHMARKS.md)"),
    # Two ranks, a GPU each, a shape the model does not speak for (it misses fixed costs there: on the same
    # 2 x H200 it predicted each of the five inference shapes 16-60 % too fast, the worse of two_shot and
    # matmul then NCCL). Measured there (2026-12-04, runs of 11:13, 12:00 and 17:27 UTC, N = 8192): at 16 rows
    # per rank the ring took 0.55 and 0.65x cuBLAS then NCCL's time, two_shot 0.76-0.96x; at 64 rows two_shot
    # 0.79 and 0.95x with its few-rows tiles, the ring 0.80 and 1.08x; at 256-4096 rows two_shot 0.68-0.84x.
    "two_gpus_few_rows": ("ring", "measured on 2 x H200 at 16 rows per rank (N = 8192), the ring took 0.55-0.65x "
                                  "cuBLAS then NCCL's time, less than two_shot (BENCHMARKS.md); the performance "
                                  "model does not speak for so few rows"),
    "two_gpus_rows": ("two_shot", "measured on 2 x H200 at 64-4096 rows per rank (N = 8192), two_shot took "
                                  "0.68-0.95x cuBLAS then NCCL's time (BENCHMARKS.md); the performance model does "
                                  "not speak for this shape"),
    # CPU interpreter or ranks sharing a GPU: places to learn and test, with no NCCL between the ranks.
    "shared": ("two_shot", "there is no NCCL path between these ranks (cpu interpreter, or ranks sharing one "
                           "GPU), and two_shot is the fused kernel that gives every rank the same bits"),
}


RING_MAX_ROWS, TWO_SHOT_MAX_ROWS = 16, 4096   # the rows per rank measured in each "two_gpus_*" entry


def choose_algorithm(backend, world_size, gpus, rows=None):
    """``--algorithm auto`` by the measured rule: (algorithm or "unfused", why), by AUTO_RULE; ``rows``, the
    rows per rank where known. (With a GPU per rank, ``cli.choose_auto`` first asks the performance model
    about the shape.)"""
    if backend != "cuda" or world_size > gpus:
        return AUTO_RULE["shared"]
    if world_size == 1:
        return AUTO_RULE["one_gpu"]
    if world_size == 2 and rows is not None and rows <= TWO_SHOT_MAX_ROWS:
        return AUTO_RULE["two_gpus_few_rows" if rows <= RING_MAX_ROWS else "two_gpus_rows"]
    return AUTO_RULE["gpus"]
