"""The engine's cost model (``lib.engine.cost``) fitted to the steps of a running engine rather than to
steps timed alone: what chapter 6's simulator needs to predict the engine in service.

A calibration times each kind of step alone, each shape a few times. In service the steps come as the
scheduler makes them: new prompt lengths, decodes riding along, the front end's Python running between
two steps. ``fit_steps`` takes runs' step records (``LLMEngine.steps``), times each step from its start
to the next one's (``periods``), and fits

- a step that prefills: t = S(M) + alpha W + beta_p K, with S(M) = h max(1, M / M*): a floor of h seconds
  (the eager pass's host time) up to M* tokens, then linear in M; M* is searched on a grid;
- a decode-only step: t = d0 + d1 b + beta K, b the captured batch size the step runs at;

each branch by least squares on the relative error, no coefficient below zero. K counts each decode's new
token too, as the simulator does.

``fit_steps(..., detail=True)`` adds what the token counts cannot say, from records that hold it: a
decode-only step + gamma c (c the longest decoding request's KV tokens: at a small batch, decode attention
takes as long as its longest request), a step that prefills + eta (n - 1) (n the requests it prefills,
each an attention call and its own host work). It returns a ``DetailedCostModel``, which the simulator asks
through ``step_detail``.

Chapters: 8.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lib.bench import fit
from lib.engine.cost import EngineCostModel
from lib.serving.cost_model import MeasuredCostModel


@dataclass(frozen=True)
class DetailedCostModel:
    """``base`` plus the terms token counts cannot carry (see the module): ``step`` is the base model's,
    ``step_detail`` adds gamma c to a decode-only step and eta (n - 1) to a step that prefills."""

    base: EngineCostModel
    gamma_s_per_ctx_token: float
    eta_s_per_prefill: float

    def step(self, tokens: int, prefill_ctx_work: float, decode_kv_tokens: int) -> float:
        return self.base.step(tokens, prefill_ctx_work, decode_kv_tokens)

    def step_detail(self, tokens: int, prefill_ctx_work: float, decode_kv_tokens: int, *, prefills: int,
                    decode_ctx_max: int) -> float:
        t = self.base.step(tokens, prefill_ctx_work, decode_kv_tokens)
        if tokens <= 0:
            return t
        if prefills:
            return t + self.eta_s_per_prefill * (prefills - 1)
        return t + self.gamma_s_per_ctx_token * decode_ctx_max


def periods(run: list[dict]) -> list[dict]:
    """A run's steps, in order, each with its "period": from its start to the next step's start when requests
    were still running after it (the engine went straight on; the time between the two, handing tokens to
    the front end and taking new requests in, is part of what a step costs the timeline), else its own
    length (the engine then waited for arrivals)."""
    out = []
    for i, s in enumerate(run):
        busy = i + 1 < len(run) and s["running"] > 0
        out.append({**s, "period": (run[i + 1]["start"] if busy else s["end"]) - s["start"]})
    return out


def _relative(rows: list[dict], X) -> tuple[np.ndarray, np.ndarray]:
    """Each row of X divided by its step's period, against ones: least squares on the relative error."""
    t = np.array([s["period"] for s in rows], dtype=float)
    return np.asarray(X, dtype=float) / t[:, None], np.ones(len(rows))


def fit_steps(runs: list[list[dict]], graph_batch_sizes, *, detail: bool = False):
    """Fit the model to the step records of one or more runs (each a list of the engine's steps in order:
    "start", "end", "running", "prefill_tokens", "decode_tokens", "decode_kv", "prefill_work"; with
    ``detail``, "batch" and "decode_ctx_max" too), each step's time its period (``periods``; see the
    module). An ``EngineCostModel``, or with ``detail`` a ``DetailedCostModel``."""
    steps = [s for run in runs for s in periods(run)]
    pre = [s for s in steps if s["prefill_tokens"]]
    dec = [s for s in steps if not s["prefill_tokens"] and s["decode_tokens"]]
    if len(pre) < 4 or len({s["decode_tokens"] for s in dec}) < 2:
        raise ValueError(f"the fit needs 4 steps that prefill or more and decode-only steps at 2 batch sizes or more; "
                         f"got {len(pre)} and {len({s['decode_tokens'] for s in dec})}: record a longer run")
    sizes = tuple(graph_batch_sizes)
    pad = EngineCostModel(None, 0.0, 0.0, 0.0, sizes).padded
    if detail and not all("decode_ctx_max" in s and "batch" in s for s in steps):
        raise ValueError("a detailed fit needs each step's batch and decode_ctx_max: these records do not hold "
                         "them (measured before the engine recorded them); fit with detail=False")
    A, y = _relative(dec, [[1.0, pad(s["decode_tokens"]), s["decode_kv"] + s["decode_tokens"]]
                           + ([s["decode_ctx_max"]] if detail else []) for s in dec])
    d0, d1, beta, *gamma = (float(v) for v in fit.nonneg_lstsq(A, y))
    M = np.array([s["prefill_tokens"] + s["decode_tokens"] for s in pre], dtype=float)
    rest = np.array([[s["prefill_work"], s["decode_kv"] + s["decode_tokens"]]
                     + ([s["batch"] - s["decode_tokens"] - 1] if detail else []) for s in pre], dtype=float)
    best = None
    for knee in (2.0 ** (e / 4) for e in range(16, 65)):  # M* from 16 to 65,536 tokens, four per octave
        A, y = _relative(pre, np.column_stack([np.maximum(1.0, M / knee), rest]))
        x = fit.nonneg_lstsq(A, y)
        err = fit.residual(A, x, y)
        if best is None or err < best[0]:
            best = (err, float(knee), x)
    _, knee, (h, alpha, beta_p, *eta) = best
    ms = sorted({2 ** i for i in range(17)} | {knee})
    s_of_m = [max(h * max(1.0, m / knee), 1e-6) for m in ms]
    base = EngineCostModel(MeasuredCostModel.fitted(ms, s_of_m, float(alpha), 0.0, float(beta_p)), d0, d1, beta, sizes)
    return DetailedCostModel(base, gamma[0], float(eta[0])) if detail else base
