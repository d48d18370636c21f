"""What each ``gemmar`` command does, once ``cli.py`` has read its words: ``gemmar bench`` (a fused kernel
on every rank, checked, timed, traced; ``--algorithm auto``), ``gemmar allreduce`` (the standalone all-reduce,
checked and timed), ``gemmar gantt`` (draw a saved trace) and ``gemmar run`` (a program, such as an Iris
program, on every rank). What the commands write is in ``outputs.py``."""

import math
import sys

from .algorithms import builtin_names, get as get_algorithm
from .analysis.auto_rule import AUTO_RULE, choose_algorithm
from .analysis.plots import plural
from .config import DTYPES, IRIS_AMD_ONLY, SPLIT_K_ALGORITHMS, AllReduceConfig, RunConfig
from .errors import UsageError
from .outputs import (DEFAULT_TRACE_FILE, check_output_path, iris_report, raise_if_not_written, trace_path_for,
                      write_report, write_whole)
from .progress import ProgressBar
from .report import log, print_figures
from .runtime.backends import (check_heap_fits, check_world_size, gpu_count, gpu_properties, resolve_backend,
                               shares_gpu)
from .runtime.heap import size_text
from .runtime.launch import heap_bytes_needed
from .tuning import TUNED_KNOBS, reads_by_tma, tuned_defaults
from .tune_command import tile_source_line


def starting_line(backend, W):
    if shares_gpu(backend, W):
        return f"starting ranks 0..{W - 1} in one ipyparallel engine, sharing GPU 0 (fewer GPUs than ranks)"
    return f"starting {W} ipyparallel engine(s) as ranks 0..{W - 1}"


def config_from_args(args, backend, algorithm=None):
    """The run's RunConfig; with ``algorithm`` (the --baseline comparison), the same run for that algorithm,
    leaving out the dtype flags it does not take."""
    strict, algorithm = algorithm is None, algorithm or args.algorithm
    gpu, capability, sms = gpu_properties(backend)
    if shares_gpu(backend, args.num_ranks):
        sms //= args.num_ranks   # the ranks' programs must all be resident on the one GPU at once
    k_rank = -(-args.k // max(args.num_ranks, 1))
    given = {k: getattr(args, k) for k in TUNED_KNOBS}
    if not strict and (algorithm not in SPLIT_K_ALGORITHMS or args.num_ranks != 1):
        given["gemv"] = False   # (a baseline or the heap's sizing for an algorithm the few-rows kernel is not)
    knobs = tuned_defaults(backend, algorithm, capability, sms, shape=(args.m, args.n, k_rank, args.num_ranks),
                           given=given, trace=args.trace_tiles,
                           tma=reads_by_tma(args.n, args.k, args.num_ranks, args.datatype),
                           shared=shares_gpu(backend, args.num_ranks), gpu=gpu, datatype=args.datatype)
    spec = get_algorithm(algorithm)
    if args.total_sms is not None and spec.comm_programs:
        comm = args.total_sms - knobs["num_sms"]
        if args.comm_sms is not None and args.comm_sms != comm:
            raise UsageError(f"--total_sms {args.total_sms} is not --gemm_sms {knobs['num_sms']} + --comm_sms "
                             f"{args.comm_sms}: give two of the three")
        if comm < 1:
            raise UsageError(f"--total_sms {args.total_sms} leaves no communication program beside "
                             f"{knobs['num_sms']} GEMM programs: use more than --gemm_sms")
        knobs["comm_sms"] = comm
    takes_dtypes = strict or spec.wire_dtype
    if not strict and (algorithm not in SPLIT_K_ALGORITHMS or args.num_ranks != 1 or
                       knobs["split_k"] > -(-args.k // knobs["BLK_K"])):
        # (a baseline or the heap's sizing: an algorithm without split-K, or whose tile has fewer K steps than the
        # slices asked for, cuts no K)
        knobs["split_k"] = 1
    return RunConfig(m=args.m, n=args.n, k=args.k, datatype=args.datatype, algorithm=algorithm,
                     world_size=args.num_ranks, iterations=args.iterations, timeout_s=args.timeout,
                     trace=args.trace_tiles, sanitize=args.sanitize, seed=args.seed, out_dtype=args.out_dtype if takes_dtypes else None,
                     wire_dtype=args.wire_dtype if takes_dtypes else None, **knobs).validate()


def choose_auto(backend, world_size, gpus, shape=None):
    """``--algorithm auto``: (algorithm or "unfused", why). With a GPU per rank and the per-rank ``shape``
    (M, N, K_r) known, the performance model's prediction for that shape, where the model reproduces the
    measured figures and the measured shape nearest this one (``analysis.model.choose``); otherwise the measured
    rule (``analysis.auto_rule.AUTO_RULE``, which knows the rows per rank where it was measured)."""
    from .analysis import model

    rule = choose_algorithm(backend, world_size, gpus)
    if rule == AUTO_RULE["gpus"] and shape is not None:
        return model.choose(shape, world_size) or choose_algorithm(backend, world_size, gpus, rows=shape[0])
    return rule


def cmd_bench(args):
    from .cluster import Cluster

    _check_args_before_work(args)
    backend = resolve_backend(args.backend, args.num_ranks) if 1 <= args.num_ranks <= 64 else "cpu"
    if args.algorithm == "auto":
        shape = (args.m, args.n, args.k // args.num_ranks) if args.k >= args.num_ranks >= 1 else None
        args.algorithm, why = choose_auto(backend, args.num_ranks, gpu_count(), shape)
        log("-", args.num_ranks, f"--algorithm auto: {args.algorithm}, because {why}")
        if args.algorithm == "unfused":
            return run_unfused(args, backend)
    if args.sanitize and backend != "cpu":
        raise UsageError(f"--sanitize is not allowed on the {backend} backend: the sanitizer watches kernels under the "
                         f"Triton interpreter; add --backend cpu")
    config = config_from_args(args, backend)
    W = config.world_size
    _check_config_before_work(args, backend, config)
    log("-", W, tile_source_line(args, backend, config))
    log("-", W, starting_line(backend, W))
    figures = None
    heap_size = args.heap_size or max(256 << 20, max(heap_bytes_needed(config_from_args(args, backend, alg))
                                                     for alg in builtin_names()))
    with Cluster(world_size=W, backend=backend, heap_size=heap_size, timeout_s=args.timeout) as cluster:
        log("-", W, f"ranks up on backend {cluster.backend}: {cluster.info[0]['device']}, "
                    f"torch {cluster.info[0]['torch']}, triton {cluster.info[0]['triton']}")
        result = cluster.bench(config, validate=args.validate, verbose=True, progress=True)
        if args.baseline:
            log("-", W, f"timing every fused kernel and the unfused baseline ({args.reps} reps, median of 5)")
            configs = {alg: config_from_args(args, backend, alg) for alg in builtin_names()}
            figures = cluster.compare_to_unfused(configs, reps=args.reps)
            print_figures(figures, configs)
    return _report_bench(args, config, result, figures)


def _check_args_before_work(args):
    """The flags that need no backend, checked before anything starts (one line each, exit 2)."""
    if args.baseline and not args.benchmark:
        raise UsageError("--baseline times against cuBLAS + NCCL: use it together with -b/--benchmark")
    if not 1 <= args.reps <= 100_000:
        raise UsageError(f"--reps {args.reps} is out of range: use 1 to 100000")
    if args.heap_size is not None and args.heap_size <= 0:
        raise UsageError(f"--heap_size {args.heap_size} is not allowed: give bytes per rank, or leave it out for "
                         f"what the run needs")
    if args.output_file is not None:
        check_output_path("--output_file", args.output_file)
        if args.trace_tiles:
            check_output_path("--output_file", trace_path_for(args.output_file))
    elif args.trace_tiles:
        check_output_path("-t (the trace, with no --output_file)", DEFAULT_TRACE_FILE)


def _check_config_before_work(args, backend, config):
    """The run's config against the machine, before the engines start; flags that mean nothing, said so."""
    from .cluster import check_memory

    W = config.world_size
    if args.baseline and backend != "cuda":
        raise UsageError(f"--baseline needs the cuda backend (NCCL and cuBLAS); this run's backend is {backend}")
    if args.baseline and shares_gpu(backend, args.num_ranks):
        raise UsageError(f"--baseline needs one GPU per rank (NCCL between GPUs); {args.num_ranks} ranks share "
                         f"this machine's GPU: time the fused kernels alone with -b")
    for name in IRIS_AMD_ONLY:
        if getattr(args, name) is not None:
            log("-", W, f"--{name} is an AMD compiler setting of Iris's benchmark: it means nothing here, ignored")
    if args.total_sms is not None and not config.spec.comm_programs:
        log("-", W, f"--total_sms means nothing for {config.algorithm}, which has no communication programs: "
                    f"ignored")
    check_memory(config, W, backend)   # before the engines start, and in words about the problem's size
    if args.heap_size is not None:
        check_heap_fits(backend, W, args.heap_size)   # (a size no run could use is said so first)
        needed = heap_bytes_needed(config)
        if args.heap_size < needed:
            raise UsageError(f"--heap_size {args.heap_size} is too small: this run needs {needed} bytes per rank "
                             f"({size_text(needed)}); give at least that, or leave it out")


def _report_bench(args, config, result, figures):
    """The verdict, timings, -d's register counts, the report and the trace; the exit code."""
    W, seconds = config.world_size, result.seconds
    median_ms = sorted(seconds)[len(seconds) // 2] * 1e3
    if args.benchmark:
        log("-", W, f"time per iteration (slowest rank): median {median_ms:.3f} ms, "
                    f"min {min(seconds) * 1e3:.3f} ms over {len(seconds)} iteration(s)")
    success = result.ok if args.validate else True
    if config.sanitize and not result.sanitizer.ok:
        success = False
    if args.validate:
        log("-", W, f"{'PASSED' if success else 'FAILED'}: max|C - ref| = {result.max_abs_diff:.3g} on all "
                    f"{plural(W, 'rank')} over {config.iterations} iteration(s)")
    else:
        log("-", W, f"ran {config.iterations} iteration(s) on {plural(W, 'rank')}; C was not checked (add -v to "
                    f"check it against torch after every iteration)")
    kernels = result.ranks[0].kernels
    if args.debug:
        if not kernels:
            log("-", W, f"-d: nothing compiled on the {result.backend} backend (the Triton interpreter runs the "
                        f"kernels as Python), so there are no register or spill counts")
        for k in kernels:
            log("-", W, f"-d: {k['kernel']}: {k['registers']} registers per thread, {k['spills']} spilled")
    trace_path = (trace_path_for(args.output_file) if args.output_file is not None else DEFAULT_TRACE_FILE) \
        if args.trace_tiles else None
    failures = []
    if args.output_file is not None:
        failures.append(write_report(args, W, iris_report(args, config, median_ms, len(seconds), success, kernels),
                                     success=success, validated=args.validate,
                                     max_abs_diff=result.max_abs_diff if args.validate else None,
                                     seconds_per_iteration=seconds, backend=result.backend, ranks=result.info,
                                     config=config.to_dict(), timings_ms=figures))
    if trace_path:
        failures.append(write_whole(trace_path, result.trace.save, "the trace"))
        if failures[-1] is None:
            log("-", W, f"wrote {trace_path}")
    return raise_if_not_written(failures, 0 if success else 1)


def run_unfused(args, backend):
    """What --algorithm auto runs where cuBLAS + NCCL measured faster: torch.matmul and NCCL's all_reduce,
    in sequence and overlapped in row blocks, timed; the overlapped C checked against the reference."""
    from .cluster import Cluster, check_memory

    if args.output_file is not None:
        check_output_path("--output_file", args.output_file)
    problem = config_from_args(args, backend, RunConfig.algorithm)   # (its shape and dtype only)
    W = problem.world_size
    check_memory(problem, W, backend)
    log("-", W, starting_line(backend, W))
    with Cluster(world_size=W, backend=backend, heap_size=256 << 20, timeout_s=args.timeout) as cluster:
        figures = cluster.compare_to_unfused({}, reps=args.reps, problem=problem)
    print_figures(figures, {}, problem)
    success = figures["overlap_max_abs_diff"] <= figures["overlap_tolerance"]
    log("-", W, f"{'PASSED' if success else 'FAILED'}: the overlapped path's max|C - ref| = "
                f"{figures['overlap_max_abs_diff']:.3g} (tolerance {figures['overlap_tolerance']:.3g})")
    if args.output_file is not None:
        return raise_if_not_written([write_report(args, W, success=success, timings_ms=figures,
                                                  config=problem.to_dict())], 0 if success else 1)
    return 0 if success else 1


def cmd_allreduce(args):
    from .cluster import Cluster
    from .runtime.allreduce import all_reduce_heap_bytes, check_all_reduce_fits

    if args.output_file is not None:
        check_output_path("--output_file", args.output_file)
    check_world_size(args.num_ranks)
    backend = resolve_backend(args.backend, args.num_ranks)
    sizes = args.sizes or ([1, 4, 16, 64, 256] if backend == "cuda" else [0.0625, 0.25])   # (cpu: seconds)
    itemsize = DTYPES[args.datatype].itemsize
    numels = []
    for mib in sizes:
        numel = int(mib * 2 ** 20) // itemsize if math.isfinite(mib) else 0
        if not 1 <= numel <= 2 ** 34:
            raise UsageError(f"--sizes {mib:g}: use message sizes from {itemsize / 2 ** 20:.2g} MiB (one value) "
                             f"to {2 ** 34 * itemsize / 2 ** 20:g} MiB")
        numels.append(numel)
    timed = backend == "cuda"
    runs = [(mib, AllReduceConfig(numel, args.datatype, args.comm_sms, args.iterations, timeout_s=args.timeout,
                                  reps=args.reps if timed else 0, baseline=args.baseline and scheme == args.schemes[0],
                                  scheme=scheme).validate())
            for mib, numel in zip(sizes, numels) for scheme in args.schemes]
    if args.baseline and (backend != "cuda" or shares_gpu(backend, args.num_ranks)):
        raise UsageError("--baseline times NCCL between GPUs: it needs the cuda backend and one GPU per rank")
    W = args.num_ranks
    heap_size = max(256 << 20, max(all_reduce_heap_bytes(n, DTYPES[args.datatype], backend) for n in numels))
    check_heap_fits(backend, W, heap_size)   # before the engines start (3000 MiB once tried ~19 GB)
    check_all_reduce_fits(max(numels), DTYPES[args.datatype], backend, W, heap_size)
    rows = []
    log("-", W, starting_line(backend, W))
    bar = ProgressBar(len(runs) * args.iterations, label="checked launches ")
    with Cluster(world_size=W, backend=backend, heap_size=heap_size, timeout_s=args.timeout) as cluster:
        for i, (mib, config) in enumerate(runs):
            def progress(rank, data, i=i, what=f"{mib:g} MiB, {config.scheme}"):
                if rank == 0:
                    bar.update(i * args.iterations + data["iteration"], what)

            bar.update(i * args.iterations, f"{mib:g} MiB, {config.scheme}")
            f = cluster.all_reduce(config, on_progress=progress)
            bar.clear()
            line = allreduce_line(f, f"{mib:g} MiB {args.datatype} x {W} ranks", config.scheme,
                                  2 * (W - 1) / W * config.numel * itemsize, W)
            log("-", W, line)
            rows.append(dict(mib=mib, **f))
    verdict = 0 if all(r["ok"] for r in rows) else 1
    if args.output_file is not None:
        return raise_if_not_written([write_report(args, W, backend=backend, results=rows)], verdict)
    return verdict


def allreduce_line(f, what, scheme, bus_bytes, world_size):
    """One checked (and timed) all-reduce as a line; ``f`` gains ``speed_vs_best_baseline`` where it was timed
    against baselines (the figure issue 50 asks for: the speed against the best of them). At one rank NCCL
    returns without touching the buffer, so it is shown but is no baseline there (gemmar and torch symmetric
    memory both copy the values in and out)."""
    ran = f["scheme"] if scheme != "auto" else f"{f['scheme']} (auto)"
    line = (f"{what}, {ran}: {'PASSED' if f['ok'] else 'FAILED'} max|out - sum| {f['max_abs_diff']:.3g} (tolerance "
            f"{f['tolerance']:.3g}), same bits on every rank: {'yes' if f['identical'] else 'NO'}")
    names = {"nccl_ms": "NCCL", "torch_symm_mem_ms": "torch symm_mem two-shot",
             "torch_symm_mem_one_shot_ms": "torch symm_mem one-shot"}
    for key, name in {"gemmar_ms": f"gemmar {f['scheme']}", **names}.items():
        if key in f:   # bus bytes per rank, in MB: GB/s = MB / ms
            line += f" | {name} {f[key]:.3f} ms ({bus_bytes / 1e6 / f[key]:.0f} GB/s bus)"
    baselines = {name: f[key] for key, name in names.items() if key in f and (world_size > 1 or key != "nccl_ms")}
    if baselines and "gemmar_ms" in f:
        best = min(baselines, key=baselines.get)
        f["speed_vs_best_baseline"] = baselines[best] / f["gemmar_ms"]
        line += f" | {f['speed_vs_best_baseline']:.2f}x the speed of the best baseline ({best})"
    return line


def cmd_gantt(args):
    import matplotlib

    matplotlib.use("Agg")
    from .analysis.trace import Trace

    if not args.output.lower().endswith((".png", ".svg")):
        raise UsageError(f"--output {args.output} must end in .png or .svg")
    for flag, path in (("--output", args.output), ("--perfetto", args.perfetto), ("--tile_grid", args.tile_grid)):
        if path is not None:
            check_output_path(flag, path)
    trace = Trace.load(args.trace)
    kept = f"the trace is still at {args.trace}"
    failures = [write_whole(args.output, lambda path: trace.gantt(iteration=args.iteration, max_lanes=args.max_lanes,
                                                                  path=path), "the Gantt chart", kept)]
    if failures[-1] is None:
        print(f"[gemmar] wrote {args.output}: {trace}")
    print(trace.summary(args.iteration).round(2).to_string())
    if args.tile_grid is not None:
        failures.append(write_whole(args.tile_grid, lambda path: trace.tile_grid(iteration=args.iteration, path=path),
                                    "the tile grid", kept))
        if failures[-1] is None:
            print(f"[gemmar] wrote {args.tile_grid}")
    if args.perfetto is not None:
        failures.append(write_whole(args.perfetto, trace.to_perfetto, "the Perfetto trace", kept))
        if failures[-1] is None:
            print(f"[gemmar] wrote {args.perfetto} (open it at ui.perfetto.dev)")
    return raise_if_not_written(failures, 0)


def cmd_run(args):
    import os
    import time

    from .cluster import Cluster

    check_world_size(args.num_ranks)
    if not os.path.isfile(args.script):
        raise UsageError(f"{args.script}: no such program file")
    if not 0 < args.timeout <= 86400:
        raise UsageError(f"--timeout {args.timeout:g}: use seconds from 0 to 86400")
    from .programs import hooks

    if getattr(args, "hook_error", None):
        raise UsageError(args.hook_error)
    hook_options = hooks.given(args)
    hooks.plans(hook_options)   # (a bad --iris is one line here, before any engine starts)
    backend = resolve_backend(args.backend, args.num_ranks)
    if args.sanitize and backend != "cpu":
        raise UsageError(f"--sanitize is not allowed on the {backend} backend: the sanitizer watches kernels under the "
                         f"Triton interpreter; add --backend cpu")
    check_heap_fits(backend, args.num_ranks, args.heap_size)
    W = args.num_ranks
    start = time.monotonic()
    where = f"starting {W} ipyparallel engine(s) as ranks 0..{W - 1}"
    if shares_gpu(backend, W):
        where += (f", sharing GPU 0 ({gpu_count()} GPU(s) here): a process per rank, whose kernels take turns on "
                  f"the GPU, so a wait for another rank lasts until the GPU switches to it")
    log("-", W, f"{where}, backend {backend}, heap {size_text(args.heap_size)} per rank")
    with Cluster(world_size=W, backend=backend, heap_size=args.heap_size, timeout_s=max(10.0, args.timeout),
                 process_per_rank=True) as cluster:
        result = cluster.run_script(args.script, *args.args, timeout=args.timeout, sanitize=args.sanitize,
                                    **hook_options)
    seconds = time.monotonic() - start
    if result.ok:
        log("-", W, f"every rank exited 0 ({seconds:.1f} s)")
    else:
        print(f"gemmar run: {'; '.join(result.failure_lines())}", file=sys.stderr, flush=True)
    if result.ok and result.sanitizer is not None and not result.sanitizer.ok:
        print(f"gemmar run: the sanitizer found {len(result.sanitizer.races)} race(s), above", file=sys.stderr,
              flush=True)
        return 1
    return result.exit_code
