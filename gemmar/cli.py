"""``gemmar`` command line. ``gemmar gantt`` draws a saved trace. ``gemmar bench`` takes the flags of Iris's GEMM + all-reduce benchmark.py where
the meaning is the same, plus ``--algorithm``, ``--backend``, ``--iterations`` and ``-t/--trace_tiles``.

Exit codes: 0 success, 1 a check failed (C differs from the reference), 2 bad arguments,
3 a deadlock or a dead rank.
"""

import argparse
import datetime
import json
import platform
import sys

from .config import ALGORITHMS, BACKENDS, DTYPES, RunConfig
from .errors import ClusterError, DeadlockError, GemmarError, RankDiedError, UsageError


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        # One line naming the problem, exit code 2 (argparse would print the whole usage first).
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _bench_parser(sub):
    p = sub.add_parser("bench", help="run the fused GEMM + all-reduce on ipyparallel ranks, check and time it",
                       description="Run the fused GEMM + all-reduce with K split over ranks. Every rank "
                                   "builds the same seeded A (M x K) and B (K x N) and keeps its K-slice.")
    d = RunConfig()
    p.add_argument("-m", type=int, default=d.m, help="rows of A and C (default %(default)s)")
    p.add_argument("-n", type=int, default=d.n, help="columns of B and C (default %(default)s)")
    p.add_argument("-k", type=int, default=d.k, help="the reduced dimension, split over ranks (default %(default)s)")
    p.add_argument("--datatype", choices=list(DTYPES), default=d.datatype, help="input dtype; accumulation is fp32")
    p.add_argument("--algorithm", choices=ALGORITHMS, default=d.algorithm, help="how partial tiles are reduced")
    p.add_argument("--BLK_M", type=int, default=d.BLK_M)
    p.add_argument("--BLK_N", type=int, default=d.BLK_N)
    p.add_argument("--BLK_K", type=int, default=d.BLK_K)
    p.add_argument("--gsize_m", type=int, default=d.gsize_m, help="GROUP_SIZE_M of the tile swizzle")
    p.add_argument("--num_sms", type=int, default=d.num_sms, help="persistent programs per rank")
    p.add_argument("--num_warps", type=int, default=d.num_warps, help="GPU only")
    p.add_argument("--num_stages", type=int, default=d.num_stages, help="GPU only")
    p.add_argument("-r", "--num_ranks", type=int, default=2, help="ranks = ipyparallel engines (default 2)")
    p.add_argument("--backend", choices=BACKENDS, default="auto", help="auto: cuda when GPUs are present, else cpu")
    p.add_argument("--iterations", type=int, default=1, help="back-to-back launches, each checked with -v")
    p.add_argument("-v", "--validate", action="store_true", help="check every rank's C after every iteration")
    p.add_argument("-b", "--benchmark", action="store_true", help="print timings")
    p.add_argument("-t", "--trace_tiles", action="store_true", help="record per-tile events on every rank")
    p.add_argument("--output_file", help="write a JSON report (and, with -t, <stem>.trace.json beside it)")
    p.add_argument("--timeout", type=float, default=60.0, help="watchdog on every spin-wait, seconds")
    p.add_argument("--heap_size", type=int, default=256 << 20, help="symmetric heap bytes per rank")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_bench)


def cmd_bench(args):
    from .cluster import Cluster, log

    config = RunConfig(m=args.m, n=args.n, k=args.k, datatype=args.datatype, algorithm=args.algorithm,
                       BLK_M=args.BLK_M, BLK_N=args.BLK_N, BLK_K=args.BLK_K, gsize_m=args.gsize_m,
                       num_sms=args.num_sms, world_size=args.num_ranks, iterations=args.iterations,
                       timeout_s=args.timeout, trace=args.trace_tiles, seed=args.seed, num_warps=args.num_warps,
                       num_stages=args.num_stages).validate()
    W = config.world_size
    log("-", W, f"starting {W} ipyparallel engine(s) as ranks 0..{W - 1}")
    with Cluster(world_size=W, backend=args.backend, heap_size=args.heap_size, timeout_s=args.timeout) as cluster:
        log("-", W, f"ranks up on backend {cluster.backend}: {cluster.info[0]['device']}, "
                    f"torch {cluster.info[0]['torch']}, triton {cluster.info[0]['triton']}")
        result = cluster.bench(config, validate=args.validate, verbose=True)
    seconds = result.seconds
    if args.benchmark:
        ordered = sorted(seconds)
        log("-", W, f"time per iteration (slowest rank): median {ordered[len(ordered) // 2] * 1e3:.3f} ms, "
                    f"min {ordered[0] * 1e3:.3f} ms over {len(seconds)} iteration(s)")
    success = result.ok if args.validate else True
    if args.validate:
        log("-", W, f"{'PASSED' if success else 'FAILED'}: max|C - ref| = {result.max_abs_diff:.3g} on all "
                    f"{W} ranks over {config.iterations} iteration(s)")
    if args.output_file:
        report = dict(args={k: v for k, v in vars(args).items() if k != "func"}, success=success,
                      validated=args.validate, max_abs_diff=result.max_abs_diff if args.validate else None,
                      seconds_per_iteration=seconds, backend=result.backend, ranks=result.info,
                      date=datetime.datetime.now().isoformat(timespec="seconds"), host=platform.node())
        with open(args.output_file, "w") as f:
            json.dump(report, f, indent=2)
        log("-", W, f"wrote {args.output_file}")
        if args.trace_tiles:
            path = trace_path_for(args.output_file)
            result.trace.save(path)
            log("-", W, f"wrote {path}")
    elif args.trace_tiles:
        result.trace.save("gemmar.trace.json")
        log("-", W, "wrote gemmar.trace.json")
    return 0 if success else 1


def _gantt_parser(sub):
    p = sub.add_parser("gantt", help="draw a saved trace: Gantt chart, tile grid, Perfetto JSON",
                       description="Draw a trace written by gemmar bench -t (or Trace.save).")
    p.add_argument("trace", help="a .trace.json (or .trace.json.gz) file")
    p.add_argument("-o", "--output", default="gantt.png", help="Gantt chart image, .png or .svg (default %(default)s)")
    p.add_argument("--perfetto", help="also write a Chrome/Perfetto trace JSON here (open at ui.perfetto.dev)")
    p.add_argument("--tile_grid", help="also draw the per-rank tile-grid heat maps here")
    p.add_argument("--iteration", type=int, default=-1, help="which iteration to draw (default: the last)")
    p.add_argument("--max_lanes", type=int, default=48, help="above this many lanes, draw per-rank aggregates")
    p.set_defaults(func=cmd_gantt)


def cmd_gantt(args):
    import matplotlib

    matplotlib.use("Agg")
    from .trace import Trace

    if not args.output.lower().endswith((".png", ".svg")):
        raise UsageError(f"--output {args.output} must end in .png or .svg")
    trace = Trace.load(args.trace)
    trace.gantt(iteration=args.iteration, max_lanes=args.max_lanes, path=args.output)
    print(f"[gemmar] wrote {args.output}: {trace}")
    print(trace.summary(args.iteration).round(2).to_string())
    if args.tile_grid:
        trace.tile_grid(iteration=args.iteration, path=args.tile_grid)
        print(f"[gemmar] wrote {args.tile_grid}")
    if args.perfetto:
        trace.to_perfetto(args.perfetto)
        print(f"[gemmar] wrote {args.perfetto} (open it at ui.perfetto.dev)")
    return 0


def trace_path_for(output_file):
    stem = output_file[:-5] if output_file.endswith(".json") else output_file
    return stem + ".trace.json"


def main(argv=None):
    parser = _Parser(prog="gemmar", description="Fused GEMM + all-reduce in Triton: run, check, trace.")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)
    _bench_parser(sub)
    _gantt_parser(sub)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.error("a command is required: bench or gantt")
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
