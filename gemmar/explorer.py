"""The tile-scheduling explorer: widgets for every knob of a run; Run reruns on the cluster and redraws
the Gantt chart and the per-rank summary. The cluster stays up between runs (restarted only when the
world size changes, or after a stopped run).

The Run button runs in a background thread, and the explorer's own Stop button ends that run's ranks at
once; the next Run starts fresh ones. (Jupyter's stop button cannot do it: JupyterLab 4.6 hands widget
clicks to an ipykernel *subshell* thread, and SIGINT reaches only the main thread; measured by the browser
test, a two-minute run went on to its end.) ``run()`` called in a cell runs in the cell, where Jupyter's
stop button does interrupt it, with the same result. Making a new Explorer (running its cell again) stops
the previous one's cluster."""

import base64
import io
import threading
import time

from .cluster import Cluster
from .algorithms import names as algorithm_names
from .analysis.plots import plural
from .config import DTYPES, RunConfig
from .errors import ClusterError, GemmarError


_current = None   # the Explorer made last: a new one stops its cluster


class Explorer:
    def __init__(self, world_size=3, m=64, n=64, k=64, BLK_M=16, BLK_N=16, BLK_K=16, num_sms=3, gsize_m=2,
                 algorithm=RunConfig.algorithm, datatype="fp16", iterations=1, backend="cpu"):
        """Knobs take RunConfig's names; the values here are the widgets' starting values."""
        import ipywidgets as w

        global _current
        if _current is not None:
            _current.close()
        _current = self

        self.backend, self.cluster, self.runs = backend, None, 0
        blocks = [16, 32, 64]
        self.m = w.BoundedIntText(value=m, min=1, max=512, description="M")
        self.n = w.BoundedIntText(value=n, min=1, max=512, description="N")
        self.k = w.BoundedIntText(value=k, min=1, max=512, description="K")
        self.block_m = w.Dropdown(options=blocks, value=BLK_M, description="BLK_M")
        self.block_n = w.Dropdown(options=blocks, value=BLK_N, description="BLK_N")
        self.block_k = w.Dropdown(options=blocks, value=BLK_K, description="BLK_K")
        self.group = w.BoundedIntText(value=gsize_m, min=1, max=16, description="gsize_m")
        self.programs = w.BoundedIntText(value=num_sms, min=1, max=16, description="num_sms")
        self.world = w.BoundedIntText(value=world_size, min=1, max=5, description="world size")
        self.algorithm = w.Dropdown(options=list(algorithm_names()), value=algorithm, description="algorithm")
        self.datatype = w.Dropdown(options=list(DTYPES), value=datatype, description="dtype")
        self.iterations = w.BoundedIntText(value=iterations, min=1, max=20, description="iterations")
        self.button = w.Button(description="Run", button_style="primary", icon="play")
        self.stop_button = w.Button(description="Stop", icon="stop", disabled=True,
                                    tooltip="end this run's ranks now; the next Run starts fresh ones")
        self.progress = w.IntProgress(value=0, min=0, max=1, description="progress")
        self.status = w.HTML("Press Run.")
        self.out = w.Output()
        self.button.on_click(lambda _: self.start())
        self.stop_button.on_click(lambda _: self.stop())
        self._thread, self._stopped = None, False
        for knob in (self.m, self.n, self.k, self.block_m, self.block_n, self.block_k, self.group, self.programs,
                     self.world, self.algorithm, self.datatype, self.iterations):
            knob.style = {"description_width": "110px"}
        knobs = w.GridBox([self.m, self.n, self.k, self.block_m, self.block_n, self.block_k, self.group,
                           self.programs, self.world, self.algorithm, self.datatype, self.iterations],
                          layout=w.Layout(grid_template_columns="repeat(3, 320px)"))
        self.widget = w.VBox([knobs, w.HBox([self.button, self.stop_button, self.progress]), self.status, self.out])
        self.first_config = self.config()   # what the notebook started with (an exercise asks for another)
        self.first_result = None            # its run

    def config(self):
        return RunConfig(m=self.m.value, n=self.n.value, k=self.k.value, datatype=self.datatype.value,
                         algorithm=self.algorithm.value, BLK_M=self.block_m.value, BLK_N=self.block_n.value,
                         BLK_K=self.block_k.value, gsize_m=self.group.value, num_sms=self.programs.value,
                         world_size=self.world.value, iterations=self.iterations.value, trace=True).validate()

    def _cluster(self, world_size):
        if self.cluster is not None and (self.cluster.world_size != world_size or not self.cluster.running):
            self.cluster.stop()
            self.cluster = None
        if self.cluster is None:
            self.status.value = f"starting {plural(world_size, 'rank')} (ipyparallel engines)..."
            self.cluster = Cluster(world_size=world_size, backend=self.backend)
        return self.cluster

    def start(self):
        """The Run button: the run in a background thread, so that the kernel is free to take Stop."""
        if self._thread is not None and self._thread.is_alive():   # (Run is disabled meanwhile: never queue)
            return
        self._thread = threading.Thread(target=self.run, name="gemmar-explorer-run", daemon=True)
        self._thread.start()

    def stop(self):
        """The Stop button: end the running run's ranks now (the run reports it); the next Run starts fresh
        ones."""
        if self.button.disabled:   # a run is in progress
            self._stopped = True
            if self.cluster is not None:   # (pressed while the ranks start: the run ends once they are up)
                self.cluster.stop()

    def run(self):
        """Run the configuration the widgets show; redraw. Errors show in the status line."""
        self.button.disabled, self.stop_button.disabled, self._stopped = True, False, False
        self.progress.value = 0    # (not the last run's 100 % while this one starts)
        start = time.monotonic()   # what the user waits for, a cluster start included
        try:
            self._run(start)
        except GemmarError as e:
            self.status.value = f"<b>error:</b> {e}{self._old_chart()}" if not self._stopped else (
                f"stopped after {time.monotonic() - start:.1f} s: the run's ranks were ended; the next Run starts "
                f"fresh ones{self._old_chart()}")
        except KeyboardInterrupt:   # run() in a cell, and Jupyter's stop button
            self.status.value = (f"interrupted after {time.monotonic() - start:.1f} s: the run's ranks were stopped; "
                                 f"the next Run starts fresh ones{self._old_chart()}")
        finally:
            self.button.disabled, self.stop_button.disabled = False, True

    def _old_chart(self):
        return f" (the chart below is still run {self.runs}'s)" if self.runs else ""

    def _run(self, start):
        import matplotlib.pyplot as plt

        config = self.config()
        cluster = self._cluster(config.world_size)
        if self._stopped:
            cluster.stop()
            raise ClusterError("stopped while the ranks started")
        self.progress.max, self.progress.value = config.world_size * config.iterations, 0
        done = {}

        def on_progress(rank, data):
            done[rank] = data["iteration"]
            self.progress.value = sum(done.values())

        self.status.value = f"running {config.algorithm} on {plural(config.world_size, 'rank')}..."
        result = cluster.bench(config, on_progress=on_progress)
        self.progress.value = self.progress.max
        self.runs += 1
        verdict = "correct on every rank" if result.ok else "WRONG RESULT"
        self.status.value = (f"run {self.runs}: {config.algorithm}, {config.m}x{config.n}x{config.k} "
                             f"{config.datatype}, {plural(config.world_size, 'rank')} x {plural(config.num_sms, 'program')}: "
                             f"{verdict} (max |C - ref| {result.max_abs_diff:.2g}), "
                             f"{time.monotonic() - start:.1f} s")
        self.result = result
        if config.to_dict() == self.first_config.to_dict() and self.first_result is None:
            self.first_result = result   # (notebook 4's exercise compares a later run with it)
        # The chart as a PNG in the Output widget's outputs, set in one go: `with self.out:` and clear_output
        # capture through the kernel's current message, which a background thread does not have.
        fig = result.trace.gantt(show=False)   # (drawn into the Output widget below, not under a cell)
        png = io.BytesIO()
        fig.savefig(png, format="png", bbox_inches="tight")
        plt.close(fig)
        self.out.outputs = ({"output_type": "display_data", "metadata": {},
                             "data": {"image/png": base64.b64encode(png.getvalue()).decode(),
                                      "text/plain": f"<Gantt chart of run {self.runs}>"}},)

    def close(self):
        if self.cluster is not None:
            self.cluster.stop()
            self.cluster = None
