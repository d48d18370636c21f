"""The user API: ``Cluster`` (ipyparallel engines as ranks) runs the fused GEMM + all-reduce and returns a
``Result`` with every rank's view. Engine lifecycle lives in ``runtime/engines.py``; what runs on each
engine in ``runtime/rank.py``.
"""

import dataclasses
import functools
from dataclasses import dataclass, field

import torch

from . import algorithms
from .config import RunConfig, k_bounds
from .errors import UsageError
from .report import log
from .runtime import rank as rank_runtime
from .runtime.allreduce import check_all_reduce_fits, run_all_reduce
from .runtime.problem import input_scale, narrower_dtype_hint
from .runtime.timing import benchmark_rank
from .programs import runner as programs
from .runtime import memory
from .runtime.engines import EngineCluster
from .runtime.launch import heap_bytes_needed
from .runtime.results import RankFailure
from .runtime.shipping import ship, ship_parts


# A run given progress=True draws its bar only once it has taken this long: a short one draws nothing.
PROGRESS_AFTER_S = 2.0


def _launches_bar(config):
    """The progress bar of a run's launches (drawn once the run has taken PROGRESS_AFTER_S)."""
    from .progress import ProgressBar

    n = config.iterations
    return ProgressBar(n, label=f"{config.algorithm}: launches ", delay_s=PROGRESS_AFTER_S, ticking=True,
                       what=f"launch 1 of {n} running")


def check_memory(config, engines, backend, client_copy=False):
    """Refuse a run the machine's memory cannot hold, before anything is allocated. On cpu every engine
    builds the global inputs (fp32, then their dtype) and a float64 reference, and holds C and the part of
    its heap the run uses; ``client_copy``: the client holds the inputs and a reference too. (On GPUs the
    heap is checked against GPU memory as it is made.)"""
    if backend != "cpu":
        return
    m, n, k = config.m, config.n, config.k
    per_engine = 12 * m * n + 8 * (m * k + k * n) + heap_bytes_needed(config)
    need = engines * per_engine + (8 * m * n + 8 * (m * k + k * n) if client_copy else 0)
    memory.check_fits(need, f"m x n x k = {m} x {n} x {k} ({engines} ranks, each with the inputs, a float64 "
                            f"reference and C)", "use a smaller problem")


def check_matrix(name, t):
    """What a tensor is, checked before any of its values is read (once the sizes are known to fit: a 2**20 x
    2**20 expanded view of one number is 8 bytes until something scans it)."""
    if not isinstance(t, torch.Tensor):
        raise UsageError(f"{name} must be a 2-D torch tensor, got {type(t).__name__}")
    if t.layout != torch.strided or t.is_quantized or getattr(t, "is_nested", False):
        what = "nested" if getattr(t, "is_nested", False) else "quantized" if t.is_quantized else t.layout
        raise UsageError(f"{name} is a {what} tensor: give a dense one "
                         f"({name}.{'dequantize' if t.is_quantized else 'to_dense'}())")
    if t.dim() != 2:
        raise UsageError(f"{name} must be a 2-D torch tensor, got {t.dim()} dimension(s) {tuple(t.shape)}")
    if t.device.type not in ("cpu", "cuda"):
        raise UsageError(f"{name} is on device {t.device.type!r}, which holds no values: give a cpu or cuda tensor")


def _largest(t):
    return float(t.abs().max()) if t.numel() else 0.0


def check_no_overflow(config, largest, partial_largest):
    """Refuse inputs whose product (its largest magnitude: ``largest``) does not fit the dtype C is written in,
    or, for an algorithm whose partials travel in a wire dtype, whose per-rank partial products
    (``partial_largest``) do not fit that: the kernel would write inf, and the check would call a right
    kernel wrong."""
    checks = [("A @ B", largest, config.c_dtype, "C")]
    if config.spec.wire_dtype:
        checks += [(f"rank {r}'s partial product", value, config.wire_torch_dtype, "the partials on the wire")
                   for r, value in enumerate(partial_largest)]
    for what, value, dtype, where in checks:
        top = torch.finfo(dtype).max
        if value > top:
            raise UsageError(f"the inputs overflow: |{what}| reaches {value:.3g}, above {str(dtype)[6:]}'s largest "
                             f"{top:.6g} ({where}); scale A or B down, or use a wider dtype (bf16, fp32)")


@dataclass
class Result:
    """What one fused GEMM + all-reduce run gave back, from every rank."""

    config: RunConfig
    backend: str
    ranks: list                      # per rank: a RankResult (max_abs_diff, seconds per iteration, ...)
    C: torch.Tensor = None           # rank 0's all-reduced C (dtype: config.c_dtype), when asked for
    info: list = field(default_factory=list)  # per rank: device, versions, pid
    mistake: str = "none"            # the teaching mistake whose parts ran (for display; runs know only parts)

    @property
    def max_abs_diff(self):
        diffs = [d for r in self.ranks for d in r.max_abs_diff if d is not None]
        return max(diffs) if diffs else None

    @property
    def ok(self):
        """Every rank matched the reference within tolerance after every iteration."""
        return all(r.ok for r in self.ranks)

    @property
    def seconds(self):
        """Per iteration, the slowest rank's time (the all-reduce is done when the last rank is)."""
        return [max(r.seconds[i] for r in self.ranks) for i in range(self.config.iterations)]

    @functools.cached_property
    def sanitizer(self):
        """sanitize=True: the SanitizerReport of the run (races found across ranks and programs), else None."""
        if not self.config.sanitize:
            return None
        from .sanitizer import analyse

        return analyse([r.sanitizer for r in self.ranks])

    @functools.cached_property
    def trace(self):
        """The run's Trace (built once, on first use)."""
        from .analysis.trace import Trace

        return Trace.from_result(self)


class Cluster(EngineCluster):
    """``world_size`` ipyparallel engines as ranks, and the fused GEMM + all-reduce on them; programs (Iris's
    among them) on them with ``run_script`` and ``activate`` (``programs/runner.py``)."""

    def run_script(self, path, *args, timeout=None, echo=True, out=None, err=None, sanitize=False, **hook_options):
        """Run the Python program ``path`` with ``args`` on every rank, as ``mpirun -np N python path args``
        would. ``hook_options``: the keywords of the layers' program hooks (``programs/hooks.py``); gemmar's
        Iris layer takes ``iris=PATH`` (a real Iris checkout) and ``replace_iris=True`` (its stand-in whatever is
        installed), else an installed Iris, else the stand-in. Output is printed as it comes, each line tagged
        ``[rank r/N]`` (``echo=False``: not printed). ``timeout``: seconds before ranks still running are
        named and stopped (None: no deadline). ``sanitize`` (cpu): record every heap access of the program's
        kernels and report races and out-of-bounds accesses (``ProgramResult.sanitizer``, also printed).
        Needs one process per rank (``Cluster(..., process_per_rank=True)`` where ranks share a GPU).
        Returns a ProgramResult."""
        return programs.run_script(self, path, args, timeout=timeout, echo=echo, out=out, err=err,
                                   sanitize=sanitize, **hook_options)

    def activate(self, suffix="", **hook_options):
        """Register ipyparallel's ``%px`` / ``%%px`` magics (``%%px{suffix}``) for these ranks in the running
        IPython, each rank made ready as for ``run_script`` (same ``hook_options``): in a ``%%px`` cell ``import iris``
        and ``shmem = iris.iris(heap_size)`` work as in a program run by ``gemmar run``, kernels defined in
        the cell run on every rank, and each rank's output is shown under its engine. Returns the view."""
        return programs.activate(self, suffix, **hook_options)

    def bench(self, config=None, validate=True, verbose=False, mistake="none", return_c=False, on_progress=None,
              parts=None, progress=False, **settings):
        """Run with seeded inputs built on each rank (nothing but settings travel). Returns a Result.
        ``algorithm`` (a setting) may be a registered name or an AlgorithmSpec (a user's own algorithm).

        ``on_progress(rank, {"iteration", "max_abs_diff", "seconds"})`` is called as ranks finish iterations.
        ``parts``: {name: @triton.jit function} run in place of the kernel's own (``runtime/shipping.py``).
        ``mistake``: a teaching mistake by name (``kernels/mistakes.py``): the parts it swaps, before ``parts``.
        ``progress``: a run longer than ``PROGRESS_AFTER_S`` draws a progress bar (launches checked, the time of
        the one running; tqdm: a widget in a notebook, a line in a terminal). A checked config (the
        command line's, ``RunConfig.validate``'s) of this cluster's world size is run as it is.
        """
        if config is not None and not isinstance(config, RunConfig):
            raise UsageError(f"config={config!r} is not allowed: give a RunConfig (or leave it out and pass settings, "
                             f"e.g. bench(algorithm={config!r}) for an algorithm)" if isinstance(config, str) else
                             f"config={type(config).__name__} is not allowed: give a RunConfig, or settings by name")
        if "algorithm" in settings:
            settings["algorithm"] = algorithms.get(settings["algorithm"]).name
        config = self._checked(config or RunConfig(), settings)
        check_memory(config, len(self.engine_ranks), self.backend)
        parts = {**config.spec.mistake_swaps(mistake), **(parts or {})}
        result = self._run(config, None, validate, verbose, return_c, on_progress, parts, progress=progress)
        result.mistake = mistake
        return result

    def gemm_all_reduce(self, A, B, algorithm=RunConfig.algorithm, validate=True, mistake="none", verbose=False,
                        parts=None, launch_deadline_s=None, progress=False, **settings):
        """C = A @ B with K split over the ranks, reduced by ``algorithm`` (a registered name, or a user's
        own AlgorithmSpec: it is registered, and its source travels to the ranks); checked against torch.

        A is M x K and B is K x N (fp16, bf16 or fp32, same dtype). Rank r gets ``A[:, K_r]`` and
        ``B[K_r, :]``; every rank ends with all of C, checked against a float64 reference after every
        iteration. ``settings`` are RunConfig fields (``BLK_M``, ``BLK_N``, ``BLK_K``, ``gsize_m``,
        ``num_sms``, ``iterations``, ``trace``, ``timeout_s``, ...); unset ones keep RunConfig's defaults.
        ``parts`` ({name: @triton.jit function}) runs a participant's own kernel parts in place of the
        kernel's (``runtime/shipping.py``: tile_coords, push_partial, reduce_step, sum_partials).
        A user's own algorithm on cpu ranks runs with ``sanitize=True`` unless told otherwise (an access outside
        its buffer or a race is named, though C may come out right).
        ``launch_deadline_s``: how long a rank may go without finishing a launch before every rank is stopped
        (a launch that waits on no flag never meets the watchdog; default ``2 x timeout_s + 10``).
        ``progress``: as in :meth:`bench`.
        Returns a Result whose ``C`` is rank 0's copy (and every rank's is in ``ranks[r].C``).
        """
        check_matrix("A", A)
        check_matrix("B", B)
        if launch_deadline_s is not None and (isinstance(launch_deadline_s, bool) or not isinstance(
                launch_deadline_s, (int, float)) or not 1 <= launch_deadline_s <= 86400):
            raise UsageError(f"launch_deadline_s={launch_deadline_s!r} is not allowed: use seconds from 1 to 86400, "
                             f"or None (2 x timeout_s + 10)")
        if A.shape[1] != B.shape[0]:
            raise UsageError(f"A is {tuple(A.shape)} and B is {tuple(B.shape)}: A's columns must equal B's rows")
        if A.dtype != B.dtype:
            raise UsageError(f"A is {A.dtype} and B is {B.dtype}: use the same dtype for both")
        spec = algorithms.get(algorithm)
        parts = {**spec.mistake_swaps(mistake), **(parts or {})}
        fixed = dict(m=A.shape[0], n=B.shape[1], k=A.shape[1], datatype=A.dtype, algorithm=spec.name,
                     world_size=self.world_size)
        if not spec.builtin and self.backend == "cpu" and "sanitize" not in settings:
            # A new algorithm on cpu ranks runs with the bounds and race checks: a store past C's edge lands in the
            # next heap buffer and leaves C right, so only they see it (sanitize=False turns them off).
            settings["sanitize"] = True
        given = sorted(set(settings) & set(fixed))
        if given:   # (they come from A, B and the cluster: a different value would be silently ignored)
            raise UsageError(f"{', '.join(f'{k}={settings[k]!r}' for k in given)}: gemm_all_reduce takes these "
                             f"from A, B and the cluster (m, n, k from the shapes, datatype from the dtype, "
                             f"world_size from the cluster); leave them out")
        config = RunConfig.from_settings({"timeout_s": self.timeout_s, **settings}, **fixed)
        check_memory(config, self.world_size, self.backend, client_copy=True)
        for name, t in (("A", A), ("B", B)):
            if not bool(torch.isfinite(t).all()):
                bad = int((~torch.isfinite(t)).sum())
                raise UsageError(f"{name} holds {bad} NaN or infinite value(s): C could not be checked against "
                                 f"the reference; give finite inputs")
        A, B = A.detach().cpu(), B.detach().cpu()
        slices = [k_bounds(config.k, config.world_size, r) for r in range(config.world_size)]
        reference, partial_largest = torch.zeros(config.m, config.n, dtype=torch.float64), []
        for s, e in slices:   # (one partial at a time: the reference's memory, not world_size times it)
            partial = A[:, s:e].double() @ B[s:e, :].double()
            partial_largest.append(_largest(partial))
            reference += partial
        check_no_overflow(config, _largest(reference), partial_largest)
        inputs = [(A[:, s:e].contiguous(), B[s:e, :].contiguous()) for s, e in slices]
        result = self._run(config, (inputs, reference, input_scale(A, B)), validate, verbose, True, parts=parts,
                           launch_deadline_s=launch_deadline_s, progress=progress)
        result.mistake = mistake
        return result

    def compare_to_unfused(self, configs, reps=20, warmup=5, baseline=True, problem=None):
        """GPU only: time each fused kernel and the unfused baseline (cuBLAS matmul, NCCL all-reduce, both in
        sequence) in one run. ``configs`` maps an algorithm to its RunConfig (same shape for all; a single
        RunConfig times just its own algorithm). Returns milliseconds, the slowest rank's each."""
        if isinstance(configs, RunConfig):
            configs = {configs.algorithm: configs}
        configs = {alg: self._checked(cfg, dict(algorithm=alg)) for alg, cfg in configs.items()}
        problem = self._checked(problem, {}) if problem is not None else None
        if not configs and (problem is None or not baseline):
            raise UsageError("nothing to time: give fused configs, or a problem and baseline=True")
        shapes = {(c.m, c.n, c.k, c.datatype, c.seed) for c in list(configs.values()) + [problem] if c is not None}
        if len(shapes) != 1:
            raise UsageError(f"configs to compare must share one shape, dtype and seed; got {sorted(shapes)}")
        outs = self.run_ranks(benchmark_rank, configs, reps, warmup, baseline, problem)
        RankFailure.raise_first(outs)
        figures = {f"{alg}_ms": max(o["fused_ms"][alg] for o in outs) for alg in configs}
        figures.update({f"{alg}_max_abs_diff": max(o["max_abs_diff"][alg] for o in outs) for alg in configs})
        figures.update({f"{alg}_tolerance": min(o["tolerance"][alg] for o in outs) for alg in configs})
        if baseline:
            for key in ("matmul_ms", "allreduce_ms", "sequential_ms", "overlap_ms", "overlap_max_abs_diff"):
                figures[key] = max(o[key] for o in outs)
            figures["overlap_tolerance"] = min(o["overlap_tolerance"] for o in outs)
            figures["overlap_chunks"] = outs[0]["overlap_chunks"]
            figures["unfused_ms"] = min(figures["sequential_ms"], figures["overlap_ms"])
            figures["bound_ms"] = max(figures["matmul_ms"], figures["allreduce_ms"])
        return figures

    def all_reduce(self, numel, datatype="bf16", comm_sms=None, iterations=3, seed=0, reps=0, baseline=False,
                   scheme="auto", on_heap=False, sanitize=False, on_progress=None):
        """The standalone all-reduce on the symmetric heap (``scheme`` two_shot: by tile owner; one_shot:
        every rank sums everything; auto: one_shot below ``ONE_SHOT_BELOW_BYTES`` with a GPU per rank, else
        two_shot, the one it ran is the dict's ``scheme``; ``runtime/allreduce.py``) of ``numel`` seeded
        values per rank: every rank's result checked against the float64 sum of all inputs after each launch
        (each launch's values scaled by another power of two, in the same tensors, so a launch that did not
        run is caught), and its bits compared across ranks. ``on_heap``: the values already lie in the
        all-reduce's heap input (as torch's symmetric-memory all-reduce reduces its own buffer), so no launch
        copies them in. On GPUs, ``reps`` >
        0 times it, and ``baseline`` times NCCL (and torch's symmetric-memory two-shot) on the same values.
        ``sanitize`` (cpu): record the launches' heap accesses; the dict's ``sanitizer`` is the SanitizerReport.
        ``on_progress(rank, {"iteration", "of"})`` is called as ranks finish checked launches.
        Returns a dict: ``max_abs_diff``, ``tolerance``, ``identical`` (every rank the same bits),
        ``checked_launches`` and the times in ms. ``numel`` may instead be an AllReduceConfig (the command
        line's, checked already: it runs as it is, with this cluster's ``timeout_s``)."""
        from .config import AllReduceConfig

        config = numel if isinstance(numel, AllReduceConfig) else AllReduceConfig(
            numel, datatype, comm_sms, iterations, seed, self.timeout_s, reps, bool(baseline), scheme, bool(on_heap),
            bool(sanitize))
        if not (config.checked and config.timeout_s == self.timeout_s):   # (the API's one check)
            config = dataclasses.replace(config, timeout_s=self.timeout_s).validate()
        if config.sanitize and self.backend != "cpu":
            raise UsageError(f"sanitize=True is not allowed on the {self.backend} backend: the sanitizer watches "
                             f"kernels under the Triton interpreter, so use backend='cpu'")
        check_all_reduce_fits(config.numel, config.torch_dtype, self.backend, self.world_size, self.heap_size)
        outs = self.run_ranks(run_all_reduce, config, on_progress=on_progress)
        RankFailure.raise_first(outs)
        figures = dict(numel=config.numel, datatype=config.datatype, scheme=outs[0]["scheme"], on_heap=config.on_heap,
                       comm_sms=outs[0]["comm_sms"],
                       world_size=self.world_size,
                       max_abs_diff=max(d for o in outs for d in o["max_abs_diff"]), tolerance=outs[0]["tolerance"],
                       identical=len({o["digest"] for o in outs}) == 1, checked_launches=len(outs[0]["max_abs_diff"]))
        for key in ("gemmar_ms", "nccl_ms", "torch_symm_mem_ms", "torch_symm_mem_error", "torch_symm_mem_one_shot_ms",
                    "torch_symm_mem_one_shot_error"):
            values = [o[key] for o in outs if key in o]
            if values:
                figures[key] = max(values) if key.endswith("_ms") else values[0]
        figures["ok"] = figures["max_abs_diff"] <= figures["tolerance"] and figures["identical"]
        if config.sanitize:
            from .sanitizer import analyse

            figures["sanitizer"] = analyse([o["sanitizer"] for o in outs])
        return figures

    def _checked(self, config, settings):
        """The Python API's one check: ``config`` with ``settings`` and this cluster's world size, checked
        (``RunConfig.from_settings``); a config checked already (the command line's) with nothing to change
        goes on as it is."""
        if not isinstance(config, RunConfig):
            raise UsageError(f"{config!r} is not allowed: give a RunConfig")
        changes = {name: value for name, value in {**settings, "world_size": self.world_size}.items()
                   if name not in config.to_dict() or getattr(config, name) != value}
        if config.checked and not changes:
            return config
        return RunConfig.from_settings({**config.to_dict(), **changes})

    def _run(self, config, data, validate, verbose, return_c, on_progress=None, parts=None, launch_deadline_s=None,
             progress=False):
        """Below the boundary: ``config`` checked, ``parts`` a teaching mistake's and a participant's together."""
        W, n = config.world_size, config.iterations
        sources = ship_parts(parts, config.spec)
        shipped = ship(config.spec)
        bar, checked = _launches_bar(config) if progress else None, {}   # checked: rank -> launches checked

        def report(r, d):
            if on_progress is not None:
                on_progress(r, d)
            if bar is not None and "iteration" in d:
                checked[r] = d["iteration"]
                done = min(checked.values()) if len(checked) == W else 0
                bar.update(done, f"launch {done + 1} of {n} running" if done < n else "all checked")
                if verbose:   # (on a terminal: the log line below goes where the bar was; the ticker redraws it)
                    bar.clear()
            if verbose:
                diff = "" if d.get("max_abs_diff") is None else f"  max|C - ref| = {d['max_abs_diff']:.3g}"
                log(r, W, f"{config.algorithm} iteration {d['iteration']}/{n}  {d['seconds'] * 1e3:.1f} ms{diff}")

        def engine_args(e):
            if data is None:
                return (config,)
            inputs, reference, scale = data
            return (config, [inputs[r] for r in self.engine_ranks[e]], reference, scale)

        if verbose:
            programs = f"{config.num_sms} GEMM + {config.comm_sms} communication programs per rank" \
                if config.spec.comm_programs else f"{config.num_sms} programs per rank"
            shared = f", {W} ranks sharing GPU 0" if self.shares_gpu else ""
            log("-", W, f"{config.algorithm}: {config.m} x {config.n} x {config.k} {config.datatype}, blocks "
                        f"{config.BLK_M}x{config.BLK_N}x{config.BLK_K}, {programs}, {n} iteration(s), "
                        f"backend {self.backend}{shared}")
        # Each launch reports when it ends; a rank silent for longer than this is stuck in a launch that
        # waits on no flag (the watchdog catches those that do), and every rank is stopped.
        try:
            outs = self.run_ranks(rank_runtime.run_gemm_all_reduce, engine_args=engine_args, on_progress=report,
                                  launch_deadline_s=launch_deadline_s or 2 * config.timeout_s + 10,
                                  return_c=return_c, validate=validate, parts=sources, algorithm=shipped)
        finally:
            if bar is not None:
                bar.close()
        RankFailure.raise_first(outs)
        result = Result(config, self.backend, outs, outs[0].C, self.info)
        if verbose and validate:
            peak = float(data[1].abs().max()) if data is not None else None
            for r, out in enumerate(outs):
                verdict = "ok" if out.ok else "MISMATCH"
                hint = "" if out.ok else narrower_dtype_hint(max(out.max_abs_diff), peak)
                log(r, W, f"{verdict}: max|C - ref| = {max(out.max_abs_diff):.3g} over {n} iteration(s) "
                          f"(tolerance {out.tolerance:.3g}){hint}")
        if verbose and config.sanitize:
            for line in str(result.sanitizer).splitlines():
                log("-", W, line)
        return result


