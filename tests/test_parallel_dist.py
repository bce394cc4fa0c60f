"""A group of ranks on one machine (``lib.parallel.dist.run``): results by rank, a failing rank reported with
its traceback, bad arguments refused."""

import pytest

from lib import llama
from lib.experiments import parallelism as px
from lib.parallel import dist, tp


def test_every_rank_runs_and_results_come_back_by_rank():
    out = dist.run(px.collective_rank, 2, [64, 4096], 2)
    assert len(out) == 2
    for r in out:
        assert set(r) == set(px.COLLECTIVES) and all(len(v) == 2 and min(v) > 0 for v in r.values())


def test_a_failing_rank_is_reported_not_waited_for():
    # heads 4 do not split over 3 ranks: every rank raises, and run says which and why, long before the timeout
    with pytest.raises(dist.RankFailed, match="must divide|divisible"):
        dist.run(tp.check_rank, 3, llama.TINY, 1, 0, timeout_s=120)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="at least one rank"):
        dist.run(px.collective_rank, 0)
    with pytest.raises(ValueError, match="backend"):
        dist.run(px.collective_rank, 2, backend="mpi")
