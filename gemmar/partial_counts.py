"""How a puzzle run's C is judged: how many times each rank's partial is in each rank's C, tile by tile, on
inputs where that count is exact (whole numbers) or where the order of a sum shows in the bits; how precise
it is against the package's own part; and what else a run tells of a part (the rank a push returned, a
tile_coords that returned floats). The checks that use it are in ``exercises.py``."""

import re

import torch

from .config import k_bounds
from .runtime.problem import NARROWER, SIGNIFICANT_BITS, rounded_to


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


# The puzzles' first inputs are whole numbers, exact in every dtype (so that the partial counts are exact), and a
# part that rounded a partial to fp16 on its way passed. So a right answer runs once more on fp32 inputs, whose
# partials fp16 cannot hold, and must err by at most PRECISION_MARGIN x what the package's own part errs by on the
# same inputs (about 1e-6 of C's largest value; rounding to fp16 costs about 1e-4 of it, to bf16 1e-3).
PRECISION_MARGIN = 16


def precision_problem(m, n, k, seed):
    """fp32 inputs (unit normals) whose partials fp16 and bf16 cannot hold."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, k, generator=g), torch.randn(k, n, generator=g)


def judge_precision(part, yours, right_error, A, B):
    """None when the run ``yours`` of a participant's ``part`` on ``A``, ``B`` (:func:`precision_problem`) errs by
    at most PRECISION_MARGIN x ``right_error``, the package's own part's max |C - reference| on them; else what
    to say, naming the rounding where its error shows which."""
    W = yours.config.world_size
    partials = [A[:, s:e].double() @ B[s:e, :].double() for s, e in (k_bounds(A.shape[1], W, q)
                                                                     for q in range(W))]
    exact = sum(partials)
    peak = float(exact.abs().max())
    right_error = max(right_error, 2.0 ** -24 * peak)   # (the package's part may be exact by chance)
    allowed = PRECISION_MARGIN * right_error
    if yours.max_abs_diff <= allowed:
        return None
    off = (f"C is off by {yours.max_abs_diff:.2g}, where the package's own {part} is off by "
           f"{right_error:.2g} on the same inputs (fp32 values, whose partials fp16 cannot hold)")
    held = held_in(yours.C) if held_in(exact.float()) is None else None
    if held is not None:
        return (f"not quite: every partial is in C once, but your {part} rounds the sum to {held}: every value in "
                f"C is {'an' if held == 'fp16' else 'a'} {held} number. {off}. Keep the sum in fp32")
    wrong_by = sum(float((r.C.double() - exact).abs().mean()) for r in yours.ranks)
    for name, dtype in NARROWER.items():
        # C as if each rank's partial had been rounded to this dtype and then added: far nearer to it than to the
        # exact sum (on average: the kernel's fp32 partial can round the other way where it is near a tie).
        rounded = sum(p.float().to(dtype).double() for p in partials)
        if sum(float((r.C.double() - rounded).abs().mean()) for r in yours.ranks) < wrong_by / 10:
            return (f"not quite: every partial is in C once, but your {part} rounds each partial to {name} before it "
                    f"is added: {off}. Add the fp32 partial as it is ({name} keeps {SIGNIFICANT_BITS[name]} "
                    f"significant bits)")
    name = rounded_to(yours.max_abs_diff, peak)
    if name is not None:
        return (f"not quite: every partial is in C once, but your {part} rounds a value to {name} on its way into "
                f"C (a partial, a sum, or what it passes on): {off}; that is about what rounding to {name} costs. "
                f"Keep partials and sums in fp32")
    return f"not quite: every partial is in C once, but not precisely: {off}"


def held_in(C):
    """"bf16" or "fp16" when every value of C is a number of that dtype (a sum rounded to it); else None."""
    for name in ("bf16", "fp16"):   # (bf16 first: its numbers are mostly fp16 numbers too, not the other way)
        if torch.equal(C, C.to(NARROWER[name]).to(C.dtype)):
            return name
    return None


def returned_rank_verdict(result):
    """None when every push's returned rank is the rank whose C its atomic add went to (the sanitizer's record
    of the last launch, cpu ranks), else what to say. Not judged where there is no record (GPU ranks)."""
    events = result.trace.iteration(-1)
    pushes = events[events.kind == "push"].sort_values(["rank", "program", "start_us"])
    for record in (r.sanitizer for r in result.ranks):
        if not record:
            return None
        rank = record["rank"]
        kernels = [e[2] for e in record["events"] if e[0] == "start" and e[3] == "gemm_all_reduce_atomics"]
        if not kernels:
            return None
        went = {}   # program -> ranks its adds into C went to, in order
        for e in record["events"]:
            if e[0] == "access" and e[2] == kernels[-1] and e[4] == "rmw" and e[12] and e[12][0] == "C_pair":
                went.setdefault(e[3], []).append(int(e[13]))
        for program, said in pushes[pushes["rank"] == rank].groupby("program"):
            targets = went.get(program, [])
            if len(targets) != len(said):   # (a part that adds in pieces: nothing to pair up)
                continue
            for (_, push), target in zip(said.iterrows(), targets):
                if int(push.peer) != target:
                    return (f"not quite: every rank's C is right, but your push_partial returned rank {int(push.peer)} "
                            f"for a push that went to rank {target} (rank {rank}, tile ({int(push.pid_m)}, "
                            f"{int(push.pid_n)}), step {int(push.step)}): return the rank whose C you added into, "
                            f"the kernel records each push (and when a tile is done) by it")
    return None


def not_whole_numbers(failed, part):
    """What to say when the kernel refused a tile_coords whose pid_m or pid_n is not a whole number (kernels/gemm.py
    checks, before the address arithmetic that failed in Triton's words); None for any other failure."""
    found = re.search(r"TILE_COORDS returned a (pid_[mn]) that is not a whole number", failed)
    if not found:
        return None
    source = getattr(part, "src", "") or ""   # (a @triton.jit function's own source)
    returns = [line.strip() for line in source.splitlines() if line.strip().startswith("return")]
    at = f" at `{returns[-1]}`" if returns else ""
    return (f"not yet: the {found.group(1)} your tile_coords returned{at} is not a whole number (a float): the kernel "
            f"needs integers (int32) for pid_m and pid_n, to address the tile's rows and columns. In Triton, as in "
            f"Python, / divides into a float; // keeps whole numbers")
