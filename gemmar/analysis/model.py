"""A performance model of the fused kernels on W GPUs, from what one GPU can measure.

What one GPU measures (``OneGpu``): each kernel's launch time at world size 1 as a ratio to torch.matmul
in the same run - the kernel's own structure around the GEMM (``benchmarks/fused_vs_unfused.py --world_size 1``) -
and two_shot's tail after its last GEMM tile (``benchmarks/two_shot_tail.py``). What the target machine
gives (``Machine``): torch.matmul's time per shape there, the link's bandwidth per direction and NCCL's bus
bandwidth. Both are inputs; the defaults are stated where they are defined.

Per rank, a launch moves these bytes over the links (C is M x N):

- atomics: the fp32 partial into every peer's C, ``(W - 1) M N 4``, by fire-and-forget reductions issued
  by the GEMM programs between tiles;
- ring: each tile's fp32 partial through ``W - 1`` hops, ``(W - 1) M N 4``; a GEMM program sends, then
  waits for the slot and the data, so nothing of it hides behind the GEMM;
- two_shot: bf16 partials to their owners and the owners' sums back, ``2 (W - 1) / W M N 2``, by
  communication programs beside GEMM programs that never wait;
- sequential (matmul, then NCCL's all-reduce of C in bf16): ``2 (W - 1) / W M N 2`` at NCCL's bus bandwidth.

and a launch takes ``t_local + exposure * t_link`` (atomics, ring) or ``max(t_local, t_link) + tail``
(two_shot), with ``t_local = ratio_at_W1 * t_matmul`` and ``t_link = bytes / link bandwidth``. The exposure
is 1 for the ring (it blocks on every send, by construction) and 0.5 for atomics: that one number was
chosen by looking at the two-GPU figures this model is checked against, so its fit there is no test.

:func:`check` compares the model with measured figures; :func:`predict` speaks for two_shot only when
every check is within ``TOLERANCE``.

For a shape nobody measured (``--algorithm auto``), two_shot's one-GPU time is itself estimated
(:func:`two_shot_local_ms`, checked against the world-size-1 figures by :func:`check_local`): the GEMM on the
programs left beside the communication programs (whole waves of tiles), plus the partial's round trip
through memory (written and read once more in bf16, ``2 M N 2`` bytes at ``Gpu.hbm_gb_s``); torch.matmul's
own time at an unmeasured shape is its FLOPs at ``Gpu.matmul_tflops``. :func:`choose` turns that into
fused or unfused, and :func:`draw` shows one rank's predicted timeline against matmul then NCCL.
"""

import dataclasses
import functools
import json
import os

from ..errors import UsageError

TOLERANCE = 0.15
EXPOSURE = {"atomics": 0.5, "ring": 1.0}


@dataclasses.dataclass
class Machine:
    """The target: torch.matmul's time per per-rank shape (ms), and its links."""

    matmul_ms: dict                    # {(M, N, K_r): ms}
    link_gb_s: float = 450.0           # NVLink 4 (Hopper), one direction: half its both-ways figure
    nccl_bus_gb_s: float = 270.0       # NCCL's all-reduce bus bandwidth, measured (docs/decisions.md, Model)
    latency_us: float = 10.0           # a collective's fixed cost


@dataclasses.dataclass
class OneGpu:
    """What one GPU measured: kernel time at world size 1 over torch.matmul's, per algorithm and shape."""

    ratio: dict                        # {algorithm: {(M, N, K_r): kernel ms / matmul ms}}
    two_shot_tail_us: float = 16.0     # after the last GEMM tile, measured (docs/decisions.md, Model)


def read_run(path):
    """A measured run's JSON, read once per file version (``--algorithm auto`` asks the model at every
    launch of the CLI's runs; the model only reads what it is given)."""
    return _read_run(os.path.abspath(path), os.path.getmtime(path))


@functools.lru_cache(maxsize=16)
def _read_run(path, mtime):
    with open(path) as f:
        return json.load(f)


def link_bytes(algorithm, m, n, W):
    if algorithm in ("atomics", "ring"):
        return (W - 1) * m * n * 4
    return 2 * (W - 1) / W * m * n * 2          # two_shot and NCCL: bf16 reduce-scatter + all-gather


def link_ms(algorithm, m, n, W, machine):
    """The time of ``link_bytes`` at the link's bandwidth per direction, or for "nccl" at NCCL's bus bandwidth."""
    return link_bytes(algorithm, m, n, W) / ((machine.nccl_bus_gb_s if algorithm == "nccl" else machine.link_gb_s) * 1e6)


def predict_ms(algorithm, shape, W, machine, one_gpu):
    """One launch on W GPUs (ms), or the sequential matmul + NCCL."""
    m, n, _ = shape
    mm = machine.matmul_ms[tuple(shape)]
    if algorithm == "sequential":
        return mm + (link_ms("nccl", m, n, W, machine) + machine.latency_us / 1e3
                     if W > 1 else 0.0)
    local = one_gpu.ratio[algorithm][tuple(shape)] * mm
    link = link_ms(algorithm, m, n, W, machine)
    if algorithm == "two_shot":
        return max(local, link) + (one_gpu.two_shot_tail_us / 1e3 if W > 1 else 0.0)
    return local + EXPOSURE[algorithm] * link


def check(measured, W, machine, one_gpu):
    """[(algorithm, shape, measured ms, predicted ms, relative error)] for every measured figure."""
    rows = []
    for shape, figures in measured.items():
        for algorithm, ms in figures.items():
            predicted = predict_ms(algorithm, shape, W, machine, one_gpu)
            rows.append((algorithm, shape, ms, predicted, predicted / ms - 1))
    return rows


def predict(algorithm, shapes, world_sizes, machine, one_gpu, checked_rows):
    """{(shape, W): (fused ms, sequential ms)}; refused unless every checked figure is within TOLERANCE."""
    worst = max(abs(r[4]) for r in checked_rows)
    if worst > TOLERANCE:
        raise ValueError(f"the model is off by {100 * worst:.0f} % on a measured figure (allowed "
                         f"{100 * TOLERANCE:.0f} %): it predicts nothing")
    return {(tuple(s), W): (predict_ms(algorithm, s, W, machine, one_gpu), predict_ms("sequential", s, W, machine,
                                                                                       one_gpu))
            for s in shapes for W in world_sizes}


def load_inputs(two_gpu_json, one_gpu_json, algorithms=("atomics", "ring", "two_shot"), two_shot_from=None):
    """(measured {shape: {alg: ms}}, Machine, OneGpu) from fused_vs_unfused.py's JSON files: the 2-GPU run gives
    the figures to check and the target's matmul times; the 1-GPU run the ratios of ``algorithms``, which it
    must hold at every shape of the 2-GPU run. ``two_shot_from``: a later 1-GPU run to take two_shot's
    ratios from (``fused_vs_unfused.py --world_size 1 --algorithms two_shot``)."""
    if two_shot_from:
        measured, machine, one = load_inputs(two_gpu_json, one_gpu_json, [a for a in algorithms if a != "two_shot"])
        one.ratio["two_shot"] = load_inputs(two_gpu_json, two_shot_from, ("two_shot",))[2].ratio["two_shot"]
        return measured, machine, one
    two, one = read_run(two_gpu_json), read_run(one_gpu_json)
    measured = {tuple(r["shape"]): {a: r[f"{a}_ms"] for a in ("atomics", "ring", "sequential") if f"{a}_ms" in r}
                for r in two["results"]}
    machine = Machine(matmul_ms={tuple(r["shape"]): r["matmul_ms"] for r in two["results"]})
    ratio = {a: {tuple(r["shape"]): r[f"{a}_ms"] / r["matmul_ms"] for r in one["results"] if f"{a}_ms" in r}
             for a in algorithms}
    missing = [f"{a} at {' x '.join(map(str, shape))}" for a in ratio for shape in measured if shape not in ratio[a]]
    if missing:
        raise UsageError(f"{one_gpu_json} has no world-size-1 figure for {', '.join(missing)}: the model needs "
                         f"{', '.join(algorithms)} at every shape of {two_gpu_json} (fused_vs_unfused.py --world_size 1)")
    return measured, machine, OneGpu(ratio=ratio)


# -- shapes nobody measured: two_shot's one-GPU time estimated, and the choice of --algorithm auto ----------
TWO_SHOT_TILE = (128, 256)            # two_shot's tile on Hopper (kernels/two_shot.py, gpu_tuning)
# The measured runs the model is checked against travel with the package (gemmar/analysis/measured/, package
# data), so --algorithm auto decides the same in every install. In it: the 2-GPU run; the 1-GPU run of every algorithm (their ratios); two_shot's 1-GPU run with one
# communication program beside each GEMM program, for the one-GPU estimate. That run's partials still went
# through memory at world size 1, as every tile's do at W >= 2; since then (two_shot.write_alone_tile) a
# world-size-1 run skips that trip, so it is no longer a rank's one-GPU cost at W >= 2 and is not used here.
MEASURED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "measured")
CHECKED_AGAINST = ("two-gpus-large-shapes.json", "one-gpu-large-shapes.json", "one-gpu-large-shapes-comm-beside.json")
# Inference shapes (16-4096 rows per rank) on two GPUs, two_shot and matmul then NCCL: the model misses them
# where a launch's fixed costs (NCCL's small-message latency, two_shot's flags and two kernels) are most of
# it, so it speaks for a shape only where the nearest measured shape was reproduced (``nearest_reproduced``).
FEW_ROWS_RUN = "two-gpus-inference-shapes.json"


@dataclasses.dataclass
class Gpu:
    """One GPU, for two_shot's one-GPU time at shapes that were not measured. Defaults: the GPU the model was
    checked on (docs/decisions.md, Model)."""

    sms: int = 132
    hbm_gb_s: float = 4000.0          # what a streaming kernel reaches of HBM's peak (an assumption)
    matmul_tflops: float = 705.0      # torch.matmul, bf16, 8192^3, measured (docs/decisions.md, Model)
    comm_beside_gemm: bool = True     # two_shot's communication programs share the GEMM's SMs (Hopper's default)


def matmul_ms(shape, gpu):
    """torch.matmul's time where it was not measured: its FLOPs at ``gpu.matmul_tflops``, or at few rows the
    bytes of A, B and C at ``gpu.hbm_gb_s`` where that takes longer (reading B decides there)."""
    m, n, k = shape
    return max(2 * m * n * k / (gpu.matmul_tflops * 1e9), (m * k + k * n + m * n) * 2 / (gpu.hbm_gb_s * 1e6))


def two_shot_local_ms(shape, mm_ms, W, gpu):
    """two_shot's launch on one GPU (ms) from torch.matmul's ``mm_ms``: the GEMM in whole waves of tiles on its
    programs - every SM when the communication programs run beside them (``gpu.comm_beside_gemm``), else
    those left beside the communication programs (``tuning.split_programs``) - plus the partial's round trip
    through memory."""
    from ..tuning import split_programs

    m, n, k = shape
    tiles = -(-m // TWO_SHOT_TILE[0]) * -(-n // TWO_SHOT_TILE[1])
    gemm_programs = gpu.sms if gpu.comm_beside_gemm else gpu.sms - split_programs(gpu.sms, tiles, k, W)
    waves = -(-tiles // gemm_programs) / -(-tiles // gpu.sms)
    return mm_ms * waves + 2 * m * n * 2 / (gpu.hbm_gb_s * 1e6)


def check_local(one_gpu_json, gpu):
    """[(shape, measured ms, estimated ms, relative error)]: two_shot at world size 1, against a 1-GPU run."""
    one = read_run(one_gpu_json)
    rows = []
    for r in one["results"]:
        if "two_shot_ms" in r:
            estimate = two_shot_local_ms(tuple(r["shape"]), r["matmul_ms"], 1, gpu)
            rows.append((tuple(r["shape"]), r["two_shot_ms"], estimate, estimate / r["two_shot_ms"] - 1))
    return rows


def few_rows_checks(path, machine, gpu):
    """[(shape, measured two_shot ms, predicted, measured sequential ms, predicted)] at the 2-GPU run of
    inference shapes, predicted as for a shape nobody measured (matmul's time measured in that run)."""
    run = read_run(path)
    rows = []
    for r in run["results"]:
        shape, mm = tuple(r["shape"]), r["matmul_ms"]
        target = dataclasses.replace(machine, matmul_ms={shape: mm})
        one = OneGpu(ratio={"two_shot": {shape: two_shot_local_ms(shape, mm, 2, gpu) / mm}})
        rows.append((shape, r["two_shot_ms"], predict_ms("two_shot", shape, 2, target, one), r["sequential_ms"],
                     predict_ms("sequential", shape, 2, target, one)))
    return rows


def nearest_reproduced(shape, measured, few_rows):
    """(nearest measured shape, whether the model reproduced its figures within TOLERANCE): nearest in
    log M, log N, log K together. The large shapes' figures are all reproduced (the model speaks at all only
    then); at an inference shape, both two_shot's and matmul then NCCL's."""
    import math

    reproduced = {s: True for s in measured}
    reproduced.update({s: abs(t / tm - 1) <= TOLERANCE and abs(q / qm - 1) <= TOLERANCE
                       for s, tm, t, qm, q in few_rows})
    near = min(reproduced, key=lambda s: sum(math.log(a / b) ** 2 for a, b in zip(s, shape)))
    return near, reproduced[near]


def predict_unmeasured(shape, W, machine=None, gpu=None, data=MEASURED):
    """(two_shot ms, matmul then NCCL ms) predicted for the per-rank shape (M, N, K_r) on W GPUs, two_shot's
    one-GPU time estimated (``two_shot_local_ms``). The model speaks only after it reproduces the measured
    figures in ``data`` (the two-GPU run, and two_shot at world size 1) within TOLERANCE, and the measured
    shape nearest this one too (``nearest_reproduced``); where it cannot (the files are not there, or it misses
    one), None. ``machine``: the target's links (default: those the
    checks ran with) and matmul times (default: ``gpu.matmul_tflops``)."""
    gpu = gpu or Gpu()
    paths = [os.path.join(data, name) for name in (*CHECKED_AGAINST, FEW_ROWS_RUN)]
    if not all(os.path.exists(p) for p in paths):
        return None
    measured, checked_machine, one_gpu = load_inputs(*paths[:2])
    errors = [r[4] for r in check(measured, 2, checked_machine, one_gpu)] + [r[3] for r in check_local(paths[2], gpu)]
    shape = tuple(shape)
    if max(abs(e) for e in errors) > TOLERANCE or \
            not nearest_reproduced(shape, measured, few_rows_checks(paths[3], checked_machine, gpu))[1]:
        return None
    links = machine or checked_machine
    mm = links.matmul_ms.get(shape) or matmul_ms(shape, gpu)   # measured where it was, as draw() does
    target = dataclasses.replace(links, matmul_ms={shape: mm})
    ratio = one_gpu.ratio.get("two_shot", {}).get(shape)   # measured at this shape on one GPU, as draw() uses it
    estimated = dataclasses.replace(one_gpu, ratio={"two_shot": {shape: ratio or two_shot_local_ms(shape, mm, W, gpu) / mm}})
    return predict_ms("two_shot", shape, W, target, estimated), predict_ms("sequential", shape, W, target, estimated)


def choose(shape, W, machine=None, gpu=None, data=MEASURED):
    """``--algorithm auto`` with one GPU per rank: ("two_shot" or "unfused", why), by
    :func:`predict_unmeasured` at this per-rank shape; None where the model does not speak."""
    predicted = predict_unmeasured(shape, W, machine, gpu, data)
    if predicted is None:
        return None
    fused, sequential = predicted
    m, n, k = shape
    pick = "two_shot" if fused < sequential else "unfused"
    return pick, (f"the performance model (gemmar/analysis/model.py, within {100 * TOLERANCE:.0f} % of every figure "
                  f"measured on two GPUs and on one at the large shapes, and at the measured shape nearest this "
                  f"one) predicts two_shot {fused:.3f} ms against cuBLAS then NCCL {sequential:.3f} ms for {m} x {n} "
                  f"x {k} per rank on {W} GPUs; a prediction (on two GPUs two_shot won where the model said, at "
                  f"the three large shapes; at 16-4096 rows per rank it does not speak: docs/decisions.md, Model)")


def draw(shape, W, machine, one_gpu, ax=None, gpu=None):
    """One rank's predicted launch, two_shot against matmul then NCCL, as a Gantt chart (labelled a
    prediction). ``machine.matmul_ms`` gives matmul's time at ``shape`` if it was measured; otherwise
    ``gpu.matmul_tflops`` does."""
    import matplotlib.pyplot as plt

    gpu = gpu or Gpu()
    own_figure = ax is None   # (a figure of its own is shown in a notebook; one given an ax is the caller's)
    if own_figure:
        _, ax = plt.subplots(figsize=(8, 2.2))
    m, n, _ = shape
    mm = machine.matmul_ms.get(tuple(shape)) or matmul_ms(shape, gpu)
    ratio = one_gpu.ratio.get("two_shot", {}).get(tuple(shape))
    local = ratio * mm if ratio else two_shot_local_ms(shape, mm, W, gpu)
    link = link_ms("two_shot", m, n, W, machine)
    nccl = link_ms("nccl", m, n, W, machine) + machine.latency_us / 1e3
    tail = one_gpu.two_shot_tail_us / 1e3
    end = max(local, link)
    rows = [("matmul, then NCCL", [(0, mm, "tab:blue", "matmul"), (mm, nccl, "tab:orange", "NCCL all-reduce")]),
            ("two_shot: GEMM programs", [(0, local, "tab:blue", "GEMM + publish")]),
            # The link's bytes go out as tiles finish, spread over the whole launch: drawn pale, over its span.
            ("two_shot: communication", [(0, end, "tab:green", f"NVLink busy {link:.2f} ms of this"),
                                         (end, tail, "tab:red", "tail")])]
    for y, (_, bars) in enumerate(rows):
        for start, width, color, label in bars:
            pale = label.startswith("NVLink")
            ax.broken_barh([(start, width)], (y - 0.35, 0.7), color=color, alpha=0.35 if pale else 0.8)
            if width > 0.02 * len(label) * (mm + nccl):   # (only where the words fit)
                ax.text(start + width / 2, y, label, ha="center", va="center", fontsize=7,
                        color="black" if pale else "white")
    ax.set_yticks(range(len(rows)), [r[0] for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ms (one rank)")
    ax.set_title(f"PREDICTED, not measured: {m} x {n} x {shape[2]} per rank on {W} GPUs - two_shot "
                 f"{end + tail:.3f} ms, matmul + NCCL {mm + nccl:.3f} ms", fontsize=9)
    if own_figure:
        from .figures import finish_figure

        finish_figure(ax.figure)
    return ax
