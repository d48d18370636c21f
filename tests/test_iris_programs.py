"""Iris programs, unchanged, on gemmar's ranks: `gemmar run -r N`, Cluster.run_script and %%px.

The programs are Iris-style programs written here (examples/iris_style): message passing with put and with
load/store and flags, a remote atomic add, and a GEMM + all-reduce by remote atomics with its validation;
plus programs that end badly (tests/iris_programs/ends_badly.py): an exit code, an exception, a killed rank
and a hanging rank.
"""

import io
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples", "iris_style")
ENDS_BADLY = os.path.join(ROOT, "tests", "iris_programs", "ends_badly.py")


def expected_lines(program, W):
    """What each rank prints, by rank: every value is known exactly."""
    if program == "message_passing_put.py":
        return [f"[Iris] received 300 values from rank {(r - 1) % W}: Validation successful." for r in range(W)]
    if program == "message_passing_load_store.py":
        return [f"[Iris] rank {(r - 1) % W} -> rank {r}: 200 of 200 values arrived intact" for r in range(W)]
    if program == "atomic_add.py":
        total = W * (W + 1) // 2
        return [f"[Iris] counters hold [{total}] (expected [{total}])" for r in range(W)]
    return ["[Iris] Validation passed: C is 64 x 96, max|C - A @ B| within the tolerance" for r in range(W)]


PROGRAMS = {"message_passing_put.py": ["--buffer_size", "300", "--block_size", "64"],
            "message_passing_load_store.py": ["--buffer_size", "200", "--block_size", "64"],
            "atomic_add.py": ["--buffer_size", "100"],
            "gemm_atomics_all_reduce.py": ["-m", "64", "-n", "96", "-k", "120", "--validate"]}


def by_rank(text, W):
    lines = {r: [] for r in range(W)}
    for line in text.splitlines():
        for r in range(W):
            if line.startswith(f"[rank {r}/{W}] "):
                lines[r].append(line[len(f"[rank {r}/{W}] "):])
    return lines


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("program", sorted(PROGRAMS))
def test_iris_style_programs_run_unchanged(clusters, program, world_size):
    out, err = io.StringIO(), io.StringIO()
    result = clusters(world_size).run_script(os.path.join(EXAMPLES, program), *PROGRAMS[program], timeout=120,
                                             out=out, err=err)
    assert result.ok and result.exit_code == 0, (result, out.getvalue(), err.getvalue())
    lines = by_rank(out.getvalue(), world_size)
    for r, line in enumerate(expected_lines(program, world_size)):
        # Every rank's own lines only (the heap note is rank 0's): nothing else printed.
        assert [x for x in lines[r] if not x.startswith("[Iris] iris.iris(heap_size")] == [line]
    if program == "gemm_atomics_all_reduce.py":   # its launch passes AMD-only options: dropped, said once
        assert err.getvalue().count("AMD compiler option(s), dropped on the cpu backend") == 1, err.getvalue()


@pytest.mark.parametrize("world_size", [3])
def test_a_failing_rank_is_named_with_its_exit_code_and_exception(clusters, world_size):
    cluster = clusters(world_size)
    out, err = io.StringIO(), io.StringIO()
    result = cluster.run_script(ENDS_BADLY, "--how", "exit", "--rank", "1", timeout=60, out=out, err=err)
    assert result.exit_codes == [0, 4, 0] and result.exit_code == 4
    assert result.failure_lines() == ["rank 1: exit code 4"]
    assert "rank 0 done" in by_rank(out.getvalue(), 3)[0] and "rank 1 done" not in by_rank(out.getvalue(), 3)[1]

    result = cluster.run_script(ENDS_BADLY, "--how", "raise", "--rank", "2", timeout=60, out=out, err=err)
    assert result.exit_codes == [0, 0, 1] and result.exit_code == 1
    assert result.failure_lines() == ["rank 2: ValueError: rank index 5 is out of range (ends_badly.py:21)"]
    assert cluster.running   # nothing was stopped: the ranks ended on their own

    result = cluster.run_script(ENDS_BADLY, "--how", "amd_clock", "--rank", "0", timeout=60, out=out, err=err)
    assert result.exit_codes == [1, 0, 0]
    assert result.failure_lines() == [
        "rank 0: InterpreterError: inline_asm not supported in interpreter mode: inline assembly (e.g. AMD's "
        "s_memrealtime) cannot run under the Triton interpreter (the cpu backend) (ends_badly.py:42)"]

    # In that program rank 0 alone allocated a tensor: gemmar's own runs on the same ranks, which need the
    # same heap offsets on every rank, must still line up (they once read each other's memory at a skew).
    import torch
    from inputs import allowed_error, random_inputs, reference

    A, B = random_inputs(40, 24, 37, torch.float16, seed=3)
    for algorithm in ("atomics", "two_shot"):
        run = cluster.gemm_all_reduce(A, B, algorithm=algorithm, BLK_M=16, BLK_N=16, BLK_K=16, num_sms=2)
        assert run.ok and (run.C.double() - reference(A, B)).abs().max().item() <= allowed_error(run, A, B)


def gemmar_run(*args, timeout=240):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "gemmar", "run", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=env)


def test_gemmar_run_command_runs_a_program_on_every_rank():
    p = gemmar_run("-r", "3", "--backend", "cpu", "--heap_size", "64M", os.path.join(EXAMPLES, "atomic_add.py"),
                   "--buffer_size", "64")
    assert p.returncode == 0, p.stderr
    assert by_rank(p.stdout, 3) == {r: ["[Iris] iris.iris(heap_size=1 GiB): each rank's heap is 64 MiB (gemmar run "
                                        "--heap_size); allocations past that are refused"] * (r == 0) +
                                    ["[Iris] counters hold [6] (expected [6])"] for r in range(3)}
    assert "every rank exited 0" in p.stdout


def test_gemmar_run_names_a_killed_rank_and_a_hanging_one():
    p = gemmar_run("-r", "2", "--backend", "cpu", ENDS_BADLY, "--how", "kill", "--rank", "1")
    assert p.returncode == 128 + 11, (p.stdout, p.stderr)
    assert p.stderr.strip().splitlines()[-1].startswith("gemmar run: rank 1: its process ")
    assert "was killed by SIGSEGV (on cpu ranks most often a kernel's address outside every heap" in p.stderr
    assert p.stderr.strip().endswith("gemmar run --sanitize or sanitize=True, to have the access named with its line)")

    p = gemmar_run("-r", "2", "--backend", "cpu", "--timeout", "10", ENDS_BADLY, "--how", "hang", "--rank", "0")
    assert p.returncode == 3, (p.stdout, p.stderr)
    assert p.stderr.strip().splitlines()[-1] == ("gemmar run: rank 0: still running after the 10 s deadline: stopped "
                                                 "(it was at ends_badly.py:31 (while tl.atomic_add(flag, 0, "
                                                 "sem=\"acquire\", scope=\"sys\") == 0:))")
    assert "rank 1 done" in p.stdout


def test_gemmar_run_refuses_bad_arguments_in_one_line(tmp_path, capsys):
    from gemmar import cli

    for argv, says in ((["run", "-r", "0", ENDS_BADLY], "world_size=0 is not allowed"),
                       (["run", str(tmp_path / "missing.py")], "missing.py: no such program file"),
                       (["run", "--heap_size", "lots", ENDS_BADLY], "'lots' is not a size"),
                       (["run", "--timeout", "-1", ENDS_BADLY], "--timeout -1: use seconds from 0 to 86400"),
                       (["run", "-r", "2", "--backend", "cpu", "--heap_size", "100000G", ENDS_BADLY],
                        "of shared memory")):
        try:
            code = cli.main(argv)
        except SystemExit as e:   # argparse's own refusals
            code = e.code
        err = capsys.readouterr().err
        assert code == 2 and len(err.strip().splitlines()) == 1 and says in err, (argv, code, err)


def test_percent_px_cells_run_iris_code_on_every_rank():
    """ipyparallel's own %%px, in a real IPython shell: `import iris`, a kernel defined in the cell, and
    each rank's output under its engine."""
    script = textwrap.dedent('''
        from IPython.core.interactiveshell import InteractiveShell
        import gemmar
        shell = InteractiveShell.instance()
        with gemmar.Cluster(world_size=2, backend="cpu") as cluster:
            cluster.activate()
            cell = """%%px
        import torch, triton, triton.language as tl
        import iris

        @triton.jit
        def ring_put(src, dst, flag, n, me, peer, BLOCK: tl.constexpr, heap_bases):
            offs = tl.arange(0, BLOCK)
            iris.put(src + offs, dst + offs, me, peer, heap_bases, mask=offs < n)
            iris.atomic_xchg(flag, 1, me, peer, heap_bases, sem="release", scope="sys")

        shmem = iris.iris(1 << 20)
        rank, W = shmem.get_rank(), shmem.get_num_ranks()
        src, dst = shmem.full(8, rank + 1, dtype=torch.int32), shmem.zeros(8, dtype=torch.int32)
        flag = shmem.zeros(1, dtype=torch.int32)
        shmem.barrier()
        ring_put[(1,)](src, dst, flag, 8, rank, (rank + 1) % W, 8, shmem.get_heap_bases())
        shmem.barrier()
        print("rank", rank, "got", dst.tolist(), "flag", flag.item())
        """
            assert shell.run_cell(cell).success
            assert shell.run_cell("%%px\\nprint('broadcast', shmem.broadcast(3.5 if rank == 1 else 0, 1))").success
    ''')
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    lines = p.stdout.splitlines()
    for engine, line in ((0, "rank 0 got [2, 2, 2, 2, 2, 2, 2, 2] flag 1"),
                         (1, "rank 1 got [1, 1, 1, 1, 1, 1, 1, 1] flag 1")):
        assert lines[lines.index(f"[stdout:{engine}] ") + 1] == line, p.stdout
    assert p.stdout.count("broadcast 3.5") == 2


def test_gemmar_run_never_replaces_an_installed_iris_unless_asked(tmp_path, capsys, monkeypatch):
    from gemmar import cli

    (tmp_path / "iris").mkdir()
    (tmp_path / "iris" / "__init__.py").write_text("raise ImportError('a real Iris would need ROCm here')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    code = cli.main(["run", "-r", "2", "--backend", "cpu", ENDS_BADLY, "--how", "exit"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "an installed Iris was found" in err and str(tmp_path / "iris") in err and "--replace_iris" in err
