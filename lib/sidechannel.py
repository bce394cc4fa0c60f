"""The timing side channel of a shared prefix cache, scored as an attacker would.

An attacker sends a prompt that starts with a guess of another tenant's prefix and times the first
token: a cached prefix skips its prefill and answers sooner. Over many trials with the guess right
(prefix cached) and wrong (not cached), the attack's quality is the area under the ROC curve of the
score "faster first token": 1.0 tells the two apart every time, 0.5 is a coin toss. A per-tenant salt in
the cache key (``lib.prefix_cache``) means another tenant's prefix is never a hit, which should bring it
to 0.5.

Chapters: 5.
"""

from __future__ import annotations


def roc_auc(positives, negatives) -> float:
    """P(score of a random positive > score of a random negative), ties counting one half
    (the Mann-Whitney statistic); O((n + m) log(n + m))."""
    pos, neg = [float(x) for x in positives], [float(x) for x in negatives]
    if not pos or not neg:
        raise ValueError("roc_auc needs at least one positive and one negative score")
    allv = sorted([(v, 1) for v in pos] + [(v, 0) for v in neg])
    rank_sum, i = 0.0, 0
    while i < len(allv):  # average ranks over ties
        j = i
        while j < len(allv) and allv[j][0] == allv[i][0]:
            j += 1
        avg = (i + 1 + j) / 2
        rank_sum += avg * sum(1 for k in range(i, j) if allv[k][1])
        i = j
    n, m = len(pos), len(neg)
    return (rank_sum - n * (n + 1) / 2) / (n * m)


def ttft_attack_auc(ttft_cached, ttft_uncached) -> float:
    """AUC of the attack that calls a prefix cached when its first token came faster."""
    return roc_auc([-t for t in ttft_cached], [-t for t in ttft_uncached])
