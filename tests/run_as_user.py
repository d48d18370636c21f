"""Running gemmar as a user does, for the tests that need whole processes (plain functions, imported by module
name): the command, the tools a limit is set with, whether processes are gone, Ctrl-C as a terminal sends it."""

import os
import shutil
import signal
import subprocess
import sys

import pytest
from inputs import process_alive, wait_until

GEMMAR = [sys.executable, "-m", "gemmar.cli"]


def needs(*tools, root=True):
    """Skip the test, saying why, where a tool that sets its limit is missing (or it needs root and is not)."""
    missing = [t for t in tools if not shutil.which(t)]
    if missing or (root and os.geteuid() != 0):
        pytest.skip(f"needs {'root and ' if root else ''}{', '.join(tools)} to set the limit ({missing or 'not root'})")


def needs_mount_namespace():
    """Skip the test, saying why, where no mount namespace of its own can be made (unshare -m)."""
    needs("unshare", "mount")
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs tmpfs /mnt"], capture_output=True)
    if probe.returncode:
        pytest.skip(f"no mount namespace here: {probe.stderr.decode().strip()}")


def gone_within(pids, seconds):
    """Whether every process of ``pids`` has ended (zombies count as ended) within ``seconds``."""
    return wait_until(lambda: not any(process_alive(p) for p in pids), seconds, poll_s=0.1)


def ctrl_c_as_in_a_terminal():
    """A command typed in a terminal has Ctrl-C's default action; one started in the background by a shell
    without job control (a CI script run with `&`) inherits SIGINT ignored, and rightly keeps ignoring it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
