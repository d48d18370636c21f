"""The device check of Iris's allocators: CUDA devices only."""

import torch


def is_valid_device(device, heap_device):
    requested = torch.device(device) if isinstance(device, str) else device
    return requested.type == "cuda" and heap_device.type == "cuda"


def throw_if_invalid_device(device, heap_device):
    if not is_valid_device(device, heap_device):
        raise RuntimeError(f"Device mismatch: requested device {device}, heap on {heap_device}")
