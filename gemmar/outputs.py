"""What the command line writes: output paths checked before any work, and the JSON reports (Iris's keys and
gemmar's)."""

import contextlib
import datetime
import json
import os
import platform

from .errors import UsageError
from .report import log


DEFAULT_TRACE_FILE = "gemmar.trace.json"   # -t without --output_file


def check_output_path(flag, path):
    """Refuse, before any work, a file the run could not write at the end (one line, exit 2): a folder, a
    device, a FIFO or a /proc file, a missing or read-only folder. A new file is test-written (and removed
    again), so that a full disk or a file system that refuses writes is found now, not after the work."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise UsageError(f"{flag} {path} is a folder: give a file name")
    if os.path.exists(path) and not os.path.isfile(path):
        raise UsageError(f"{flag} {path} is not a regular file (a device, a FIFO or a socket): give a file name")
    if not os.path.isdir(folder):
        raise UsageError(f"{flag} {path}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise UsageError(f"{flag} {path}: {'the file' if os.path.exists(path) else 'the folder ' + folder} is not "
                         f"writable")
    if not os.path.exists(path):
        try:
            with open(path, "x") as probe:
                probe.write("{}\n")
                probe.flush()
                os.fsync(probe.fileno())
        except OSError as e:
            raise UsageError(f"{flag} {path} cannot be written: {e.strerror}") from None
        finally:
            if os.path.isfile(path):
                os.unlink(path)


@contextlib.contextmanager
def written_to(path):
    """A write that fails after the checks (a disk that fills up meanwhile) is one line too."""
    try:
        yield
    except OSError as e:
        raise UsageError(f"could not write {path}: {e.strerror or e}") from None


def trace_path_for(output_file):
    stem = output_file[:-5] if output_file.endswith(".json") else output_file
    return stem + ".trace.json"


def arguments(args):
    """The command line as parsed, for a report."""
    return {k: v for k, v in vars(args).items() if k != "func"}


def write_report(args, W, first=None, **fields):
    """The JSON report at --output_file: ``first`` (Iris's flat keys, which gemmar's then override), the
    arguments, ``fields``, and when and where it ran."""
    report = {**(first or {}), **dict(args=arguments(args), **fields,
                                      date=datetime.datetime.now().isoformat(timespec="seconds"), host=platform.node())}
    with open(args.output_file, "w") as f:
        json.dump(report, f, indent=2)
    log("-", W, f"wrote {args.output_file}")


def iris_report(args, config, median_ms, iterations, success, kernels):
    """The keys of Iris's benchmark report, with Iris's meaning: every argument flat (``k`` per rank, ``K``
    global, as Iris rewrites them), ``world_size``, ``gemm_sms``, ``success``, and with -b ``tflops`` /
    ``total_ms`` (Iris's ring benchmark), ``triton_tflops`` / ``triton_ms`` (its atomics benchmark) and
    ``gemm_ms`` / ``gemm_experiments``; on GPUs ``gemm_registers`` / ``gemm_spills``."""
    W = config.world_size
    flat = arguments(args)
    # (the tile and programs the run used, where the flags left them to the tuning)
    out = dict(flat, world_size=W, M=config.m, N=config.n, K=config.k, k=-(-config.k // W),
               gemm_sms=config.num_sms, BLK_M=config.BLK_M, BLK_N=config.BLK_N, BLK_K=config.BLK_K,
               gsize_m=config.gsize_m, num_sms=config.num_sms)
    if args.validate:
        out["success"] = success
    if args.benchmark:
        tflops = 2 * config.m * config.n * config.k * 1e-12 / (median_ms * 1e-3)
        out.update(tflops=tflops, total_ms=median_ms, triton_tflops=tflops, triton_ms=median_ms, gemm_ms=median_ms,
                   gemm_experiments=iterations)
    if kernels:
        out.update(gemm_registers=kernels[0]["registers"], gemm_spills=kernels[0]["spills"])
    return out
