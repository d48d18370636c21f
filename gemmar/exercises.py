"""The notebooks' exercise checks. They live here, not in the notebooks, so that the answers are not in a
cell the participant can read, and so that the tests can prove each check both ways (a right answer
passes, a wrong one is told *what* is wrong without being told the answer).

Each check returns the message it prints: "right! ..." or "not quite: ..." (or what to do first).
"""

from .analysis.schedule import tile_schedule


def _say(message):
    print(message)
    return message


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


def check_waiting_beats_comm(explorer):
    """Notebook 4: a ring run whose total waiting (all ranks) is smaller than its total communication,
    found by changing the explorer's knobs (the configuration it started with does not count)."""
    if not hasattr(explorer, "result"):
        return _say("press Run first")
    config = explorer.result.config
    s = explorer.result.trace.summary()
    wait_ms, comm_ms = s.wait_us.sum() / 1e3, s.comm_us.sum() / 1e3
    if config.algorithm != "ring":
        return _say(f"not yet: the last run is {config.algorithm}; the exercise is about the ring")
    if config.to_dict() == explorer.first_config.to_dict():
        return _say(f"that is the starting configuration (waiting {wait_ms:.0f} ms, communicating {comm_ms:.0f} ms): "
                    f"change some knobs and Run again")
    if wait_ms < comm_ms:
        return _say(f"found one! waiting {wait_ms:.0f} ms < communicating {comm_ms:.0f} ms: which knob made the "
                    f"difference, and why?")
    return _say(f"not yet: waiting {wait_ms:.0f} ms vs communicating {comm_ms:.0f} ms")


def check_worst_wait(my_answer, rows):
    """Notebook 5: which trace has the largest waiting time per program (``rows``: the table's rows)."""
    if my_answer is None:
        return _say("fill in my_answer (a trace name from the table)")
    by_name = {r["trace"]: r["wait_per_program_us"] for r in rows}
    if my_answer not in by_name:
        return _say(f"not quite: {my_answer!r} is not in the table; use one of {', '.join(sorted(by_name))}")
    if by_name[my_answer] == max(by_name.values()):
        return _say("right! and only the ring waits: its programs hand each tile on, and wait for the slot")
    return _say(f"not quite: {my_answer} waits {by_name[my_answer]:.1f} us per program; another trace waits longer")
