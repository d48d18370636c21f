"""What the command line writes: output paths checked before any work, and the JSON reports (Iris's keys and
gemmar's)."""

import contextlib
import datetime
import json
import os
import platform
import stat
import tempfile

from .errors import GemmarError, UsageError
from .report import log


DEFAULT_TRACE_FILE = "gemmar.trace.json"   # -t without --output_file


def check_output_path(flag, path):
    """Refuse, before any work, a file the run could not write at the end (one line, exit 2): '', a folder, a
    device, a FIFO or a /proc file, a missing or read-only folder, another user's file in a sticky folder
    (/tmp). A file is written whole beside the path and then renamed over it (``write_whole``), so that is what
    is tried here: a temporary file is written in the folder, synced and removed (a full disk or a file system
    that refuses new files is found now, not after the work)."""
    if not path:
        raise UsageError(f"{flag} '' is not a file name: give one, or leave {flag} out")
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
    if os.path.exists(path) and not _replaceable(path, folder):
        raise UsageError(f"{flag} {path} belongs to another user (uid {os.stat(path).st_uid}) in the sticky folder "
                         f"{folder}, where only its owner may replace it: give another file name")
    probe = None
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".gemmar-probe-")
        with os.fdopen(fd, "w") as f:
            f.write("{}\n")
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        raise UsageError(f"{flag} {path} cannot be written: a new file in {folder} fails ({e.strerror or e})") from None
    finally:
        if probe:
            with contextlib.suppress(OSError):
                os.unlink(probe)


def _replaceable(path, folder):
    """Whether this process may rename a file over ``path``: in a sticky folder (/tmp) only the owner of the
    file or of the folder may (or root, CAP_FOWNER)."""
    folder_stat, file_stat = os.stat(folder), os.stat(path)
    uid = os.geteuid()
    return not folder_stat.st_mode & stat.S_ISVTX or uid in (0, folder_stat.st_uid, file_stat.st_uid)


class OutputNotWritten(GemmarError):
    """A file the run was asked for could not be written after the work (a disk that filled meanwhile):
    ``exit_code`` is what the command exits with (the run's own verdict when that failed)."""

    def __init__(self, message, exit_code):
        super().__init__(message)
        self.exit_code = exit_code


NOT_WRITTEN_EXIT_CODE = 4


def write_whole(path, write, what="the report", results="the run's results are in the lines above"):
    """``write(temporary_path)`` writes a file beside ``path`` that is then renamed over it: ``path`` is the
    whole new file or, if anything failed, left as it was (an earlier report is never half overwritten).
    Returns None, or the one line that says what was not written, why, and where the results still are:
    the temporary file where only the rename failed, else a copy in the temp folder when one can be written
    there, else ``results``."""
    folder, name = os.path.split(os.path.abspath(path))
    temporary = None
    try:
        fd, temporary = tempfile.mkstemp(dir=folder, prefix=".gemmar-", suffix=f"-{name}")
        os.close(fd)
        write(temporary)
        os.chmod(temporary, _new_file_mode(path))
        with open(temporary, "rb") as f:
            os.fsync(f.fileno())
    except OSError as e:
        if temporary:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
        kept = "; an earlier file there is left as it was" if os.path.exists(path) else ""
        return f"{what} was not written to {path} ({e.strerror or e}){kept}; {_elsewhere(path, write, results)}"
    try:
        os.replace(temporary, path)
    except OSError as e:
        return f"{what} was not written to {path} ({e.strerror or e}); it is at {temporary}"
    return None


def _elsewhere(path, write, results):
    """Where the results are when ``path``'s folder took nothing: a copy in the temp folder, else ``results``."""
    if os.path.dirname(os.path.abspath(path)) != os.path.abspath(tempfile.gettempdir()):
        copy = None
        try:
            fd, copy = tempfile.mkstemp(prefix="gemmar-", suffix=f"-{os.path.basename(path)}")
            os.close(fd)
            write(copy)
            return f"it is at {copy}"
        except OSError:
            if copy:
                with contextlib.suppress(OSError):
                    os.unlink(copy)
    return results


def _new_file_mode(path):
    """The mode ``path`` has, or a new file would get (0666 less the umask, read without changing it)."""
    with contextlib.suppress(OSError):
        return stat.S_IMODE(os.stat(path).st_mode)
    umask = 0o022
    with contextlib.suppress(OSError, ValueError, StopIteration):
        with open("/proc/self/status") as f:
            umask = int(next(line for line in f if line.startswith("Umask:")).split()[1], 8)
    return 0o666 & ~umask


def raise_if_not_written(lines, exit_code):
    """After a command has written what it could: one line for every file it could not, ``exit_code`` (the
    run's verdict) where that is not 0, else NOT_WRITTEN_EXIT_CODE."""
    lines = [line for line in lines if line]
    if lines:
        raise OutputNotWritten("; ".join(lines), exit_code or NOT_WRITTEN_EXIT_CODE)
    return exit_code


def trace_path_for(output_file):
    stem = output_file[:-5] if output_file.endswith(".json") else output_file
    return stem + ".trace.json"


def arguments(args):
    """The command line as parsed, for a report."""
    return {k: v for k, v in vars(args).items() if k != "func"}


def write_report(args, W, first=None, **fields):
    """The JSON report at --output_file: ``first`` (Iris's flat keys, which gemmar's then override), the
    arguments, ``fields``, and when and where it ran. Returns None, or the line saying it was not written
    (``write_whole``)."""
    report = {**(first or {}), **dict(args=arguments(args), **fields,
                                      date=datetime.datetime.now().isoformat(timespec="seconds"), host=platform.node())}

    def write(path):
        with open(path, "w") as f:
            json.dump(report, f, indent=2)

    failure = write_whole(args.output_file, write)
    if failure is None:
        log("-", W, f"wrote {args.output_file}")
    return failure


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
