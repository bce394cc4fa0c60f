"""The engine's cost model (``lib.engine.cost``) fitted to the steps of a running engine rather than to
steps timed alone: what chapter 6's simulator needs to predict the engine in service.

A calibration times each kind of step alone, each shape a few times. In service the steps come as the
scheduler makes them: new prompt lengths, decodes riding along, the front end's Python running beside the
loop. ``fit_steps`` takes a run's step records (``LLMEngine.steps``) and fits

- a step that prefills: t = S(M) + alpha W + beta_p K, with S(M) = h max(1, M / M*): a floor of h seconds
  (the eager pass's host time) up to M* tokens, then linear in M; M* is searched on a grid;
- a decode-only step: t = d0 + d1 b + beta K, b the captured batch size the step runs at;

each branch by least squares on the relative error, no coefficient below zero. K counts each decode's new
token too, as the simulator does.

Chapters: 8.
"""

from __future__ import annotations

import numpy as np

from lib.engine.cost import EngineCostModel
from lib.serving.cost_model import MeasuredCostModel


def nonneg_lstsq(A: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient >= 0: a coefficient that comes out negative is set to 0 and the
    rest refitted, the most negative first (enough for the two to four columns here)."""
    keep = list(range(A.shape[1]))
    while True:
        x = np.zeros(A.shape[1])
        if keep:
            x[keep] = np.linalg.lstsq(A[:, keep], y, rcond=None)[0]
        neg = [j for j in keep if x[j] < 0]
        if not neg:
            return x
        keep.remove(min(neg, key=lambda j: x[j]))


def _relative(rows: list[dict], X) -> tuple[np.ndarray, np.ndarray]:
    """Each row of X divided by its step's wall time, against ones: least squares on the relative error."""
    t = np.array([s["end"] - s["start"] for s in rows], dtype=float)
    return np.asarray(X, dtype=float) / t[:, None], np.ones(len(rows))


def fit_steps(steps: list[dict], graph_batch_sizes) -> EngineCostModel:
    """Fit the model to step records ("start", "end", "prefill_tokens", "decode_tokens", "decode_kv",
    "prefill_work"; see the module)."""
    pre = [s for s in steps if s["prefill_tokens"]]
    dec = [s for s in steps if not s["prefill_tokens"] and s["decode_tokens"]]
    if len(pre) < 4 or len({s["decode_tokens"] for s in dec}) < 2:
        raise ValueError(f"the fit needs 4 steps that prefill or more and decode-only steps at 2 batch sizes or more; "
                         f"got {len(pre)} and {len({s['decode_tokens'] for s in dec})}: record a longer run")
    sizes = tuple(graph_batch_sizes)
    pad = EngineCostModel(None, 0.0, 0.0, 0.0, sizes).padded
    A, y = _relative(dec, [[1.0, pad(s["decode_tokens"]), s["decode_kv"] + s["decode_tokens"]] for s in dec])
    d0, d1, beta = (float(v) for v in nonneg_lstsq(A, y))
    M = np.array([s["prefill_tokens"] + s["decode_tokens"] for s in pre], dtype=float)
    rest = np.array([[s["prefill_work"], s["decode_kv"] + s["decode_tokens"]] for s in pre], dtype=float)
    best = None
    for knee in np.geomspace(16, 65536, 49):  # M*: where the pass stops being host-bound
        A, y = _relative(pre, np.column_stack([np.maximum(1.0, M / knee), rest]))
        x = nonneg_lstsq(A, y)
        err = float(np.sum((A @ x - y) ** 2))
        if best is None or err < best[0]:
            best = (err, float(knee), x)
    _, knee, (h, alpha, beta_p) = best
    ms = sorted({2 ** i for i in range(17)} | {knee})
    s_of_m = [max(h * max(1.0, m / knee), 1e-6) for m in ms]
    return EngineCostModel(MeasuredCostModel.fitted(ms, s_of_m, float(alpha), 0.0, float(beta_p)), d0, d1, beta, sizes)
