"""lib.workloads, lib.prefix_cache.replay and lib.sidechannel."""

from __future__ import annotations

import random

import pytest

from lib import prefix_cache, sidechannel, workloads


def test_prompts_are_reproducible_and_share_prefixes():
    a = workloads.shared_prefix_prompts(50, seed=1, system_len=(32, 64), user_len=(4, 8), doc_len=(16, 32))
    b = workloads.shared_prefix_prompts(50, seed=1, system_len=(32, 64), user_len=(4, 8), doc_len=(16, 32))
    assert a == b and a != workloads.shared_prefix_prompts(50, seed=2, system_len=(32, 64), user_len=(4, 8),
                                                           doc_len=(16, 32))
    chats = [p for p in a if p["kind"] == "chat"]
    same = [p for p in chats if p["prefix"] == chats[0]["prefix"]]
    assert len(same) > 1 and same[0]["tokens"][:32] == same[1]["tokens"][:32]
    with pytest.raises(ValueError):
        workloads.shared_prefix_prompts(3, doc_share=1.5)


def test_replay_hit_rate_grows_with_capacity_and_pinning_costs_room():
    prompts = [p["tokens"] for p in workloads.shared_prefix_prompts(
        200, seed=3, system_len=(64, 128), user_len=(8, 32), doc_len=(64, 128))]
    small = prefix_cache.replay(prompts, 64, 16)
    big = prefix_cache.replay(prompts, 1024, 16)
    assert 0 <= small["hit_rate"] <= big["hit_rate"] < 1 and big["evictions"] == 0
    assert prefix_cache.replay(prompts, 1024, 16) == big  # deterministic
    crowded = prefix_cache.replay(prompts, 64, 16, live=8)
    assert crowded["rejected"] > 0  # blocks held by running requests cannot be evicted
    fifo = prefix_cache.replay(prompts, 64, 16, policy="fifo")
    assert 0 <= fifo["hit_rate"] <= big["hit_rate"]


def test_roc_auc():
    assert sidechannel.roc_auc([3, 4], [1, 2]) == 1.0
    assert sidechannel.roc_auc([1, 2], [3, 4]) == 0.0
    assert sidechannel.roc_auc([1, 1], [1, 1]) == 0.5
    assert sidechannel.roc_auc([1, 3], [2]) == 0.5
    rng = random.Random(0)
    noise = sidechannel.roc_auc([rng.random() for _ in range(2000)], [rng.random() for _ in range(2000)])
    assert abs(noise - 0.5) < 0.03
    assert sidechannel.ttft_attack_auc([10, 11, 12], [20, 21]) == 1.0  # cached answers faster
    with pytest.raises(ValueError):
        sidechannel.roc_auc([], [1])
