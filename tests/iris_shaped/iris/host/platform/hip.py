"""Loads a GPU runtime at import, as Iris's platform module does: on a machine without one this import fails,
so a test that gets past it shows gemmar supplied its own module."""

import ctypes

runtime = ctypes.cdll.LoadLibrary("libamdhip64.so")


def count_devices():
    raise RuntimeError("not reached")


def set_device(gpu_id):
    raise RuntimeError("not reached")
