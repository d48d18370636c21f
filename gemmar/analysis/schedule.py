"""The persistent GEMM's tile schedule, on the host: which program does which tile, in which order.

This mirrors the kernels' tile order and the tile loop ``range(pid, total_tiles, NUM_SMS)`` on the host, so a
notebook can draw the schedule before running anything; the tests check it against the tiles the kernels
actually recorded in their traces.
"""

import numpy as np
import pandas as pd


def tile_coords(tile_id, num_pid_m, num_pid_n, gsize_m):
    """(pid_m, pid_n) of tile ``tile_id`` in the kernels' grouped order. How is notebook 1's puzzle, so the
    package's own is kept out of sight (``kernels/puzzle_parts.py``) and this asks it."""
    from ..kernels import puzzle_parts

    return puzzle_parts.host_tile_coords(tile_id, num_pid_m, num_pid_n, gsize_m)


def tile_schedule(m, n, BLK_M, BLK_N, gsize_m, num_sms):
    """One row per tile: tile id, (pid_m, pid_n), the program that computes it and its turn in that
    program's loop (0 = first). Arguments take RunConfig's names."""
    num_pid_m, num_pid_n = -(-m // BLK_M), -(-n // BLK_N)
    rows = []
    for tile in range(num_pid_m * num_pid_n):
        pid_m, pid_n = tile_coords(tile, num_pid_m, num_pid_n, gsize_m)
        rows.append(dict(tile=tile, pid_m=pid_m, pid_n=pid_n, program=tile % num_sms, turn=tile // num_sms))
    return pd.DataFrame(rows)


def plot_schedule(m, n, BLK_M, BLK_N, gsize_m, num_sms, path=None):
    """Two heat maps over the output tiles: the tile id (the order tiles are handed out) and the program."""
    import matplotlib.pyplot as plt

    s = tile_schedule(m, n, BLK_M, BLK_N, gsize_m, num_sms)
    shape = (s["pid_m"].max() + 1, s["pid_n"].max() + 1)
    order, program = np.zeros(shape), np.zeros(shape)
    order[s["pid_m"], s["pid_n"]] = s["tile"]
    program[s["pid_m"], s["pid_n"]] = s["program"]
    from .plots import finish_figure, program_colorbar, program_colormap

    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
    program_cmap, program_norm = program_colormap(num_sms)   # the same colours as the tile grid's
    for ax, grid, title, cmap, norm in (
            (axes[0], order, f"tile id: hand-out order (gsize_m={gsize_m})", "viridis", None),
            (axes[1], program, f"program ({num_sms} program{'s' if num_sms != 1 else ''})", program_cmap, program_norm)):
        image = ax.imshow(grid, cmap=cmap, norm=norm)
        if norm is None:
            fig.colorbar(image, ax=ax, fraction=0.046)
        else:
            program_colorbar(fig, image, ax, num_sms)
        ax.set_title(title)
        ax.set_xlabel("pid_n")
        ax.set_ylabel("pid_m")
        if grid.size <= 100:
            for (i, j), v in np.ndenumerate(grid):
                ax.text(j, i, int(v), ha="center", va="center", fontsize=8, color="white")
    fig.suptitle(f"C = {m} x {n} in {BLK_M} x {BLK_N} tiles")
    return finish_figure(fig, path)


def plot_tile_order(computed, num_pid_m, num_pid_n, gsize_m, path=None):
    """Notebook 1's puzzle: where a kernel put each tile id (``computed``: rows with tile, pid_m, pid_n, as
    its trace recorded them) next to the grouped order, with the cells that differ outlined in red. A cell
    shows every tile id computed there ("-": none; ids outside the grid are not drawn)."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    from .plots import finish_figure

    ids = {}
    for t, i, j in zip(computed["tile"], computed["pid_m"], computed["pid_n"]):
        if 0 <= i < num_pid_m and 0 <= j < num_pid_n:
            ids.setdefault((int(i), int(j)), set()).add(int(t))
    expected = {tile_coords(t, num_pid_m, num_pid_n, gsize_m): t for t in range(num_pid_m * num_pid_n)}
    fig, axes = plt.subplots(1, 2, figsize=(10, 0.55 * num_pid_m + 1.6))
    panels = ((axes[0], "your kernel: tile ids computed here", lambda c: sorted(ids.get(c, ()))),
              (axes[1], f"grouped order (tile_coords, gsize_m={gsize_m})", lambda c: [expected[c]]))
    total = num_pid_m * num_pid_n
    for ax, title, cell in panels:
        grid = np.full((num_pid_m, num_pid_n), np.nan)
        for c in np.ndindex(num_pid_m, num_pid_n):
            there = cell(c)
            if there:
                grid[c] = there[0]
            ax.text(c[1], c[0], ",".join(map(str, there)) or "-", ha="center", va="center", fontsize=8,
                    color="white" if there else "black")
            if ids.get(c, set()) != {expected[c]}:
                ax.add_patch(Rectangle((c[1] - 0.42, c[0] - 0.42), 0.84, 0.84, fill=False, edgecolor="red", lw=2))
        ax.imshow(grid, cmap="viridis", vmin=0, vmax=max(total - 1, 1))
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("pid_n")
        ax.set_ylabel("pid_m")
    fig.suptitle("red: a cell whose tile ids differ from the grouped order")
    return finish_figure(fig, path)
