"""Settings checks that need no engines."""

import os
import re

import pytest
import torch

from gemmar import RunConfig, UsageError, k_bounds
from gemmar.config import dtype_name
from gemmar.tuning import tuned_defaults


@pytest.mark.parametrize("K,W", [(1, 1), (7, 3), (120, 3), (3, 4), (1000, 7)])
def test_k_bounds_cover_k_exactly_once(K, W):
    bounds = [k_bounds(K, W, r) for r in range(W)]
    assert bounds[0][0] == 0 and bounds[-1][1] == K
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    sizes = [e - s for s, e in bounds]
    assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("field,value,needle", [
    ("m", 0, "m=0"), ("n", -3, "n=-3"), ("k", 2.5, "k=2.5"), ("m", 1 << 30, "out of range"),
    ("BLK_M", 48, "power of two"), ("BLK_N", 8, "power of two"), ("BLK_K", 1024, "BLK_K=1024"),
    ("datatype", "int8", "int8"), ("algorithm", "tree", "tree"), ("world_size", 0, "world_size=0"),
    ("num_sms", 0, "num_sms=0"), ("gsize_m", 0, "gsize_m=0"), ("iterations", 0, "iterations=0"),
    ("num_warps", 3, "num_warps=3"), ("timeout_s", 0, "timeout_s=0"), ("m", True, "not an integer"),
    ("split_k", 0, "split_k=0"), ("split_k", 2, "split_k=2 is not allowed with ring at world size 2"),
])
def test_bad_values_name_themselves(field, value, needle):
    with pytest.raises(UsageError, match=needle.replace("(", r"\(").replace(".", r"\.")) as info:
        RunConfig(**{field: value}).validate()
    assert "\n" not in str(info.value)


def test_dtype_names():
    assert dtype_name(torch.bfloat16) == "bf16" and dtype_name("fp32") == "fp32"
    assert RunConfig(datatype=torch.float16).validate().datatype == "fp16"
    assert RunConfig(m=100, n=33, BLK_M=32, BLK_N=16).tiles == (4, 3)


def test_a_config_is_checked_once_where_it_comes_in_and_travels_down_unchanged():
    """Issue 59: validate returns a checked copy (the given config stays as it was) and a checked config is not
    checked again; nothing changes a config after that; an unknown setting is one line; and below the boundary
    (the ranks' runtime, the kernels) no module calls validate or takes a mistake beside its parts."""
    import dataclasses
    import pathlib

    import gemmar
    from gemmar.config import AllReduceConfig

    given = RunConfig(datatype=torch.float16, out_dtype=torch.float32)
    checked = given.validate()
    assert (checked.datatype, checked.out_dtype, checked.checked) == ("fp16", "fp32", True)
    assert given.datatype is torch.float16 and not given.checked and checked.validate() is checked
    with pytest.raises(dataclasses.FrozenInstanceError):
        checked.m = 64
    assert not dataclasses.replace(checked, m=64).checked   # a derived config is checked again where it comes in
    with pytest.raises(UsageError, match="setting 'blk_m' is not known: use RunConfig's names") as info:
        RunConfig(blk_m=32)
    assert "\n" not in str(info.value)
    with pytest.raises(UsageError, match="setting 'sizes' is not known: use AllReduceConfig's names"):
        AllReduceConfig(8, sizes=2)
    for settings, needle in ((dict(numel=0), "numel=0"), (dict(numel=8, comm_sms=0), "comm_sms=0"),
                             (dict(numel=8, scheme="three_shot"), "scheme 'three_shot'"),
                             (dict(numel=8, datatype="fp8"), "fp8"), (dict(numel=8, iterations=0), "iterations=0")):
        with pytest.raises(UsageError, match=needle):
            AllReduceConfig(**settings).validate()
    assert AllReduceConfig(8, torch.float32).validate().datatype == "fp32"
    package = pathlib.Path(gemmar.__file__).parent
    for path in [*(package / "runtime").rglob("*.py"), *(package / "kernels").glob("*.py")]:
        text = path.read_text()
        assert ".validate(" not in text, path
        signatures = re.findall(r"def \w+\(([^)]*)\)", text)
        assert not [a for a in signatures if re.search(r"\bmistake\b", a) and re.search(r"\bparts\b", a)], path


def test_algorithm_auto_follows_the_measured_rule():
    from gemmar.analysis.auto_rule import AUTO_RULE, choose_algorithm

    # One GPU per rank: cuBLAS + NCCL measured faster than every fused kernel (BENCHMARKS.md).
    assert choose_algorithm("cuda", 2, 2)[0] == "unfused" and "docs/decisions.md" in choose_algorithm("cuda", 2, 8)[1]
    assert choose_algorithm("cuda", 1, 1)[0] == "unfused"
    # No NCCL between the ranks: the fused kernel with the same bits on every rank.
    assert choose_algorithm("cuda", 4, 1) == AUTO_RULE["shared"] == choose_algorithm("cpu", 3, 0)
    assert AUTO_RULE["shared"][0] == "two_shot"


def test_algorithm_auto_on_several_gpus_follows_the_model_per_shape():
    from gemmar.commands import choose_auto
    from gemmar.analysis.auto_rule import AUTO_RULE

    # A large GEMM whose all-reduce the model hides behind it, and a mid-sized one where two_shot's tail and its
    # partials' round trip cost more than NCCL's: the model answers differently, and says it predicts.
    big, why = choose_auto("cuda", 2, 2, shape=(8192, 8192, 2048))
    mid, why_mid = choose_auto("cuda", 8, 8, shape=(2048, 2048, 8192))
    assert big == "two_shot" and mid in ("two_shot", "unfused")
    for text in (why, why_mid):
        assert "predicts two_shot" in text and "a prediction" in text and "within 15 %" in text
    assert "2048 x 2048 x 8192 per rank on 8 GPUs" in why_mid
    # Few rows (issue 36): the model, which misses fixed costs there, does not speak; at two ranks the rule
    # measured there does (the ring at 16 rows, two_shot above), at more ranks (never measured) unfused.
    assert choose_auto("cuda", 2, 2, shape=(16, 8192, 1024)) == AUTO_RULE["two_gpus_few_rows"]
    assert AUTO_RULE["two_gpus_few_rows"][0] == "ring" and AUTO_RULE["two_gpus_rows"][0] == "two_shot"
    assert choose_auto("cuda", 2, 2, shape=(64, 8192, 3584)) == AUTO_RULE["two_gpus_rows"]
    assert choose_auto("cuda", 2, 2, shape=(256, 8192, 8192)) == AUTO_RULE["two_gpus_rows"]
    assert choose_auto("cuda", 8, 8, shape=(16, 8192, 1024)) == AUTO_RULE["gpus"]
    # Without the shape, and wherever the ranks share a GPU or there is one rank, the measured rule.
    assert choose_auto("cuda", 2, 2) == AUTO_RULE["gpus"] and choose_auto("cuda", 4, 1) == AUTO_RULE["shared"]
    assert choose_auto("cuda", 1, 1, shape=(8192, 8192, 8192)) == AUTO_RULE["one_gpu"]


def test_the_model_speaks_only_where_the_nearest_measured_shape_was_reproduced():
    """Issue 36: on 2 x H200 the model predicted each inference shape 16-60 % too fast (no fixed costs). A shape
    whose nearest measured one it missed gets no prediction; one near a reproduced large shape does."""
    import os

    from gemmar.analysis import model

    measured, machine, _ = model.load_inputs(*(os.path.join(model.MEASURED, n) for n in model.CHECKED_AGAINST[:2]))
    few = model.few_rows_checks(os.path.join(model.MEASURED, model.FEW_ROWS_RUN), machine, model.Gpu())
    assert [row[0][0] for row in few] == [4096, 1024, 256, 64, 16]
    assert all(abs(t / tm - 1) > model.TOLERANCE or abs(q / qm - 1) > model.TOLERANCE for _, tm, t, qm, q in few)
    assert model.nearest_reproduced((128, 8192, 4096), measured, few) == ((64, 8192, 3584), False)
    assert model.predict_unmeasured((128, 8192, 4096), 2) is None and model.choose((512, 512, 4096), 2) is None
    assert model.nearest_reproduced((4096, 4096, 4096), measured, few) == ((8192, 8192, 8192), True)
    assert model.predict_unmeasured((4096, 4096, 4096), 8) is not None


def test_triton_releases_outside_the_accepted_range_are_refused_in_one_line():
    from gemmar.kernels.triton_support import check_release

    for accepted in ("3.6.0", "3.7.1", "3.8.0", "3.9.0", "3.9.0+git7d1a2b"):
        check_release(accepted)
    for refused in ("3.5.1", "3.10.0", "2.3.1", "4.0.0"):
        with pytest.raises(UsageError, match=rf"^Triton {re.escape(refused)} is installed; gemmar needs Triton "
                                             r"3\.6 to 3\.9 \(pip install 'triton>=3\.6,<3\.10'\)$"):
            check_release(refused)
    with pytest.raises(UsageError, match="cannot read Triton's version 'nightly'"):
        check_release("nightly")


INTERPRETED_HELPERS = """
import torch, triton, triton.language as tl
from gemmar.kernels.triton_support import gemmar_interpreter  # (patches once per launch inside its scope)
from triton.runtime import interpreter

calls = []
patch_core = interpreter._patch_lang_core
interpreter._patch_lang_core = lambda lang, scope: (calls.append(1), patch_core(lang, scope))[1]


@triton.jit
def twice(x):
    return x * 2


@triton.jit
def kernel(out, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    # tl.zeros and tl.cdiv are Triton's own @triton.jit functions, in a module that sees tl.core, not tl
    nothing = tl.zeros((BLOCK,), tl.float32) + tl.cdiv(BLOCK, 8)
    tl.store(out + offsets, twice(twice(tl.load(out + offsets))) + twice(1) + nothing)


out = torch.arange(8, dtype=torch.float32)
for launch in range(2):
    with gemmar_interpreter():
        kernel[(2,)](out, BLOCK=4)
print(len(calls), out.tolist(), tl.core.is_builtin(tl.load) and tl.core.is_builtin(tl.core.full))
"""


def test_the_interpreter_patches_the_language_once_per_launch():
    """triton_support._patch_once_per_launch (inside gemmar's interpreter scope): two launches of two programs,
    each calling @triton.jit helpers six times and Triton's own tl.zeros and tl.cdiv (which see tl.core), patch tl
    and tl.core once each per launch (at most 5 in all, not at every helper call), compute what they should, and
    leave triton.language and triton.language.core as they were."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", INTERPRETED_HELPERS], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "TRITON_INTERPRET": "1"})
    assert done.returncode == 0, done.stderr
    expected = [float(((x * 4 + 3) * 4) + 3) for x in range(8)]
    # Patched at every call of tl.zeros and tl.cdiv, it was 10 (5 a launch); the interpreter's first rewrite
    # of tl.zeros gives its module a global naming tl, so the second launch patches tl once more there.
    assert int(done.stdout.split("[")[0]) <= 5 and done.stdout.strip().endswith("True"), done.stdout
    assert done.stdout[done.stdout.index("["):done.stdout.index("]") + 1] == str(expected)


def test_communication_programs_follow_the_shape():
    from gemmar.tuning import split_programs, tuned_defaults

    # One H200 (132 SMs), 128 x 256 tiles: the three benchmark shapes, and ranks sharing the GPU.
    assert split_programs(132, 2048, 8192) == 4      # needs 4; 16 waves on 128 GEMM programs as on 132
    assert split_programs(132, 1024, 14336) == 4     # needs 3; 8 waves on 128 GEMM programs as on 132
    assert split_programs(132, 2048, 2048) == 16     # K_r 2048: the reduction needs 16
    assert split_programs(66, 2048, 4096, 2) == 7    # ranks sharing one H200: needs 6; 35 waves on 59 as on 60
    assert split_programs(33, 2048, 4096, 4) == 5    # needs 5; 74 waves on 28 GEMM programs
    assert split_programs(132, 2048, 4096) == 11     # needs 8; 17 waves on 121 GEMM programs as on 124
    assert split_programs(132, 4, 100) == 4          # never more than there are tiles to reduce
    # Hopper: one communication program beside each GEMM program, on its SM; other GPUs: the split above.
    knobs = tuned_defaults("cuda", "two_shot", (9, 0), 132, shape=(8192, 8192, 2048, 1))
    assert (knobs["num_sms"], knobs["comm_sms"], knobs["BLK_N"]) == (132, 132, 256)
    assert tuned_defaults("cuda", "two_shot", (9, 0), 66, given={"num_sms": 60})["comm_sms"] == 60
    knobs = tuned_defaults("cuda", "two_shot", (9, 0), 132, shape=(8192, 8192, 2048, 1), trace=True)
    assert (knobs["num_sms"], knobs["comm_sms"]) == (116, 16)   # traced kernels do not fit two to an SM
    knobs = tuned_defaults("cuda", "two_shot", (8, 0), 108, shape=(8192, 8192, 2048, 1))
    comm = split_programs(108, 4096, 2048)   # (the default tile there is 128 x 128: 4096 tiles)
    assert (knobs["num_sms"], knobs["comm_sms"]) == (108 - comm, comm)
    knobs = tuned_defaults("cuda", "two_shot", (9, 0), 132, shape=(8192, 8192, 8192, 1), given={"comm_sms": 8})
    assert (knobs["num_sms"], knobs["comm_sms"]) == (124, 8)   # the user's count, the rest to the GEMM
    assert tuned_defaults("cuda", "ring", (9, 0), 132, shape=(8192, 8192, 8192, 1))["comm_sms"] == 0


def test_communication_programs_go_beside_the_gemm_only_when_it_reads_through_tensor_descriptors():
    """The pointer GEMM (odd N or K-slices, fp32) takes more registers: on 2 ranks sharing an H200, 1000 x 777 x
    1999 with programs beside each other was refused (86016 registers a SM of 65536), so it gets the split."""
    from gemmar.tuning import reads_by_tma

    assert reads_by_tma(8192, 4096, 2, "bf16") and reads_by_tma(768, 16, 2, "fp16")
    assert not reads_by_tma(777, 2000, 2, "bf16")      # rows of B: 1554 bytes
    assert not reads_by_tma(768, 1999, 2, "bf16")      # K-slices of 1000 and 999
    assert not reads_by_tma(768, 2048, 2, "fp32")      # no 16-bit values
    assert not reads_by_tma(768, 8, 2, "bf16")         # a K-slice of 4
    shape = (1000, 777, 1000, 2)
    beside = tuned_defaults("cuda", "two_shot", (9, 0), 66, shape=shape)
    split = tuned_defaults("cuda", "two_shot", (9, 0), 66, shape=shape, tma=False)
    assert (beside["num_sms"], beside["comm_sms"]) == (66, 66)
    assert split["num_sms"] + split["comm_sms"] == 66 and split["comm_sms"] < 66


def test_few_rows_get_a_tile_that_gives_every_sm_work():
    """two_shot on Hopper at world size 1 or with a GPU per rank: its 128 x 256 tile while there are at least as
    many tiles as SMs; with fewer, the few-rows tile for M (benchmarks/inference_sweep.py, BENCHMARKS.md); a
    tile the user gives wins."""
    def tile(m, n=8192, sms=132, **given):
        knobs = tuned_defaults("cuda", "two_shot", (9, 0), sms, shape=(m, n, 1024, 1), given=given)
        return tuple(knobs[k] for k in ("BLK_M", "BLK_N", "BLK_K", "num_warps", "num_stages"))

    assert tile(4096) == tile(1024) == (128, 256, 64, 8, 3)   # 1024 and 256 tiles
    assert tile(256) == tile(512) == (128, 128, 64, 4, 4)     # 128 x 256 would give 64 and 128 tiles
    assert tile(64) == tile(33) == (64, 64, 128, 4, 4)
    assert tile(16) == tile(1) == (16, 64, 128, 4, 4)
    assert tile(16, n=65536) == (128, 256, 64, 8, 3)          # 256 tiles even at 128 x 256
    assert tile(4096, n=1024) == (128, 256, 64, 8, 3)         # many rows: never a few-rows tile
    assert tile(16, BLK_N=128)[:2] == (16, 128)
    assert tuned_defaults("cuda", "two_shot", (8, 0), 108, shape=(16, 8192, 1024, 1))["BLK_M"] == 128   # Hopper only
    assert tuned_defaults("cuda", "ring", (9, 0), 132, shape=(16, 8192, 1024, 1))["BLK_M"] == 128      # unmeasured
    # Ranks sharing a GPU must all fit on it at once: not measured, not used. A GPU per rank: measured, used.
    shared = tuned_defaults("cuda", "two_shot", (9, 0), 66, shape=(300, 777, 1000, 2), shared=True)
    assert (shared["BLK_M"], shared["BLK_N"]) == (128, 256)
    assert tile(64, n=8192) == (64, 64, 128, 4, 4)
    own = tuned_defaults("cuda", "two_shot", (9, 0), 132, shape=(64, 8192, 3584, 2))
    assert (own["BLK_M"], own["BLK_N"], own["BLK_K"]) == (64, 64, 128)


def test_programs_that_cannot_share_an_sm_are_refused_in_one_line(monkeypatch):
    """launch.check_co_resident with the resources an H200 reported on 2026-12-03: two_shot's GEMM (189
    registers at 8 warps) beside its communication programs (63 registers at 4 warps) fits two to an SM;
    the traced pair (76800 registers of 65536) does not, and is refused before anything launches."""
    from types import SimpleNamespace

    from gemmar.errors import UsageError
    from gemmar.runtime import launch

    props = SimpleNamespace(name="NVIDIA H200", multi_processor_count=132, max_threads_per_multi_processor=2048,
                            regs_per_multiprocessor=65536, shared_memory_per_multiprocessor=233472)
    monkeypatch.setattr(launch.torch.cuda, "get_device_properties", lambda device: props)

    def kernel(registers, warps, shared):
        return SimpleNamespace(n_regs=registers, metadata=SimpleNamespace(num_warps=warps, shared=shared))

    gemm, comm = kernel(189, 8, 164096), kernel(63, 4, 0)
    one, two = SimpleNamespace(device=None, ranks_on_device=1), SimpleNamespace(device=None, ranks_on_device=2)
    launch.check_co_resident([(gemm, 132), (comm, 132)], one)      # one of each per SM
    launch.check_co_resident([(gemm, 66), (comm, 66)], two)        # two ranks sharing: still one of each
    launch.check_co_resident([(gemm, 116), (kernel(255, 8, 0), 16)], one)   # an SM each: nothing to share
    with pytest.raises(UsageError, match=r"^2 rank\(s\) x \(66 \+ 66\) programs cannot all be resident on one NVIDIA "
                                         r"H200 \(132 SMs; each SM would need 76800 registers of 65536\).*use at "
                                         r"most 66 programs per rank"):
        launch.check_co_resident([(kernel(232, 8, 164096), 66), (kernel(136, 4, 0), 66)], two)
    launch.check_co_resident([(kernel(16, 32, 0), 264)], one)        # two 1024-thread programs to an SM fit
    with pytest.raises(UsageError, match=r"each SM would need 3072 threads of 2048\)"):
        launch.check_co_resident([(kernel(16, 32, 0), 396)], one)    # three do not


def test_a_mistyped_flag_gets_the_flag_it_meant(capsys):
    from gemmar.cli import main

    for argv, meant in ((["bench", "--blk_m", "32"], "--BLK_M"), (["allreduce", "--Baseline"], "--baseline"),
                        (["bench", "--zzz"], None)):
        with pytest.raises(SystemExit) as stop:
            main(argv)
        said = capsys.readouterr().err.strip()
        assert stop.value.code == 2 and said.count("\n") == 0, said
        assert (f"(did you mean {meant}?)" in said) if meant else ("did you mean" not in said), said


def test_split_k_is_refused_where_it_cannot_run_and_chosen_only_for_few_tiles_and_a_long_k():
    from gemmar.tuning import SPLIT_MIN_STEPS, split_k_rule

    for settings, needle in ((dict(algorithm="two_shot", world_size=2, split_k=2), "at world size 1 only"),
                             (dict(algorithm="atomics", world_size=1, split_k=2), "with atomics at world size 1"),
                             (dict(algorithm="one_shot", world_size=1, k=64, BLK_K=32, split_k=3),
                              "split_k=3 is more than the 2 steps of BLK_K=32 in K=64: use at most 2"),
                             (dict(algorithm="two_shot", world_size=1, m=512, n=512, k=65536, BLK_M=16, BLK_N=16,
                                   BLK_K=16, num_sms=1024, comm_sms=1, split_k=2), r"pass 2\*\*31")):
        with pytest.raises(UsageError, match=needle) as info:
            RunConfig(**settings).validate()
        assert "\n" not in str(info.value)
    assert RunConfig(algorithm="one_shot", world_size=1, k=64, BLK_K=32, split_k=2).validate().split_k == 2
    # One row at K = 8192 with 16 x 64 x 256 tiles: 32 tiles on 132 SMs, 32 steps of K: 4 slices fill the SMs.
    assert split_k_rule("two_shot", (1, 2048, 8192, 1), (16, 64, 256), 132) == 4
    # ... at most K's steps / SPLIT_MIN_STEPS slices, and none where the tiles fill half the SMs, at W >= 2,
    # for an algorithm without split-K
    assert split_k_rule("two_shot", (1, 2048, 1024, 1), (16, 64, 256), 132) == 4 // SPLIT_MIN_STEPS
    assert split_k_rule("two_shot", (16, 8192, 8192, 1), (16, 64, 256), 132) == 1
    assert split_k_rule("two_shot", (1, 2048, 8192, 2), (16, 64, 256), 132) == 1
    assert split_k_rule("ring", (1, 2048, 8192, 1), (16, 64, 256), 132) == 1
    # A wave and a bit: 512 x 5120 in 128 x 128 tiles is 160 tiles, the last wave's 28 fill a fifth of 132 SMs:
    # 4 slices (132 // 28) of K = 4352's 68 steps; 256 tiles leave 124 for the last wave: not cut.
    assert split_k_rule("two_shot", (512, 5120, 4352, 1), (128, 128, 64), 132) == 4
    assert split_k_rule("two_shot", (1024, 8192, 4352, 1), (128, 256, 64), 132) == 1
    # ... none where a slice would have under SPLIT_K_PER_ROW x BLK_M of K (2048 x 5120 x 1280: 320 tiles, the last
    # wave's 56 could take 2 slices of 640), or after more than SPLIT_MAX_WHOLE_WAVES whole waves (3584 tiles)
    assert split_k_rule("two_shot", (2048, 5120, 1280, 1), (128, 256, 64), 132) == 1
    assert split_k_rule("two_shot", (2048, 5120, 1280, 1), (128, 256, 64), 132, k_per_row=4) == 2
    assert split_k_rule("two_shot", (16384, 7168, 4608, 1), (128, 256, 64), 132) == 1
    assert split_k_rule("two_shot", (16384, 7168, 4608, 1), (128, 256, 64), 132, max_whole_waves=64) == 6
    config = RunConfig(algorithm="two_shot", world_size=1, m=512, n=5120, k=4352, BLK_M=128, BLK_N=128, BLK_K=64,
                       num_sms=132, comm_sms=132, split_k=4).validate()
    assert (config.whole_tiles, config.work_units) == (132, 132 + 28 * 4)
    knobs = tuned_defaults("cuda", "two_shot", (9, 0), 132, shape=(1, 2048, 8192, 1))
    assert knobs["split_k"] == split_k_rule("two_shot", (1, 2048, 8192, 1),
                                            (knobs["BLK_M"], knobs["BLK_N"], knobs["BLK_K"]), knobs["num_sms"]) > 1
    assert tuned_defaults("cuda", "two_shot", (9, 0), 132, shape=(1, 2048, 8192, 1), given={"split_k": 1})["split_k"] == 1
    assert tuned_defaults("cpu", "two_shot")["split_k"] == 1
