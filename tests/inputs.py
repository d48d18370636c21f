"""Inputs, references and polling shared by the tests (plain functions, imported by module name)."""

import time

import torch


def random_inputs(m, n, k, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    A = torch.randn(m, k, generator=gen).to(dtype)
    B = torch.randn(k, n, generator=gen).to(dtype)
    return A, B


def reference(A, B):
    return A.double() @ B.double()


def wait_until(predicate, timeout_s, poll_s=0.05):
    """Poll ``predicate`` until it is true or ``timeout_s`` passes; return its last value."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(poll_s)
