"""The ``gemmar`` command line's words: ``main``, and each command's arguments (``gemmar bench`` takes the
flags of Iris's GEMM + all-reduce benchmark.py where the meaning is the same, plus ``--algorithm``,
``--backend``, ``--iterations`` and ``-t/--trace_tiles``), every refusal one line with exit code 2. What each
command then does is in ``commands.py``.

Exit codes (docs/cli.md): 0 success, 1 a check failed (C differs from the reference) or a race was found
(``--sanitize``), 2 bad arguments, 3 a deadlock, a dead rank or a deadline, 4 the run passed but a file it was asked
to write could not be written (``outputs.py``; the line says where its results are), 130 after Ctrl-C
(``interrupts.py``). ``gemmar run`` exits with the first failed rank's code.
"""

import argparse
import sys

from .algorithms import builtin_names
from .config import BACKENDS, DTYPES, IRIS_AMD_ONLY, SCHEMES, RunConfig
from .errors import ClusterError, DeadlockError, GemmarError, RankDiedError, UsageError
from .outputs import OutputNotWritten
from .tune_command import cmd_tune


def _command(name):
    """A command of commands.py, imported when it runs: parsing the arguments (and refusing a bad one) needs
    none of torch, Triton or ipyparallel, which take seconds to import (issue 61)."""
    def command(args):
        from . import commands

        return getattr(commands, name)(args)

    command.__name__ = name
    return command


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
    p.add_argument("--split_k", type=int, help="two_shot, one_shot at 1 rank: cut the K of each tile of the last "
                                               "wave into this many slices, each a program's work (with more "
                                               "slices than programs, every program gets an equal share across "
                                               "tiles: stream-K); the tiles before it run whole (default 1 on cpu; "
                                               "on GPUs tuned for a last wave at most half full and a long K)")
    p.add_argument("--gemv", action=argparse.BooleanOptionalAction,
                   help="two_shot, one_shot at 1 rank: the few-rows kernel (all of M in one row of tiles, one program "
                        "per column tile and K slice, not persistent; needs BLK_M >= M, takes no --num_sms or "
                        "--comm_sms); default: on Hopper GPUs up to 64 rows where the tuning cache holds no entry for "
                        "the shape (tuning.gemv_tile), else off")
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
    p.set_defaults(func=_command("cmd_bench"))


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
    p.set_defaults(func=_command("cmd_allreduce"))


def _gantt_parser(sub):
    p = sub.add_parser("gantt", help="draw a saved trace: Gantt chart, tile grid, Perfetto JSON",
                       description="Draw a trace written by gemmar bench -t (or Trace.save).")
    p.add_argument("trace", help="a .trace.json (or .trace.json.gz) file")
    p.add_argument("-o", "--output", default="gantt.png", help="Gantt chart image, .png or .svg (default %(default)s)")
    p.add_argument("--perfetto", help="also write a Chrome/Perfetto trace JSON here (open at ui.perfetto.dev)")
    p.add_argument("--tile_grid", help="also draw the per-rank tile-grid heat maps here")
    p.add_argument("--iteration", type=int, default=-1, help="which iteration to draw (default: the last)")
    p.add_argument("--max_lanes", type=int, default=48, help="above this many lanes, draw per-rank aggregates")
    p.set_defaults(func=_command("cmd_gantt"))


def _heap_bytes(text):
    """'1073741824', '1G', '512M', '64K' (binary units) -> bytes."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    scale = units.get(text[-1:].upper(), 1)
    digits = text[:-1] if scale > 1 else text
    if not digits.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a size: give bytes, or a number with K, M or G")
    return int(digits) * scale


def _tune_parser(sub):
    p = sub.add_parser("tune", help="time tiles for your shapes on this GPU and write the tuning cache the kernels read",
                       description="Time the candidate tiles of each per-rank shape M x N x K (K per rank) at world "
                                   "size 1 on this machine's GPU, each checked against torch, and write the fastest "
                                   "into the tuning cache (keyed by GPU, dtype, world size and shape). gemmar bench "
                                   "and the kernels' defaults then use it; shapes it does not hold take the fitted "
                                   "rule. Shapes already in the cache are not timed again.")
    p.add_argument("shapes", nargs="*", metavar="MxNxK", help="per-rank shapes, e.g. 128x5120x3456")
    p.add_argument("-f", "--file", help="a file of shapes, one MxNxK a line (# comments)")
    p.add_argument("--datatype", choices=list(DTYPES), default="bf16", help="(default %(default)s)")
    p.add_argument("--cache", help="the cache file (default: $GEMMAR_TUNING_CACHE, else ~/.cache/gemmar/tuning.json)")
    p.add_argument("--retune", action="store_true", help="time shapes the cache already holds again")
    p.set_defaults(func=cmd_tune)


def _run_parser(sub):
    p = sub.add_parser("run", help="run a Python program (an Iris program, unchanged) on every rank, like mpirun",
                       description="gemmar run -r N SCRIPT ARGS is `mpirun -np N python SCRIPT ARGS` for Iris "
                                   "programs: every rank runs SCRIPT in its own ipyparallel engine, `import iris` "
                                   "gives the real Iris (--iris PATH, or an installed one) or else gemmar's "
                                   "stand-in, over the rank's symmetric heap, output "
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
    from .programs import hooks

    try:
        hooks.add_arguments(p)   # (the layers' own flags: gemmar's Iris layer adds --iris PATH and --replace_iris)
    except UsageError as e:   # (a broken hook is said by `gemmar run`, in one line; the other commands work)
        p.set_defaults(hook_error=str(e))
    p.add_argument("--sanitize", action="store_true",
                   help="(cpu) record every heap access of the program's kernels and report races across ranks "
                        "and programs, and accesses outside their buffer (docs/sanitizer.md); exit 1 on a race")
    p.add_argument("script", help="the Python program each rank runs")
    p.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    p.set_defaults(func=_command("cmd_run"))


def main(argv=None):
    parser = _Parser(prog="gemmar", description="Fused GEMM + all-reduce in Triton: run, check, trace.")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)
    _bench_parser(sub)
    _allreduce_parser(sub)
    _gantt_parser(sub)
    _run_parser(sub)
    _tune_parser(sub)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.error("a command is required: bench, allreduce, gantt, run or tune")
    try:
        return args.func(args)
    except UsageError as e:
        print(f"gemmar: error: {e}", file=sys.stderr)
        return 2
    except OutputNotWritten as e:   # (after the work: the line says where its results are)
        print(f"gemmar: {e}", file=sys.stderr)
        return e.exit_code
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
    from .interrupts import exit_on_interrupt

    exit_on_interrupt()
    sys.exit(main())
