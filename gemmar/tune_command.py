"""``gemmar tune SHAPES... [--file FILE]``: time the candidate tiles of each per-rank shape on this machine's GPU
and write the fastest right one into the tuning cache (``tuning_cache``), which ``gemmar bench`` and the kernels'
defaults then read. A shape already in the cache is not tuned again (``--retune`` does)."""

import os

from .errors import UsageError
from .progress import ProgressBar
from .report import log


def cmd_tune(args):
    from . import tuning_cache

    shapes = [tuning_cache.parse_shape(text) for text in args.shapes]
    if args.file:
        shapes += tuning_cache.read_shapes_file(args.file)
    if not shapes:
        raise UsageError("no shapes to tune: give M x N x K per rank as MxNxK (e.g. 128x5120x3456), or --file FILE "
                         "with one a line")
    shapes = list(dict.fromkeys(shapes))
    import torch

    if not torch.cuda.is_available() or torch.version.hip is not None:
        raise UsageError("gemmar tune times the kernels on this machine's NVIDIA GPU, and there is none here "
                         "(torch.cuda.is_available() is False): run it where the kernels will run")
    path = os.path.abspath(args.cache or tuning_cache.default_cache_path())
    cached = tuning_cache.load_cache(path)   # (a bad cache file is refused before any work)
    from .runtime.backends import gpu_properties
    from .tuner import heap_bytes_for, one_gpu_rank, tune_shape
    from .tuning import gemv_tile, tuned_defaults
    from .tuning_cache import TILE_KNOBS

    gpu, capability, sms = gpu_properties("cuda")
    family = "hopper" if tuple(capability) >= (9, 0) else "default"
    todo = [s for s in shapes if args.retune or
            tuning_cache.cache_key(gpu, args.datatype, 1, s) not in cached]
    for s in shapes:
        if s not in todo:
            entry = cached[tuning_cache.cache_key(gpu, args.datatype, 1, s)]
            log("-", 1, f"{'x'.join(map(str, s))}: in the cache already ({_tile_text(entry['tile'])}); --retune "
                        f"times it again")
    if not todo:
        return 0
    log("-", 1, f"tuning {len(todo)} shape(s) on {gpu} ({args.datatype}, world size 1); the cache: {path}")
    bar = ProgressBar(sum(len(tuning_cache.candidates(m)) + 2 + bool(gemv_tile("two_shot", family, (m, n, k, 1)))
                      for m, n, k in todo), label="tiles timed ")
    done, failed = 0, []
    with one_gpu_rank(heap_bytes_for(todo, args.datatype)) as heap:
        for shape in todo:
            name = "x".join(map(str, shape))
            bar.update(done, name)
            today = tuned_defaults("cuda", "two_shot", capability, sms, shape=(*shape, 1), gpu=gpu,
                                   datatype=args.datatype)
            entry, tried, matmul = tune_shape(heap, shape, args.datatype, gpu, sms, first=[today[k] for k in TILE_KNOBS],
                                              gemv=gemv_tile("two_shot", family, (*shape, 1)),
                                              on_tile=lambda i, name=name: bar.update(done + i, name))
            done += len(tried)
            bar.clear()
            if entry is None:
                failed.append(name)
                log("-", 1, f"{name}: no tile gave the right C ({'; '.join(t.get('error', 'wrong') for t in tried)[:300]})")
                continue
            tuning_cache.save_cache([entry], path)   # (after every shape: an interrupted run keeps what it timed)
            log("-", 1, f"{name}: {_tile_text(entry['tile'])}{' (the few-rows kernel)' if entry.get('gemv') else ''}, "
                        f"{entry['ms'] * 1e3:.1f} us, torch.matmul "
                        f"{entry['matmul_ms'] * 1e3:.1f} us ({entry['ms'] / entry['matmul_ms']:.2f}x); "
                        f"{len(tried)} tiles timed")
    bar.update(bar.total)
    log("-", 1, f"wrote {len(todo) - len(failed)} entr{'y' if len(todo) - len(failed) == 1 else 'ies'} to {path}; "
                f"gemmar bench and the kernels' defaults read it (GEMMAR_TUNING_CACHE={path} elsewhere)")
    return 1 if failed else 0


def _tile_text(tile):
    return (f"{tile['BLK_M']}x{tile['BLK_N']}x{tile['BLK_K']} tiles, {tile['num_warps']} warps, "
            f"{tile['num_stages']} stages")


def tile_source_line(args, backend, config):
    """``gemmar bench``'s line saying which tile the run uses and where it came from: the command line, the tuning
    cache (which file), the fitted rule, the algorithm's measured tile, or the cpu defaults."""
    from .runtime.backends import gpu_properties, shares_gpu
    from .tuning import tile_choice
    from .tuning_cache import TILE_KNOBS

    tile = _tile_text({k: getattr(config, k) for k in TILE_KNOBS})
    given = [k for k in TILE_KNOBS if getattr(args, k, None) is not None]
    if backend != "cuda":
        source = "RunConfig's defaults for the interpreter (the cpu backend takes no tuned tile)"
    else:
        gpu, capability, _ = gpu_properties(backend)
        family = "hopper" if tuple(capability) >= (9, 0) else "default"
        W = args.num_ranks
        _, source, _ = tile_choice(config.algorithm, family, (args.m, args.n, -(-args.k // max(W, 1)), W), gpu,
                                   args.datatype, shares_gpu(backend, W), gemv=config.gemv)
    if given:
        source = f"{', '.join(given)} from the command line, the rest from {source}"
    split = ""
    if config.gemv:
        how = "--split_k" if args.split_k is not None else "tuning.gemv_split"
        split = (f"; the few-rows kernel (two_shot.one_rank_gemv{', --gemv' if getattr(args, 'gemv', None) else ''}): "
                 f"{config.num_sms} programs, one per column tile and K slice ({config.split_k} a tile: {how})")
    elif config.split_k > 1:
        cut, sharing = config.cut_tiles, config.k_sharing
        shares = f"{config.split_k} slices a tile" if sharing == cut * config.split_k else \
            f"shared by all {sharing} programs, across tiles: stream-K"
        split = (f"; K of {'each' if cut == config.tile_count else f'the last {cut}'} of {config.tile_count} tiles cut "
                 f"({shares}; split-K: {'--split_k' if args.split_k is not None else 'the rule for a last wave at most half full and a long K, tuning.split_k_rule'})")
    return f"{config.algorithm}: {tile}: from {source}{split}"
