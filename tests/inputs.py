"""Inputs, references and polling shared by the tests (plain functions, imported by module name)."""

import os
import time

import psutil
import torch


def random_inputs(m, n, k, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    A = torch.randn(m, k, generator=gen).to(dtype)
    B = torch.randn(k, n, generator=gen).to(dtype)
    return A, B


def reference(A, B):
    return A.double() @ B.double()


def process_alive(pid):
    """Whether the process ``pid`` runs (a zombie, ended but not yet reaped, does not)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_until(predicate, timeout_s, poll_s=0.05):
    """Poll ``predicate`` until it is true or ``timeout_s`` passes; return its last value."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(poll_s)


EPSILON = {torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8, torch.float32: 0.0}


def allowed_error(result, A, B):
    """An independent bound on max |C - A @ B|: fp32 accumulation over K, plus rounding C to its dtype and,
    for two_shot, each rank's partial to the wire dtype (the input dtype unless the run said otherwise)."""
    ref = reference(A, B)
    peak = ref.abs().max().item() if ref.numel() else 0.0
    rounding = EPSILON[result.C.dtype]   # (half an ulp: conversions round to nearest even, on cpu ranks too)
    if result.config.spec.wire_dtype:   # partials rounded to their wire dtype on the way
        rounding += result.config.world_size * EPSILON[result.config.wire_torch_dtype]
    return 1e-3 * max(1.0, A.shape[1] ** 0.5) + rounding * peak


def gemmar_shm_entries():
    """{name: is a folder} of gemmar's entries in the shared-memory folder (a cluster's heap folder, ...)."""
    from gemmar.runtime.heap import shm_dir

    return {e.name: e.is_dir() for e in os.scandir(shm_dir()) if e.name.startswith("gemmar-")}


def loose_gemmar_files(before):
    """gemmar's entries in the shared-memory folder, not in ``before``, that are files rather than a cluster's
    folder. (The suite may run in two workers, each with clusters of its own coming and going: a test looks at
    its own cluster's folder by name, and at loose files, never at every folder there.)"""
    return [name for name, is_dir in gemmar_shm_entries().items() if name not in before and not is_dir]
