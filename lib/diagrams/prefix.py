"""The diagram of a prefix cache's chained block keys and its pool, drawn from a real cache state.

Chapter 5 explains it. Two bands, top to bottom:

1. The key chains: one row per request, one box per block of its prompt. A full block shows the first
   hex digits of its key, key_i = sha256(key_{i-1} | tokens of block i) (``lib.prefix_cache.block_keys``),
   and the pool block that holds it; an arrow joins each key to the next, since each is hashed from the
   one before. Requests that share a prefix show the same keys in the same pool blocks; the first key
   that differs makes every later key differ. A partial last block has no key: it is never cached.
2. The pool (``lib.kv_pool.KVPool``): each block marked with its state (``block_states``):
   - *shared*: cached and held by two or more running requests (pinned: it cannot be evicted);
   - *pinned*: cached and held by one running request;
   - *private*: held by a running request but not cached (a partial block: nobody else can match it);
   - *evictable*: cached, held by nobody: its K and V stay until an allocation needs the room;
   - *free*: holds nothing.

``example_state`` builds the state the way a server would: a finished request leaves its blocks cached
and evictable, running requests look up the cache, take its hits and allocate the rest, and commit their
full blocks. Nothing is typed in: change the prompts and the figure follows.

Chapters: 5.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, Rectangle

from lib.bench import plots  # the book's figure style
from lib.kv_pool import KVPool
from lib.prefix_cache import PrefixCache, block_keys

STATES = ("shared", "pinned", "private", "evictable", "free")
# colour and hatch of each state: told apart without colour too
STYLE = {"shared": ("#C44E52", "xx"), "pinned": ("#4C72B0", "//"), "private": ("#DD8452", ".."),
         "evictable": ("#BBBBBB", None), "free": ("white", None)}
FONT = 10  # points; the figure is shown at the page column's width, so this is the rendered size
KEY_HEX = 4  # hex digits of a key shown in its box


def example_state(finished=(), running=(), *, block_size: int = 4, num_blocks: int = 16, extra=()):
    """A cache state built as a server builds it: (cache, leases of the running requests).

    The prompts of ``finished`` run one after the other and finish (their full blocks cached, then
    released: evictable); then those of ``running`` are admitted in order and stay running, each taking
    the cached prefix and committing its full blocks, so a later one hits an earlier one's blocks."""
    if not finished and not running:
        raise ValueError("example_state needs at least one prompt, finished or running")
    cache = PrefixCache(KVPool(num_blocks, block_size, storage=False))
    for tokens in finished:
        lease = cache.acquire(tokens, extra)
        cache.commit(lease)
        cache.release(lease)
    leases = []
    for tokens in running:
        lease = cache.acquire(tokens, extra)
        cache.commit(lease)
        leases.append(lease)
    return cache, leases


def block_states(cache: PrefixCache) -> list[str]:
    """The state of each of the pool's blocks (see the module), from its reference count and the cache's
    map of cached blocks."""
    pool, out = cache.pool, []
    for b in range(pool.num_blocks):
        cached, refs = b in cache.key_of, pool.refs[b]
        if pool.is_free(b):
            out.append("free")
        elif refs == 0:
            if not cached:
                raise ValueError(f"block {b} is neither free, held nor cached: the pool and the cache disagree")
            out.append("evictable")
        elif cached:
            out.append("shared" if refs >= 2 else "pinned")
        else:
            out.append("private")
    return out


def _box(ax, x, y, w, h, text, *, face="white", hatch=None, edge="0.2", size=FONT, colour="black"):
    ax.add_patch(Rectangle((x, y), w, h, facecolor=face, edgecolor=edge, hatch=hatch, lw=0.9))
    if text:
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=size, color=colour,
                bbox=dict(boxstyle="round,pad=0.12", facecolor="white", edgecolor="none", alpha=0.85)
                if hatch or face not in ("white",) else None)


def figure(cache: PrefixCache, leases, finished=(), *, title: str = "Chained block keys and the pool"):
    """The two bands (module docstring) for ``cache``, the ``leases`` of its running requests and the token
    lists of the ``finished`` ones (drawn first, their keys recomputed under the running requests' extra);
    returns the figure."""
    pool, p = cache.pool, cache.pool.block_size
    if not leases and not finished:
        raise ValueError("nothing to draw: pass the running requests' leases or the finished prompts")
    states = block_states(cache)
    extra = leases[0].extra if leases else ()
    rows = []  # (label, tokens, keys, blocks or None per block)
    for i, tokens in enumerate(finished):
        keys = block_keys(tokens, p, extra)
        rows.append((f"finished {i}", list(tokens), keys, [cache.block_of.get(k) for k in keys]))
    for i, lease in enumerate(leases):
        if lease.released:
            raise ValueError(f"running request {i}'s lease is released: pass only running requests' leases")
        rows.append((f"running {i}", lease.tokens, lease.keys, lease.blocks))
    width = max(-(-len(r[1]) // p) for r in rows)
    n_blk = pool.num_blocks
    x_max, gap, row_h = 12.0, 0.45, 0.95
    cell_w = x_max / width - gap
    fig, ax = plt.subplots(figsize=(plots.WIDTH_IN, 2.4 + 0.62 * len(rows) + 1.6))
    ax.set_axis_off()
    ax.set_xlim(-2.3, x_max + 0.2)
    # band 1: the key chains
    y0 = 0.0
    ax.text(-2.3, y0 + 0.35, f"1. Blocks of p = {p} tokens: key, and the pool block that holds it",
            fontsize=FONT + 1, fontweight="bold", va="bottom")
    for r, (label, tokens, keys, blocks) in enumerate(rows):
        y = y0 - row_h * (r + 1)
        ax.text(-0.15, y + 0.35, label, ha="right", va="center", fontsize=FONT)
        n_full = len(tokens) // p
        for i in range(-(-len(tokens) // p)):
            x = i * (cell_w + gap)
            blk = blocks[i] if i < len(blocks) else None
            if i < n_full:  # a full block: its key, and where it lives (or that it was evicted)
                face, hatch = STYLE[states[blk]] if blk is not None else ("white", None)
                short = keys[i].hex()[:KEY_HEX]
                text = f"key {short}\nblock {blk}" if blk is not None else f"key {short}\nevicted"
                if i > 0:
                    ax.add_patch(FancyArrowPatch((x - gap, y + 0.35), (x, y + 0.35), arrowstyle="-|>",
                                                 mutation_scale=8, color="0.3", lw=0.8, shrinkA=0, shrinkB=0))
            else:  # a partial block: no key, never cached
                face, hatch = STYLE["private"] if blk is not None else ("white", None)
                text = f"no key\nblock {blk}" if blk is not None else "no key\nfreed"
            _box(ax, x, y, cell_w, 0.7, text, face=face, hatch=hatch, size=FONT - 1)
    # band 2: the pool
    y_pool = y0 - row_h * len(rows) - 1.5
    cell = x_max / n_blk
    ax.text(-2.3, y_pool + 0.6, f"2. The pool: {n_blk} blocks (lib.kv_pool.KVPool), each in its state",
            fontsize=FONT + 1, fontweight="bold", va="bottom")
    for b in range(n_blk):
        face, hatch = STYLE[states[b]]
        _box(ax, b * cell, y_pool - 0.1, cell, 0.6, str(b), face=face, hatch=hatch, size=FONT - 1,
             colour="0.45" if states[b] == "free" else "black")
    # legend of the states, with counts
    y_leg = y_pool - 0.75
    for j, s in enumerate(STATES):
        face, hatch = STYLE[s]
        x = -2.3 + j * ((x_max + 2.3) / len(STATES))
        ax.add_patch(Rectangle((x, y_leg - 0.4), 0.45, 0.35, facecolor=face, edgecolor="0.2", hatch=hatch, lw=0.9))
        ax.text(x + 0.55, y_leg - 0.22, f"{s} ({states.count(s)})", fontsize=FONT - 1, va="center")
    ax.text(-2.3, y_leg - 0.65, "shared, pinned: cached and held by 2+ / 1 running requests; private: held, not "
            "cached;\nevictable: cached, held by none; computed with lib.prefix_cache", fontsize=FONT - 1,
            color="0.3", va="top")
    ax.set_ylim(y_leg - 1.45, y0 + 1.0)
    fig.suptitle(title, fontsize=FONT + 2)
    fig.tight_layout()
    return fig
