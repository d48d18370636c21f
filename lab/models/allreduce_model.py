"""A model of the standalone all-reduce across W GPUs, fitted on a measured 2-GPU run, that predicts 4 and 8
GPUs before anybody measures them (issue 50: the predictions are committed, dated, then checked).

Each implementation's time for S bytes per rank is ``latency(W) + bus_bytes(S, W) / bandwidth``:

- bus bytes per rank: two-shot schemes (gemmar's two_shot, torch symmetric memory's two-shot, NCCL's ring)
  send ``2 (W - 1) / W S`` (a share out, the sums back); one-shot reads every peer's whole message,
  ``(W - 1) S``. On NVSwitch machines a GPU's link bandwidth is the same whatever the number of peers, so the
  bandwidth fitted at W = 2 stands for every W.
- latency: NCCL's ring makes ``2 (W - 1)`` steps one after another, so its 2-GPU latency grows as ``W - 1``;
  the symmetric-memory kernels signal and wait on every peer at once, so theirs grows by a share of itself per
  extra peer (``PER_PEER_LATENCY``: an assumption, not a measurement; docs/decisions.md, the all-reduce model).

The two numbers of each implementation (latency, bandwidth) are fitted to the measured run by least squares
on relative error; :func:`fit` returns them with the fit's error at every measured size, so a poor fit shows.
"""

import dataclasses
import json
import os

import numpy as np

# The run it is fitted on: lab/data/ (its machine and date: docs/decisions.md, the all-reduce model).
LAB = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MEASURED_RUN = os.path.join(LAB, "data", "two-gpus-allreduce.json")
# implementation -> (its scheme's bus bytes, how its latency grows with W)
IMPLEMENTATIONS = {"gemmar_two_shot": ("two_shot", "direct"), "gemmar_one_shot": ("one_shot", "direct"),
                   "symm_mem_two_shot": ("two_shot", "direct"), "nccl": ("two_shot", "ring")}
# Each peer past the first adds this share of the 2-GPU latency to a kernel that talks to all peers at once
# (an assumption to be checked on 4 and 8 GPUs: docs/decisions.md, the all-reduce model).
PER_PEER_LATENCY = 0.25
MIB = 2 ** 20


def bus_bytes(scheme, nbytes, W):
    """Bytes each rank moves over its links for an all-reduce of ``nbytes`` per rank."""
    return 2 * (W - 1) / W * nbytes if scheme == "two_shot" else (W - 1) * nbytes


def latency_factor(growth, W):
    """How many times its 2-GPU latency an implementation takes at W GPUs."""
    return W - 1 if growth == "ring" else 1 + PER_PEER_LATENCY * (W - 2)


@dataclasses.dataclass
class Fit:
    implementation: str
    latency_ms: float     # at W = 2
    gb_s: float           # bus bandwidth, GB/s
    errors: dict          # MiB -> (model - measured) / measured, at the measured world size

    def ms(self, mib, W):
        scheme, growth = IMPLEMENTATIONS[self.implementation]
        return self.latency_ms * latency_factor(growth, W) + bus_bytes(scheme, mib * MIB, W) / (self.gb_s * 1e6)


def load(path=MEASURED_RUN):
    with open(path) as f:
        run = json.load(f)
    if run.get("world_size") != 2:
        raise ValueError(f"{path}: the model is fitted on a 2-GPU run, this one is of world_size {run.get('world_size')}")
    return run


def fit(run):
    """{implementation: Fit} from a measured run's rows (mib, implementation, ms)."""
    fits = {}
    for implementation, (scheme, _) in IMPLEMENTATIONS.items():
        rows = [r for r in run["rows"] if r["implementation"] == implementation]
        if len(rows) < 2:
            continue
        # t = a + x * bytes, each row divided by its t: least squares on relative error
        t = np.array([r["ms"] for r in rows])
        design = np.array([[1.0, bus_bytes(scheme, r["mib"] * MIB, 2)] for r in rows]) / t[:, None]
        (a, x), *_ = np.linalg.lstsq(design, np.ones(len(rows)), rcond=None)
        one = Fit(implementation, float(a), float(1 / x / 1e6), {})
        one.errors = {r["mib"]: one.ms(r["mib"], 2) / r["ms"] - 1 for r in rows}
        fits[implementation] = one
    return fits


def predictions(fits, sizes_mib, world_sizes):
    """Rows of predicted times: gemmar's best scheme (what ``scheme="auto"`` should pick) against the best
    baseline, per world size and size."""
    rows = []
    for W in world_sizes:
        for mib in sizes_mib:
            ms = {name: f.ms(mib, W) for name, f in fits.items()}
            ours = min(("gemmar_two_shot", "gemmar_one_shot"), key=ms.get)
            theirs = min((n for n in ms if not n.startswith("gemmar")), key=ms.get)
            rows.append(dict(world_size=W, mib=mib, **{f"{n}_ms": v for n, v in ms.items()}, best_scheme=ours[7:],
                             best_baseline=theirs, speed_vs_best_baseline=ms[theirs] / ms[ours]))
    return rows


def one_shot_crossover_mib(fits, W):
    """The size below which one-shot is predicted faster than two-shot at W GPUs (0: never)."""
    two, one = fits["gemmar_two_shot"], fits["gemmar_one_shot"]
    extra_bytes_per_mib = (bus_bytes("one_shot", MIB, W) / (one.gb_s * 1e6) -
                           bus_bytes("two_shot", MIB, W) / (two.gb_s * 1e6))
    saved = (two.latency_ms - one.latency_ms) * latency_factor("direct", W)
    return max(0.0, saved / extra_bytes_per_mib) if extra_bytes_per_mib > 0 else float("inf")
