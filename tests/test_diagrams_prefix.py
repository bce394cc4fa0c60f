"""The prefix-cache diagram (lib.diagrams.prefix): a hand-worked cache state, each block's state against a
hand count, the drawn keys against the chain's own keys, and bad input refused."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pytest

from lib.diagrams import prefix
from lib.prefix_cache import block_keys

SYS = list(range(100, 108))  # a system prompt of two blocks of 4
FINISHED = [SYS + [1, 2, 3, 4, 5, 6]]  # 14 tokens: 3 full blocks and a partial one
RUNNING = [SYS + [7, 8, 9, 10, 11], SYS + [12, 13, 14], [999] + SYS[1:] + [15]]


def _state():
    return prefix.example_state(FINISHED, RUNNING, block_size=4, num_blocks=16)


def test_states_by_hand():
    # the finished request takes blocks 0-3, caches 0-2 and frees its partial block 3 (to the end of the free
    # list [4..15, 3]); running 0 hits 0, 1 and allocates 4 (full: cached) and 5 (partial); running 1 hits 0, 1
    # and allocates 6 (partial); running 2 differs in its first token, so no key matches: 7, 8 (full), 9
    cache, leases = _state()
    assert [le.blocks for le in leases] == [[0, 1, 4, 5], [0, 1, 6], [7, 8, 9]]
    assert [le.hit_tokens for le in leases] == [8, 8, 0]
    assert prefix.block_states(cache) == (["shared", "shared", "evictable", "free", "pinned", "private", "private",
                                           "pinned", "pinned", "private"] + ["free"] * 6)


def test_chain_differs_after_the_first_different_token():
    # running 2 holds the system prompt's tokens 1..7 at the same positions, yet shares no key
    k_sys = block_keys(RUNNING[0], 4)
    k_other = block_keys(RUNNING[2], 4)
    assert SYS[4:8] == RUNNING[2][4:8] and k_sys[1] != k_other[1]


def test_an_evicted_block_is_free_again_and_drawn_as_evicted():
    # a pool of 4 blocks: the finished request's 3 cached blocks are evictable; a new 13-token request needs 4
    cache, leases = prefix.example_state([SYS + [1, 2, 3, 4]], [[50] * 13], block_size=4, num_blocks=4)
    assert prefix.block_states(cache) == ["private", "pinned", "pinned", "pinned"]
    fig = prefix.figure(cache, leases, [SYS + [1, 2, 3, 4]])
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert sum("evicted" in t for t in texts) == 3
    plt.close(fig)


def test_figure_shows_the_real_keys_and_blocks():
    cache, leases = _state()
    fig = prefix.figure(cache, leases, FINISHED)
    texts = [t.get_text() for t in fig.axes[0].texts]
    for lease in leases:
        for key, blk in zip(lease.keys, lease.blocks):
            assert f"key {key.hex()[:prefix.KEY_HEX]}\nblock {blk}" in texts
    assert "shared (2)" in texts and "evictable (1)" in texts and "free (7)" in texts
    plt.close(fig)


def test_bad_input_refused():
    with pytest.raises(ValueError, match="at least one prompt"):
        prefix.example_state()
    cache, leases = _state()
    cache.release(leases[0])
    with pytest.raises(ValueError, match="released"):
        prefix.figure(cache, leases)
    with pytest.raises(ValueError, match="nothing to draw"):
        prefix.figure(cache, [])
