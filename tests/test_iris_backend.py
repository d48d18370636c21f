"""The iris backend without an AMD GPU: the backend choice, and the calls it makes into Iris.

A stand-in ``iris`` module (recording its calls, with CPU tensors) replaces the real one here; nothing
about AMD hardware is tested, as README says."""

import sys
import types

import pytest
import torch

import gemmar
from gemmar.runtime.backends import resolve_backend


def test_iris_backend_needs_iris():
    if "iris" in sys.modules:
        pytest.skip("a real iris is importable here")
    with pytest.raises(gemmar.UsageError, match="backend 'iris' needs Iris installed"):
        resolve_backend("iris", 2)


def test_iris_heap_takes_arena_and_bases_from_iris(monkeypatch):
    calls = {}

    class FakeIris:
        def __init__(self, heap_size):
            calls["heap_size"] = heap_size
            raw = torch.zeros(heap_size + 256, dtype=torch.uint8)
            self.buffer = raw[(-raw.data_ptr()) % 256:][:heap_size]  # device allocations are aligned

        def zeros(self, size, dtype):
            calls["zeros"] = (size, dtype)
            return self.buffer[:size]

        def get_heap_bases(self):
            return torch.tensor([self.buffer.data_ptr()], dtype=torch.int64)

    fake = types.SimpleNamespace(iris=FakeIris)
    monkeypatch.setitem(sys.modules, "iris", fake)
    monkeypatch.setattr(torch.cuda, "set_device", lambda rank: calls.setdefault("device", rank))
    from gemmar.runtime.heap.iris import IrisHeap

    monkeypatch.setattr(IrisHeap, "synchronize", lambda self: None)
    monkeypatch.setattr(IrisHeap, "barrier", lambda self, *a, **k: 0)
    heap = IrisHeap.create(0, 1, 1 << 20, "test")
    assert calls["heap_size"] >= 1 << 20 and calls["zeros"] == (1 << 20, torch.uint8) and calls["device"] == 0
    assert heap.heap_bases.tolist() == [heap._iris.buffer.data_ptr()]
    assert heap.zeros(16, torch.float32).data_ptr() - heap.arena.data_ptr() == 256  # first block after the header
    assert resolve_backend("iris", 1) == "iris"
