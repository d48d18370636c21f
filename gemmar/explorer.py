"""The tile-scheduling explorer: widgets for every knob of a run; Run reruns on the cluster and redraws
the Gantt chart and the per-rank summary. The cluster stays up between runs (restarted only when the
world size changes, or after an interrupted run). Interrupting the kernel (Jupyter's stop button) during a
run stops that run's ranks at once; the next Run starts fresh ones. Making a new Explorer (running its
cell again) stops the previous one's cluster."""

import time

from .cluster import Cluster
from .config import ALGORITHMS, DTYPES, RunConfig
from .errors import GemmarError


_current = None   # the Explorer made last: a new one stops its cluster


class Explorer:
    def __init__(self, world_size=3, m=64, n=64, k=64, BLK_M=16, BLK_N=16, BLK_K=16, num_sms=3, gsize_m=2,
                 algorithm="ring", datatype="fp16", iterations=1, backend="cpu"):
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
        self.algorithm = w.Dropdown(options=list(ALGORITHMS), value=algorithm, description="algorithm")
        self.datatype = w.Dropdown(options=list(DTYPES), value=datatype, description="dtype")
        self.iterations = w.BoundedIntText(value=iterations, min=1, max=20, description="iterations")
        self.button = w.Button(description="Run", button_style="primary", icon="play")
        self.progress = w.IntProgress(value=0, min=0, max=1, description="progress")
        self.status = w.HTML("Press Run.")
        self.out = w.Output()
        self.button.on_click(lambda _: self.run())
        for knob in (self.m, self.n, self.k, self.block_m, self.block_n, self.block_k, self.group, self.programs,
                     self.world, self.algorithm, self.datatype, self.iterations):
            knob.style = {"description_width": "110px"}
        knobs = w.GridBox([self.m, self.n, self.k, self.block_m, self.block_n, self.block_k, self.group,
                           self.programs, self.world, self.algorithm, self.datatype, self.iterations],
                          layout=w.Layout(grid_template_columns="repeat(3, 320px)"))
        self.widget = w.VBox([knobs, w.HBox([self.button, self.progress]), self.status, self.out])
        self.first_config = self.config()   # what the notebook started with (an exercise asks for another)

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
            self.status.value = f"starting {world_size} ranks (ipyparallel engines)..."
            self.cluster = Cluster(world_size=world_size, backend=self.backend)
        return self.cluster

    def run(self):
        """Run the configuration the widgets show; redraw. Errors show in the status line."""
        import matplotlib.pyplot as plt
        from IPython.display import display

        self.button.disabled = True
        start = time.monotonic()   # what the user waits for, a cluster start included
        try:
            config = self.config()
            cluster = self._cluster(config.world_size)
            self.progress.max, self.progress.value = config.world_size * config.iterations, 0
            done = {}

            def on_progress(rank, data):
                done[rank] = data["iteration"]
                self.progress.value = sum(done.values())

            self.status.value = f"running {config.algorithm} on {config.world_size} ranks..."
            result = cluster.bench(config, on_progress=on_progress)
            self.progress.value = self.progress.max
            self.runs += 1
            verdict = "correct on every rank" if result.ok else "WRONG RESULT"
            self.status.value = (f"run {self.runs}: {config.algorithm}, {config.m}x{config.n}x{config.k} "
                                 f"{config.datatype}, {config.world_size} ranks x {config.num_sms} programs: "
                                 f"{verdict} (max |C - ref| {result.max_abs_diff:.2g}), "
                                 f"{time.monotonic() - start:.1f} s")
            self.result = result
            self.out.clear_output(wait=True)
            with self.out:
                fig = result.trace.gantt()
                display(fig)
                plt.close(fig)
        except GemmarError as e:
            self.status.value = f"<b>error:</b> {e}"
        except KeyboardInterrupt:
            self.status.value = (f"interrupted after {time.monotonic() - start:.1f} s: the run's ranks were stopped; "
                                 f"the next Run starts fresh ones")
        finally:
            self.button.disabled = False

    def close(self):
        if self.cluster is not None:
            self.cluster.stop()
            self.cluster = None
