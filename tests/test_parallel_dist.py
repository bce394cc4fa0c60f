"""A group of ranks on one machine (``lib.parallel.dist.run``): results by rank, a failing rank reported with
its traceback, bad arguments refused."""

import pytest

from lib import models
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
        dist.run(tp.check_rank, 3, models.CONFIGS["tiny"], 1, 0, timeout_s=120)


def test_a_rank_that_failed_on_its_own_is_reported_before_one_that_lost_its_peer():
    """Rank 1's error arrives first, but it only says that a peer closed the connection under it: rank 0's own
    error is the cause, and comes first (each group keeps the order it came in)."""
    lost = "Traceback ...\nRuntimeError: Gloo connectFullMesh failed with ... Connection closed by peer [127.0.0.1]:4\n"
    own = "Traceback ...\nValueError: 4 heads must divide over 3 ranks\n"
    other = "Traceback ...\nZeroDivisionError: division by zero\n"
    assert dist.first_cause([(1, lost), (0, own), (2, other)]) == [(0, own), (2, other), (1, lost)]
    assert dist.first_cause([(2, lost)]) == [(2, lost)]


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="at least one rank"):
        dist.run(px.collective_rank, 0)
    with pytest.raises(ValueError, match="backend"):
        dist.run(px.collective_rank, 2, backend="mpi")
