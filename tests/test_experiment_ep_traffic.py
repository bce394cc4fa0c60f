"""lib.experiments.ep_traffic (chapters 4 and 10): expert parallelism's all-to-all bytes and rank loads,
worked by hand."""

import pytest

from lib.experiments import ep_traffic


def test_expert_parallel_bytes_and_rank_loads_by_hand():
    # K = 7168, k = 8, bf16, 8 GPUs: one way 8 * 7168 * 2 * 7/8 = 100,352 bytes; both ways 200,704
    b = ep_traffic.ep_bytes_per_token(7168, 8, 8, 2)
    assert (b["dispatch"], b["combine"], b["total"]) == (100_352, 100_352, 200_704)
    assert ep_traffic.ep_bytes_per_token(4096, 2, 1)["total"] == 0  # one GPU: nothing leaves it
    # experts 0-1 on GPU 0, 2-3 on GPU 1, 4-5 on GPU 2
    assert ep_traffic.ep_rank_loads([5, 0, 1, 1, 0, 3], 3).tolist() == [5, 2, 3]
    with pytest.raises(ValueError, match="do not split evenly"):
        ep_traffic.ep_rank_loads([1, 2, 3], 2)
    with pytest.raises(ValueError, match="ranks must be a positive int"):
        ep_traffic.ep_rank_loads([1, 2], 0)
    with pytest.raises(ValueError, match="none negative"):
        ep_traffic.ep_rank_loads([1, -2], 1)
    with pytest.raises(ValueError, match="top_k must be a positive int"):
        ep_traffic.ep_bytes_per_token(4096, 0, 8)
