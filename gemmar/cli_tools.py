"""The command line's smaller commands: ``gemmar allreduce`` (the standalone all-reduce, checked and timed),
``gemmar gantt`` (draw a saved trace) and ``gemmar run`` (a program, such as an Iris program, on every rank).
``cli.py`` holds ``main`` and ``gemmar bench``."""

import argparse
import math
import sys

from .config import BACKENDS, DTYPES
from .errors import UsageError
from .outputs import check_output_path, write_report, written_to
from .progress import ProgressBar
from .report import log
from .runtime import memory
from .runtime.allreduce import SCHEMES
from .runtime.backends import check_heap_fits, check_world_size, gpu_count, resolve_backend, shares_gpu
from .runtime.heap import size_text


def starting_line(backend, W):
    if shares_gpu(backend, W):
        return f"starting ranks 0..{W - 1} in one ipyparallel engine, sharing GPU 0 (fewer GPUs than ranks)"
    return f"starting {W} ipyparallel engine(s) as ranks 0..{W - 1}"


def _allreduce_parser(sub):
    p = sub.add_parser("allreduce", help="the standalone all-reduce on the symmetric heap, checked and timed",
                       description="All-reduce (sum) of seeded values on every rank, by two_shot's tile owners "
                                   "or one-shot (runtime/allreduce.py); every rank's result checked "
                                   "against the float64 sum and compared bit for bit across ranks. On GPUs it is "
                                   "timed, and with --baseline NCCL is timed on the same values.")
    p.add_argument("-r", "--num_ranks", type=int, default=2, help="ranks (default %(default)s)")
    p.add_argument("--backend", choices=BACKENDS, default="auto", help="cpu (interpreter), cuda, iris, auto")
    p.add_argument("--datatype", choices=list(DTYPES), default="bf16", help="dtype of the values (default %(default)s)")
    p.add_argument("--sizes", type=float, nargs="+", help="message sizes in MiB per rank (default: cpu 0.0625 "
                                                          "0.25, seconds under the interpreter; GPU 1 4 16 64 256)")
    p.add_argument("--comm_sms", type=int, help="programs per rank (default: cpu 2; GPU one per SM, the SMs shared "
                                                "among ranks sharing the GPU)")
    p.add_argument("--schemes", nargs="+", choices=(*SCHEMES, "auto"), default=list(SCHEMES),
                   help="two_shot (by tile owner), one_shot (every rank sums everything) and/or auto (one_shot "
                        "below 2 MiB with a GPU per rank, else two_shot); default two_shot one_shot")
    p.add_argument("--iterations", type=int, default=3, help="checked launches per size (default %(default)s)")
    p.add_argument("--reps", type=int, default=20, help="GPU: launches per timing, median of 5 (default %(default)s)")
    p.add_argument("--baseline", action="store_true", help="GPU, one per rank: also time NCCL's all_reduce "
                                                                 "(and torch's symmetric-memory two-shot)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds before a wait counts as a hang")
    p.add_argument("--output_file", help="write the figures as JSON here")
    p.set_defaults(func=cmd_allreduce)


def cmd_allreduce(args):
    from .cluster import Cluster
    from .runtime.allreduce import all_reduce_heap_bytes

    if args.output_file:
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
    if args.comm_sms is not None and not 1 <= args.comm_sms <= 4096:
        raise UsageError(f"--comm_sms {args.comm_sms} is not allowed: use 1 to 4096 programs per rank")
    if args.iterations < 1:
        raise UsageError(f"--iterations {args.iterations} is not allowed: use 1 or more launches")
    if args.baseline and (backend != "cuda" or shares_gpu(backend, args.num_ranks)):
        raise UsageError("--baseline times NCCL between GPUs: it needs the cuda backend and one GPU per rank")
    W = args.num_ranks
    heap_size = max(256 << 20, max(all_reduce_heap_bytes(n, DTYPES[args.datatype], backend) for n in numels))
    check_heap_fits(backend, W, heap_size)   # before the engines start (3000 MiB once tried ~19 GB)
    if backend == "cpu":
        # Each rank also holds its input and the float64 reference (built from every rank's input).
        need = W * (heap_size + max(numels) * (W * itemsize + 3 * 8))
        memory.check_fits(need, f"--sizes {max(sizes):g} MiB on {W} rank(s)", "use smaller sizes")
    timed = backend == "cuda"
    rows = []
    log("-", W, starting_line(backend, W))
    runs = [(size, scheme) for size in zip(sizes, numels) for scheme in args.schemes]
    bar = ProgressBar(len(runs) * args.iterations, label="checked launches ")
    with Cluster(world_size=W, backend=backend, heap_size=heap_size, timeout_s=args.timeout) as cluster:
        for i, ((mib, numel), scheme) in enumerate(runs):
            def progress(rank, data, i=i, what=f"{mib:g} MiB, {scheme}"):
                if rank == 0:
                    bar.update(i * args.iterations + data["iteration"], what)

            bar.update(i * args.iterations, f"{mib:g} MiB, {scheme}")
            f = cluster.all_reduce(numel, args.datatype, args.comm_sms, args.iterations, reps=args.reps if timed else 0,
                                   baseline=args.baseline and scheme == args.schemes[0], scheme=scheme,
                                   on_progress=progress)
            bar.clear()
            line = allreduce_line(f, f"{mib:g} MiB {args.datatype} x {W} ranks", scheme, 2 * (W - 1) / W * numel * itemsize)
            log("-", W, line)
            rows.append(dict(mib=mib, **f))
    if args.output_file:
        write_report(args, W, backend=backend, results=rows)
    return 0 if all(r["ok"] for r in rows) else 1


def allreduce_line(f, what, scheme, bus_bytes):
    """One checked (and timed) all-reduce as a line; ``f`` gains ``speed_vs_best_baseline`` where it was timed
    against baselines (the figure issue 50 asks for: the speed against the best of them)."""
    ran = f["scheme"] if scheme != "auto" else f"{f['scheme']} (auto)"
    line = (f"{what}, {ran}: {'PASSED' if f['ok'] else 'FAILED'} max|out - sum| {f['max_abs_diff']:.3g} (tolerance "
            f"{f['tolerance']:.3g}), same bits on every rank: {'yes' if f['identical'] else 'NO'}")
    names = {"nccl_ms": "NCCL", "torch_symm_mem_ms": "torch symm_mem two-shot",
             "torch_symm_mem_one_shot_ms": "torch symm_mem one-shot"}
    for key, name in {"gemmar_ms": f"gemmar {f['scheme']}", **names}.items():
        if key in f:   # bus bytes per rank, in MB: GB/s = MB / ms
            line += f" | {name} {f[key]:.3f} ms ({bus_bytes / 1e6 / f[key]:.0f} GB/s bus)"
    baselines = {name: f[key] for key, name in names.items() if key in f}
    if baselines and "gemmar_ms" in f:
        best = min(baselines, key=baselines.get)
        f["speed_vs_best_baseline"] = baselines[best] / f["gemmar_ms"]
        line += f" | {f['speed_vs_best_baseline']:.2f}x the speed of the best baseline ({best})"
    return line


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
    from .analysis.trace import Trace

    if not args.output.lower().endswith((".png", ".svg")):
        raise UsageError(f"--output {args.output} must end in .png or .svg")
    for flag, path in (("--output", args.output), ("--perfetto", args.perfetto), ("--tile_grid", args.tile_grid)):
        if path:
            check_output_path(flag, path)
    trace = Trace.load(args.trace)
    with written_to(args.output):
        trace.gantt(iteration=args.iteration, max_lanes=args.max_lanes, path=args.output)
    print(f"[gemmar] wrote {args.output}: {trace}")
    print(trace.summary(args.iteration).round(2).to_string())
    if args.tile_grid:
        with written_to(args.tile_grid):
            trace.tile_grid(iteration=args.iteration, path=args.tile_grid)
        print(f"[gemmar] wrote {args.tile_grid}")
    if args.perfetto:
        with written_to(args.perfetto):
            trace.to_perfetto(args.perfetto)
        print(f"[gemmar] wrote {args.perfetto} (open it at ui.perfetto.dev)")
    return 0


def _heap_bytes(text):
    """'1073741824', '1G', '512M', '64K' (binary units) -> bytes."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    scale = units.get(text[-1:].upper(), 1)
    digits = text[:-1] if scale > 1 else text
    if not digits.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a size: give bytes, or a number with K, M or G")
    return int(digits) * scale


def _run_parser(sub):
    p = sub.add_parser("run", help="run a Python program (an Iris program, unchanged) on every rank, like mpirun",
                       description="gemmar run -r N SCRIPT ARGS is `mpirun -np N python SCRIPT ARGS` for Iris "
                                   "programs: every rank runs SCRIPT in its own ipyparallel engine, `import iris` "
                                   "gives gemmar's Iris-compatible module over the rank's symmetric heap, output "
                                   "comes back line by line tagged [rank r/N]. On cpu, kernels run under the Triton "
                                   "interpreter and CUDA host calls (device=\"cuda\", synchronize, streams, events) "
                                   "run as their CPU equivalents.",
                       epilog="Exit status: 0 when every rank exits 0; otherwise the first failed rank's exit code "
                              "(a killed rank: 128 + its signal), after one line naming each failed rank and how; "
                              "3 when a rank is still running at the deadline (it is named and stopped); 2 for bad "
                              "arguments; 1 when --sanitize found a race. When a rank fails, the others get 5 s to end before they are stopped.")
    p.add_argument("-r", "--num_ranks", type=int, default=2, help="ranks = processes (default %(default)s)")
    p.add_argument("--backend", choices=("auto", "cpu", "cuda"), default="auto",
                   help="cpu (Triton interpreter, shared memory) or cuda (a GPU per rank, or ranks sharing GPU 0 "
                        "in separate processes); auto: cuda when there is an NVIDIA GPU, else cpu")
    p.add_argument("--timeout", type=float, default=600.0,
                   help="seconds before ranks still running are named and stopped, exit 3 (default %(default)g)")
    p.add_argument("--heap_size", type=_heap_bytes, default=1 << 30,
                   help="symmetric heap per rank, bytes or with K/M/G (default 1G); a program's iris.iris(size) "
                        "gets this heap")
    p.add_argument("--replace_iris", action="store_true",
                   help="use gemmar's iris module even where a real Iris is installed")
    p.add_argument("--sanitize", action="store_true",
                   help="(cpu) record every heap access of the program's kernels and report races across ranks "
                        "and programs, and accesses outside their buffer (docs/sanitizer.md); exit 1 on a race")
    p.add_argument("script", help="the Python program each rank runs")
    p.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    p.set_defaults(func=cmd_run)


def cmd_run(args):
    import os
    import time

    from .cluster import Cluster

    check_world_size(args.num_ranks)
    if not os.path.isfile(args.script):
        raise UsageError(f"{args.script}: no such program file")
    if not 0 < args.timeout <= 86400:
        raise UsageError(f"--timeout {args.timeout:g}: use seconds from 0 to 86400")
    if not args.replace_iris:   # (the ranks would refuse too, each one; this says it once, before any work)
        from .iris.rank import refuse_installed_iris

        refuse_installed_iris()
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
        result = cluster.run_script(args.script, *args.args, timeout=args.timeout, replace_iris=args.replace_iris,
                                    sanitize=args.sanitize)
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
