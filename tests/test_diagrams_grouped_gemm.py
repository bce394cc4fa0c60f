"""lib.diagrams.grouped_gemm (chapter 4's tile schedule diagram), checked against schedules worked by hand."""

from __future__ import annotations

import matplotlib
import numpy as np
import pytest

from lib.bench import glue
from lib.diagrams import grouped_gemm as dg
from lib.kernels import grouped_gemm as gg

matplotlib.use("Agg")


@pytest.fixture(autouse=True)
def close_figures():
    yield
    matplotlib.pyplot.close("all")


# the worked example: A (64 rows) and B (192 rows), N = 128, 64 x 64 tiles: A has 1 x 2 tiles, B 3 x 2
WORKED = dict(counts=[64, 192], N=128, programs=4)


def test_worked_example_in_expert_order_by_hand():
    grid, rows = dg.schedule_grid(WORKED["counts"], WORKED["N"], {"block_m": 64, "block_n": 64, "order": "experts"},
                                  WORKED["programs"])
    # tiles 0-1 are A's, 2-7 B's; program j takes tiles j and j + 4
    assert grid.tolist() == [[0, 0, 1, 1], [1, 1, 1, 1]]
    assert len(rows) == 8


def test_heavy_first_starts_the_heavy_expert_by_hand():
    grid, _ = dg.schedule_grid(WORKED["counts"], WORKED["N"],
                               {"block_m": 64, "block_n": 64, "order": "heavy_first"}, WORKED["programs"])
    # B has three row tiles (heavy): its 6 tiles go first, then A's 2
    assert grid.tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]


def test_empty_experts_keep_their_ids_and_idle_programs_are_marked():
    # experts 0 and 2 are empty; expert 1 has 10 rows (one 16-row tile) and N = 32 in 16-column tiles: 2 tiles;
    # expert 3 has 40 rows (3 row tiles) x 2 = 6 tiles; 8 tiles over 5 programs: 2 rounds, 2 programs idle in the last
    grid, _ = dg.schedule_grid([0, 10, 0, 40], 32, {"block_m": 16, "block_n": 16, "order": "experts"}, 5)
    assert grid.tolist() == [[1, 1, 3, 3, 3], [3, 3, 3, -1, -1]]


def test_the_grid_is_the_kernel_schedule():
    # every cell names the expert of the tile the kernel's own schedule gives that program and round
    counts, N, cfg = [3, 0, 70, 5, 130], 300, gg.choose_config(208, 5)
    grid, rows = dg.schedule_grid(counts, N, cfg, 7)
    sched = gg.tile_schedule([3, 70, 5, 130], N, cfg["block_m"], cfg["block_n"], 7, order=cfg["order"])
    nonempty = [0, 2, 3, 4]
    for s in sched:
        assert grid[s["round"], s["worker"]] == nonempty[s["problem"]]
    assert (grid >= 0).sum() == len(sched) == len(rows)


def test_figure_names_the_heavy_experts_and_is_legible():
    counts = [1, 200, 3, 0, 90, 2]
    fig = dg.tile_schedule(counts, 256, {"block_m": 64, "block_n": 128, "order": "heavy_first"}, 6, "schedule")
    assert fig.heavy == [1, 4]  # more than one row tile, most tokens first
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert labels[:2] == ["expert 1: 200 tokens", "expert 4: 90 tokens"]
    assert "idle" in labels
    glue.figure_png("fig_schedule_test", fig)  # raises if its text is too small in the page column


@pytest.mark.parametrize("kwargs, match", [
    (dict(counts=[], N=8, config={"block_m": 16, "block_n": 16}, programs=2), "counts must be"),
    (dict(counts=[4, -1], N=8, config={"block_m": 16, "block_n": 16}, programs=2), "none negative"),
    (dict(counts=[4], N=8, config={"block_m": 16, "block_n": 16}, programs=0), "programs must be a positive int"),
    (dict(counts=[4], N=0, config={"block_m": 16, "block_n": 16}, programs=2), "N must be a positive int"),
    (dict(counts=[4], N=8, config={"block_n": 16}, programs=2), "config lacks"),
])
def test_bad_input_is_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        dg.schedule_grid(**kwargs)


def test_all_empty_routing_draws_one_idle_round():
    grid, rows = dg.schedule_grid([0, 0], 8, {"block_m": 16, "block_n": 16}, 3)
    assert rows == [] and np.array_equal(grid, np.full((1, 3), -1))
