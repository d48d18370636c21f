"""The real Iris hosted on gemmar's ranks (gemmar/iris/real_iris.py), tested without Iris's files: an Iris-shaped
package (tests/iris_shaped) whose GPU runtime import and GPU heap would fail here unless gemmar supplies its own.
Also: which Iris a run gets and says it got, torch.distributed's collectives ordering ranks for the sanitizer, a
flag left from an earlier call named as stale, and where a rank stopped at the deadline was."""

import io
import os
import textwrap

import pytest

from gemmar.errors import UsageError
from gemmar.iris import real_iris

HERE = os.path.dirname(os.path.abspath(__file__))
SHAPED = os.path.join(HERE, "iris_shaped")
PROGRAMS = os.path.join(HERE, "iris_programs")


def run(cluster, path, *args, timeout=120, **kwargs):
    out, err = io.StringIO(), io.StringIO()
    result = cluster.run_script(path, *args, timeout=timeout, out=out, err=err, **kwargs)
    return result, out.getvalue(), err.getvalue()


def test_which_iris_a_run_gets(tmp_path, monkeypatch):
    assert real_iris.choose(None, replace_iris=True) == real_iris.STAND_IN
    assert real_iris.choose(SHAPED) == SHAPED
    assert real_iris.choose(os.path.join(SHAPED, "iris")) == SHAPED          # (the package folder works too)
    assert real_iris.choose() == real_iris.STAND_IN                            # (no Iris installed here)
    monkeypatch.syspath_prepend(SHAPED)                                        # an installed one is hosted
    assert real_iris.choose() == SHAPED
    with pytest.raises(UsageError, match="two different Iris"):
        real_iris.choose(SHAPED, replace_iris=True)
    with pytest.raises(UsageError) as refused:
        real_iris.choose(str(tmp_path))
    assert str(tmp_path) in str(refused.value) and "iris/host/iris.py" in str(refused.value)
    assert "\n" not in str(refused.value)


def test_the_cli_refuses_a_path_without_iris_in_one_line(tmp_path, capsys):
    from gemmar import cli

    program = tmp_path / "prog.py"
    program.write_text("pass\n")
    code = cli.main(["run", "-r", "2", "--backend", "cpu", "--iris", str(tmp_path), str(program)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "no Iris package there" in err, err


def test_an_iris_shaped_package_runs_on_gemmars_heap(clusters):
    """Its hip module (which loads a GPU runtime) and its GPU heap are gemmar's; its device code reads the
    neighbour's buffer through heap_bases; its aggregate keeps a plain int as a constexpr and its jit method; its
    ops say in one line that tritonBLAS is missing; the run says which Iris it is."""
    result, out, err = run(clusters(2), os.path.join(PROGRAMS, "hosted_iris_shaped.py"), iris=SHAPED)
    assert result.ok, (result, out, err)
    assert f"[gemmar] iris: the real Iris from {os.path.join(SHAPED, 'iris')}" in err
    for rank in range(2):
        peer = (rank + 1) % 2
        assert f"[rank {rank}/2] rank {rank} read {[float(10 + peer)] * 8} from rank {peer}" in out, out
    assert out.count("hip from module: gemmar's answers to Iris's device queries") == 2, out
    assert out.count("ops: UsageError: tritonblas.kernels.stages.GemmContext: tritonBLAS is not installed") == 2, out


def test_the_stand_in_says_it_is_one(clusters):
    result, out, err = run(clusters(2), os.path.join(PROGRAMS, "hosted_iris_shaped.py"), replace_iris=True)
    assert "[gemmar] iris: gemmar's Iris stand-in" in err
    assert not result.ok   # (the stand-in has no read_from: the program is the shaped package's)


STALE_FLAG = textwrap.dedent('''
    import time
    import torch, torch.distributed as dist, triton, triton.language as tl
    import iris

    @triton.jit
    def publish_then_read(mine, theirs, out, flags, rank, peer, heap_bases, BLOCK: tl.constexpr):
        offsets = tl.arange(0, BLOCK)
        tl.store(mine + offsets, tl.load(out + offsets) * 0 + rank + 1.0)
        tl.atomic_xchg(flags, 1, sem="release", scope="sys")              # "ready": the constant 1, every call
        while iris.atomic_add(flags, 0, rank, peer, heap_bases, sem="acquire", scope="sys") != 1:
            pass
        tl.store(out + offsets, iris.load(mine + offsets, rank, peer, heap_bases))

    dist.init_process_group(backend="gloo")
    ctx = iris.iris(1 << 20)
    rank = ctx.get_rank()
    mine, out = ctx.zeros(16, dtype=torch.float32), ctx.zeros(16, dtype=torch.float32)
    flags = ctx.zeros(1, dtype=torch.int32)
    for call in range(2):
        torch.cuda.synchronize()   # (a host barrier orders kernels only after the host waited for them)
        dist.barrier()
        if rank == 1 and call == 1:
            time.sleep(0.5)
        publish_then_read[(1,)](mine, None, out, flags, rank, 1 - rank, ctx.get_heap_bases(), BLOCK=16)
    torch.cuda.synchronize()
    dist.barrier()
''')


def test_a_flag_left_by_an_earlier_call_is_named_stale(clusters, tmp_path):
    """The second launch's wait sees the 1 the peer left in its first: the sanitizer says so, ordering the two
    launches of each rank by the program's dist.barrier calls (no race reported between them)."""
    program = tmp_path / "stale.py"
    program.write_text(STALE_FLAG)
    result, out, err = run(clusters(2), str(program), sanitize=True)
    assert result.ok, (result, out, err)
    races = result.sanitizer.races
    assert races and all("mine" in r.text for r in races), out
    assert any("left at stale.py:10 in an earlier kernel launch" in r.text and "flags[0]" in r.text for r in races), out
    # (launches counted per kernel: the rank's own count also has the barrier kernels between)
    assert any("in an earlier kernel launch, rank 1's 1st launch of publish_then_read; this write is in rank 1's "
               "2nd launch of publish_then_read:" in r.text for r in races), [r.text for r in races]


def test_a_rank_stopped_at_the_deadline_is_named_with_its_line(clusters, tmp_path):
    program = tmp_path / "spin.py"
    program.write_text(textwrap.dedent('''
        import time, torch, triton, triton.language as tl, iris

        @triton.jit
        def wait_for(flag):
            while tl.atomic_add(flag, 0, sem="acquire", scope="sys") == 0:
                pass

        shmem = iris.iris(1 << 20)
        flag = shmem.zeros(1, dtype=torch.int32)
        if shmem.get_rank() == 0:
            wait_for[(1,)](flag)
        else:
            time.sleep(600)
    '''))
    result, out, err = run(clusters(2), str(program), timeout=8)
    assert result.timed_out, (result, out, err)
    assert "(it was at spin.py:6 (while tl.atomic_add(flag, 0, sem=\"acquire\", scope=\"sys\") == 0:)" in \
        result.errors[0], result.errors
    assert "(it was at spin.py:14 (time.sleep(600)))" in result.errors[1], result.errors


def test_a_second_init_process_group_uses_the_group_there_is(clusters, tmp_path):
    """A GPU-per-rank heap makes the ranks' default group before the program starts (item 4: Iris's launcher then
    stopped with "trying to initialize the default process group twice!"); on cpu ranks the same path is a program's
    second init_process_group: the group there is is used, said once, and collectives work on it."""
    program = tmp_path / "twice.py"
    program.write_text(textwrap.dedent('''
        import torch, torch.distributed as dist
        dist.init_process_group(backend="gloo")
        dist.init_process_group(backend="gloo", device_id=torch.device("cuda:0"))
        total = torch.tensor([dist.get_rank() + 1])
        dist.all_reduce(total)
        print("sum", total.item())
    '''))
    result, out, err = run(clusters(2), str(program))
    assert result.ok, (result, out, err)
    assert out.count("sum 3") == 2, out
    assert err.count("the ranks' process group exists already") == 1, err


def test_all_to_all_works_where_the_backend_has_none(clusters, tmp_path):
    """Ranks sharing one GPU meet on gloo, whose all_to_all some torch releases refuse for GPU tensors ("Backend
    gloo does not support alltoall": 33 of Iris's ccl and context cases on an H100 at 2 ranks sharing it). The
    same exchange goes through all_gather, said once; here gloo's refusal is made on purpose (torch 2.13's gloo has
    the CPU path) and the result compared with the backend's own all_to_all."""
    program = tmp_path / "all_to_all.py"
    program.write_text(textwrap.dedent('''
        import torch, torch.distributed as dist
        from gemmar.programs import launch
        dist.init_process_group(backend="gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        sent = [torch.arange(6, dtype=torch.float32).view(2, 3) + 100 * rank + 10 * peer for peer in range(world)]
        expected = [torch.empty(2, 3) for _ in range(world)]
        dist.all_to_all(expected, sent)                       # (the backend's own)
        backend_all_to_all = launch._original["all_to_all"]
        def refused(*args, **kwargs):
            raise RuntimeError("Backend gloo does not support alltoall")
        launch._original["all_to_all"] = refused
        try:
            got = [torch.full((2, 3), -1.0) for _ in range(world)]
            work = dist.all_to_all(got, sent, async_op=True)
            work.wait()
            print("same", all(torch.equal(g, e) for g, e in zip(got, expected)),
                  [g[0, 0].item() for g in got])
            try:
                dist.all_to_all([torch.empty(2) for _ in range(world)], sent)
            except Exception as error:
                print("refused:", type(error).__name__, error)
        finally:   # (the engines outlive this program)
            launch._original["all_to_all"] = backend_all_to_all
    '''))
    result, out, err = run(clusters(3), str(program))
    assert result.ok, (result, out, err)
    for rank in range(3):   # (rank r receives peer p's tensor number r: 100 p + 10 r)
        assert f"same True {[100.0 * p + 10 * rank for p in range(3)]}" in out, out
    assert out.count("refused: UsageError dist.all_to_all over gloo here: gemmar exchanges tensors of one size") == 3
    assert err.count("exchanges the tensors through dist.all_gather instead") == 1, err


def test_an_aligned_allocation_and_an_empty_one_keep_the_heaps_table_right():
    """Iris allocates from the heap's end at 1024-byte alignment (HeapOverGemmar.allocate -> heap.empty), and its
    tests allocate empty tensors: an empty one must not take the table entry of the tensor before it (the sanitizer
    would then call every access to that tensor one "in no buffer")."""
    import torch

    from gemmar.runtime.heap.base import SymmetricHeap

    raw = torch.zeros((1 << 16) + 4096, dtype=torch.uint8)
    start = (-raw.data_ptr()) % 4096
    arena = raw[start:start + (1 << 16)]
    heap = SymmetricHeap(0, 1, arena, torch.tensor([arena.data_ptr()]), torch.device("cpu"), 5.0)
    with heap.allocating_for_program():
        values = heap.empty(100, torch.float32, alignment=1024)
        empty = heap.empty(0, torch.float32, alignment=1024)
    assert heap.offset_of(values) % 1024 == 0 and empty.numel() == 0
    assert heap.describe_offset(heap.offset_of(values) + 8) == f"heap tensor at byte {heap.offset_of(values)}[2]"
    with pytest.raises(UsageError, match="heap alignment 300: use a power of two"):
        heap.empty(4, torch.float32, alignment=300)
