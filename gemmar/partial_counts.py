"""How a puzzle run's C is judged: how many times each rank's partial is in each rank's C, tile by tile, on
inputs where that count is exact (whole numbers) or where the order of a sum shows in the bits. The checks
that use it are in ``exercises.py``."""

import torch

from .config import k_bounds


def integer_problem(m, n, k, seed):
    # Small whole numbers in fp32: every partial and every sum is exact, so a C that holds a rank's partial
    # twice shows up as exactly 2 in the counts below, not as a tolerance question.
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(-3, 4, (m, k), generator=g).float(), torch.randint(-3, 4, (k, n), generator=g).float())


def partial_counts(result, A, B):
    """Per rank and tile: how many times each rank's partial ``A[:, K_q] @ B[K_q, :]`` is in that rank's C
    (least squares over the tile's elements), and whether C is exactly such a sum."""
    cfg = result.config
    W, bm, bn = cfg.world_size, cfg.BLK_M, cfg.BLK_N
    partials = [A[:, s:e].double() @ B[s:e, :].double() for s, e in (k_bounds(cfg.k, W, q) for q in range(W))]
    tiles_m, tiles_n = cfg.tiles
    C = [out.C.double() for out in result.ranks]
    counts = {}
    for i in range(tiles_m):
        for j in range(tiles_n):
            region = (slice(i * bm, (i + 1) * bm), slice(j * bn, (j + 1) * bn))
            X = torch.stack([p[region].flatten() for p in partials], dim=1)   # the same for every rank
            for rank in range(W):
                y = C[rank][region].flatten()
                coef = torch.linalg.lstsq(X, y[:, None]).solution[:, 0]
                exact = bool(torch.allclose(X @ coef, y, atol=1e-6 * (1 + float(y.abs().max()))))
                counts[rank, (i, j)] = ([round(float(c), 2) + 0.0 for c in coef], exact)   # + 0.0: no "-0"
    return dict(sorted(counts.items()))   # by rank, then tile: the first wrong one is rank 0's first


def _times(c):
    c = int(c) if float(c).is_integer() else c
    return {0: "0 times", 1: "once", 2: "twice"}.get(c, f"{c} times")


def judge_partials(result, A, B, hint):
    """The puzzles whose answer decides which partials reach which rank's C: "right!" or the first wrong
    tile, as a table of how many times each rank's partial is in each rank's C there."""
    W = result.config.world_size
    counts = partial_counts(result, A, B)
    wrong = [key for key, (coef, exact) in counts.items() if not exact or any(c != 1 for c in coef)]
    if not wrong and result.ok:
        return None
    if not wrong:
        bad = next(r for r in result.ranks if not r.ok)
        return (f"not quite: the last launch is right, but an earlier one on rank {bad.rank} was not (max error "
                f"{max(d for d in bad.max_abs_diff if d is not None):.3g}): does your code depend on the launch?")
    rank, tile = wrong[0]
    ranks_wrong = sorted({r for r, _ in wrong})
    lines = [f"not quite: {len(wrong)} of {len(counts)} tiles are wrong, on rank(s) {', '.join(map(str, ranks_wrong))}. "
             f"In tile (pid_m, pid_n) = {tile}, each rank's C holds each rank's partial this many times:",
             "            " + "".join(f"{f'rank {q}':>9}" for q in range(W))]
    for r in range(W):
        coef, exact = counts[r, tile]
        lines.append(f"  rank {r}'s C" + "".join(f"{c:>9g}" for c in coef) + ("" if exact else "   (+ other values)"))
    r, q = next(((r, q) for r in range(W) for q in range(W) if counts[r, tile][0][q] != 1), (rank, rank))
    lines.append(f"For example rank {r}'s C has rank {q}'s partial {_times(counts[r, tile][0][q])}. "
                 f"Every rank's C needs every rank's partial exactly once. {hint(rank, tile)}")
    return "\n".join(lines)


def order_sensitive_problem(m, n, k, world_size, seed):
    """fp32 inputs whose rank r's K-slice is scaled by 4096**r: the partials' magnitudes differ so much that
    the order of their fp32 sum shows in the bits."""
    g = torch.Generator().manual_seed(seed)
    A, B = torch.randn(m, k, generator=g), torch.randn(k, n, generator=g)
    for r in range(world_size):
        start, end = k_bounds(k, world_size, r)
        A[:, start:end] *= 4096.0 ** r
    return A, B
