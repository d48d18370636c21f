"""``gemmar`` command line: ``main`` and ``gemmar bench``, which takes the flags of Iris's GEMM + all-reduce
benchmark.py where the meaning is the same, plus ``--algorithm``, ``--backend``, ``--iterations`` and
``-t/--trace_tiles``. ``gemmar allreduce`` and ``gemmar gantt`` are in ``cli_tools.py``, what the commands
write in ``outputs.py``.

Exit codes: 0 success, 1 a check failed (C differs from the reference), 2 bad arguments,
3 a deadlock or a dead rank.
"""

import argparse
import sys

from .algorithms import builtin_names, get as get_algorithm
from .cli_tools import _allreduce_parser, _gantt_parser, _run_parser, starting_line
from .analysis.auto_rule import AUTO_RULE, choose_algorithm
from .config import BACKENDS, DTYPES, RunConfig
from .tuning import TUNED_KNOBS, reads_by_tma, tuned_defaults
from .errors import ClusterError, DeadlockError, GemmarError, RankDiedError, UsageError
from .outputs import DEFAULT_TRACE_FILE, check_output_path, iris_report, trace_path_for, write_report
from .analysis.plots import plural
from .report import log, print_figures
from .runtime.backends import check_heap_fits, gpu_count, gpu_properties, resolve_backend, shares_gpu
from .runtime.heap import size_text
from .runtime.launch import heap_bytes_needed


# Iris's benchmark flags that set AMD compiler knobs: accepted so that an Iris command line runs unchanged.
IRIS_AMD_ONLY = ("two_tiles", "waves_per_eu", "mfmaInstrSize", "kpack")


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        # One line naming the problem, exit code 2 (argparse would print the whole usage first).
        self.exit(2, f"{self.prog}: error: {message}{self._did_you_mean(message)} (see {self.prog} --help)\n")

    def _options(self):
        for action in self._actions:
            yield from action.option_strings
            if isinstance(action, argparse._SubParsersAction):
                for parser in action.choices.values():
                    yield from parser._options()

    def _did_you_mean(self, message):
        """For an unknown option that is a known one in another case or nearly (--blk_m: --BLK_M)."""
        import difflib

        if not message.startswith("unrecognized arguments:"):
            return ""
        known = sorted(set(self._options()))
        for word in message.split(":", 1)[1].split():
            if not word.startswith("-"):
                continue
            name = word.split("=")[0]
            same = [o for o in known if o.lower() == name.lower()] or difflib.get_close_matches(name, known, 1, 0.8)
            if same:
                return f" (did you mean {same[0]}?)"
        return ""


def _bench_parser(sub):
    p = sub.add_parser("bench", help="run the fused GEMM + all-reduce on ipyparallel ranks, check and time it",
                       description="Run the fused GEMM + all-reduce with K split over ranks. Every rank "
                                   "builds the same seeded A (M x K) and B (K x N) and keeps its K-slice.",
                       epilog="(tuned): left out, it is chosen for the device: on cpu 32/32/32 tiles and 4 "
                              "programs; on GPUs the algorithm's measured tile, one program per SM (shared out when "
                              "ranks share a GPU), and for two_shot and one_shot one communication program beside "
                              "each GEMM program on Hopper GPUs (untraced runs), otherwise as many as the shape's "
                              "reduction needs (tuning.split_programs). "
                              "(Iris): a flag of Iris's GEMM + all-reduce benchmark.py, taken with Iris's meaning. "
                              "(Iris, AMD) : accepted so that Iris command lines run, and said to mean nothing "
                              "here. Differences: no int8; --output_file is off unless given (Iris: log.json); "
                              "the report holds Iris's keys and gemmar's.")
    d = RunConfig()
    tuned = "default: tuned for the device (see \"(tuned)\" below)"
    p.add_argument("-m", type=int, default=d.m, help="(Iris) rows of A and C (default %(default)s)")
    p.add_argument("-n", type=int, default=d.n, help="(Iris) columns of B and C (default %(default)s)")
    p.add_argument("-k", type=int, default=d.k,
                   help="(Iris) the reduced dimension, split over ranks (default %(default)s)")
    p.add_argument("--datatype", choices=list(DTYPES), default=d.datatype,
                   help="(Iris) input dtype; accumulation is fp32")
    p.add_argument("--algorithm", choices=builtin_names() + ("auto",), default=d.algorithm,
                   help="how partial tiles are reduced (default %(default)s); auto: chosen by the measured "
                        "rule in docs/decisions.md (a fused kernel, or cuBLAS + NCCL where those measured faster), saying which "
                        "and why")
    p.add_argument("--BLK_M", type=int, help="(Iris) rows of a tile: a power of two from 16 to 256; " + tuned)
    p.add_argument("--BLK_N", type=int, help="(Iris) columns of a tile, as BLK_M")
    p.add_argument("--BLK_K", type=int, help="(Iris) the K step of a tile's GEMM, as BLK_M")
    p.add_argument("--gsize_m", type=int, help="(Iris) GROUP_SIZE_M of the tile swizzle (tuned)")
    p.add_argument("--num_sms", "--gemm_sms", dest="num_sms", type=int,
                   help="(Iris: --gemm_sms) persistent GEMM programs per rank (tuned)")
    p.add_argument("--comm_sms", type=int, help="(Iris) two_shot, one_shot: communication programs per rank, "
                                                "besides the GEMM's (tuned)")
    p.add_argument("--total_sms", type=int, help="(Iris) GEMM + communication programs per rank: two_shot takes "
                                                 "comm_sms = total_sms - gemm_sms (one_shot too); atomics and ring "
                                                 "have no communication programs")
    p.add_argument("-d", "--debug", action="store_true",
                   help="(Iris) print the compiled kernels' register and spill counts (GPU; the interpreter "
                        "compiles nothing)")
    for name in IRIS_AMD_ONLY:
        p.add_argument(f"--{name}", help="(Iris, AMD) an AMD compiler setting of Iris's benchmark; means "
                                         "nothing here")
    _add_run_flags(p)
    p.set_defaults(func=cmd_bench)


def _add_run_flags(p):
    """gemmar bench's flags about the run itself (dtypes, ranks, backend, checks, outputs)."""
    p.add_argument("--out_dtype", choices=list(DTYPES), help="dtype of C (default: fp32 for atomics and ring, "
                                                             "which sum in C; the input dtype for two_shot and "
                                                             "one_shot)")
    p.add_argument("--wire_dtype", choices=list(DTYPES), help="two_shot, one_shot: dtype of the partial tiles sent "
                                                              "between ranks (default: the input dtype)")
    p.add_argument("--num_warps", type=int, help="(Iris) GPU only: warps per program (tuned)")
    p.add_argument("--num_stages", type=int, help="(Iris) GPU only: software-pipeline stages (tuned)")
    p.add_argument("-r", "--num_ranks", type=int, default=2,
                   help="(Iris) ranks = ipyparallel engines; with more ranks than GPUs, one engine runs them all on GPU 0, "
                        "each on its own stream (default 2)")
    p.add_argument("--backend", choices=BACKENDS, default="auto",
                   help="auto: cuda when an NVIDIA GPU is present (shared by the ranks if there are fewer GPUs "
                        "than ranks), else cpu")
    p.add_argument("--iterations", type=int, default=1, help="back-to-back launches, each checked with -v")
    p.add_argument("-v", "--validate", action="store_true",
                   help="(Iris) check every rank's C after every iteration")
    p.add_argument("-b", "--benchmark", action="store_true", help="(Iris) print timings")
    p.add_argument("--baseline", action="store_true",
                   help="with -b on GPUs, one per rank: time every fused kernel, torch.matmul, the NCCL all-reduce "
                        "of C and the two in sequence, in one run, and print the ratios")
    p.add_argument("--reps", type=int, default=20, help="timed repetitions per measurement with --baseline")
    p.add_argument("-t", "--trace_tiles", action="store_true", help="(Iris) record per-tile events on every rank")
    p.add_argument("--output_file", help="(Iris) write a JSON report with Iris's keys and gemmar's (and, with -t, "
                                         "<stem>.trace.json beside it)")
    p.add_argument("--timeout", type=float, default=60.0, help="watchdog on every spin-wait, seconds")
    p.add_argument("--sanitize", action="store_true",
                   help="(cpu) record every heap access and report races across ranks and programs, and accesses "
                        "outside their buffer; exit 1 on a race (docs/sanitizer.md)")
    p.add_argument("--heap_size", type=int, help="(Iris) symmetric heap bytes per rank (default: what the run needs, "
                                                 "at least 256 MiB)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs, the same on every rank "
                                                        "(default %(default)s)")


def config_from_args(args, backend, algorithm=None):
    """The run's RunConfig; with ``algorithm`` (the --baseline comparison), the same run for that algorithm,
    leaving out the dtype flags it does not take."""
    strict, algorithm = algorithm is None, algorithm or args.algorithm
    _, capability, sms = gpu_properties(backend)
    if shares_gpu(backend, args.num_ranks):
        sms //= args.num_ranks   # the ranks' programs must all be resident on the one GPU at once
    k_rank = -(-args.k // max(args.num_ranks, 1))
    knobs = tuned_defaults(backend, algorithm, capability, sms, shape=(args.m, args.n, k_rank, args.num_ranks),
                           given={k: getattr(args, k) for k in TUNED_KNOBS}, trace=args.trace_tiles,
                           tma=reads_by_tma(args.n, args.k, args.num_ranks, args.datatype),
                           shared=shares_gpu(backend, args.num_ranks))
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
    log("-", W, starting_line(backend, W))
    figures = None
    heap_size = args.heap_size or max(256 << 20, max(heap_bytes_needed(config_from_args(args, backend, alg))
                                                     for alg in builtin_names()))
    with Cluster(world_size=W, backend=backend, heap_size=heap_size, timeout_s=args.timeout) as cluster:
        log("-", W, f"ranks up on backend {cluster.backend}: {cluster.info[0]['device']}, "
                    f"torch {cluster.info[0]['torch']}, triton {cluster.info[0]['triton']}")
        result = cluster.bench(config, validate=args.validate, verbose=True)
        if args.baseline:
            log("-", W, f"timing every fused kernel and the unfused baseline ({args.reps} reps, median of 5)")
            configs = {alg: config_from_args(args, backend, alg) for alg in builtin_names()}
            figures = cluster.compare_to_unfused(configs, reps=args.reps)
            print_figures(figures, configs, W)
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
    if args.output_file:
        check_output_path("--output_file", args.output_file)
        if args.trace_tiles:
            check_output_path("--output_file", trace_path_for(args.output_file))
    elif args.trace_tiles:
        check_output_path("-t (the trace, with no --output_file)", DEFAULT_TRACE_FILE)
    if args.iterations < 1:
        raise UsageError(f"--iterations {args.iterations} is not allowed: use 1 or more launches")


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
    trace_path = (trace_path_for(args.output_file) if args.output_file else DEFAULT_TRACE_FILE) \
        if args.trace_tiles else None
    if args.output_file:
        write_report(args, W, iris_report(args, config, median_ms, len(seconds), success, kernels),
                     success=success, validated=args.validate,
                     max_abs_diff=result.max_abs_diff if args.validate else None, seconds_per_iteration=seconds,
                     backend=result.backend, ranks=result.info, config=config.to_dict(), timings_ms=figures)
    if trace_path:
        result.trace.save(trace_path)
        log("-", W, f"wrote {trace_path}")
    return 0 if success else 1


def run_unfused(args, backend):
    """What --algorithm auto runs where cuBLAS + NCCL measured faster: torch.matmul and NCCL's all_reduce,
    in sequence and overlapped in row blocks, timed; the overlapped C checked against the reference."""
    from .cluster import Cluster, check_memory

    if args.output_file:
        check_output_path("--output_file", args.output_file)
    problem = config_from_args(args, backend, RunConfig.algorithm)   # (its shape and dtype only)
    W = problem.world_size
    check_memory(problem, W, backend)
    log("-", W, starting_line(backend, W))
    with Cluster(world_size=W, backend=backend, heap_size=256 << 20, timeout_s=args.timeout) as cluster:
        figures = cluster.compare_to_unfused({}, reps=args.reps, problem=problem)
    print_figures(figures, {}, W, problem)
    success = figures["overlap_max_abs_diff"] <= figures["overlap_tolerance"]
    log("-", W, f"{'PASSED' if success else 'FAILED'}: the overlapped path's max|C - ref| = "
                f"{figures['overlap_max_abs_diff']:.3g} (tolerance {figures['overlap_tolerance']:.3g})")
    if args.output_file:
        write_report(args, W, success=success, timings_ms=figures, config=problem.to_dict())
    return 0 if success else 1


def main(argv=None):
    parser = _Parser(prog="gemmar", description="Fused GEMM + all-reduce in Triton: run, check, trace.")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)
    _bench_parser(sub)
    _allreduce_parser(sub)
    _gantt_parser(sub)
    _run_parser(sub)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.error("a command is required: bench, allreduce, gantt or run")
    try:
        return args.func(args)
    except UsageError as e:
        print(f"gemmar: error: {e}", file=sys.stderr)
        return 2
    except (DeadlockError, RankDiedError) as e:
        print(f"gemmar: {type(e).__name__}: {e}", file=sys.stderr)
        return 3
    except (ClusterError, GemmarError) as e:
        print(f"gemmar: {type(e).__name__}: {e}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        print("gemmar: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
