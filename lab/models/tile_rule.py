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
