"""The diagram of a paged KV cache read by split-KV decode attention, drawn from the book's own objects.

Chapter 3 explains it. Three bands, top to bottom:

1. The pool (``lib.kv_pool.KVPool``): its blocks of ``block_size`` tokens, numbered as the pool numbers
   them, each marked with the request that holds it (colour and hatch) or left white when free.
2. The block table: one row per request, entry i naming the pool block that holds the request's tokens
   i * block_size .. (i + 1) * block_size - 1, and its length. Lines join the first request's entries to
   their blocks: logically adjacent pages need not be adjacent in the pool.
3. The split plan of the decode kernel (``lib.kernels.decode_attention.DecodeAttention``): each request's
   tokens as the kernel sees them, cut into the plan's ``splits`` ranges of ``split_len`` tokens; each
   range is one program, which writes a partial result (a running maximum, a sum, an unnormalised
   output); the combine merges a request's partials by log-sum-exp into its output. A range past the
   request's length holds no tokens and weighs nothing in the combine.

The split ranges follow the kernel's rule: split s covers tokens [s * split_len, min((s + 1) * split_len,
length)), with split_len the planned maximum length over the splits, rounded up to whole tiles
(``split_ranges``). Nothing is typed in: change the batch and the figure follows.

Chapters: 3.
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, Rectangle

from lib.bench import plots  # the book's figure style
from lib.kv_pool import KVPool

HATCHES = ("//", "..", "xx", "\\\\", "oo", "++")
COLOURS = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860")
FONT = 10  # points; the page column shows the figure at its own width, so this is the rendered size


def example_batch(lengths=(40, 64, 19), block_size: int = 16, num_blocks: int = 10, finished: int = 2):
    """A small batch built the way a serving engine builds it: (pool, block_table, lengths).

    A request of ``finished`` blocks is admitted first and finishes (its blocks go back to the pool's free
    list); then the requests of ``lengths`` are admitted one prompt block at a time, in turns, as prefill
    chunks and decode steps would grow them. The block table is a list of rows of block numbers, padded
    with the row's last entry (the kernel never reads entries beyond a request's length)."""
    if not lengths or any(not isinstance(n, int) or n < 1 for n in lengths):
        raise ValueError(f"lengths must be a non-empty list of positive token counts, got {lengths!r}")
    pool = KVPool(num_blocks, block_size, storage=False)
    need = [pool.blocks_for(n) for n in lengths]
    if max(sum(need), finished) > num_blocks:
        raise ValueError(f"the batch needs {sum(need)} blocks of {block_size} tokens and the finished request "
                         f"{finished}, but the pool has {num_blocks}: pass a larger num_blocks")
    if finished:
        done = pool.allocate(finished)
        pool.decref(done)
        pool.free(done)
    rows = [[] for _ in lengths]
    while any(len(r) < n for r, n in zip(rows, need)):
        for r, n in zip(rows, need):
            if len(r) < n:
                r.extend(pool.allocate(1))
    width = max(need)
    table = [r + [r[-1]] * (width - len(r)) for r in rows]
    return pool, table, list(lengths)


def split_ranges(plan, lengths) -> list[list[tuple[int, int]]]:
    """Per request, the token range [start, end) of each split of ``plan`` (a ``DecodeAttention``); an empty
    range (start == end) where a split lies past the request's length.

    The kernel's rule: split_len = ceil(ceil(max_len / splits) / block_n) * block_n tokens, where max_len is
    the planned bound on the lengths (the block table's capacity unless the plan was given one)."""
    splits, length = plan.splits, split_len(plan)
    out = []
    for n in lengths:
        row = []
        for s in range(splits):
            start = min(s * length, n)
            row.append((start, min(start + length, n)))
        out.append(row)
    return out


def split_len(plan) -> int:
    """Tokens per split of ``plan`` (a ``DecodeAttention``), by the kernel's rule:
    ceil(ceil(max_len / splits) / block_n) * block_n, where max_len is the planned bound on the lengths (the
    block table's capacity unless the plan was given one)."""
    block_n = plan.meta["BLOCK_N"]
    max_len = plan.max_seq_len if plan.max_seq_len is not None else plan.layout[3][1] * plan.page
    return math.ceil(math.ceil(max_len / plan.splits) / block_n) * block_n


def _box(ax, x, y, w, h, text, *, face="white", hatch=None, edge="0.2", size=FONT, colour="black", lw=0.9):
    ax.add_patch(Rectangle((x, y), w, h, facecolor=face, edgecolor=edge, hatch=hatch, lw=lw))
    if text:
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=size, color=colour,
                bbox=dict(boxstyle="round,pad=0.12", facecolor="white", edgecolor="none", alpha=0.85) if hatch else None)


def figure(pool: KVPool, block_table, lengths, plan, *, title: str = "A paged KV cache and one split-KV decode step"):
    """The three bands (module docstring) for ``pool``, its ``block_table`` (rows of block numbers) and
    ``lengths``, read by ``plan`` (the ``DecodeAttention`` planned for this batch); returns the figure."""
    B = len(lengths)
    if len(block_table) != B:
        raise ValueError(f"the block table has {len(block_table)} rows for {B} lengths: one row per request")
    p = pool.block_size
    owner = {}
    for r, (row, n) in enumerate(zip(block_table, lengths)):
        used = row[:pool.blocks_for(n)]
        if len(used) < pool.blocks_for(n):
            raise ValueError(f"request {r} has {n} tokens but its block-table row names only {len(row)} blocks of {p}")
        for blk in used:
            if pool.is_free(blk):
                raise ValueError(f"request {r}'s block {blk} is free in the pool: the table and the pool disagree")
            owner[blk] = r
    ranges = split_ranges(plan, lengths)
    splits = plan.splits
    width_blocks = max(len(r) for r in block_table)

    fig, ax = plt.subplots(figsize=(plots.WIDTH_IN, 6.4))
    ax.set_axis_off()
    ax.set_xlim(-2.6, 13.0)
    top = 0.0
    # band 1: the pool
    n_blk = pool.num_blocks
    cell = min(1.0, 12.0 / n_blk)
    y_pool = top - 1.2
    ax.text(-2.6, y_pool + 1.45, f"1. The pool: {n_blk} blocks of p = {p} tokens (lib.kv_pool.KVPool), white: free",
            fontsize=FONT + 1, fontweight="bold", va="bottom")
    pool_x = {}
    for blk in range(n_blk):
        x = blk * cell
        r = owner.get(blk)
        if r is None:
            _box(ax, x, y_pool, cell, 1.0, str(blk), face="white", colour="0.45")
        else:
            _box(ax, x, y_pool, cell, 1.0, str(blk), face=COLOURS[r % 6], hatch=HATCHES[r % 6])
        pool_x[blk] = x + cell / 2
    # band 2: the block table
    y_tab = y_pool - 3.0
    ax.text(width_blocks + 1.9, y_tab + 0.2 + 0.55 * (B - 1) + 0.5, "2. The block table:\none row per request,\n"
            "entry i = the block of\ntokens i p to (i + 1) p - 1", fontsize=FONT + 1, fontweight="bold", va="top")
    rows_y = []
    for r, (row, n) in enumerate(zip(block_table, lengths)):
        y = y_tab + 0.55 * (B - 1 - r) + 0.2
        rows_y.append(y)
        ax.text(-0.15, y + 0.25, f"request {r}", ha="right", va="center", fontsize=FONT)
        used = pool.blocks_for(n)
        for i in range(width_blocks):
            blk = row[i] if i < len(row) else None
            if i < used:
                _box(ax, i * 1.0, y, 1.0, 0.5, str(blk), face=COLOURS[r % 6], hatch=HATCHES[r % 6])
            else:
                _box(ax, i * 1.0, y, 1.0, 0.5, "–", face="white", size=FONT - 1, colour="0.45")
        ax.text(width_blocks + 0.3, y + 0.25, f"L = {n}", ha="left", va="center", fontsize=FONT)
    for i, blk in enumerate(block_table[0][:pool.blocks_for(lengths[0])]):  # request 0's entries to their blocks
        ax.add_patch(FancyArrowPatch((i + 0.5, rows_y[0] + 0.5), (pool_x[blk], y_pool - 0.02), arrowstyle="-|>",
                                     mutation_scale=9, color="0.3", lw=0.8, shrinkA=0, shrinkB=0))
    # band 3: the splits and the combine
    y_sp = y_tab - 1.3 - 1.15 * B
    bound = plan.max_seq_len if plan.max_seq_len is not None else plan.layout[3][1] * plan.page
    cap = width_blocks * p
    scale = 8.0 / cap  # tokens to x
    ax.text(-2.6, y_sp + 1.15 * B + 0.1,
            f"3. The kernel's plan: {splits} splits of {split_len(plan)} tokens, combined by log-sum-exp",
            fontsize=FONT + 1, fontweight="bold", va="bottom")
    for r, n in enumerate(lengths):
        y = y_sp + 1.15 * (B - 1 - r)
        ax.text(-0.15, y + 0.25, f"request {r}", ha="right", va="center", fontsize=FONT)
        ax.add_patch(Rectangle((0, y), n * scale, 0.5, facecolor=COLOURS[r % 6], edgecolor="0.2", hatch=HATCHES[r % 6],
                               lw=0.9, alpha=0.55))
        ax.add_patch(Rectangle((n * scale, y), (cap - n) * scale, 0.5, facecolor="white", edgecolor="0.6", lw=0.6))
        for k in range(1, width_blocks):  # page boundaries
            ax.plot([k * p * scale] * 2, [y, y + 0.5], color="0.55", lw=0.6)
        for s, (a, b) in enumerate(ranges[r]):
            x0 = s * split_len(plan) * scale
            x1 = min((s + 1) * split_len(plan), cap) * scale
            empty = a == b
            ax.annotate("", (x0 + 0.04, y + 0.6), (x1 - 0.04, y + 0.6),
                        arrowprops=dict(arrowstyle="|-|", color="0.6" if empty else "0.1", lw=0.8,
                                        mutation_scale=3))
            ax.text((x0 + x1) / 2, y + 0.72, f"s{s}", ha="center", va="bottom",
                    fontsize=FONT - 1, color="0.55" if empty else "black")
        live = sum(1 for a, b in ranges[r] if b > a)
        ax.add_patch(FancyArrowPatch((8.15, y + 0.25), (9.3, y + 0.25), arrowstyle="-|>", mutation_scale=10,
                                     color="0.3", lw=0.9))
        ax.text(8.2, y - 0.05, f"{live} partials", ha="left", va="top", fontsize=FONT - 1, color="0.3")
        _box(ax, 9.35, y - 0.05, 3.6, 0.6, f"combine: out[{r}]", face="0.93", size=FONT)
    ax.text(0, y_sp - 0.55, f"one program per (request, KV head, split); lengths up to {bound}, "
            f"tiles of {plan.meta['BLOCK_N']} tokens", fontsize=FONT - 1, color="0.3", va="top")
    ax.set_ylim(y_sp - 1.0, top + 1.0)
    fig.suptitle(title, fontsize=FONT + 2)
    fig.tight_layout()
    return fig

