"""The smoke run for a Triton release other than the one the full suite runs on (see .ci/run).

One cluster of two ranks: every algorithm launched and checked against torch, one puzzle check wrong and
right, one trace drawn; then notebook 1 top to bottom. Prints one line per step and exits 1 on the first
thing that is not as it should be.
"""

import atexit
import io
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

# Nothing into the user's home (the notebook's kernel keeps IPython history, matplotlib its caches): a
# private one, removed at the end, as the test suite does (tests/conftest.py).
HOME = tempfile.mkdtemp(prefix="gemmar-smoke-home-")
os.environ["HOME"] = HOME
atexit.register(shutil.rmtree, HOME, ignore_errors=True)

import triton  # noqa: E402

import gemmar  # noqa: E402
from gemmar import RunConfig, exercises  # noqa: E402
from gemmar.algorithms import builtin_names  # noqa: E402
from gemmar.kernels.gemm import tile_coords  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
start = time.monotonic()


def step(what, ok, detail=""):
    print(f"[smoke triton {triton.__version__}] {what}: {'ok' if ok else 'FAILED'} {detail}".rstrip(), flush=True)
    if not ok:
        sys.exit(1)


expected = os.environ.get("GEMMAR_SMOKE_TRITON")
if expected:   # (.ci/run puts the release ahead of the venv's own Triton: the ranks must import it too)
    step(f"Triton {expected} imported from {os.path.dirname(triton.__file__)}", triton.__version__ == expected)


WRONG_PART = """
import triton
import triton.language as tl


@triton.jit
def row_major(tile_id, num_pid_m, num_pid_n, GROUP_SIZE_M: tl.constexpr):
    return tile_id // num_pid_n, tile_id % num_pid_n
"""


with tempfile.TemporaryDirectory() as folder, gemmar.Cluster(world_size=2) as cluster:
    for algorithm in builtin_names():
        result = cluster.bench(RunConfig(m=48, n=40, k=40, BLK_M=16, BLK_N=16, BLK_K=16, algorithm=algorithm,
                                         iterations=2, trace=algorithm == "ring"), validate=True)
        step(f"{algorithm} at world size 2", result.ok, f"max|C - ref| = {result.max_abs_diff:.3g}")
        ranks_triton = {info["triton"] for info in result.info}
        step(f"{algorithm}'s ranks run Triton {triton.__version__}", ranks_triton == {triton.__version__},
             f"(they run {', '.join(sorted(ranks_triton))})")
        if algorithm == "ring":
            png = Path(folder) / "ring.png"
            result.trace.gantt().savefig(png)
            step("a trace drawn", png.stat().st_size > 10_000, f"({len(result.trace.events)} events)")
    Path(folder, "wrong_part.py").write_text(WRONG_PART)   # as a participant writes it, in a file
    sys.path.insert(0, folder)
    import wrong_part

    said = exercises.check_tile_coords(cluster, wrong_part.row_major)
    step("a wrong puzzle answer refused", said.startswith("not quite:"), f"({said[:60]}...)")
    said = exercises.check_tile_coords(cluster, tile_coords)
    step("the right puzzle answer accepted", said.startswith("right!"))
    # Today's Iris launch and device API (mp.spawn, torch.distributed, DeviceContext) under this interpreter.
    said = io.StringIO()
    program = cluster.run_script(ROOT / "examples" / "iris_today" / "spawn_device_context.py", "-s", "200",
                                 timeout=120, out=said, err=io.StringIO())
    step("an Iris program with DeviceContext", program.ok and said.getvalue().count("200 of 200 values") == 2)
    said, trace_file = io.StringIO(), Path(folder) / "device_trace.json"
    program = cluster.run_script(ROOT / "examples" / "iris_today" / "device_tracing.py", "-s", "200", "-o",
                                 str(trace_file), timeout=120, out=said, err=io.StringIO())
    drawn = program.ok and len(gemmar.Trace.load(str(trace_file)).events) == 2 * 3   # 2 ranks x (put, wait, reduce)
    step("an Iris program's device trace, exported and read", drawn and said.getvalue().count("sums right") == 4)

# Casts to bf16 and fp16 under this release's interpreter give torch's (a compiled kernel's) bits: every count full.
import re  # noqa: E402
import subprocess  # noqa: E402

casts = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "cast_bits.py")], capture_output=True, text=True,
                       env={**os.environ, "CUDA_VISIBLE_DEVICES": ""}).stdout
counts = [(int(a), int(b)) for line in casts.splitlines() for a, b in
          re.findall(r"(\d+)/(\d+)", line.split("as torch")[0])]
step("casts to bf16 and fp16 round as a GPU does", len(counts) == 20 and all(a == b for a, b in counts)
     and "by 3 programs: 3.0" in casts, f"({len(counts)} counts)")

import nbformat  # noqa: E402 - the notebook step needs no cluster; imported where it runs
from nbclient import NotebookClient  # noqa: E402

path = ROOT / "notebooks" / "01_persistent_gemm.ipynb"
nb = nbformat.read(path, as_version=4)
NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
step("notebook 1 top to bottom", not errors, f"({len(nb.cells)} cells)")
print(f"[smoke triton {triton.__version__}] done in {time.monotonic() - start:.0f} s", flush=True)
