"""``iris.hip`` on gemmar: the device queries Iris programs make, answered for NVIDIA GPUs and the CPU.

Iris reads these from ROCm; here a rank is one die (``get_num_xcc`` is 1), its clock is gemmar's ``now()``
in ns (``get_wall_clock_rate`` is 1e6 kHz, what turns ``read_realtime`` ticks into time), and its compute
units are the GPU's SMs, or on the cpu backend the machine's cores. Any other ROCm call is refused in one line.
"""

import os

import torch

from ..errors import UsageError
from . import this_rank

WALL_CLOCK_KHZ = 1_000_000


def _device():
    return this_rank.rank_heap().arena.device


def get_num_xcc(device_id=None):
    return 1


def get_wall_clock_rate(device_id=None):
    return WALL_CLOCK_KHZ


def get_cu_count(device_id=None):
    device = _device()
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return os.cpu_count() or 1


def count_devices():
    return torch.cuda.device_count() if _device().type == "cuda" else 1


def get_device_id():
    device = _device()
    return (device.index or 0) if device.type == "cuda" else 0


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    raise UsageError(f"iris.hip.{name} is a ROCm call that gemmar's iris does not have (it has get_num_xcc, "
                     f"get_wall_clock_rate, get_cu_count, count_devices, get_device_id)")
