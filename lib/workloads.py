"""Seeded, reproducible request workloads.

``shared_prefix_prompts``: prompts as token lists that share prefixes the way serving traffic does: chat
requests start with one of a few system prompts (some far more popular than others) followed by the
user's own tokens; multi-document requests concatenate documents drawn from a small library and end
with a question. Nothing but the seed decides the tokens.

Chapters: 5 (prefix caching); 6 uses the same seeds for its arrivals.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from numbers import Integral, Real


def _zipf_weights(n: int, s: float) -> list[float]:
    return [1.0 / (i + 1) ** s for i in range(n)]


def shared_prefix_prompts(n: int, *, seed: int = 0, vocab: int = 32000, system_prompts: int = 4,
                          system_len: tuple[int, int] = (256, 1024), user_len: tuple[int, int] = (16, 256),
                          doc_share: float = 0.3, docs: int = 16, doc_len: tuple[int, int] = (512, 2048),
                          docs_per_request: tuple[int, int] = (1, 3), popularity: float = 1.0) -> list[dict]:
    """``n`` prompts, each {"kind": "chat" | "docs", "tokens": [...], "prefix": id of its shared part}.

    Popularity of system prompts and documents follows a Zipf law of exponent ``popularity``."""
    if n < 0 or not 0 <= doc_share <= 1 or system_prompts < 1 or docs < 1:
        raise ValueError("n >= 0, 0 <= doc_share <= 1, system_prompts >= 1 and docs >= 1 are required")
    rng = random.Random(seed)

    def toks(k):
        return [rng.randrange(vocab) for _ in range(k)]

    systems = [toks(rng.randint(*system_len)) for _ in range(system_prompts)]
    library = [toks(rng.randint(*doc_len)) for _ in range(docs)]
    w_sys, w_doc = _zipf_weights(system_prompts, popularity), _zipf_weights(docs, popularity)
    out = []
    for _ in range(n):
        if rng.random() < doc_share:
            k = rng.randint(*docs_per_request)
            picked = rng.choices(range(docs), weights=w_doc, k=k)
            tokens = [t for d in picked for t in library[d]] + toks(rng.randint(*user_len))
            out.append({"kind": "docs", "tokens": tokens, "prefix": ("docs", *picked)})
        else:
            s = rng.choices(range(system_prompts), weights=w_sys)[0]
            out.append({"kind": "chat", "tokens": systems[s] + toks(rng.randint(*user_len)), "prefix": ("system", s)})
    return out


def arrival_times(n: int, rate: float, *, process: str = "poisson", cv: float = 1.0, seed: int = 0) -> list[float]:
    """``n`` arrival times (seconds) at ``rate`` requests per second: a Poisson process, or bursty
    (``process="gamma"``: gamma-distributed gaps with coefficient of variation ``cv`` > 1)."""
    if not (_whole(n) and n >= 0) or not (_finite(rate) and rate > 0) or not (_finite(cv) and cv > 0):
        raise ValueError(f"need a whole n >= 0, a finite rate > 0 and a finite cv > 0; got n={n!r}, rate={rate!r}, "
                         f"cv={cv!r}")
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        if process == "poisson":
            gap = rng.expovariate(rate)
        elif process == "gamma":
            shape = 1.0 / cv**2
            gap = rng.gammavariate(shape, 1.0 / (rate * shape))
        else:
            raise ValueError(f"process must be 'poisson' or 'gamma', got {process!r}")
        t += gap
        out.append(t)
    return out


# input and output lengths in tokens: log-normal (median, sigma), clipped to [low, high]
CHAT = {"input": (600, 0.8, 16, 4096), "output": (200, 0.7, 4, 1024)}
LONG_DOC = {"input": (8000, 0.5, 2048, 32768), "output": (300, 0.6, 16, 1024)}


def _lognormal(rng, spec):
    median, sigma, low, high = spec
    return int(min(high, max(low, round(rng.lognormvariate(math.log(median), sigma)))))


def _whole(value) -> bool:
    return isinstance(value, Integral) and not isinstance(value, bool)


def _finite(value) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)


def check_mix(mix) -> None:
    """Raise ValueError, saying what to change, unless ``mix`` is ((name, lengths, share), ...): distinct
    names, ``lengths`` {"input": spec, "output": spec} with each spec (median > 0, sigma >= 0, low, high)
    and whole 1 <= low <= high tokens, and shares finite and >= 0 with a positive sum (a share is a
    weight: shares 3 and 1 draw three requests of the first kind for one of the second)."""
    how = "mix must be ((name, {'input': spec, 'output': spec}, share), ...) like (('chat', CHAT, 1.0),)"
    if isinstance(mix, (str, bytes)) or not isinstance(mix, Sequence) or not mix:
        raise ValueError(f"{how}; got {mix!r}")
    for m in mix:
        if isinstance(m, (str, bytes)) or not isinstance(m, Sequence) or len(m) != 3:
            raise ValueError(f"{how}; got the entry {m!r}")
        name, lengths, share = m
        if not (_finite(share) and share >= 0):
            raise ValueError(f"mix {name!r}: share must be a finite weight >= 0, got {share!r}")
        if not (isinstance(lengths, Mapping) and {"input", "output"} <= set(lengths)):
            raise ValueError(f"mix {name!r}: lengths must be a dict with 'input' and 'output' specs, got {lengths!r}")
        for k in ("input", "output"):
            spec = lengths[k]
            ok = isinstance(spec, Sequence) and len(spec) == 4
            if ok:
                median, sigma, low, high = spec
                ok = (_finite(median) and median > 0 and _finite(sigma) and sigma >= 0 and _whole(low)
                      and _whole(high) and 1 <= low <= high)
            if not ok:
                raise ValueError(f"mix {name!r}: {k} lengths must be (median > 0, sigma >= 0, low, high) with whole "
                                 f"1 <= low <= high tokens, got {spec!r}")
    names = [m[0] for m in mix]
    if len(set(names)) != len(names):
        raise ValueError(f"mix names must be distinct (each request's kind is its name), got {names}")
    if not sum(m[2] for m in mix) > 0:
        raise ValueError(f"mix shares must not all be 0: no kind could be drawn; got {[m[2] for m in mix]}")


def requests(n: int, rate: float, *, mix=(("chat", CHAT, 1.0),), process: str = "poisson", cv: float = 1.0,
             seed: int = 0) -> list[dict]:
    """``n`` requests {"id", "arrival", "kind", "input", "output"} arriving at ``rate`` per second, of the
    kinds in ``mix`` ((name, lengths, share), ...; see ``check_mix``), each kind drawn with probability
    its share over the sum of shares, its lengths then drawn from its specs."""
    check_mix(mix)
    times = arrival_times(n, rate, process=process, cv=cv, seed=seed)
    rng = random.Random(seed + 1)
    names = [m[0] for m in mix]
    shares = [m[2] for m in mix]
    specs = {m[0]: m[1] for m in mix}
    out = []
    for i, t in enumerate(times):
        kind = rng.choices(names, weights=shares)[0]
        out.append({"id": i, "arrival": t, "kind": kind, "input": _lognormal(rng, specs[kind]["input"]),
                    "output": _lognormal(rng, specs[kind]["output"])})
    return out
