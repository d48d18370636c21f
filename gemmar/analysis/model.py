"""A performance model of the fused kernels on W GPUs, from what one GPU can measure.

What one GPU measures (``OneGpu``): each kernel's launch time at world size 1 as a ratio to torch.matmul
in the same run - the kernel's own structure around the GEMM (``benchmarks/h200_bench.py --world_size 1``) -
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
chosen by looking at the 2 x H200 figures this model is checked against, so its fit there is no test.

:func:`check` compares the model with measured figures; :func:`predict` speaks for two_shot only when
every check is within ``TOLERANCE``.
"""

import dataclasses
import json

TOLERANCE = 0.15
EXPOSURE = {"atomics": 0.5, "ring": 1.0}


@dataclasses.dataclass
class Machine:
    """The target: torch.matmul's time per per-rank shape (ms), and its links."""

    matmul_ms: dict                    # {(M, N, K_r): ms}
    link_gb_s: float = 450.0           # NVLink 4 on H100/H200: 900 GB/s both ways, so 450 per direction
    nccl_bus_gb_s: float = 270.0       # NCCL's all-reduce measured on the 2 x H200 (BENCHMARKS.md, 2026-12-01)
    latency_us: float = 10.0           # a collective's fixed cost


@dataclasses.dataclass
class OneGpu:
    """What one GPU measured: kernel time at world size 1 over torch.matmul's, per algorithm and shape."""

    ratio: dict                        # {algorithm: {(M, N, K_r): kernel ms / matmul ms}}
    two_shot_tail_us: float = 16.0     # after the last GEMM tile, ranks sharing one H200 (2026-12-02)


def link_bytes(algorithm, m, n, W):
    if algorithm in ("atomics", "ring"):
        return (W - 1) * m * n * 4
    return 2 * (W - 1) / W * m * n * 2          # two_shot and NCCL: bf16 reduce-scatter + all-gather


def predict_ms(algorithm, shape, W, machine, one_gpu):
    """One launch on W GPUs (ms), or the sequential matmul + NCCL."""
    m, n, _ = shape
    mm = machine.matmul_ms[tuple(shape)]
    if algorithm == "sequential":
        return mm + (link_bytes("nccl", m, n, W) / (machine.nccl_bus_gb_s * 1e6) + machine.latency_us / 1e3
                     if W > 1 else 0.0)
    local = one_gpu.ratio[algorithm][tuple(shape)] * mm
    link = link_bytes(algorithm, m, n, W) / (machine.link_gb_s * 1e6)
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


def load_inputs(two_gpu_json, one_gpu_json):
    """(measured {shape: {alg: ms}}, Machine, OneGpu) from h200_bench.py's JSON files: the 2-GPU run gives
    the figures to check and the target's matmul times; the 1-GPU run the ratios."""
    with open(two_gpu_json) as f:
        two = json.load(f)
    with open(one_gpu_json) as f:
        one = json.load(f)
    measured = {tuple(r["shape"]): {a: r[f"{a}_ms"] for a in ("atomics", "ring", "sequential") if f"{a}_ms" in r}
                for r in two["results"]}
    machine = Machine(matmul_ms={tuple(r["shape"]): r["matmul_ms"] for r in two["results"]})
    ratio = {a: {tuple(r["shape"]): r[f"{a}_ms"] / r["matmul_ms"] for r in one["results"] if f"{a}_ms" in r}
             for a in ("atomics", "ring", "two_shot")}
    return measured, machine, OneGpu(ratio=ratio)
