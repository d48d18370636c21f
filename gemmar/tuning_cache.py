"""Per-shape choices of kernel and tile: the tuning cache (a JSON file that ``gemmar tune`` writes and a user can
ship beside their model) and the fitted rule that answers for every shape the cache does not hold.

    choose(gpu, datatype, world_size, (M, N, K_r), algorithm=None, sms=None) -> Choice(algorithm, tile, source)

A cache entry is keyed by the GPU's name, the dtype, the world size and the per-rank shape (M, N, K_r) and gives
the kernel and its tile (BLK_M, BLK_N, BLK_K, num_warps, num_stages, gsize_m) that measured fastest there. Where
the cache holds no entry, the rule (:data:`RULE`: by rows per rank, and above 64 rows a wave model of the
candidate tiles on the GPU's SMs; fitted on the shape sweep's measured grid:
benchmarks/shape_sweep.py; docs/decisions.md, the tile rule and the tuning cache) gives the tile for two_shot and
one_shot at one rank on Hopper; elsewhere, or were the rule empty, the algorithm's own measured tiles stand
(``tuning.tuned_defaults``). This module needs no GPU and no torch: the CPU tests read, refuse and fall back
without either.
"""

import datetime
import json
import os

from .config import SPLIT_K_ALGORITHMS
from .errors import UsageError

CACHE_FORMAT = "gemmar-tuning-cache/1"
CACHE_ENV = "GEMMAR_TUNING_CACHE"      # where the cache is read and written, when set
TILE_KNOBS = ("BLK_M", "BLK_N", "BLK_K", "num_warps", "num_stages", "gsize_m")
# The kernels whose GEMM core takes a tile from here: at world size 1 their launch is that GEMM alone.
TILED = ("two_shot", "one_shot")
DATATYPES = ("fp16", "bf16", "fp32")

# The tiles the tuner and the sweep time, by the rows per rank they suit (at world size 1 the GEMM reads A and B
# through plain pointers up to tuning.FEW_ROWS rows, through tensor descriptors above).
CANDIDATES = {
    "few": [(16, 64, 128, 4, 4, 8), (16, 128, 128, 4, 4, 8), (16, 64, 256, 4, 3, 8), (16, 32, 256, 4, 3, 8),
            (32, 64, 128, 4, 4, 8), (64, 64, 128, 4, 4, 8), (64, 128, 64, 4, 4, 8), (32, 128, 128, 4, 4, 8)],
    "mid": [(64, 64, 128, 4, 4, 8), (64, 128, 64, 4, 4, 8), (64, 128, 128, 4, 4, 8), (128, 128, 64, 4, 4, 8),
            (128, 128, 64, 8, 4, 8), (64, 256, 64, 8, 3, 8), (128, 64, 64, 4, 4, 8), (32, 64, 128, 4, 4, 8),
            (128, 256, 64, 8, 3, 8), (128, 256, 64, 8, 4, 8)],   # (the last two's coefficients: fitted above 512 rows)
    "large": [(128, 256, 64, 8, 3, 8), (128, 256, 64, 8, 4, 8), (128, 128, 64, 8, 4, 8), (128, 128, 64, 4, 4, 8),
              (256, 128, 64, 8, 3, 8), (64, 128, 64, 4, 4, 8), (128, 64, 64, 4, 4, 8), (64, 256, 64, 8, 3, 8)],
}
# The rule: {most rows per rank: what picks the tile}, fitted on the shape sweep's grid at world size 1
# (benchmarks/shape_sweep.py --grid, then --analyse: lab/models/tile_rule.py). Up to 64 rows (where the few-rows
# kernel runs, unless the user says --no-gemv) one tile a bucket, (BLK_M, BLK_N, BLK_K, num_warps, num_stages,
# gsize_m): the one with the least geometric-mean time / torch.matmul's over the bucket. Above, a wave model a bucket:
# ((tile, (fixed, per wave, per wave-step) microseconds), ...) over the bucket's candidates, and the tile whose
# predicted time (predicted_us) is least at the shape: a persistent GEMM runs ceil(tiles / SMs) waves of K / BLK_K
# steps, so the tile that leaves the fewest SMs idle in the last wave wins unless its steps cost more. Fitted per
# tile on GPU time over every swept shape above 64 rows that timed it. Why each bucket has its tile, and what the wave
# model buys and leaves slow (its paragraph there): docs/decisions.md, the tile rule and the tuning cache.
_WAVES = {   # {tile: (fixed, per wave, per wave-step) microseconds}
    (32, 64, 128, 4, 4, 8): (3.2652, 1.0521, 0.3619),
    (64, 64, 128, 4, 4, 8): (3.2575, 1.152, 0.355),
    (64, 128, 64, 4, 4, 8): (4.0397, 0.4088, 0.2919),
    (64, 128, 128, 4, 4, 8): (4.0263, 1.3373, 0.4473),
    (64, 256, 64, 8, 3, 8): (4.448, 0.8166, 0.4861),
    (128, 64, 64, 4, 4, 8): (4.0302, 0.323, 0.3186),
    (128, 128, 64, 4, 4, 8): (4.4179, 0.8727, 0.3748),
    (128, 128, 64, 8, 4, 8): (4.5753, 0.9388, 0.3888),
    (128, 256, 64, 8, 3, 8): (4.4958, 2.0581, 0.674),
    (128, 256, 64, 8, 4, 8): (4.8124, 2.034, 0.6672),
    (256, 128, 64, 8, 3, 8): (4.1665, 2.1966, 0.7452),
}
RULE_SMS = 132   # (the SMs of the GPU the wave model was fitted on; a GPU with others counts its own waves)
RULE = {
    16: (16, 64, 256, 4, 3, 8),
    64: (64, 64, 128, 4, 4, 8),
    512: tuple((tile, _WAVES[tile]) for tile in CANDIDATES["mid"]),
    1 << 20: tuple((tile, _WAVES[tile]) for tile in CANDIDATES["large"]),
}


def candidates(m):
    """The tiles worth timing for ``m`` rows per rank."""
    return CANDIDATES["few" if m <= 64 else "mid" if m <= 512 else "large"]


class Choice:
    """What runs at a shape: ``algorithm``, ``tile`` (a dict of TILE_KNOBS) and ``source`` (where it came from,
    in words: the cache file, or the rule)."""

    def __init__(self, algorithm, tile, source, cached=False, gemv=False):
        self.algorithm, self.tile, self.source, self.cached = algorithm, dict(tile), source, cached
        self.gemv = gemv   # the tile runs the few-rows kernel (RunConfig.gemv)

    def describe(self):
        t = self.tile
        return (f"{self.algorithm} {t['BLK_M']}x{t['BLK_N']}x{t['BLK_K']} tiles, {t['num_warps']} warps, "
                f"{t['num_stages']} stages (from {self.source})")

    def __repr__(self):
        return f"Choice({self.describe()})"


def rule_tile(shape, rule=None, sms=None):
    """The rule's tile for ``shape`` (M, N, K per rank) on ``sms`` SMs (RULE_SMS when not given): the entry of the
    smallest bound at or above M - a tile, or of a wave model's tiles the one predicted fastest (ties: the first
    listed); None when the rule is empty."""
    rule = RULE if rule is None else rule
    if not rule:
        return None
    bounds = sorted(rule)
    entry = rule[next((b for b in bounds if shape[0] <= b), bounds[-1])]
    if not entry:
        return None
    if isinstance(entry[0], (tuple, list)):
        return tuple(min(entry, key=lambda pair: predicted_us(pair[1], pair[0], shape, sms or RULE_SMS))[0])
    return tuple(entry)


def wave_features(tile, shape, sms):
    """(1, waves, waves x steps) of a persistent GEMM with ``tile`` at ``shape`` on ``sms`` programs."""
    m, n, k = shape[:3]
    waves = -(-(-(-m // tile[0]) * -(-n // tile[1])) // sms)
    return 1.0, float(waves), float(waves * -(-k // tile[2]))


def predicted_us(coefficients, tile, shape, sms):
    """A wave model's time for ``tile`` at ``shape``: fixed + waves x per wave + waves x steps x per step (us)."""
    return sum(c * f for c, f in zip(coefficients, wave_features(tile, shape, sms)))


def rule_from_json(obj):
    """A rule read from a JSON file ({"bound": tile, or [[tile, coefficients], ...]}: :func:`rule_to_json`'s), as RULE
    holds one; a one-line UsageError for anything else."""
    def tile_of(value):
        tile = tuple(int(x) for x in value)
        if len(tile) != len(TILE_KNOBS) or min(tile) < 1:
            raise ValueError(f"a tile is {len(TILE_KNOBS)} positive integers ({', '.join(TILE_KNOBS)}), not {value}")
        return tile

    rule = {}
    try:
        for bound, entry in obj.items():
            if not entry:
                raise ValueError(f"rows {bound} have no tile")
            if isinstance(entry[0], list):
                rule[int(bound)] = tuple((tile_of(tile), tuple(float(c) for c in coefficients))
                                         for tile, coefficients in entry)
                if any(len(c) != 3 for _, c in rule[int(bound)]):
                    raise ValueError(f"rows {bound}: a wave model's coefficients are 3 numbers (fixed, per wave, "
                                     f"per wave-step)")
            else:
                rule[int(bound)] = tile_of(entry)
    except (AttributeError, TypeError, ValueError) as e:
        raise UsageError(f"a rule must map rows to a tile or to [[tile, coefficients], ...]: {e}") from None
    return rule


def rule_to_json(rule):
    """``rule`` as a JSON object (:func:`rule_from_json` reads it back)."""
    return {str(bound): [[list(tile), list(c)] for tile, c in entry] if entry and isinstance(entry[0], tuple)
            else list(entry) for bound, entry in rule.items()}


# -- the cache file ------------------------------------------------------------------------------------------

def default_cache_path():
    """$GEMMAR_TUNING_CACHE, else gemmar/tuning.json under $XDG_CACHE_HOME (~/.cache)."""
    if os.environ.get(CACHE_ENV):
        return os.environ[CACHE_ENV]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "gemmar", "tuning.json")


def cache_key(gpu, datatype, world_size, shape):
    m, n, k = shape
    return f"{gpu}|{datatype}|W{world_size}|{m}x{n}x{k}"


def _entry_problem(entry, i):
    """What is wrong with the cache's entry ``i``, in words, or None."""
    if not isinstance(entry, dict):
        return f"entry {i} is a {type(entry).__name__}, not an object"
    for name, kind in (("gpu", str), ("datatype", str), ("world_size", int), ("shape", list),
                       ("algorithm", str), ("tile", dict)):
        if not isinstance(entry.get(name), kind) or isinstance(entry.get(name), bool):
            return f"entry {i} has no {name} ({kind.__name__})"
    if entry["datatype"] not in DATATYPES:
        return f"entry {i} has datatype {entry['datatype']!r}: use one of {', '.join(DATATYPES)}"
    if entry["world_size"] < 1:
        return f"entry {i} has world_size {entry['world_size']}: use 1 or more"
    shape = entry["shape"]
    if len(shape) != 3 or not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in shape):
        return f"entry {i} has shape {shape!r}: use [M, N, K per rank], three positive integers"
    from .algorithms import builtin_names

    if entry["algorithm"] not in builtin_names():
        return f"entry {i} has algorithm {entry['algorithm']!r}: use one of {', '.join(builtin_names())}"
    tile = entry["tile"]
    missing = [k for k in TILE_KNOBS if not isinstance(tile.get(k), int) or isinstance(tile.get(k), bool)]
    if missing:
        return f"entry {i}'s tile has no whole-number {', '.join(missing)}"
    for name in ("BLK_M", "BLK_N", "BLK_K"):
        if not 16 <= tile[name] <= 256 or tile[name] & (tile[name] - 1):
            return f"entry {i}'s tile has {name} {tile[name]}: use a power of two from 16 to 256"
    if not 1 <= tile["num_warps"] <= 32 or tile["num_warps"] & (tile["num_warps"] - 1):
        return f"entry {i}'s tile has num_warps {tile['num_warps']}: use a power of two from 1 to 32"
    if not 1 <= tile["num_stages"] <= 8 or tile["gsize_m"] < 1:
        return f"entry {i}'s tile has num_stages {tile['num_stages']} / gsize_m {tile['gsize_m']}: use 1-8 / 1 or more"
    if not isinstance(entry.get("gemv", False), bool):
        return f"entry {i} has gemv {entry['gemv']!r}: use true or false (the few-rows kernel, or the tile GEMM)"
    if entry.get("gemv") and (entry["world_size"] != 1 or tile["BLK_M"] < shape[0] or
                              entry["algorithm"] not in SPLIT_K_ALGORITHMS):
        return f"entry {i} has gemv true for {entry['algorithm']} at world size {entry['world_size']} with BLK_M " \
               f"{tile['BLK_M']} for M {shape[0]}: the few-rows kernel runs two_shot or one_shot at world size 1 " \
               f"with BLK_M >= M"
    return None


_LOADED = {}   # path -> ((mtime, size), {key: entry}): a file read once until it changes


def load_cache(path=None):
    """{key: entry} of the cache file at ``path`` (default_cache_path()); {} when there is no such file. A file
    that is not a tuning cache is refused in one line naming it and what is wrong (UsageError)."""
    path = path or default_cache_path()
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return {}
    except OSError as e:
        raise UsageError(f"tuning cache {path}: cannot be read ({e.strerror})") from None
    stamp = (stat.st_mtime_ns, stat.st_size)
    if path in _LOADED and _LOADED[path][0] == stamp:
        return _LOADED[path][1]
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except UnicodeDecodeError:
        raise UsageError(f"tuning cache {path}: not a text file (a JSON file written by gemmar tune)") from None
    except json.JSONDecodeError as e:
        raise UsageError(f"tuning cache {path}: not JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
    except OSError as e:
        raise UsageError(f"tuning cache {path}: cannot be read ({e.strerror})") from None
    if not isinstance(data, dict) or data.get("format") != CACHE_FORMAT:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise UsageError(f"tuning cache {path}: format is {found!r}, not {CACHE_FORMAT!r} (write it with gemmar tune)")
    if not isinstance(data.get("entries"), list):
        raise UsageError(f"tuning cache {path}: has no list of entries")
    entries = {}
    for i, entry in enumerate(data["entries"]):
        problem = _entry_problem(entry, i)
        if problem:
            raise UsageError(f"tuning cache {path}: {problem}")
        entries[cache_key(entry["gpu"], entry["datatype"], entry["world_size"], tuple(entry["shape"]))] = entry
    _LOADED[path] = (stamp, entries)
    return entries


def save_cache(entries, path=None):
    """Write ``entries`` (a list, or {key: entry}; later entries replace earlier ones at the same key) to the cache
    file, keeping the entries it already holds for other keys. Written whole then renamed, so a reader never sees
    half a file. Returns the path."""
    path = path or default_cache_path()
    merged = dict(load_cache(path)) if os.path.exists(path) else {}
    for entry in (entries.values() if isinstance(entries, dict) else entries):
        problem = _entry_problem(entry, 0)
        if problem:
            raise ValueError(f"not a cache entry: {problem}")
        merged[cache_key(entry["gpu"], entry["datatype"], entry["world_size"], tuple(entry["shape"]))] = entry
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(dict(format=CACHE_FORMAT, entries=sorted(merged.values(), key=lambda e: cache_key(
            e["gpu"], e["datatype"], e["world_size"], tuple(e["shape"])))), f, indent=1)
    os.replace(tmp, path)
    _LOADED.pop(path, None)
    return path


def make_entry(gpu, datatype, world_size, shape, algorithm, tile, gemv=False, **measured):
    """A cache entry; ``gemv``: the tile runs the few-rows kernel (kept only when true); ``measured``: figures kept
    beside it (ms, matmul_ms, triton, ...)."""
    return dict(gpu=gpu, datatype=datatype, world_size=world_size, shape=[int(x) for x in shape],
                algorithm=algorithm, tile=dict(zip(TILE_KNOBS, (int(x) for x in tile))) if not isinstance(tile, dict)
                else {k: int(tile[k]) for k in TILE_KNOBS}, **({"gemv": True} if gemv else {}),
                tuned=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), **measured)


def choose(gpu, datatype, world_size, shape, algorithm=None, path=None, rule=None, sms=None):
    """The kernel and tile for one per-rank ``shape`` (M, N, K_r): the cache's entry for this GPU, dtype, world
    size and shape, where it has one (and, when ``algorithm`` is given, for that algorithm); else the rule's tile
    for ``algorithm`` (two_shot when none is given) on ``sms`` SMs; None when the rule is empty too."""
    path = path or default_cache_path()
    entry = load_cache(path).get(cache_key(gpu, datatype, world_size, tuple(shape)))
    if entry is not None and algorithm in (None, entry["algorithm"]):
        return Choice(entry["algorithm"], entry["tile"], f"the tuning cache {path}", cached=True,
                      gemv=entry.get("gemv", False))
    tile = rule_tile(tuple(shape), rule, sms)
    if tile is None:
        return None
    return Choice(algorithm or "two_shot", dict(zip(TILE_KNOBS, tile)),
                  "the rule (gemmar/tuning_cache.py RULE, fitted on the shape sweep; above 64 rows its wave model's fastest "
                  "candidate)" if entry is None else
                  f"the rule (the cache {path} holds {entry['algorithm']} for this shape)")


def parse_shape(text):
    """'MxNxK' (K per rank) -> (M, N, K); UsageError naming the text otherwise."""
    parts = text.lower().replace("*", "x").split("x")
    try:
        shape = tuple(int(p) for p in parts)
    except ValueError:
        shape = ()
    if len(shape) != 3 or not all(1 <= x <= 1 << 20 for x in shape):
        raise UsageError(f"shape {text!r} is not allowed: write M x N x K per rank as MxNxK, e.g. 128x5120x3456, each "
                         f"from 1 to {1 << 20}")
    return shape


def read_shapes_file(path):
    """Shapes from a file: one MxNxK a line (blank lines and # comments skipped)."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"--file {path}: cannot be read ({getattr(e, 'strerror', None) or e})") from None
    shapes = []
    for number, line in enumerate(lines, 1):
        line = line.split("#")[0].strip()
        if line:
            try:
                shapes.append(parse_shape(line))
            except UsageError as e:
                raise UsageError(f"--file {path}, line {number}: {e}") from None
    return shapes
