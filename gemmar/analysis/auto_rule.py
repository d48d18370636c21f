"""``--algorithm auto``'s measured rule: what to run by where it runs, when the performance model
(``model.py``, beside it) does not speak for the shape. ``commands.choose_auto`` asks the model first."""

# --algorithm auto: what to run, by where it runs. Each entry follows measured figures, kept with their runs in
# docs/decisions.md ("--algorithm auto"); change an entry only with new figures there.
AUTO_RULE = {
    # One GPU per rank, W >= 2, where the shape is not known or the performance model does not speak
    # (commands.choose_auto asks the model first): two_shot was faster than cuBLAS then NCCL at every measured shape,
    # atomics slower, the ring faster only at the fewest rows; two runs on one kind of machine, so without the
    # shape the library path stays the choice.
    "gpus": ("unfused", "without the shape there is no telling: across GPUs two_shot measured faster than cuBLAS "
                        "then NCCL at three large shapes and at five of 16-4096 rows, atomics slower, the ring "
                        "faster only at 16 rows (docs/decisions.md, --algorithm auto)"),
    # One rank on one GPU: nothing to reduce, so torch.matmul alone is the whole job; a fused kernel can only
    # match it.
    "one_gpu": ("unfused", "with one rank there is nothing to reduce, so torch.matmul alone is the whole job and a "
                           "fused kernel is only a GEMM there too (two_shot measured about torch.matmul's time, "
                           "atomics and ring slower: docs/decisions.md, --algorithm auto)"),
    # Two ranks, a GPU each, a shape the model does not speak for (it misses fixed costs there): the ring was
    # the fastest at the fewest rows, two_shot from RING_MAX_ROWS up to TWO_SHOT_MAX_ROWS.
    "two_gpus_few_rows": ("ring", "measured on two GPUs at 16 rows per rank (N = 8192), the ring took less than "
                                  "cuBLAS then NCCL's time and less than two_shot (docs/decisions.md, --algorithm "
                                  "auto); the performance model does not speak for so few rows"),
    "two_gpus_rows": ("two_shot", "measured on two GPUs at 64-4096 rows per rank (N = 8192), two_shot took less "
                                  "than cuBLAS then NCCL's time (docs/decisions.md, --algorithm auto); the "
                                  "performance model does not speak for this shape"),
    # CPU interpreter or ranks sharing a GPU: places to learn and test, with no NCCL between the ranks.
    "shared": ("two_shot", "there is no NCCL path between these ranks (cpu interpreter, or ranks sharing one "
                           "GPU), and two_shot is the fused kernel that gives every rank the same bits"),
}


RING_MAX_ROWS, TWO_SHOT_MAX_ROWS = 16, 4096   # the rows per rank measured in each "two_gpus_*" entry


def choose_algorithm(backend, world_size, gpus, rows=None):
    """``--algorithm auto`` by the measured rule: (algorithm or "unfused", why), by AUTO_RULE; ``rows``, the
    rows per rank where known. (With a GPU per rank, ``commands.choose_auto`` first asks the performance model
    about the shape.)"""
    if backend != "cuda" or world_size > gpus:
        return AUTO_RULE["shared"]
    if world_size == 1:
        return AUTO_RULE["one_gpu"]
    if world_size == 2 and rows is not None and rows <= TWO_SHOT_MAX_ROWS:
        return AUTO_RULE["two_gpus_few_rows" if rows <= RING_MAX_ROWS else "two_gpus_rows"]
    return AUTO_RULE["gpus"]
