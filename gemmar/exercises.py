"""The notebooks' exercise checks. They live here, not in the notebooks, so that the answers are not in a
cell the participant can read, and so that the tests can prove each check both ways (a right answer
passes, a wrong one is told *what* is wrong without being told the answer).

Each check returns the message it prints: "right! ..." or "not quite: ..." (or what to do first).

The puzzles (``check_tile_coords``, ``check_push_partial``, ``check_reduce_step``, ``check_sum_partials``)
take a participant's ``@triton.jit`` function and run it for real inside the package's kernel on the
notebook's cluster (``runtime/shipping.py``), then judge the result against a torch reference: they say which
rank and tile went wrong and how, and return the run (``verdict.result``) for a closer look. Solutions:
``instructors/solutions.py`` (out of the notebooks' folder, so out of a participant's file browser).
"""

import re

import torch

from .analysis.schedule import plot_tile_order, tile_coords, tile_schedule
from .errors import GemmarError, RankDiedError
from .partial_counts import (held_in, integer_problem, judge_partials, judge_precision, not_whole_numbers,
                             order_sensitive_problem, precision_problem, returned_rank_verdict)
from .runtime.problem import SIGNIFICANT_BITS
from .runtime.gpu_compile import compile_error


class Verdict(str):
    """The message a check printed; ``result`` is the run it judged (None when nothing ran)."""

    result = None

    @property
    def right(self):
        return self.startswith("right!")


def _say(message, result=None):
    print(message)
    verdict = Verdict(message)
    verdict.result = result
    return verdict


# Seconds a check's launch may run before its ranks are stopped (a check's launch takes a second or two), and
# a wait on a flag before it is named (a DeadlockError): a participant's wrong wait is told within 15 s.
CHECK_LAUNCH_DEADLINE_S = 10
CHECK_WAIT_S = 10


def _run_part(cluster, algorithm, parts, A, B, **settings):
    """(the Result, None), or (None, what went wrong) when the participant's code did not run through."""
    if not cluster.running or cluster.restart_reason:   # stopped by the last cell after a Run All, or a crash (in a
        # notebook the fresh ranks start at once, in the background: then they may be up already)
        reason = cluster.restart_reason or ""
        why = ("the last check's ranks were stopped at an access outside its buffer" if "outside its buffer" in reason
               else "the last check's ranks were stopped in a launch that did not end" if "finished no launch" in
               reason else "the last check's ranks crashed" if reason else "the cluster was stopped")
        print(f"({why}: starting {cluster.world_size} rank(s) again)")
        cluster.start()
    try:
        # cpu: with the sanitizer, so that an access outside its buffer or to a rank that does not exist is
        # named (rank, line, buffer) instead of crashing the ranks, and a race that gave the right sum is told.
        # A check's launch takes a second or two: one still running after CHECK_LAUNCH_DEADLINE_S loops.
        result = cluster.gemm_all_reduce(A, B, algorithm=algorithm, parts=parts, trace=True, timeout_s=CHECK_WAIT_S,
                                         sanitize=cluster.backend == "cpu", launch_deadline_s=CHECK_LAUNCH_DEADLINE_S,
                                         progress=True, **settings)   # (a bar, once a check runs past 2 s)
        return result, None
    except RankDiedError as e:
        if "finished no launch" in str(e):
            return None, (f"not yet: a launch with your {', '.join(parts)} ran for {CHECK_LAUNCH_DEADLINE_S} s "
                          f"without ending (a loop that never stops?), so its ranks were stopped. The next check "
                          f"starts fresh ranks by itself")
        crashed = any(f"killed by {sig}" in str(e) for sig in ("SIGSEGV", "SIGBUS"))
        hint = (f"; a load or store of your {', '.join(parts)} reached an address outside every rank's heap: "
                f"look at the order of from_rank and to_rank (data flows from the first to the second) and at "
                f"translate's arguments" if crashed else "")
        return None, f"not yet: {e}{hint}. The next check starts fresh ranks by itself"
    except GemmarError as e:
        return None, f"not yet: {e}"


def _race_verdict(result):
    """What to say when the sanitizer found a race in a run whose values came out right; else None."""
    report = result.sanitizer
    if report is None or report.ok:
        return None
    return (f"not yet: every value is right this time, but the sanitizer found a race that another timing "
            f"would lose: {report.races[0].text}")


def _gpu_verdict(result, parts):
    """None when the participant's parts, right under the interpreter, also compile for a GPU (sm_90, on
    this machine); else what to say."""
    problem = compile_error(result.config, parts)
    if problem is None:
        return None
    return (f"not quite: right on the CPU ranks, but it would not compile for a GPU (the interpreter runs any "
            f"Python; the compiler takes only what Triton can translate): {problem}")


def check_tile_coords(cluster, my_tile_coords):
    """Notebook 1's puzzle: a ``tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_SIZE_M)`` that hands out
    every tile exactly once, in the grouped order (including a short last group), run in the atomics
    kernel. A wrong answer also draws where the kernel put each tile id next to the grouped order."""
    m, n, block, group = 96, 80, 16, 4     # 6 x 5 tiles: groups of 4 tile-rows, the last one only 2 rows
    tiles_m, tiles_n = m // block, n // block
    A, B = integer_problem(m, n, 32, seed=1)
    result, failed = _run_part(cluster, "atomics", {"tile_coords": my_tile_coords}, A, B, BLK_M=block,
                               BLK_N=block, BLK_K=16, gsize_m=group, num_sms=4)
    if failed:
        return _say(not_whole_numbers(failed, my_tile_coords) or failed)
    events = result.trace.iteration(-1)
    got = events[(events.kind == "gemm") & (events["rank"] == 0)].sort_values("tile")[["tile", "pid_m", "pid_n"]]
    setting = f"({tiles_m} x {tiles_n} tiles, GROUP_SIZE_M = {group})"
    outside = got[(got.pid_m < 0) | (got.pid_m >= tiles_m) | (got.pid_n < 0) | (got.pid_n >= tiles_n)]
    if len(outside):
        t = outside.iloc[0]
        return _say(f"not quite: tile id {t.tile} went to (pid_m, pid_n) = ({t.pid_m}, {t.pid_n}), outside the "
                    f"grid {setting}", result)
    place = list(zip(got.pid_m, got.pid_n))
    missing = sorted(set((i, j) for i in range(tiles_m) for j in range(tiles_n)) - set(place))
    if missing:
        twice = got[got.duplicated(["pid_m", "pid_n"], keep=False)]
        first = twice[(twice.pid_m == twice.iloc[0].pid_m) & (twice.pid_n == twice.iloc[0].pid_n)]
        said = _say(f"not quite: {len(missing)} tile(s) were never computed, so C is wrong there: the first is "
                    f"{missing[0]}; tile ids {', '.join(map(str, first.tile))} all went to "
                    f"({first.iloc[0].pid_m}, {first.iloc[0].pid_n}) {setting}", result)
        plot_tile_order(got, tiles_m, tiles_n, group)   # (shown at once in a notebook: under the verdict)
        return said
    if not result.ok:
        return _say(f"not quite: every tile was computed once but C is off by {result.max_abs_diff:.3g}", result)
    expected = [tile_coords(t, tiles_m, tiles_n, group) for t in got.tile]
    differs = [(t, p) for t, p, e in zip(got.tile, place, expected) if p != e]
    if differs:
        t, p = differs[0]
        short = tiles_m % group
        said = _say(f"not quite: C is right (every tile once), but not in grouped order {setting}: tile id {t} "
                    f"went to {p}. Consecutive ids walk down a column of GROUP_SIZE_M tile-rows before moving one "
                    f"column right" + (f", and the last group has only {short} row(s)" if short else ""), result)
        plot_tile_order(got, tiles_m, tiles_n, group)
        return said
    return _say(_race_verdict(result) or _gpu_verdict(result, {"tile_coords": my_tile_coords}) or
                f"right! every tile once, in grouped order, the short last group included {setting}", result)


def _partials_verdict(cluster, algorithm, part, fn, shape, seed, smallest, too_few, hint, right, **settings):
    """The puzzles whose part decides which partials reach which rank's C: run ``fn`` as ``part`` in
    ``algorithm``'s kernel for two back-to-back launches on whole-number inputs of ``shape`` (M, N, K: not
    multiples of the 16 x 16 tile, so that edge tiles, where a part must honour its mask, are in every check)
    and judge every rank's C. ``hint``, what to add to a wrong answer's table: a function (result, rank, tile), or
    a text formatted with ``W``, ``steps`` (W - 1) and ``tile``."""
    if cluster.world_size < smallest:
        return f"this check needs a cluster of at least {smallest} ranks: {too_few}", None
    A, B = integer_problem(*shape, seed=seed)
    result, failed = _run_part(cluster, algorithm, {part: fn}, A, B, BLK_M=16, BLK_N=16, BLK_K=16, num_sms=2,
                               iterations=2, **settings)
    if failed:
        if "HeapBoundsError" in failed and "past its end" in failed:
            failed += (f". This check's C is {shape[0]} x {shape[1]}, not a multiple of the 16 x 16 tile: in an edge "
                       f"tile the rows and columns past C's edge must be masked off (mask=)")
        elif re.search(r"HeapBoundsError: .* asked for rank -\d", failed):
            failed += ". (In Triton, as in C, % keeps the sign of its left side: -1 % 3 is -1, not 2.)"
        return failed, None
    wrong = judge_partials(result, A, B, lambda rank, tile: hint(result, rank, tile) if callable(hint) else
                            hint.format(W=cluster.world_size, steps=cluster.world_size - 1, tile=tile))
    return (wrong or _race_verdict(result) or _gpu_verdict(result, {part: fn}) or
            f"right! {right}, over 2 back-to-back launches"), result


def _pushes_of(result, rank, tile):
    e = result.trace.iteration(-1)
    e = e[(e.kind == "push") & (e["rank"] == rank) & (e.pid_m == tile[0]) & (e.pid_n == tile[1])]
    return (f"The trace says rank {rank}'s {len(e)} pushes of that tile returned rank(s) "
            f"{', '.join(map(str, e.sort_values('step').peer))}.")


def check_push_partial(cluster, my_push_partial):
    """Notebook 2's puzzle: push step ``step`` of a partial tile into one rank's C with an atomic add and
    return that rank; run in the atomics kernel. C right is not enough: the rank returned must be the rank
    pushed to (the trace, and the replay's done rule, record each push by what the part returns)."""
    said, result = _partials_verdict(cluster, "atomics", "push_partial", my_push_partial, (40, 44, 64), 2, 2,
                                     "with one, every push lands in its own C", _pushes_of,
                                     f"every rank's C holds each of the {cluster.world_size} partials once")
    if said.startswith("right!"):
        said = returned_rank_verdict(result) or said
    if said.startswith("right!"):
        said, result = _precision_verdict(cluster, "atomics", "push_partial", my_push_partial, (40, 44, 64), 2) or \
            (said, result)
    return _say(said, result)


def check_reduce_step(cluster, my_reduce_step):
    """Notebook 3's puzzle: step 5 of the ring, ``reduce_step(total, received) -> (total, payload)``; run in
    the ring kernel."""
    said, result = _partials_verdict(cluster, "ring", "reduce_step", my_reduce_step, (36, 44, 60), 3, 3,
                                     "with 2 the ring has a single step, so what is passed on is never used",
                                     "With {W} ranks each tile takes {steps} steps: at each, what arrives is the "
                                     "partial of one more rank back along the ring, and what you pass on is what "
                                     "the next rank adds.",
                                     f"each rank's C holds every partial once after {cluster.world_size - 1} ring "
                                     f"steps")
    if said.startswith("right!"):
        said, result = _precision_verdict(cluster, "ring", "reduce_step", my_reduce_step, (36, 44, 60), 3) or \
            (said, result)
    return _say(said, result)


_right_errors = {}   # the package's own part's max |C - reference| on partial_counts.precision_problem, by run


def _precision_verdict(cluster, algorithm, part, fn, shape, seed):
    """None when ``fn`` as ``part`` is as precise as the package's own part on fp32 inputs of ``shape`` (M, N, K:
    partial_counts.judge_precision); else (what to say, the run)."""
    A, B = precision_problem(*shape, seed=seed)
    key = (algorithm, part, shape, seed, cluster.world_size, cluster.backend)
    yours, failed = _run_part(cluster, algorithm, {part: fn}, A, B, BLK_M=16, BLK_N=16, BLK_K=16, num_sms=2)
    if failed:
        return failed, None
    if key not in _right_errors:   # ({}: the package's own parts)
        right, failed = _run_part(cluster, algorithm, {}, A, B, BLK_M=16, BLK_N=16, BLK_K=16, num_sms=2)
        if failed:
            return failed, None
        _right_errors[key] = right.max_abs_diff
    said = judge_precision(part, yours, _right_errors[key], A, B)
    return (said, yours) if said else None


def check_sum_partials(cluster, my_sum_partials):
    """Notebook 6's puzzle: the owner's step 5 of two_shot, ``sum_partials(slot, rank, world_size, heap_bases,
    PEER_CACHE) -> the tile's fp32 sum of every rank's partial``; run in two_shot's reduction kernel. Every
    partial once (whole numbers, counted exactly), then in rank order: on inputs where the order of fp32
    additions shows in the bits, C must equal the package's own sum bit for bit; then in fp32: on fp16 inputs,
    whose partials added in fp16 round at every step, bit for bit again."""
    m, n, k, block = 48, 32, 60, 16
    said, result = _partials_verdict(cluster, "two_shot", "sum_partials", my_sum_partials, (m - 8, n + 4, k), 4, 2,
                            "with one, the only partial is the owner's own",
                            "Tile {tile} is summed by one rank, its owner, which writes the sum into every rank's "
                            "C: the owner's sum_partials must read the tile's slot in each of the {W} ranks' heaps.",
                            f"the owners' sums hold each of the {cluster.world_size} partials once, in every rank's C",
                            comm_sms=2)
    if not said.startswith("right!"):
        return _say(said, result)
    # Then bit for bit against the package's sum: on inputs where the order of fp32 additions shows in the
    # bits; and on fp16 inputs (the wire dtype is the input's), whose partials added in fp16 round at every
    # step, so that with 3 ranks or more some elements come out otherwise than from an fp32 sum rounded once.
    g = torch.Generator().manual_seed(7)
    stages = [(order_sensitive_problem(m, n, k, cluster.world_size, seed=6),
               "every partial is in C once, but tile {tile} has other bits than the sum in rank order (rank 0's "
               "partial, then rank 1's, ...). fp32 addition is not associative: another order rounds differently, "
               "and the ranks would not agree run after run"),
              ((torch.randn(m, k, generator=g).half(), torch.randn(k, n, generator=g).half()),
               "with fp16 inputs (the partials travel in fp16) tile {tile} has other bits than an fp32 sum: add the "
               "partials in fp32 (.to(tl.float32) on each load), so that the sum is rounded once, when it is "
               "written into C")]
    for (A, B), wrong in stages:
        tile, runs, failed = _tile_with_other_bits(cluster, my_sum_partials, A, B, block)
        if failed:
            return _say(failed)
        if tile is not None:
            narrow = held_in(runs["yours"].C) if held_in(runs["rank order"].C) is None else None
            if narrow is not None:   # (the dtype first: a sum returned in fp16 has other bits whatever its order)
                return _say(f"not quite: every partial is in C once, but your sum_partials' sum was rounded to "
                            f"{narrow}: every value in C is {'an' if narrow == 'fp16' else 'a'} {narrow} number "
                            f"({SIGNIFICANT_BITS[narrow]} significant "
                            f"bits), tile {tile} included. Return the fp32 sum (tl.float32), rounded once, when it is "
                            f"written into C", runs["yours"])
            return _say(f"not quite: {wrong.format(tile=tile)}", runs["yours"])
    return _say(f"right! {said[len('right! '):]}; summed in fp32 in rank order, bit for bit", runs["yours"])


def _tile_with_other_bits(cluster, my_sum_partials, A, B, block):
    """Run two_shot with the participant's sum and with the package's on the same inputs: ((pid_m, pid_n) of
    the first tile whose bits differ, or None; the runs; what went wrong, or None)."""
    runs = {}
    for name, parts in (("yours", {"sum_partials": my_sum_partials}), ("rank order", None)):
        runs[name], failed = _run_part(cluster, "two_shot", parts, A, B, BLK_M=block, BLK_N=block, BLK_K=block,
                                       num_sms=2, comm_sms=2, iterations=1)
        if failed:
            return None, runs, failed
    m, n = A.shape[0], B.shape[1]
    differ = (runs["yours"].C != runs["rank order"].C).view(m // block, block, n // block, block).any(3).any(1)
    tile = tuple(int(i) for i in differ.nonzero()[0]) if differ.any() else None
    return tile, runs, None


def check_tile_owner(my_program, my_turn, m=64, n=64, BLK=16, gsize_m=2, num_sms=3, tile=(3, 1)):
    """Notebook 1: which program computes tile ``tile`` = (pid_m, pid_n), and on which turn of its loop."""
    if my_program is None or my_turn is None:
        return _say("fill in my_program and my_turn, then run this cell again")
    s = tile_schedule(m, n, BLK, BLK, gsize_m, num_sms)
    row = s[(s.pid_m == tile[0]) & (s.pid_n == tile[1])].iloc[0]
    if (my_program, my_turn) == (row.program, row.turn):
        return _say(f"right! tile {tuple(tile)} is tile number {row.tile} in hand-out order")
    mine = s[(s.program == my_program) & (s.turn == my_turn)]
    if mine.empty:
        turns = int((s.program == my_program).sum())
        return _say(f"not quite: program {my_program} has {turns} turn(s) (0 to {turns - 1}) with {num_sms} programs; "
                    f"there is no turn {my_turn}" if 0 <= my_program < num_sms else
                    f"not quite: the programs are numbered 0 to {num_sms - 1}")
    other = mine.iloc[0]
    return _say(f"not quite: program {my_program} on turn {my_turn} computes tile ({other.pid_m}, {other.pid_n}), "
                f"not {tuple(tile)}: follow tile_coords once more (the group of GROUP_SIZE_M rows comes first)")


def check_total_pushes(total_pushes, trace):
    """Notebook 2: tile pushes (remote atomic adds of one whole tile into one rank's C, the rank's own C
    included) in one launch over all ranks, as a function of the number of tiles and ranks."""
    t = trace.iteration(-1)
    W = trace.meta["world_size"]
    tiles = int(((t.kind == "gemm") & (t["rank"] == 0)).sum())
    answer = total_pushes(tiles, W)
    if answer is None:
        return _say("fill in total_pushes")
    if answer == int((t.kind == "push").sum()):
        return _say(f"right! and each push adds {trace.meta['BLK_M']} x {trace.meta['BLK_N']} elements, one atomic each")
    return _say(f"not quite: for {tiles} tiles and {W} ranks your formula gives {answer}, and the trace disagrees. "
                f"Pick one tile in the Gantt chart: how many ranks compute a partial of it, and into how many "
                f"ranks' C does each partial go?")


def _ring_wait_target(epoch, step, world_size):
    # The ring kernel (kernels/ring.py, step 4): message number epoch * (W - 1) + step, and the flag counts
    # the messages that arrived, so it waits for that number plus one.
    return epoch * (world_size - 1) + step + 1


def check_ring_wait(waited_for):
    """Notebook 3: the value a rank waits for in ``data_ready[tile]`` in launch ``e``, step ``s``, W ranks."""
    if waited_for(0, 0, 3) is None:
        return _say("fill in waited_for")
    for W in (2, 3, 5):
        for e in range(4):
            for s in range(W - 1):
                if waited_for(e, s, W) != _ring_wait_target(e, s, W):
                    return _say(f"not quite: in launch e={e}, step s={s} with W={W} ranks your formula gives "
                                f"{waited_for(e, s, W)}, which is not what the kernel waits for. How many messages "
                                f"for this tile has the previous rank sent in the launches before e, and in this one?")
    return _say("right! the counter only grows, so no launch ever has to reset it")


def check_less_waiting(explorer):
    """Notebook 4: a ring run (not the starting configuration) whose total waiting, over all ranks, is under
    half the starting configuration's, found with the explorer's knobs."""
    if getattr(explorer, "first_result", None) is None:
        return _say("run the starting configuration first (the cell above), then change knobs and press Run")
    if not hasattr(explorer, "result"):
        return _say("press Run first")
    config = explorer.result.config
    start_ms = explorer.first_result.trace.summary().wait_us.sum() / 1e3
    wait_ms = explorer.result.trace.summary().wait_us.sum() / 1e3
    if config.algorithm != "ring":
        return _say(f"not yet: the last run is {config.algorithm}; the exercise is about the ring")
    if config.to_dict() == explorer.first_config.to_dict():
        return _say(f"that is the starting configuration (waiting {wait_ms:.0f} ms in all): change some knobs and "
                    f"Run again")
    if wait_ms < start_ms / 2:
        return _say(f"found one! waiting {wait_ms:.0f} ms in all, against {start_ms:.0f} ms at the start: which knob "
                    f"made the difference, and why?")
    return _say(f"not yet: waiting {wait_ms:.0f} ms in all, against {start_ms:.0f} ms at the start (under "
                f"{start_ms / 2:.0f} ms is the goal). Hint: every tile is handed from rank to rank W - 1 times, and "
                f"each hand-off can wait for a neighbour: which knobs change how many tiles there are, or how many "
                f"hand-offs each one makes?")


def check_worst_wait(my_answer, rows):
    """Notebook 5: which trace has the largest waiting time per program (``rows``: the table's rows)."""
    if my_answer is None:
        return _say("fill in my_answer (a trace name from the table)")
    by_name = {r["trace"]: r["wait_per_program_us"] for r in rows}
    if my_answer not in by_name:
        return _say(f"not quite: {my_answer!r} is not in the table; use one of {', '.join(sorted(by_name))}")
    if by_name[my_answer] == max(by_name.values()):
        return _say("right! the ring's programs hand each tile on: each waits for its neighbour's data and for its "
                    "slot to be free. Part of that waiting is a rank waiting out a peer that launched later (the "
                    "hatched launch skew in its lanes)")
    return _say(f"not quite: {my_answer} waits {by_name[my_answer]:.1f} us per program; another trace waits longer")


def check_right_ranks(my_answer, result):
    """Notebook 7: which ranks' C was right after the run that skipped the ready wait with a late rank."""
    if my_answer is None:
        return _say("fill in my_answer (a set of ranks)")
    right = {r.rank for r in result.ranks if r.ok}
    if set(my_answer) == right:
        return _say(f"right! rank {result.config.delay_rank} started late, so every partial it pulled had been "
                    f"published long before; the others pulled its partial before it existed")
    return _say(f"not quite: look at the per-rank lines above ({len(right)} rank(s) matched the reference), and at "
                f"when each rank's pull of a tile ends against when the late rank published it")
