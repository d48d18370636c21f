"""Today's Iris on gemmar's ranks: programs that start their own ranks (mp.spawn, torchrun style) and use
torch.distributed, DeviceContext, iris.ccl, iris.ops and the host API, run unchanged by Cluster.run_script
at 2 and 3 ranks; what the interpreter cannot run as written is named in one line; DeviceContext compiles.

The programs are written here (examples/iris_today, tests/iris_programs): Iris itself is not part of
gemmar (benchmarks/iris_examples.py runs the examples of an Iris checkout).
"""

import io
import os
import subprocess
import sys
import textwrap

import pytest
from test_iris_programs import by_rank   # (each rank's output lines)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TODAY = os.path.join(ROOT, "examples", "iris_today")
PROGRAMS = os.path.join(ROOT, "tests", "iris_programs")


def run(cluster, path, *args, timeout=180):
    if len(cluster.engine_ids) < cluster.world_size:   # GEMMAR_TEST_BACKEND=cuda with fewer GPUs than ranks
        pytest.skip("Iris programs need one process per rank, and this test cluster's ranks share an engine: on "
                    "GPUs run them with `gemmar run --backend cuda` (benchmarks/iris_programs_gpu.sh)")
    out, err = io.StringIO(), io.StringIO()
    result = cluster.run_script(path, *args, timeout=timeout, out=out, err=err)
    return result, out.getvalue(), err.getvalue()


def own_lines(text, W):
    """Each rank's lines but the heap note (rank 0's) and gemmar's one-time notes of what ccl/ops ran."""
    return {r: [x for x in lines if not x.startswith(("[Iris] iris.iris(heap_size", "[Iris] ccl.", "[Iris] ops."))]
            for r, lines in by_rank(text, W).items()}


@pytest.mark.parametrize("world_size", [2, 3])
def test_spawned_ranks_pass_messages_through_device_context(clusters, world_size):
    """mp.spawn's function runs once per rank; init_process_group(nccl, tcp://...) joins them on gloo (said
    once); DeviceContext's store + release / acquire-wait moves every value; dist.all_gather works."""
    result, out, err = run(clusters(world_size), os.path.join(TODAY, "spawn_device_context.py"), "-s", "300",
                           "-r", str(world_size))
    assert result.ok, (result, out, err)
    for r, lines in own_lines(out, world_size).items():
        assert lines == [f"[Iris] rank {(r - 1) % world_size} -> rank {r}: 300 of 300 values arrived intact"], out
    assert err.count("dist.init_process_group(backend='nccl'): gloo between gemmar's ranks") == 1, err


@pytest.mark.parametrize("world_size", [2, 3])
def test_torchrun_style_collectives_back_to_back(clusters, world_size):
    """ccl.all_reduce (two_shot, one_shot, and 'ring' run as two_shot: same bits on every rank), all_gather,
    all_to_all and reduce_scatter, three rounds back to back on new values, each checked in the program
    against a torch.distributed reference."""
    result, out, err = run(clusters(world_size), os.path.join(TODAY, "torchrun_ccl.py"), "-m", "40", "-n", "72",
                           "--iterations", "3")
    assert result.ok, (result, out, err)
    for lines in own_lines(out, world_size).values():
        assert lines == ["[Iris] 3 rounds of all_reduce (3 variants), all_gather, all_to_all, reduce_scatter: "
                         "all right"], out
    assert "[Iris] ccl.all_reduce: variant 'ring' runs gemmar's two_shot" in out
    assert "[Iris] ccl.all_reduce: gemmar's one_shot all-reduce" in out


@pytest.mark.parametrize("world_size", [2, 3])
def test_ops_matmul_all_reduce_by_each_kernel(clusters, world_size):
    """ops.matmul_all_reduce with edge tiles (50 x 70 in 32 x 32 tiles) by two_shot, one_shot, atomics and ring,
    three launches each, checked in float64; two_shot's and one_shot's bits the same on every rank."""
    result, out, err = run(clusters(world_size), os.path.join(TODAY, "ops_matmul_all_reduce.py"), "-m", "50",
                           "-n", "70", "-k", "90", "--iterations", "3")
    assert result.ok, (result, out, err)
    for lines in own_lines(out, world_size).values():
        assert lines == ["[Iris] matmul_all_reduce 50 x 70 x 90 per rank, 4 kernels x 3 launches: all right"], out
    for kernel in ("two_shot", "one_shot", "atomics", "ring"):
        assert f"[Iris] ops.matmul_all_reduce: gemmar's {kernel} kernel" in out


@pytest.mark.parametrize("world_size", [2, 3])
def test_host_api_of_today(clusters, world_size):
    W, last = world_size, world_size - 1
    result, out, err = run(clusters(world_size), os.path.join(PROGRAMS, "today_api.py"))
    assert result.ok, (result, out, err)
    for r, lines in own_lines(out, W).items():
        assert lines == [
            f"ranks: {r} {W} {r} {W} {r} {W}",
            f"broadcast int from last: {40 + last}",
            "broadcast float, old name: 0.5",
            f"broadcast object: {{'from': {last}, 'text': 'héllo'}}",
            "broadcast tensor: ndarray [0, 2, 4, 6, 8]",
            "zeros default dtype: torch.float32; full dtype: torch.int64 torch.float32; rand: torch.float32",
            f"device context: torch.int64 ({W + 5},) [{r}, {W}] True [0, 0, 0]",   # (no trace buffer yet)
            "symmetric: True False",
            "hip: 1 1000000 True",
            "[Iris] info shown",
            "[Iris] WARNING: warning shown",
            "[Iris] the old log",
            "[Iris] debug shown after set_logger_level",
            "as_symmetric: UsageError",
            "zeros: UsageError: shmem.zeros(): pin_memory is not a keyword it takes; allowed: dtype, device, layout, "
            "out, requires_grad",
        ], out


def test_what_the_interpreter_cannot_run_is_named_in_one_line(clusters):
    cluster = clusters(2)
    program = os.path.join(PROGRAMS, "gets_wrong.py")
    # A false tl.assume: one warning per rank naming the line, and the run goes on as on a GPU.
    result, out, err = run(cluster, program, "--how", "assume")
    assert result.ok, (result, out, err)
    assert [line for lines in by_rank(out, 2).values() for line in lines] == \
        ["rank 0: out holds 5050", "rank 1: out holds 5050"]
    warnings = [line for line in err.splitlines() if "tl.assume is false" in line]
    assert len(warnings) == 2 and all("gets_wrong.py:21 (tl.assume(pid > 0))" in w for w in warnings), err
    # Kernel metadata the interpreter lacks, Gluon, and a spawn of another size: each one line, exit 1.
    expected = {"n_regs": "UsageError: first_row_assumed_away(...).n_regs: a kernel run by the Triton interpreter "
                          "(the cpu backend) is not compiled, so it has no n_regs",
                "gluon": "UsageError: iris.gluon.IrisDeviceCtx: Gluon kernels",
                "spawn": "UsageError: mp.spawn(nprocs=7): gemmar run started 2 ranks"}
    for how, start in expected.items():
        result, out, err = run(cluster, program, "--how", how)
        assert result.exit_codes == [1, 1], (how, result, out, err)
        for line in result.failure_lines():
            assert line.split(": ", 1)[1].startswith(start) and "\n" not in line, (how, line)


def test_device_context_compiles_for_hopper(tmp_path):
    """The compiled path of DeviceContext (Triton's aggregate, gemmar's device API inside) and of its tracing
    (TraceEvent constexprs, a lone pointer and a block as addresses), for sm_90."""
    script = textwrap.dedent('''
        import triton, triton.language as tl
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
        from gemmar.iris.device import DeviceContext, TraceEvent, read_realtime

        @triton.jit
        def kernel(context, buffer, flag, rank: tl.constexpr, world_size: tl.constexpr):
            ctx = DeviceContext.initialize(context, rank, world_size)
            offsets = tl.arange(0, 128)
            ctx.store(buffer + offsets, tl.load(buffer + offsets) * 2, to_rank=1, mask=offsets < 100, hint=16)
            ctx.atomic_cas(flag, 0, 1, to_rank=1, sem="release", scope="sys")
            seen = ctx.load(buffer + offsets, from_rank=1, other=-1.0, mask=offsets < 7, cache_modifier=".cg")
            ctx.put(buffer + offsets, buffer + 128 + offsets, to_rank=1)
            ctx.copy(buffer + offsets, buffer + 256 + offsets, 0, 1)
            tl.store(buffer + offsets, seen + read_realtime().to(tl.float32))

        signature = {"context": "*i64", "buffer": "*fp32", "flag": "*i32", "rank": "constexpr",
                     "world_size": "constexpr"}
        compiled = triton.compile(ASTSource(fn=kernel, signature=signature, constexprs={"rank": 0, "world_size": 2}),
                                  target=GPUTarget("cuda", 90, 32))
        ptx = compiled.asm["ptx"]
        print("globaltimer" in ptx, "atom.global.release.sys.cas" in ptx, ".cg" in ptx)

        @triton.jit
        def traced(context, buffer, flag, rank: tl.constexpr, world_size: tl.constexpr, TRACING: tl.constexpr):
            ctx = DeviceContext.initialize(context, rank, world_size, tracing=TRACING)
            offsets = tl.arange(0, 128)
            handle = ctx.tracing.record_event_start(event_id=TraceEvent().put, target_rank=1, address=buffer + offsets,
                                                    pid_m=0, pid_n=1, mask=offsets < 100)
            ctx.put(buffer + offsets, buffer + 128 + offsets, to_rank=1)
            ctx.tracing.record_event_end(handle)
            handle = ctx.tracing.record_event_start(TraceEvent().wait, 1, flag, 0, 0)
            ctx.atomic_add(flag, 1, to_rank=1)
            ctx.tracing.record_event_end(handle)

        for tracing in (True, False):
            signature = {"context": "*i64", "buffer": "*fp32", "flag": "*i32", "rank": "constexpr",
                         "world_size": "constexpr", "TRACING": "constexpr"}
            source = ASTSource(fn=traced, signature=signature, constexprs={"rank": 0, "world_size": 2,
                                                                           "TRACING": tracing})
            ptx = triton.compile(source, target=GPUTarget("cuda", 90, 32)).asm["ptx"]
            print(ptx.count("globaltimer"))
    ''')
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    (tmp_path / "compile_device_context.py").write_text(script)   # (Triton reads a kernel's source from its file)
    p = subprocess.run([sys.executable, str(tmp_path / "compile_device_context.py")], capture_output=True, text=True,
                       env=env, timeout=300)
    if "ptxas" in p.stderr and "not found" in p.stderr:  # pragma: no cover - wheel without ptxas
        pytest.skip("this Triton wheel carries no ptxas, so it cannot compile for NVIDIA here")
    assert p.returncode == 0, p.stderr[-3000:]
    flags, traced, untraced = p.stdout.split("\n")[:3]
    assert flags.split() == ["True", "True", "True"], p.stdout
    assert int(traced) >= 4 and int(untraced) == 0, p.stdout   # tracing=False compiles the clock reads away


def read_json(path):
    import json

    with open(path) as f:
        return json.load(f)


@pytest.mark.parametrize("world_size", [2, 3])
def test_device_tracing_exports_a_trace_gemmar_draws(clusters, world_size, tmp_path):
    """ctx.tracing in a kernel records every put, wait and reduce with its program, peer, address and payload;
    reset() forgets the warm-up run; export(merge=True) writes each rank's file and rank 0's merged one, which
    Trace.load reads, gantt draws and to_perfetto writes. On one clock, each put ends before its receiver's wait
    for it does (happens-before, as recorded)."""
    from gemmar.analysis.trace import Trace

    W, n, block = world_size, 300, 128
    programs = -(-n // block)
    output = tmp_path / "device_trace.json"
    result, out, err = run(clusters(W), os.path.join(TODAY, "device_tracing.py"), "-s", str(n), "-b", str(block),
                           "-o", str(output))
    assert result.ok, (result, out, err)
    per_rank = programs * (W - 1) + 2 * programs
    for r, lines in own_lines(out, W).items():
        assert f"[Iris] run 1: sums right; {per_rank} events recorded" in lines, out
        assert f"[Iris] Exported rank {r} trace ({per_rank} events) to {tmp_path}/device_trace_rank{r}.json" in lines
    for r in range(W):
        doc = read_json(tmp_path / f"device_trace_rank{r}.json")
        puts = [e for e in doc["traceEvents"] if e.get("name") == "put"]
        assert len(puts) == programs * (W - 1) and {e["pid"] for e in puts} == {r}
        for e in puts:
            program = e["args"]["program_id"]
            assert e["args"]["payload_size"] == 4 * min(block, n - program * block), e
            assert e["args"]["target_rank"] == e["args"]["pid_n"] != r and e["ph"] == "X" and e["dur"] > 0
        # reset() dropped the warm-up run: the operations are numbered from 0 again
        assert sorted(e["args"]["op_index"] for e in doc["traceEvents"] if e["ph"] != "M") == list(range(per_rank))
    trace = Trace.load(str(output))
    assert repr(trace) == f"Trace(Iris trace of device_tracing.py, {W} ranks x {programs} programs, {W * per_rank} events)"
    events = trace.events
    assert (events.groupby("rank").size() == per_rank).all() and set(events["kind"]) == {"put", "wait", "reduce"}
    waits = events[events["kind"] == "wait"].set_index(["rank", "program"])["end_us"]
    for e in events[events["kind"] == "put"].itertuples():
        assert e.end_us <= waits[(e.peer, e.program)], e
    reduces = events[events["kind"] == "reduce"].set_index(["rank", "program"])["start_us"]
    assert all(waits[key] <= reduces[key] for key in waits.index)
    figure = trace.gantt(path=str(tmp_path / "gantt.png"))
    assert os.path.getsize(tmp_path / "gantt.png") > 10_000 and figure.axes[0].get_title().startswith("Iris trace")
    perfetto = trace.to_perfetto(str(tmp_path / "perfetto.json"))
    assert len([e for e in perfetto["traceEvents"] if e["ph"] == "X"]) == W * per_rank


def test_device_tracing_says_what_did_not_fit(clusters, tmp_path):
    """More events than max_events: the first ones are kept, the rest counted and named in one line."""
    from gemmar.analysis.trace import Trace

    output = tmp_path / "small.json"
    result, out, err = run(clusters(2), os.path.join(TODAY, "device_tracing.py"), "-s", "300", "-b", "128",
                           "-o", str(output), "--max_events", "4")
    assert result.ok, (result, out, err)
    assert out.count("WARNING: tracing.export(): 5 events did not fit in max_events=4; the first 4 are kept") == 2
    assert len(Trace.load(str(output)).events) == 8


def test_a_trace_written_by_iris_on_amd_reads_in_cycles(tmp_path):
    """Iris's own export (ts/dur in 100 MHz cycles, tid XCC<x>_CU<c>, no event_id) reads with the times in ns;
    a trace with no events, or an event without a time, is one line."""
    import json

    from gemmar.analysis.trace import Trace
    from gemmar.errors import UsageError

    def event(name, ts, dur, rank, program, target):
        return dict(name=name, cat="iris", ts=ts, dur=dur, ph="X", pid=rank, tid="XCC0_CU7",
                    args=dict(program_id=program, pid_m=1, pid_n=2, target_rank=target, op_index=0, address="0x10",
                              payload_size=64))

    doc = dict(traceEvents=[event("put", 1000, 50, 0, 3, 1), event("atomic_add", 1100, 5, 1, 0, 0),
                            event("compute", 900, 80, 1, 1, 1), dict(name="process_name", ph="M", pid=0)],
               metadata=dict(time_unit="cycles (s_memrealtime @ 100MHz)", world_size=2))
    path = tmp_path / "iris.json"
    path.write_text(json.dumps(doc))
    events = Trace.load(str(path)).events.set_index("kind")
    assert events.loc["put", ["rank", "program", "peer", "pid_m", "pid_n"]].tolist() == [0, 3, 1, 1, 2]
    assert events.loc["put", "t_start_ns"] == 1000 and events.loc["put", "duration_us"] == 0.5   # 100 cycles=1 µs
    assert events.loc["atomic_add", "group"] == "store" and events.loc["compute", "group"] == "gemm"
    doc["traceEvents"] = [dict(name="process_name", ph="M", pid=0), dict(name="put", cat="iris", pid=0)]
    path.write_text(json.dumps(doc))
    with pytest.raises(UsageError, match=r"Iris trace event 1 is not readable \(KeyError: 'ts'\)"):
        Trace.load(str(path))
    doc["traceEvents"] = [dict(name="put", cat="other", ts=1, pid=0)]
    path.write_text(json.dumps(doc))
    with pytest.raises(UsageError, match="is not a gemmar trace"):
        Trace.load(str(path))


LEAVES_BEFORE_THE_BARRIER = textwrap.dedent("""\
    import argparse, os, sys
    import torch.distributed as dist
    import iris

    parser = argparse.ArgumentParser()
    parser.add_argument("--exit", choices=["sys.exit", "os._exit"], required=True)
    parser.add_argument("--barrier", choices=["iris", "dist"], required=True)
    args = parser.parse_args()
    shmem = iris.iris(1 << 20)
    if args.barrier == "dist":
        dist.init_process_group("gloo")
    print(f"rank {shmem.get_rank()} started", flush=True)
    if shmem.get_rank() == 1:
        sys.exit(0) if args.exit == "sys.exit" else os._exit(0)
    try:
        shmem.barrier() if args.barrier == "iris" else dist.barrier()   # (the barrier the others wait in)
    except Exception as error:   # as pytest would: the rank goes on, its output kept
        print(f"rank {shmem.get_rank()} caught {type(error).__name__}")
        raise
""")


@pytest.mark.parametrize("world_size", [2])
@pytest.mark.parametrize("barrier", ["iris", "dist"])
@pytest.mark.parametrize("how", ["sys.exit", "os._exit"])
def test_a_rank_that_leaves_releases_the_others_from_a_barrier(clusters, world_size, barrier, how, tmp_path):
    """Rank 1 ends (exit code 0) before a barrier rank 0 waits in, gemmar's heap barrier or torch.distributed's:
    the wait ends long before the deadline, in one line naming rank 1, how it ended and where rank 0 waited;
    rank 0's output is kept."""
    program = tmp_path / "leaves.py"
    program.write_text(LEAVES_BEFORE_THE_BARRIER)
    line = LEAVES_BEFORE_THE_BARRIER.splitlines().index(next(x for x in LEAVES_BEFORE_THE_BARRIER.splitlines()
                                                              if "(the barrier the others wait in)" in x)) + 1
    result, out, err = run(clusters(world_size), str(program), "--exit", how, "--barrier", barrier, timeout=120)
    assert not result.timed_out and result.exit_codes[0] == 1, (result, out, err)
    where = f"{'barrier' if barrier == 'iris' else 'dist.barrier'} at leaves.py:{line}"
    assert f"rank 1 ended (exit code 0) before the {where}; rank 0 was waiting there" in result.failure_lines(), \
        result
    assert len(result.failure_lines()) == 1, result.failure_lines()
    assert by_rank(out, world_size)[0] == ["rank 0 started", "rank 0 caught RankLeftError"], out
    # The next program's barriers meet (a barrier that gave up left the ranks' counts out of step: fresh ranks)
    (tmp_path / "meets.py").write_text("import iris\nshmem = iris.iris(1 << 20)\nfor _ in range(3):\n"
                                       "    shmem.barrier()\n")
    assert run(clusters(world_size), str(tmp_path / "meets.py"), timeout=120)[0].ok


def test_the_ranks_that_waited_for_a_rank_that_left_are_one_line():
    from gemmar.programs.runner import ProgramResult

    left = "RankLeftError: rank 1 ended (exit code 4) before the barrier (prog.py:12)"
    result = ProgramResult("prog.py", [1, 4, 1, 1], [left, "exit code 4", left, "ValueError: late (prog.py:20)"])
    assert result.failure_lines() == ["rank 1 ended (exit code 4) before the barrier at prog.py:12; ranks 0, 2 were "
                                      "waiting there", "rank 3: ValueError: late (prog.py:20)"]


def test_a_wrapped_factory_still_takes_the_default_device():
    """Ranks sharing a GPU and cpu ranks wrap torch's factories to map devices; torch.set_default_device must
    still reach them, mapped too (Iris's flash-decode test sets the default device to cuda and then made its
    tensors on the cpu on ranks sharing a GPU: "Pointer argument cannot be accessed from Triton (cpu tensor?)").
    'meta' stands in for the GPU: the same path without one."""
    code = ("import torch; from gemmar.programs import host_calls; "
            "host_calls._factories_mapped(lambda d: 'meta' if str(d).split(':')[0] == 'cuda' else d); "
            "torch.set_default_device('cuda:1'); "
            "print(torch.randn(2).device, torch.empty(3).device, torch.arange(4).device, "
            "torch.zeros(1, device='cuda:0').device, torch.ones(1, device='cpu').device); "
            "torch.set_default_device(None); "
            "exec('with torch.device(\\'cuda:1\\'):\\n print(torch.zeros(1).device)'); print(torch.zeros(1).device)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["meta", "meta", "meta", "meta", "cpu", "meta", "cpu"], done.stdout
