"""The tile rule's fit: from the shape sweep's measured grid (``benchmarks/shape_sweep.py --grid``, then
``--analyse``), the rule ``gemmar/tuning_cache.py``'s ``RULE`` is to hold (docs/decisions.md, "The tile rule and the
tuning cache"). Lab code: the package uses a fitted rule (``tuning_cache.rule_tile``), never the fit; it moved here
from ``gemmar/tuning_cache.py`` (issue 59).
"""

import math

# The rows-per-rank bounds a fitted rule may use: each bucket gets the tile that was fastest over it.
M_BUCKETS = (16, 64, 128, 256, 512, 2048, 1 << 20)


def fit_rule(rows, buckets=M_BUCKETS):
    """A rule fitted on measured rows: each ``(m, {tile: ratio to torch.matmul})`` (only tiles that gave the
    right result). Per bucket of rows, the tile whose geometric-mean ratio over the bucket's shapes is least among
    tiles measured at every one of them; a bucket with no rows is left out (the next bound up answers for it)."""
    rule = {}
    lower = 0
    for bound in buckets:
        inside = [ratios for m, ratios in rows if lower < m <= bound]
        lower = bound
        if not inside:
            continue
        common = set(inside[0]).intersection(*inside[1:])
        if not common:   # (no tile measured at every shape of the bucket: the most widely measured ones)
            counts = {}
            for ratios in inside:
                for tile in ratios:
                    counts[tile] = counts.get(tile, 0) + 1
            most = max(counts.values())
            common = {t for t, c in counts.items() if c == most}

        def score(tile):
            logs = [math.log(r[tile]) for r in inside if tile in r]
            return sum(logs) / len(logs)
        rule[bound] = tuple(min(sorted(common), key=score))
    if rule and max(rule) < buckets[-1]:
        rule[buckets[-1]] = rule.pop(max(rule))
    return rule


def fit_wave_model(rows, sms, least_shapes=3):
    """{tile: (fixed, per wave, per wave-step) microseconds} from measured rows, each ``((M, N, K), {tile: GPU
    microseconds})``: per tile, least squares of the relative error over every shape that timed it (a tile timed at
    fewer than ``least_shapes`` shapes is left out). A launch of a persistent GEMM with one program an SM runs
    ceil(tiles / SMs) waves of tiles, each K / BLK_K steps long, plus a fixed cost (launch, first loads)."""
    import numpy as np

    from gemmar.tuning_cache import wave_features

    by_tile = {}
    for shape, times in rows:
        for tile, us in times.items():
            by_tile.setdefault(tuple(tile), []).append((shape, us))
    model = {}
    for tile, timed in sorted(by_tile.items()):
        if len(timed) < least_shapes:
            continue
        # (each equation divided by its time: the fit minimises relative, not absolute, error)
        X = np.array([[f / us for f in wave_features(tile, shape, sms)] for shape, us in timed])
        coefficients = np.linalg.lstsq(X, np.ones(len(timed)), rcond=None)[0]
        model[tile] = tuple(round(float(c), 4) for c in coefficients)
    return model


def wave_rule(bucket_rule, model, above=None):
    """A rule: ``bucket_rule``'s tiles up to ``above`` rows (the few-rows kernel's, ``tuning.GEMV_ROWS``, when not
    given), and above them, per bucket, the wave model over the bucket's candidate tiles
    (``tuning_cache.candidates``) that ``model`` has (a bucket with none is left out)."""
    from gemmar.tuning import GEMV_ROWS
    from gemmar.tuning_cache import candidates

    above = GEMV_ROWS if above is None else above

    rule = {bound: tile for bound, tile in bucket_rule.items() if bound <= above}
    for bound in sorted(b for b in M_BUCKETS if b > above):
        timed = tuple((tile, model[tile]) for tile in candidates(bound) if tile in model)
        if timed:   # (none of the bucket's tiles timed at enough shapes: the next bound up answers for it)
            rule[bound] = timed
    return rule
