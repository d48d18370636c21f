"""The per-shape chooser and the tuning cache, without a GPU: a cache file is read and used, a bad one is refused
in one line naming the file and what is wrong, a shape the cache does not hold falls back to the rule."""

import json
import os
import sys

import pytest
import torch

from gemmar import UsageError
from gemmar.tuning import GEMV_ROWS, gemv_tile, tuned_defaults
from gemmar.tuning_cache import (CACHE_FORMAT, TILE_KNOBS, choose, load_cache, make_entry, parse_shape,
                                 read_shapes_file, rule_tile, save_cache)

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the lab (lab/README.md)
from lab.models.tile_rule import fit_rule  # noqa: E402   (the fit is the lab's; the rule it makes is the kit's)

H100 = "NVIDIA H100 80GB HBM3"
TILE = (32, 64, 128, 4, 3, 8)


def tile_of(knobs):
    return tuple(knobs[k] for k in TILE_KNOBS)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A cache file with one entry, which GEMMAR_TUNING_CACHE names (so nothing under $HOME is read)."""
    path = tmp_path / "tuning.json"
    save_cache([make_entry(H100, "bf16", 1, (128, 5120, 3456), "two_shot", TILE, ms=0.02, matmul_ms=0.021)], str(path))
    monkeypatch.setenv("GEMMAR_TUNING_CACHE", str(path))
    return path


def test_a_cache_entry_is_used_for_its_gpu_dtype_world_size_and_shape(cache):
    choice = choose(H100, "bf16", 1, (128, 5120, 3456))
    assert choice.cached and choice.algorithm == "two_shot" and tile_of(choice.tile) == TILE
    assert str(cache) in choice.source and str(cache) in choice.describe()
    knobs = tuned_defaults("cuda", "two_shot", (9, 0), 132, shape=(128, 5120, 3456, 1), gpu=H100, datatype="bf16")
    assert tile_of(knobs) == TILE and knobs["num_sms"] == 132
    # A tile the user gives still wins over the cache's.
    assert tuned_defaults("cuda", "two_shot", (9, 0), 132, shape=(128, 5120, 3456, 1), gpu=H100, datatype="bf16",
                          given={"BLK_N": 256})["BLK_N"] == 256


FITTED = {16: (16, 64, 128, 4, 4, 8), 512: (64, 128, 64, 4, 4, 8), 1 << 20: (128, 256, 64, 8, 3, 8)}


@pytest.mark.parametrize("gpu,datatype,world_size,shape", [
    (H100, "bf16", 1, (128, 5120, 3457)),              # another shape
    ("NVIDIA H200", "bf16", 1, (128, 5120, 3456)),     # another GPU
    (H100, "fp16", 1, (128, 5120, 3456)),              # another dtype
    (H100, "bf16", 2, (128, 5120, 3456)),              # another world size
])
def test_a_missing_entry_falls_back_to_the_rule(cache, gpu, datatype, world_size, shape, monkeypatch):
    choice = choose(gpu, datatype, world_size, shape, rule=FITTED)
    assert not choice.cached and "rule" in choice.source
    assert tile_of(choice.tile) == rule_tile(shape, FITTED) == FITTED[512]
    # With an empty rule, the algorithm's measured tiles stand.
    monkeypatch.setattr("gemmar.tuning_cache.RULE", {})
    assert choose(gpu, datatype, world_size, shape) is None
    knobs = tuned_defaults("cuda", "two_shot", (9, 0), 132, shape=(*shape, world_size), gpu=gpu, datatype=datatype)
    assert knobs == tuned_defaults("cuda", "two_shot", (9, 0), 132, shape=(*shape, world_size))


def test_the_rule_answers_at_one_rank_on_hopper_and_leaves_the_rest_as_measured(tmp_path, monkeypatch):
    monkeypatch.setenv("GEMMAR_TUNING_CACHE", str(tmp_path / "none.json"))   # (no such file: an empty cache)
    monkeypatch.setattr("gemmar.tuning_cache.RULE", FITTED)
    for m in (1, 16, 64, 128, 512, 4096, 16384):
        knobs = tuned_defaults("cuda", "two_shot", (9, 0), 132, shape=(m, 5120, 3456, 1), gpu=H100, datatype="bf16")
        # (up to GEMV_ROWS rows the few-rows kernel, with its own tile; above, the fitted rule)
        assert knobs["gemv"] == (m <= GEMV_ROWS)
        assert tile_of(knobs) == (gemv_tile("two_shot", "hopper", (m, 5120, 3456, 1)) if m <= GEMV_ROWS else
                                  rule_tile((m, 5120, 3456), FITTED))
    # The ring's tile, another GPU family, and two ranks: as before (the rule is fitted at one rank on Hopper).
    old = dict(capability=(9, 0), multiprocessors=132, shape=(16, 8192, 1024, 2))
    assert tuned_defaults("cuda", "two_shot", **old, gpu=H100, datatype="bf16") == tuned_defaults("cuda", "two_shot", **old)
    assert tuned_defaults("cuda", "ring", (9, 0), 132, shape=(16, 8192, 1024, 1), gpu=H100, datatype="bf16")["BLK_M"] == 128
    assert tuned_defaults("cuda", "two_shot", (8, 0), 108, shape=(16, 8192, 1024, 1), gpu="A100",
                          datatype="bf16")["BLK_M"] == 128


def test_the_shipped_rule_answers_every_row_count_with_a_tile_the_sweep_times(tmp_path):
    """RULE is fitted on the sweep's grid, so each bucket's tile is one of the candidates timed at those rows, and
    its largest bound answers for any M above it too."""
    from gemmar.tuning_cache import RULE, candidates

    bounds = sorted(RULE)
    assert bounds[-1] >= 1 << 20 and bounds[0] >= 1
    lower, answers = 0, set()
    for bound in bounds:
        for m in {lower + 1, bound}:
            for n, k in ((5120, 96), (2048, 3456), (16384, 16384)):
                tile = rule_tile((m, n, k))
                assert tile in candidates(m), (bound, m, n, k, tile)
                answers.add(tile)
        lower = bound
    assert rule_tile((1 << 21, 8192, 8192)) in candidates(1 << 21)
    # Each is a tile a cache file may hold (save_cache refuses any other), so `gemmar tune` can start from it.
    path = str(tmp_path / "rule.json")
    save_cache([make_entry(H100, "bf16", 1, (i + 1, 8, 8), "two_shot", tile) for i, tile in enumerate(answers)], path)
    assert len(load_cache(path)) == len(answers)


def good_entry():
    return make_entry(H100, "bf16", 1, (16, 4096, 1024), "two_shot", TILE)


@pytest.mark.parametrize("content,problem", [
    ("{not json", "not JSON"),
    (json.dumps([1, 2]), "format is 'list'"),
    (json.dumps({"format": "something-else/9", "entries": []}), "format is 'something-else/9'"),
    (json.dumps({"format": CACHE_FORMAT, "entries": {}}), "no list of entries"),
    (json.dumps({"format": CACHE_FORMAT, "entries": [dict(good_entry(), algorithm="fastest")]}),
     "algorithm 'fastest'"),
    (json.dumps({"format": CACHE_FORMAT, "entries": [dict(good_entry(), tile=dict(good_entry()["tile"], BLK_M=48))]}),
     "BLK_M 48"),
    (json.dumps({"format": CACHE_FORMAT, "entries": [dict(good_entry(), shape=[16, 4096])]}), "shape [16, 4096]"),
    (json.dumps({"format": CACHE_FORMAT, "entries": [{k: v for k, v in good_entry().items() if k != "gpu"}]}),
     "no gpu"),
    (json.dumps({"format": CACHE_FORMAT, "entries": [dict(good_entry(), datatype="int8")]}), "datatype 'int8'"),
    (json.dumps({"format": CACHE_FORMAT, "entries": [dict(good_entry(), gemv="yes")]}), "gemv 'yes'"),
    (json.dumps({"format": CACHE_FORMAT, "entries": [dict(good_entry(), shape=[64, 4096, 1024], gemv=True)]}),
     "BLK_M 32 for M 64"),
    (json.dumps({"format": CACHE_FORMAT, "entries": [dict(good_entry(), algorithm="ring", gemv=True)]}),
     "gemv true for ring"),
])
def test_a_bad_cache_file_is_refused_in_one_line_naming_it(tmp_path, content, problem):
    path = tmp_path / "shipped-cache.json"
    path.write_text(content)
    with pytest.raises(UsageError) as refused:
        load_cache(str(path))
    said = str(refused.value)
    assert "\n" not in said and str(path) in said and problem in said, said
    with pytest.raises(UsageError):   # (the kernels' defaults refuse it too, rather than running on without it)
        choose(H100, "bf16", 1, (16, 4096, 1024), path=str(path))


def test_the_cache_keeps_other_entries_and_is_reread_when_it_changes(tmp_path):
    path = str(tmp_path / "c.json")
    save_cache([good_entry()], path)
    assert len(load_cache(path)) == 1
    other = make_entry(H100, "bf16", 1, (64, 4096, 1024), "one_shot", (64, 64, 128, 4, 4, 8))
    save_cache([other], path)
    assert len(load_cache(path)) == 2 and choose(H100, "bf16", 1, (64, 4096, 1024), path=path).algorithm == "one_shot"
    assert json.load(open(path))["format"] == CACHE_FORMAT


def test_the_rule_is_fitted_per_bucket_of_rows_on_geometric_means():
    a, b = (16, 64, 128, 4, 4, 8), (64, 64, 128, 4, 4, 8)
    rows = [(1, {a: 1.0, b: 1.2}), (16, {a: 1.1, b: 1.0}), (8, {a: 1.0, b: 1.05}),   # <= 16: a (geomean)
            (64, {a: 1.3, b: 1.0}),                                                 # <= 64: b
            (4096, {a: 2.0, b: 1.01})]                                              # the largest bucket: b
    rule = fit_rule(rows)
    assert rule[16] == a and rule[64] == b and rule[max(rule)] == b and len(rule) == 3
    assert rule_tile((1, 8, 8), rule) == a and rule_tile((32, 8, 8), rule) == b and rule_tile((1000, 8, 8), rule) == b
    assert rule_tile((1 << 20, 8, 8), rule) == b and rule_tile((5, 8, 8), {}) is None


def test_the_wave_model_fits_the_waves_and_picks_the_tile_that_fills_the_last():
    """Times made by a known wave model are fitted back to it, and the rule then picks, per shape, the tile with
    the fewest idle SMs unless its steps cost more: 128 x 128 tiles where 128 x 256 leave a wave half empty."""
    from gemmar.tuning_cache import predicted_us, rule_from_json, rule_to_json
    from lab.models.tile_rule import fit_wave_model, wave_rule

    small, large = (128, 128, 64, 4, 4, 8), (128, 256, 64, 8, 4, 8)
    truth = {small: (4.0, 1.0, 0.4), large: (5.0, 2.0, 0.7)}
    shapes = [(m, n, k) for m in (256, 1024, 4096) for n in (2048, 5120, 8192) for k in (192, 1024, 4096)]
    rows = [(s, {t: predicted_us(c, t, s, 132) for t, c in truth.items()}) for s in shapes]
    model = fit_wave_model(rows, 132)
    assert all(model[t] == pytest.approx(truth[t], abs=1e-3) for t in truth)
    rule = wave_rule({16: (16, 64, 256, 4, 3, 8)}, model)
    assert rule[16] == (16, 64, 256, 4, 3, 8) and all(t in dict(rule[1 << 20]) for t in truth)
    # 8192 x 8192: 256 large tiles fill two waves; 1024 x 5120: 160 large tiles are a wave and 28, 320 small 2.4
    assert rule_tile((8192, 8192, 4096), rule) == large
    assert rule_tile((1024, 5120, 3456), rule) == small
    # another GPU counts its own waves: 160 large tiles in one wave of 160 SMs
    assert rule_tile((1024, 5120, 3456), rule, sms=160) == large
    # a rule file holds the same, and a bad one is refused in one line
    assert rule_from_json(json.loads(json.dumps(rule_to_json(rule)))) == rule
    for bad in ({"16": "tile"}, {"16": []}, {"16": [16, 64]}, {"512": [[[128, 128, 64, 4, 4, 8], [1.0, 2.0]]]}):
        with pytest.raises(UsageError, match="a rule must map rows"):
            rule_from_json(bad)
    # a bucket none of whose tiles was timed at enough shapes is left out; an empty entry answers nothing
    assert 512 not in wave_rule({}, {(1, 2, 3, 4, 5, 6): (1.0, 1.0, 1.0)})
    assert rule_tile((600, 8, 8), {1 << 20: ()}) is None


def test_shapes_are_read_from_words_and_files(tmp_path):
    assert parse_shape("128x5120x3456") == (128, 5120, 3456)
    for bad in ("128x5120", "0x1x1", "axbxc", "1x2x3x4"):
        with pytest.raises(UsageError, match="MxNxK"):
            parse_shape(bad)
    f = tmp_path / "shapes.txt"
    f.write_text("# Llama 70B, TP 8\n1x8192x1024\n\n16x8192x3584  # decode\n")
    assert read_shapes_file(str(f)) == [(1, 8192, 1024), (16, 8192, 3584)]
    f.write_text("1x8192x1024\n16x8192\n")
    with pytest.raises(UsageError, match="line 2"):
        read_shapes_file(str(f))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without a GPU")
def test_gemmar_tune_without_a_gpu_refuses_in_one_line(capsys, tmp_path, monkeypatch):
    from gemmar.cli import main

    monkeypatch.setenv("GEMMAR_TUNING_CACHE", str(tmp_path / "c.json"))
    assert main(["tune", "128x5120x3456"]) == 2
    said = capsys.readouterr().err.strip()
    assert said.count("\n") == 0 and "GPU" in said, said
    assert not (tmp_path / "c.json").exists()


def test_the_few_rows_kernel_answers_up_to_64_rows_unless_the_cache_holds_the_shape(tmp_path, monkeypatch):
    """Up to GEMV_ROWS rows at one rank on Hopper the few-rows kernel runs (tuning.gemv_tile, its K slices from
    gemv_split); a cache entry for the shape wins, and says whether it is the few-rows kernel's."""
    from gemmar.tuning import GEMV_MIN_STEPS, gemv_split

    path = str(tmp_path / "c.json")
    monkeypatch.setenv("GEMMAR_TUNING_CACHE", path)
    shape = (16, 4096, 1024)
    knobs = tuned_defaults("cuda", "two_shot", (9, 0), 132, shape=(*shape, 1), gpu=H100, datatype="bf16")
    assert knobs["gemv"] and knobs["split_k"] == gemv_split((*shape, 1), knobs["BLK_N"], knobs["BLK_K"], 132)
    # Not with two ranks, nor the ring, nor off Hopper, nor where the user said --no-gemv, nor past 64 rows.
    for algorithm, capability, size, given, m in (("two_shot", (9, 0), 2, {}, 16), ("ring", (9, 0), 1, {}, 16),
                                                   ("two_shot", (8, 0), 1, {}, 16),
                                                   ("two_shot", (9, 0), 1, {"gemv": False}, 16),
                                                   ("two_shot", (9, 0), 1, {}, 65)):
        assert not tuned_defaults("cuda", algorithm, capability, 132, shape=(m, 4096, 1024, size), gpu=H100,
                                  datatype="bf16", given=given)["gemv"]
    # --no-gemv takes the tile GEMM's own tile; a BLK_M too short for M, or programs given, leave the rule out; a
    # forced --gemv with programs is refused in one line.
    rule = tuned_defaults("cuda", "two_shot", (9, 0), 132, shape=(*shape, 1), gpu=H100, datatype="bf16",
                          given={"gemv": False})
    assert not rule["gemv"] and tile_of(rule) == rule_tile(shape)
    short = tuned_defaults("cuda", "two_shot", (9, 0), 132, shape=(40, 4096, 1024, 1), gpu=H100, datatype="bf16",
                           given={"BLK_M": 16})
    assert not short["gemv"] and short["BLK_M"] == 16 and tile_of(short)[1:] == rule_tile((40, 4096, 1024))[1:]
    programs = tuned_defaults("cuda", "two_shot", (9, 0), 132, shape=(*shape, 1), gpu=H100, datatype="bf16",
                              given={"num_sms": 64})
    assert not programs["gemv"] and programs["num_sms"] == 64
    with pytest.raises(UsageError, match="num_sms=64 is not allowed with gemv=True"):
        tuned_defaults("cuda", "two_shot", (9, 0), 132, shape=(*shape, 1), given={"num_sms": 64, "gemv": True})
    # The slices: as many as keep every program resident (one an SM by dot, three at one row), each >= 4 steps.
    assert gemv_split((16, 4096, 7168, 1), 64, 256, 132) == 2        # 64 tiles x 2 <= 132; 14 steps a slice
    assert gemv_split((1, 4096, 2048, 1), 64, 128, 132) == 4         # 64 tiles x 4 <= 3 x 132; 4 steps a slice
    assert gemv_split((1, 16384, 2048, 1), 64, 128, 132) == 1        # 256 tiles x 2 > 3 x 132
    assert gemv_split((1, 2048, 512, 1), 64, 128, 132) == 1          # 4 steps: no slice of GEMV_MIN_STEPS more
    assert GEMV_MIN_STEPS == 4
    # A cache entry for the shape wins: a tile GEMM's, then a few-rows kernel's of its own tile.
    save_cache([make_entry(H100, "bf16", 1, shape, "two_shot", TILE)], path)
    cached = tuned_defaults("cuda", "two_shot", (9, 0), 132, shape=(*shape, 1), gpu=H100, datatype="bf16")
    assert not cached["gemv"] and tile_of(cached) == tuple(TILE)
    own = (16, 128, 128, 8, 3, 1)
    save_cache([make_entry(H100, "bf16", 1, shape, "two_shot", own, gemv=True)], path)
    cached = tuned_defaults("cuda", "two_shot", (9, 0), 132, shape=(*shape, 1), gpu=H100, datatype="bf16")
    assert cached["gemv"] and tile_of(cached) == own
    assert choose(H100, "bf16", 1, shape, path=path).gemv
