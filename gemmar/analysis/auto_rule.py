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
                           "fused kernel can at best match it (on an H200 two_shot measured 1.00-1.21x torch.matmul's "
                           "time at 64-8192 rows and 1.07-1.23x at 16, atomics and ring slower: BENCHMARKS.md)"),
    # CPU interpreter or ranks sharing a GPU: places to learn and test, with no NCCL between the ranks.
    "shared": ("two_shot", "there is no NCCL path between these ranks (cpu interpreter, or ranks sharing one "
                           "GPU), and two_shot is the fused kernel that gives every rank the same bits"),
}


def choose_algorithm(backend, world_size, gpus):
    """``--algorithm auto`` by the measured rule: (algorithm or "unfused", why), by AUTO_RULE. (With a GPU
    per rank, ``cli.choose_auto`` first asks the performance model about the shape.)"""
    if backend != "cuda" or world_size > gpus:
        return AUTO_RULE["shared"]
    return AUTO_RULE["one_gpu" if world_size == 1 else "gpus"]
