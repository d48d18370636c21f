"""Real models' tensor-parallel shapes on one GPU: every fused kernel and ``auto`` against torch.matmul at world
size 1, each checked against torch; a JSON and a heat map (M against N x K) beside it.

    python3 benchmarks/shape_sweep.py OUT.json [--grid] [--split] [--programs] [--cache FILE] [--rule RULE.json] [--lomo RULES.json]
                                      [--trace_worst 10] [--shard 1/2] [--max_seconds S]
    python3 benchmarks/shape_sweep.py --analyse OUT.json [--rules_out RULES.json]   (no GPU: figures, fits, maps)

Each shape is one rank's share of a layer whose output is all-reduced under tensor parallelism (Megatron's row-
parallel layers: the attention output projection and the MLP's or an expert's down projection): M tokens x N
(the model's hidden size) x K_r (the layer's input width / TP). ``SHAPES`` names the model, layer and TP degree of
each. At world size 1 a fused launch is its GEMM alone, so the ratio to torch.matmul is the GEMM core's share of a
fused kernel's time at every world size.

Per shape: torch.matmul; each fused kernel with the package's defaults before any cache or rule (``defaults``:
``tuning.tuned_defaults`` with no GPU name, the tiles measured at N = 8192); ``auto``, the kernel and tile that
``tuning_cache.choose`` gives (the cache given by --cache, else the rule of --rule or gemmar's RULE, else the
defaults; and the K slices of tuning.split_k_rule); with --split, auto's tile at each number of K slices (SPLITS)
where its last wave leaves SMs idle (with the number that gives every program a share: stream-K); with --grid every candidate tile
(``tuning_cache.candidates``: the tuner's choices, and what the rule is fitted on); with --lomo, the tile of a rule
fitted with the shape's own model left out (``--analyse --rules_out`` writes those rules from a --grid run).
Ratios are fused time / torch.matmul's, as a user's loop sees them (``wall``: host time included) and with the
host's time hidden (``gpu``); medians of 5 trials (gemmar/tuner.py).
"""

import argparse
import datetime
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # gemmar and the lab (lab/README.md)

# The K slices --split times at shapes whose last wave leaves SMs idle (RunConfig.split_k; the rule: tuning.split_k_rule).
SPLITS = (1, 2, 3, 4, 6, 8, 12, 16)
# --programs: persistent programs per SM (two or more share an SM where their registers and shared memory fit, so
# one's loads overlap another's epilogue), each with the split rule for that many programs; at auto's tile and at
# the tiles below, by rows per rank, small enough in shared memory for two or more programs an SM.
PROGRAMS_PER_SM = (1, 2, 4)
PROGRAMS_TILES = {16: [(16, 32, 128, 4, 4, 8), (16, 32, 256, 4, 3, 8)],
                  512: [(64, 128, 64, 4, 3, 8), (64, 64, 128, 4, 3, 8)],
                  1 << 20: [(128, 128, 64, 4, 3, 8), (64, 128, 64, 4, 3, 8)]}

# (model, layer, TP, N = hidden size, K = the layer's whole input width, [M tokens per rank]); per-rank K = K / TP.
# Sizes from each model's published config (hidden_size, intermediate_size / moe_intermediate_size, heads x head
# dim). M: decode batches (1-128 tokens), prefill chunks (512-16384); an expert sees the tokens routed to it.
LAYERS = [
    ("Llama-3.1-8B", "o_proj", 2, 4096, 4096, [1, 2048]),
    ("Llama-3.1-8B", "down_proj", 2, 4096, 14336, [16, 8192]),
    ("Llama-3.1-8B", "down_proj", 4, 4096, 14336, [64, 512]),
    ("Llama-3.1-8B", "down_proj", 8, 4096, 14336, [128, 16384]),
    ("Llama-3.1-70B", "o_proj", 4, 8192, 8192, [1, 4096]),
    ("Llama-3.1-70B", "o_proj", 8, 8192, 8192, [64, 16384]),
    ("Llama-3.1-70B", "down_proj", 2, 8192, 28672, [512]),
    ("Llama-3.1-70B", "down_proj", 4, 8192, 28672, [16, 2048]),
    ("Llama-3.1-70B", "down_proj", 8, 8192, 28672, [128, 8192]),
    ("Llama-3.1-405B", "o_proj", 8, 16384, 16384, [1, 128, 2048]),
    ("Llama-3.1-405B", "down_proj", 8, 16384, 53248, [16, 512, 8192]),
    ("Qwen3-8B", "down_proj", 2, 4096, 12288, [1, 4096]),
    ("Qwen3-8B", "down_proj", 4, 4096, 12288, [64, 16384]),
    ("Qwen3-8B", "o_proj", 2, 4096, 4096, [256]),
    ("Qwen3-14B", "o_proj", 4, 5120, 5120, [16, 2048]),
    ("Qwen3-14B", "down_proj", 4, 5120, 17408, [1, 512]),
    ("Qwen3-14B", "down_proj", 8, 5120, 17408, [128, 8192]),
    ("Qwen3-32B", "o_proj", 8, 5120, 8192, [64, 4096]),
    ("Qwen3-32B", "down_proj", 8, 5120, 25600, [128, 2048]),
    ("Qwen3-32B", "down_proj", 4, 5120, 25600, [1, 16384]),
    ("Qwen3-32B", "down_proj", 2, 5120, 25600, [16]),
    ("Qwen2.5-32B", "down_proj", 8, 5120, 27648, [128, 1024]),
    ("Qwen3-30B-A3B", "expert down_proj", 2, 2048, 768, [16, 512]),
    ("Qwen3-30B-A3B", "expert down_proj", 4, 2048, 768, [128, 2048]),
    ("Qwen3-30B-A3B", "expert down_proj", 8, 2048, 768, [64, 1024]),
    ("Qwen3-30B-A3B", "o_proj", 4, 2048, 4096, [1, 8192]),
    ("Qwen3-235B-A22B", "expert down_proj", 4, 4096, 1536, [16, 256, 4096]),
    ("Qwen3-235B-A22B", "expert down_proj", 8, 4096, 1536, [64, 2048]),
    ("Qwen3-235B-A22B", "o_proj", 8, 4096, 8192, [1, 16384]),
    ("Mixtral-8x7B", "expert down_proj", 2, 4096, 14336, [256, 4096]),
    ("Mixtral-8x7B", "expert down_proj", 8, 4096, 14336, [32, 1024]),
    ("Mixtral-8x7B", "o_proj", 8, 4096, 4096, [1]),
    ("Mixtral-8x22B", "expert down_proj", 4, 6144, 16384, [64, 2048]),
    ("Mixtral-8x22B", "expert down_proj", 8, 6144, 16384, [16, 8192]),
    ("Mixtral-8x22B", "o_proj", 8, 6144, 6144, [1, 512]),
    ("DeepSeek-V3", "dense down_proj", 8, 7168, 18432, [1, 128, 4096]),
    ("DeepSeek-V3", "dense down_proj", 4, 7168, 18432, [16, 16384]),
    ("DeepSeek-V3", "o_proj", 8, 7168, 16384, [8, 2048]),
    ("DeepSeek-V3", "expert down_proj", 2, 7168, 2048, [64, 512]),
    ("DeepSeek-V3", "expert down_proj", 8, 7168, 2048, [32, 1024]),
]
SHAPES = [dict(model=model, layer=layer, tp=tp, m=m, n=n, k=k // tp)
          for model, layer, tp, n, k, ms in LAYERS for m in ms]
TARGETS = dict(median=1.02, worst=1.15, few_rows=1.10, few_rows_m=64)   # issue 60's, on auto's wall ratio


def write_whole(path, report):
    """The JSON written beside ``path`` and renamed over it: a run stopped while writing (its call's time limit)
    leaves the last whole file, which the next piece counts its shapes from."""
    with open(path + ".part", "w") as f:
        json.dump(report, f, indent=1)
    os.replace(path + ".part", path)


def shape_name(s):
    return f"{s['m']}x{s['n']}x{s['k']}"


def run(args):
    import torch
    import triton

    from gemmar.algorithms import builtin_names
    from gemmar import tuner
    from gemmar.config import waves
    from gemmar.runtime.backends import gpu_properties
    from gemmar.tuner import config_for, inputs, one_gpu_rank, tile_knobs, time_config, time_matmul
    from gemmar.tuning import GEMV_SOURCE, gemv_tile, tuned_defaults
    from gemmar.tuning_cache import TILE_KNOBS, candidates, choose, rule_from_json, rule_tile

    gpu, capability, sms = gpu_properties("cuda")
    family = "hopper" if tuple(capability) >= (9, 0) else "default"
    tuner.TRIALS = args.trials
    # Every other shape first: a run stopped by --max_seconds has still measured every model, at half the shapes.
    shapes = SHAPES[::2] + SHAPES[1::2]
    if args.shard:
        part, parts = (int(x) for x in args.shard.split("/"))
        shapes = shapes[part - 1::parts]
    if args.only:
        shapes = [s for s in shapes if shape_name(s) in args.only.split(",")]
    if args.max_m:
        shapes = [s for s in shapes if s["m"] <= args.max_m]
    if args.min_m:
        shapes = [s for s in shapes if s["m"] >= args.min_m]
    shapes = shapes[args.start:]
    lomo = json.load(open(args.lomo)) if args.lomo else None
    rule = rule_from_json(json.load(open(args.rule))) if args.rule else None
    cache = args.cache or os.path.join(os.path.dirname(os.path.abspath(args.out)), "no-tuning-cache.json")
    report = dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), gpu=gpu, sms=sms,
                  torch=torch.__version__, triton=triton.__version__, datatype=args.datatype,
                  command=" ".join(sys.argv), cache=args.cache, trials=args.trials, results=[])
    started = time.monotonic()
    with one_gpu_rank(8 << 30) as heap:
        for i, s in enumerate(shapes):
            if time.monotonic() - started > args.max_seconds:
                print(f"stopping at {args.max_seconds:.0f} s: {len(shapes) - i} shapes left", flush=True)
                report["stopped_early"] = len(shapes) - i
                break
            m, n, k = s["m"], s["n"], s["k"]
            A, B, ref = inputs(m, n, k, args.datatype, seed=i)
            mm = time_matmul(A, B)
            row = dict(s, matmul=mm, kernels={})
            for algorithm in () if args.auto_only else builtin_names():
                knobs = tuned_defaults("cuda", algorithm, capability, sms, shape=(m, n, k, 1), given={})
                row["kernels"][algorithm] = dict(time_config(heap, config_for(m, n, k, args.datatype, algorithm, knobs),
                                                             A, B, ref, mm["gpu_ms"]), tile=_tile_of(knobs))
            choice = choose(gpu, args.datatype, 1, (m, n, k), path=cache, rule=rule, sms=sms)
            if choice is not None:
                algorithm, tile, source = choice.algorithm, tuple(choice.tile[key] for key in TILE_KNOBS), choice.source
                if rule and not choice.cached:
                    source = f"the rule in {args.rule}"
            else:   # (no cache entry and no fitted rule: what the package runs today)
                knobs = tuned_defaults("cuda", "two_shot", capability, sms, shape=(m, n, k, 1), given={})
                algorithm, tile, source = "two_shot", tuple(knobs[key] for key in TILE_KNOBS), \
                    "the algorithm's measured tiles (no cache entry, no fitted rule)"
            knobs = tile_knobs(tile, sms, (m, n, k), algorithm, split_k=1 if args.no_split else None)
            # The few-rows kernel where the package runs it (tuning.tile_choice): up to GEMV_ROWS rows, unless a
            # cache entry says otherwise; --no_gemv: the tile GEMM there too.
            few_rows = None if args.no_gemv else gemv_tile(algorithm, family, (m, n, k, 1))
            if choice is not None and choice.cached:
                few_rows = tuple(tile) if choice.gemv and not args.no_gemv else None
            elif few_rows:
                tile, source = few_rows, GEMV_SOURCE
            if few_rows:
                knobs = tile_knobs(tile, sms, (m, n, k), algorithm, split_k=1 if args.no_split else None, gemv=True)
            row["auto"] = dict(time_config(heap, config_for(m, n, k, args.datatype, algorithm, knobs), A, B, ref,
                                           mm["gpu_ms"]),
                               algorithm=algorithm, tile=list(tile), split_k=knobs["split_k"], source=source,
                               gemv=bool(few_rows))
            steps = -(-k // tile[2])
            tiles = -(-m // tile[0]) * -(-n // tile[1])
            last_wave = waves(tiles, sms)[1]
            if args.split and few_rows:
                # (the few-rows kernel: one program per column tile and K slice, every tile cut alike)
                row["split_grid"] = [dict(time_config(heap, config_for(m, n, k, args.datatype, algorithm,
                                                                       dict(knobs, split_k=split)),
                                                      A, B, ref, mm["gpu_ms"]), split_k=split)
                                     for split in SPLITS if split <= steps]
            elif args.split and last_wave < sms:
                # (a last wave that leaves SMs idle: auto's tile with each number of K slices for its tiles, the
                # rule's included, and the number that gives every program a share (stream-K); where that wave
                # fills more than half the SMs, 2 is that number, and more only cut finer)
                splits = sorted({s for s in SPLITS if s <= steps and (2 * last_wave <= sms or s <= 2)} |
                                {min(-(-sms // last_wave), steps)})
                row["split_grid"] = [dict(time_config(heap, config_for(m, n, k, args.datatype, algorithm,
                                                                       tile_knobs(tile, sms, split_k=split)),
                                                      A, B, ref, mm["gpu_ms"]), split_k=split)
                                     for split in splits]
            if lomo:
                held = rule_tile((m, n, k), rule_from_json(lomo[s["model"]]), sms)
                row["lomo"] = dict(time_config(heap, config_for(m, n, k, args.datatype, "two_shot",
                                                                tile_knobs(held, sms, (m, n, k))), A, B, ref,
                                               mm["gpu_ms"]),
                                   tile=list(held))
            if args.grid:
                row["grid"] = [dict(time_config(heap, config_for(m, n, k, args.datatype, "two_shot",
                                                                 tile_knobs(t, sms)), A, B, ref, mm["gpu_ms"]),
                                    tile=list(t)) for t in candidates(m)]
            if args.programs:
                extra = next(small for rows, small in sorted(PROGRAMS_TILES.items()) if m <= rows)
                row["programs_grid"] = [
                    dict(time_config(heap, config_for(m, n, k, args.datatype, algorithm,
                                                      tile_knobs(t, per_sm * sms, (m, n, k), algorithm,
                                                                 split_k=1 if args.no_split else None)),
                                     A, B, ref, mm["gpu_ms"]), tile=list(t), per_sm=per_sm)
                    for t in dict.fromkeys([tuple(tile)] + extra) for per_sm in PROGRAMS_PER_SM
                    if (per_sm, t) != (1, tuple(tile))]
            if args.trace:
                row["trace"] = trace_shares(heap, m, n, k, args.datatype, tile, sms, A, B)
            row["matmul_after"] = time_matmul(A, B)   # (the denominator taken twice: its drift is the noise)
            del A, B, ref
            report["results"].append(row)
            print(line(row), flush=True)
            write_whole(args.out, report)
        if args.trace_worst:
            # Where the worst shapes' time goes: auto's tile traced once each (gemmar's own events).
            worst = sorted(report["results"], key=lambda row: -(ratio(row, row["auto"]) or 99))[:args.trace_worst]
            for row in worst:
                if time.monotonic() - started > args.max_seconds + 60:
                    break
                A, B, _ = inputs(row["m"], row["n"], row["k"], args.datatype)
                row["trace"] = trace_shares(heap, row["m"], row["n"], row["k"], args.datatype, tuple(row["auto"]["tile"]),
                                            sms, A, B)
                print(f"traced {shape_name(row)}: {row['trace']}", flush=True)
                del A, B
    report["seconds"] = round(time.monotonic() - started, 1)
    write_whole(args.out, report)
    print(f"wrote {args.out} ({report['seconds']} s)")
    analyse([args.out], None)


def _tile_of(knobs):
    return [knobs[k] for k in ("BLK_M", "BLK_N", "BLK_K", "num_warps", "num_stages", "gsize_m")]


def trace_shares(heap, m, n, k, datatype, tile, sms, A, B):
    """Where one traced launch's time goes (gemmar's own events): the share of the programs' busy time in the
    GEMM core and in the rest (publishing, flags, writing C), and the tail (the launch after its last GEMM tile)."""
    import numpy as np

    from gemmar.kernels import events
    from gemmar.runtime.launch import FusedGemmAllReduce
    from gemmar.tuner import config_for, tile_knobs

    config = config_for(m, n, k, datatype, "two_shot", dict(tile_knobs(tile, sms, (m, n, k)), trace=True))
    try:
        with heap.scope():
            fused = FusedGemmAllReduce(heap, config)
            fused.prepare(A, B)
            for _ in range(3):
                fused(A, B)
            rows, _ = fused.events(0)
    except Exception as e:  # noqa: BLE001 - a figure missing, said so
        return dict(error=f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}")
    col = {c: i for i, c in enumerate(events.COLUMNS)}
    groups = {p.kind_id: p.group for p in config.spec.phases}
    names = {p.kind_id: p.name for p in config.spec.phases}
    start, end = rows[:, col["t_start_ns"]], rows[:, col["t_end_ns"]]
    gemm = np.array([groups.get(int(x)) == "gemm" for x in rows[:, col["kind_id"]]])
    busy = float(np.sum(end - start))
    span = float(end.max() - start.min())
    return dict(span_us=span / 1e3, gemm_share=float(np.sum((end - start)[gemm])) / busy,
                other_share=float(np.sum((end - start)[~gemm])) / busy,
                tail_share=float(end.max() - end[gemm].max()) / span if gemm.any() else float("nan"),
                programs=int(len(set(rows[:, col["program"]].tolist()))),
                kinds={names.get(k, str(k)): float(np.sum((end - start)[rows[:, col["kind_id"]] == k])) / busy
                       for k in sorted(set(rows[:, col["kind_id"]].tolist()))})


def ratio(row, entry, how="wall"):
    """entry's time / torch.matmul's (the mean of the two matmul figures), or None where it was wrong or failed."""
    if not entry or not entry.get("ok"):
        return None
    key = f"{how}_ms"
    denominator = (row["matmul"][key] + row.get("matmul_after", row["matmul"])[key]) / 2
    return entry[key] / denominator


def line(row):
    parts = [f"{row['model']} {row['layer']} TP{row['tp']} {shape_name(row)}: matmul {row['matmul']['wall_ms'] * 1e3:.1f} us"]
    for name, entry in list(row["kernels"].items()) + [("auto", row["auto"])] + \
            ([("lomo", row["lomo"])] if "lomo" in row else []):
        r = ratio(row, entry)
        parts.append(f"{name} {r:.2f}x" if r else f"{name} {'WRONG' if 'rel_err' in entry else 'FAILED'}")
    if "grid" in row:
        best = [r for r in (ratio(row, g) for g in row["grid"]) if r]
        parts.append(f"best of grid {min(best):.2f}x" if best else "grid: none right")
    return ", ".join(parts)


def geomean(values):
    return math.exp(sum(map(math.log, values)) / len(values))


def figures(rows, pick):
    """Median, worst and M <= 64 worst of pick(row) ratios; how many were wrong or failed."""
    ratios = [(row, pick(row)) for row in rows]
    good = [r for _, r in ratios if r]
    few = [r for row, r in ratios if r and row["m"] <= TARGETS["few_rows_m"]]
    if not good:
        return dict(n=0, failed=len(ratios))
    good.sort()
    return dict(n=len(good), failed=len(ratios) - len(good), median=good[len(good) // 2] if len(good) % 2 else
                (good[len(good) // 2 - 1] + good[len(good) // 2]) / 2, worst=good[-1], few_rows_worst=max(few or [0]),
                geomean=geomean(good))


def grid_ratios(row, how="wall"):
    """{tile: ratio} of the grid's right tiles."""
    return {tuple(g["tile"]): ratio(row, g, how) for g in row.get("grid", []) if ratio(row, g, how)}


def analyse(paths, rules_out, how="wall"):
    """Figures against the targets, the heat maps, and (from --grid runs) the rule fitted on every model and the
    leave-one-model-out rules evaluated on the grid's own measurements."""
    from gemmar.tuning_cache import rule_tile, rule_to_json
    from lab.models.tile_rule import fit_rule, fit_wave_model, wave_rule   # (the repository root is on sys.path: above)

    reports = [json.load(open(p)) for p in paths]
    rows = [row for rep in reports for row in rep["results"]]
    head = reports[0]
    print(f"{len(rows)} shapes; {head['gpu']}, torch {head['torch']}, Triton {head['triton']}, {head['date']}; "
          f"ratios to torch.matmul ({how})")
    picks = {f"defaults {a}": (lambda a: lambda row: ratio(row, row["kernels"][a], how))(a)
             for a in rows[0]["kernels"] if all(a in row["kernels"] for row in rows)}
    picks["auto (" + rows[0]["auto"]["source"].split(" (")[0] + ")"] = lambda row: ratio(row, row["auto"], how)
    if all("lomo" in row for row in rows):
        picks["leave-one-model-out rule (timed)"] = lambda row: ratio(row, row["lomo"], how)
    summary = {}
    split_rows = [row for row in rows if row.get("split_grid")]
    if split_rows:
        def split_ratios(row):
            return {g["split_k"]: ratio(row, g, how) for g in row.get("split_grid", []) if ratio(row, g, how)}

        picks["auto's tile, best K slices per shape"] = lambda row: min(split_ratios(row).values(), default=None) \
            if row.get("split_grid") else ratio(row, row["auto"], how)
        picks["auto's tile, never split (split_k 1)"] = lambda row: split_ratios(row).get(1) \
            if row.get("split_grid") else ratio(row, row["auto"], how)
        print(f"K slices at the {len(split_rows)} shapes whose last wave leaves SMs idle "
              f"(auto's tile; ratio to matmul, {how}; * the rule's, + the best):")
        for row in split_rows:
            by_split = split_ratios(row)
            best = min(by_split, key=by_split.get) if by_split else None
            tile = row["auto"]["tile"]
            cells = " ".join(f"{k}:{r:.2f}{'*' if k == row['auto'].get('split_k') else ''}{'+' if k == best else ''}"
                             for k, r in sorted(by_split.items()))
            print(f"  {shape_name(row):>16} tiles {-(-row['m'] // tile[0]) * -(-row['n'] // tile[1]):>3} "
                  f"steps {-(-row['k'] // tile[2]):>3}  {cells}")
        # The split rule with other least steps a slice, least K a slice per row of the tile, and most whole waves
        # before the cut one, read off the same grid (each shape's ratio at the number of slices that rule gives;
        # the grid has every number up to 4, then 6, 8, 12, 16: the nearest below otherwise)
        from gemmar.tuning import (SPLIT_FILL_EVERY_PROGRAM, SPLIT_K_PER_ROW, SPLIT_MAX_WHOLE_WAVES, SPLIT_MIN_STEPS,
                                   SPLIT_WHEN_FILLS, split_k_rule)

        sms = head.get("sms", 132)
        shipped = (SPLIT_MIN_STEPS, SPLIT_MAX_WHOLE_WAVES, SPLIT_K_PER_ROW, SPLIT_WHEN_FILLS, SPLIT_FILL_EVERY_PROGRAM)
        variants = sorted({shipped} | {(steps, *shipped[1:]) for steps in (1, 2, 4, 8)} |
                          {(shipped[0], waves, *shipped[2:]) for waves in (0, 1, 2, 4, 64)} |
                          {(*shipped[:2], per_row, *shipped[3:]) for per_row in (0, 2, 4, 6, 8, 16)} |
                          {(*shipped[:3], fills, fill) for fills in (1, 2) for fill in (False, True)}) + [None]
        for variant in variants:
            picked = []
            for row in split_rows:
                by_split = split_ratios(row)
                split = 1 if variant is None else split_k_rule(row["auto"]["algorithm"], (row["m"], row["n"], row["k"], 1),
                                                               row["auto"]["tile"][:3], sms, *variant)
                known = [k for k in by_split if k <= split]
                if known:
                    picked.append(by_split[max(known)])
            if picked:
                name = "no split" if variant is None else \
                    f">= {variant[0]} steps and >= {variant[2]} x BLK_M of K a slice, <= {variant[1]} whole waves " \
                    f"before, the last wave at most 1/{variant[3]} full, {'every program' if variant[4] else 'whole slices'}"
                print(f"  split rule with {name}{' (shipped)' if variant == shipped else ''}"
                      f": geometric mean {geomean(picked):.4f}, worst {max(picked):.3f} over {len(picked)} shapes")
    programs_rows = [row for row in rows if row.get("programs_grid")]
    if programs_rows:
        def programs_ratios(row):
            timed = [((tuple(g["tile"]), g["per_sm"]), ratio(row, g, how)) for g in row["programs_grid"]]
            timed.append(((tuple(row["auto"]["tile"]), 1), ratio(row, row["auto"], how)))
            return {key: r for key, r in timed if r}

        picks["best of auto and the programs grid"] = lambda row: min(programs_ratios(row).values(), default=None) \
            if row.get("programs_grid") else ratio(row, row["auto"], how)
        print(f"programs per SM at {len(programs_rows)} shapes (ratio to matmul, {how}; auto first):")
        for row in programs_rows:
            by = programs_ratios(row)
            cells = " ".join(f"{t[0]}x{t[1]}x{t[2]}/{t[4]}s@{p}:{r:.2f}" for (t, p), r in
                             sorted(by.items(), key=lambda x: (x[0][0] != tuple(row["auto"]["tile"]), x[0])))
            print(f"  {shape_name(row):>16}  {cells}")
    if all("grid" in row for row in rows):
        picks["best of grid (per-shape tuning)"] = lambda row: min(grid_ratios(row, how).values(), default=None)
        sms = head.get("sms", 132)

        def shape(row):
            return row["m"], row["n"], row["k"]

        def fit(kept):
            """The rule fitted on ``kept`` rows: a tile a bucket up to 64 rows (on ``how``'s ratios), above them the
            wave model (fitted on GPU time, its physics: tuning_cache.predicted_us)."""
            buckets = fit_rule([(row["m"], grid_ratios(row, how)) for row in kept])
            model = fit_wave_model([(shape(row), {tuple(g["tile"]): g["gpu_ms"] * 1e3 for g in row["grid"]
                                                  if g.get("ok")}) for row in kept if row["m"] > 64], sms)
            return buckets, wave_rule(buckets, model)

        buckets, rule = fit(rows)
        picks["rule fitted on all models (from the grid)"] = \
            lambda row: grid_ratios(row, how).get(rule_tile(shape(row), buckets, sms))
        picks["wave rule fitted on all models (from the grid)"] = \
            lambda row: grid_ratios(row, how).get(rule_tile(shape(row), rule, sms))
        models = sorted({row["model"] for row in rows})
        lomo = {model: fit([row for row in rows if row["model"] != model]) for model in models}
        picks["leave-one-model-out rule (from the grid)"] = \
            lambda row: grid_ratios(row, how).get(rule_tile(shape(row), lomo[row["model"]][0], sms))
        picks["leave-one-model-out wave rule (from the grid)"] = \
            lambda row: grid_ratios(row, how).get(rule_tile(shape(row), lomo[row["model"]][1], sms))
        if rule_tile((1, 1, 1)) is not None:   # (gemmar's RULE as shipped, where it is not the fit above)
            picks["gemmar's RULE (from the grid)"] = lambda row: grid_ratios(row, how).get(rule_tile(shape(row), sms=sms))
        print(f"rule fitted on all models: {buckets}")
        summary["rule_all"] = rule_to_json(rule)
        summary["rules_lomo"] = {mdl: rule_to_json(r[1]) for mdl, r in lomo.items()}
        if rules_out:
            with open(rules_out, "w") as f:
                json.dump(summary["rules_lomo"], f, indent=1)
            with open(os.path.splitext(rules_out)[0] + "-all.json", "w") as f:
                json.dump(summary["rule_all"], f, indent=1)
            print(f"wrote {rules_out} (each model's rule fitted without it; --lomo) and "
                  f"{os.path.splitext(rules_out)[0]}-all.json (fitted on every model; --rule)")
    # (none: no right figure - wrong, failed, or for a rule read off the grid, its tile not measured at the shape)
    print(f"{'choice':<48} {'n':>3} {'none':>4} {'median':>7} {'worst':>7} {'M<=64 worst':>11} {'geomean':>7}")
    for name, pick in picks.items():
        f = figures(rows, pick)
        summary[name] = f
        if f["n"]:
            print(f"{name:<48} {f['n']:>3} {f['failed']:>4} {f['median']:>7.3f} {f['worst']:>7.3f} "
                  f"{f['few_rows_worst']:>11.3f} {f['geomean']:>7.3f}")
        else:
            print(f"{name:<48} none right")
    worst = sorted(((ratio(row, row["auto"], how) or float("inf"), row) for row in rows), key=lambda x: -x[0])[:10]
    print("the ten worst shapes for auto:")
    for r, row in worst:
        t = row.get("trace")
        where = (f"; GEMM core {100 * t['gemm_share']:.0f} %, publish/flags/C {100 * t['other_share']:.0f} % of "
                 f"busy time, tail {100 * t['tail_share']:.0f} % of {t['span_us']:.1f} us" if t and "gemm_share" in t
                 else "")
        print(f"  {r:.3f}x {row['model']} {row['layer']} TP{row['tp']} {shape_name(row)} tile {row['auto']['tile']}"
              f"{where}")
    base = os.path.splitext(paths[0])[0] + ("" if how == "wall" else f"-{how}")
    heat_map(rows, lambda row: ratio(row, row["auto"], how), f"auto / torch.matmul ({how}), {head['gpu']}",
             base + "-auto.png")
    if all("two_shot" in row["kernels"] for row in rows):
        heat_map(rows, lambda row: ratio(row, row["kernels"]["two_shot"], how),
                 f"two_shot with the earlier defaults / torch.matmul ({how}), {head['gpu']}", base + "-defaults.png")
    with open(base + "-summary.json", "w") as f:
        json.dump(summary, f, indent=1)
    print(f"wrote {base}-auto.png{', ' + base + '-defaults.png' if all('two_shot' in row['kernels'] for row in rows) else ''}, "
          f"{base}-summary.json")
    return summary


def heat_map(rows, pick, title, path):
    """Rows: M; columns: N x K_r, ordered by N x K_r; each cell the ratio (blank: not a swept shape)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    ms = sorted({row["m"] for row in rows})
    nks = sorted({(row["n"], row["k"]) for row in rows}, key=lambda nk: (nk[0] * nk[1], nk))
    grid = np.full((len(ms), len(nks)), np.nan)
    for row in rows:
        r = pick(row)
        grid[ms.index(row["m"]), nks.index((row["n"], row["k"]))] = r if r else 9.99
    fig, ax = plt.subplots(figsize=(max(8, 0.42 * len(nks) + 2), 0.45 * len(ms) + 2.2))
    image = ax.imshow(grid, cmap="RdYlGn_r", vmin=0.85, vmax=1.25, aspect="auto")
    for (i, j), value in np.ndenumerate(grid):
        if not np.isnan(value):
            ax.text(j, i, "bad" if value >= 9.99 else f"{value:.2f}", ha="center", va="center", fontsize=6.5)
    ax.set_xticks(range(len(nks)), [f"{n}x{k}" for n, k in nks], rotation=90, fontsize=7)
    ax.set_yticks(range(len(ms)), [str(m) for m in ms], fontsize=8)
    ax.set_xlabel("N x K per rank (ordered by N x K)")
    ax.set_ylabel("M (rows per rank)")
    ax.set_title(title, fontsize=10)
    fig.colorbar(image, ax=ax, label="time / torch.matmul's (lower is better)", shrink=0.8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def waves(sms=132):
    """No GPU, arithmetic only: with today's defaults (two_shot at world size 1 on Hopper), each shape's tile, tile
    count and how full the persistent grid's waves are (tiles / (waves x SMs)); a shape that leaves most SMs idle
    is where a smaller tile, or split-K, has the most to gain. A lead for the next GPU run, not a measurement."""
    from gemmar.tuning import tuned_defaults

    print(f"{'model':<16} {'layer':<17} {'TP':>2} {'M x N x K_r':>18} {'tile':>14} {'tiles':>6} {'waves':>5} {'fill':>5}")
    rows = []
    for s in SHAPES:
        knobs = tuned_defaults("cuda", "two_shot", (9, 0), sms, shape=(s["m"], s["n"], s["k"], 1), given={})
        tiles = -(-s["m"] // knobs["BLK_M"]) * -(-s["n"] // knobs["BLK_N"])
        w = -(-tiles // sms)
        rows.append((tiles / (w * sms), s, knobs, tiles, w))
    for fill, s, knobs, tiles, w in sorted(rows, key=lambda r: r[0]):
        print(f"{s['model']:<16} {s['layer']:<17} {s['tp']:>2} {shape_name(s):>18} "
              f"{knobs['BLK_M']}x{knobs['BLK_N']}x{knobs['BLK_K']:>3} {tiles:>6} {w:>5} {fill:>5.2f}")
    low = [r for r in rows if r[0] < 0.5]
    print(f"{len(low)} of {len(rows)} shapes fill less than half of {sms} SMs with today's tiles (arithmetic, not a "
          f"measurement)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", help="where the JSON goes (the heat maps go beside it)")
    parser.add_argument("--datatype", default="bf16", choices=("bf16", "fp16"))
    parser.add_argument("--grid", action="store_true", help="also time every candidate tile (what the rule is fitted on)")
    parser.add_argument("--cache", help="auto reads this tuning cache (default: none, so the rule answers)")
    parser.add_argument("--rule", help="auto takes this fitted rule ({most rows: tile or wave model}, from --analyse --rules_out: its -all.json) "
                                       "where the cache has no entry, instead of gemmar's RULE")
    parser.add_argument("--lomo", help="leave-one-model-out rules ({model: rule}, from --analyse --rules_out): time "
                                       "each shape with the rule fitted without its model")
    parser.add_argument("--split", action="store_true", help="at shapes whose last wave leaves SMs idle, also time "
                                                              "auto's tile with each number of K slices in SPLITS "
                                                              "and the one that fills every program")
    parser.add_argument("--no_split", action="store_true", help="auto never cuts K (split_k 1): the GEMM core alone, "
                                                                 "as before split-K")
    parser.add_argument("--no_gemv", action="store_true", help="auto runs the tile GEMM at every shape, never the "
                                                               "few-rows kernel (tuning.gemv_tile)")
    parser.add_argument("--programs", action="store_true", help="also time auto's tile and PROGRAMS_TILES at "
                                                                 "PROGRAMS_PER_SM programs per SM")
    parser.add_argument("--trace", action="store_true", help="also trace auto's tile once per shape (the shares)")
    parser.add_argument("--auto_only", action="store_true", help="time auto (and --lomo) alone, not every kernel's "
                                                                  "defaults (a second run, to confirm a fitted rule)")
    parser.add_argument("--trials", type=int, default=5, help="trials per figure, the median taken (default 5)")
    parser.add_argument("--trace_worst", type=int, default=0, help="then trace auto's tile at the N worst shapes")
    parser.add_argument("--shard", help="I/N: only every N-th shape from the I-th (to split the sweep over calls)")
    parser.add_argument("--only", help="MxNxK,...: only these shapes of SHAPES")
    parser.add_argument("--max_m", type=int, help="only the shapes with at most this many rows")
    parser.add_argument("--min_m", type=int, help="only the shapes with at least this many rows")
    parser.add_argument("--start", type=int, default=0, help="skip this many shapes (to go on after --max_seconds)")
    parser.add_argument("--max_seconds", type=float, default=540, help="stop (and write what was measured) after this")
    parser.add_argument("--analyse", nargs="+", metavar="JSON", help="no GPU: figures, fitted rules and heat maps of runs")
    parser.add_argument("--rules_out", help="with --analyse: write the leave-one-model-out rules here")
    parser.add_argument("--waves", action="store_true", help="no GPU: today's tiles' wave fill at every shape")
    parser.add_argument("--how", choices=("wall", "gpu"), default="wall", help="with --analyse: which time")
    args = parser.parse_args()
    if args.waves:
        waves()
    elif args.analyse:
        analyse(args.analyse, args.rules_out, args.how)
    elif args.out:
        run(args)
    else:
        parser.error("give OUT.json (a run on the GPU) or --analyse JSON...")


if __name__ == "__main__":
    main()
