"""The explorer's life cycle without a browser (the browser test drives it in JupyterLab): an interrupted
run stops its ranks at once and says so, the next Run starts fresh ones, a new Explorer stops the old one's
cluster, and the status line reports the whole wait."""

import os
import signal
import threading
import time

import pytest

pytest.importorskip("ipywidgets")

from gemmar.explorer import Explorer  # noqa: E402
from inputs import process_alive  # noqa: E402


@pytest.fixture
def ctrl_c_as_in_a_kernel():
    """Ctrl-C as in a Jupyter kernel (a KeyboardInterrupt): a pytest started in the background by a shell without
    job control inherits SIGINT ignored, and the press below would then do nothing (tests/run_as_user.py)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_interrupt_stops_the_run_and_the_next_run_starts_fresh_ranks(ctrl_c_as_in_a_kernel):
    explorer = Explorer(world_size=2, m=128, n=128, k=128, iterations=20, algorithm="ring")
    pressed, returned_event = [], threading.Event()

    def press_stop_when_running():   # what Jupyter's stop button does: SIGINT to the kernel process
        while explorer.progress.value == 0 and not returned_event.wait(0.02):
            pass
        if not returned_event.is_set() and explorer.button.disabled:   # never interrupt pytest itself
            pressed.append(time.monotonic())
            os.kill(os.getpid(), signal.SIGINT)

    try:
        threading.Thread(target=press_stop_when_running, daemon=True).start()
        explorer.run()
        returned = time.monotonic()
        returned_event.set()
        assert pressed, "the run ended before it could be interrupted"
        assert returned - pressed[0] < 2.0
        assert explorer.status.value.startswith("interrupted after"), explorer.status.value
        old_pids = explorer.cluster.pids
        assert not any(process_alive(pid) for pid in old_pids)   # the ranks stopped, not finishing the work
        assert not explorer.button.disabled
        explorer.iterations.value = 1
        explorer.run()
        assert explorer.status.value.startswith("run 1: ring") and "correct on every rank" in explorer.status.value
        assert explorer.cluster.pids != old_pids
        # The status counts the whole wait: the restart (several seconds here) is in it.
        assert float(explorer.status.value.rsplit(", ", 1)[1].rstrip(" s")) > 1.0
        first_cluster = explorer.cluster
        replacement = Explorer(world_size=2)      # running the cell again
        assert not first_cluster.running
        replacement.close()
    finally:
        explorer.close()


def test_run_button_runs_in_the_background_and_stop_ends_the_ranks():
    """The Run button returns at once (the kernel stays free for Stop); Stop ends the run's ranks within
    2 s and says so; a click on Run during a run queues nothing; the next Run starts fresh ranks."""
    explorer = Explorer(world_size=2, m=128, n=128, k=128, iterations=20, algorithm="atomics")
    try:
        clicked = time.monotonic()
        explorer.button.click()
        assert time.monotonic() - clicked < 0.5 and explorer._thread.is_alive()
        deadline = time.monotonic() + 120
        while explorer.progress.value == 0:   # running, with ranks up
            assert time.monotonic() < deadline and explorer._thread.is_alive(), explorer.status.value
            time.sleep(0.02)
        running = explorer._thread
        explorer.button.click()               # ignored: Run is busy (and disabled in the browser)
        assert explorer._thread is running
        old_pids = explorer.cluster.pids
        pressed = time.monotonic()
        explorer.stop_button.click()
        running.join(10)
        assert time.monotonic() - pressed < 2.0, explorer.status.value
        assert explorer.status.value.startswith("stopped after"), explorer.status.value
        assert not any(process_alive(pid) for pid in old_pids)
        assert not explorer.button.disabled and explorer.stop_button.disabled
        explorer.iterations.value, explorer.m.value, explorer.n.value = 1, 32, 32
        explorer.button.click()
        explorer._thread.join(120)
        assert explorer.status.value.startswith("run 1: atomics"), explorer.status.value
        assert explorer.cluster.pids != old_pids and len(explorer.out.outputs) == 1   # the new Gantt chart
        # A run stopped after a finished one: its bar started again from 0, and the status says whose chart
        # is still drawn.
        explorer.iterations.value, explorer.m.value, explorer.n.value = 20, 128, 128
        explorer.button.click()
        deadline = time.monotonic() + 120
        while explorer.progress.value in (0, explorer.progress.max):   # not the last run's 100 %: this one's
            assert time.monotonic() < deadline and explorer._thread.is_alive(), explorer.status.value
            time.sleep(0.02)
        explorer.stop_button.click()
        explorer._thread.join(10)
        assert "stopped after" in explorer.status.value and "(the chart below is still run 1's)" in explorer.status.value
    finally:
        explorer.close()


def test_notebook_4s_exercise_is_solved_live_from_the_widgets():
    """Issue 37: the exercise's target is reachable from the widgets, on this machine, in a live run: the
    notebook's starting configuration, then bigger tiles (the knob the hint points at: fewer tiles, fewer
    hand-offs to wait for)."""
    from gemmar.exercises import check_less_waiting

    explorer = Explorer(world_size=3, m=64, n=64, k=48, BLK_M=16, BLK_N=16, BLK_K=16, num_sms=3, algorithm="ring")
    try:
        explorer.run()
        assert check_less_waiting(explorer).startswith("that is the starting configuration")
        explorer.block_m.value = explorer.block_n.value = 64
        explorer.run()
        said = check_less_waiting(explorer)
        assert said.startswith("found one! waiting"), said
    finally:
        explorer.close()
