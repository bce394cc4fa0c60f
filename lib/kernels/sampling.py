"""Top-p (nucleus) sampling of a decode step's logits without sorting them (chapter 7).

Top-p sampling with temperature T draws the next token from the smallest set of the most probable
tokens whose probabilities, softmax(logits / T), add up to at least p. Serving engines written in
PyTorch find that set by sorting the whole vocabulary (128,256 logits per request for Llama-3), taking a
cumulative sum and masking, a dozen launches. The set is simply every token whose logit is at least a
threshold tau, the largest value for which the probability of {logit >= tau} is still at least p, so
these kernels search for tau instead of sorting:

1. ``_stats_kernel``: per block of columns, the largest scaled logit and the sum of exp(logit/T - max)
   (the softmax's normaliser, in pieces).
2. ``_mass_kernel``, four times for 16-bit logits (eight for float32): a radix search for tau. The logits'
   bit patterns map to integer keys in the same order as the values (``_keys``); each pass fixes four
   more bits of tau: it counts, per block, the probability mass at or above 16 candidate keys (the bits
   fixed so far followed by each of the 16 values of the next four bits), and the next pass keeps the
   largest candidate whose mass, added over the blocks, is still at least p. After the last pass tau is
   exact: one of the logits' own values.
3. ``_sample_kernel``: the draw, by the Gumbel-max rule: among the kept tokens, the one with the largest
   logit/T + g, where g = -log(-log u) for a uniform u per token, is distributed as softmax over the kept
   set. Each block keeps its best; ``skinny_gemm``'s small kernel picks among the blocks.

Every pass reads the logits once (256 KB per request in bf16, from the L2 after the first), so the
search costs a few microseconds, and nothing is read back to the host: the whole draw fits in a CUDA graph.
The uniforms come from Triton's Philox generator seeded from a tensor on the device (a graph replays it
with the seed's current value), or from a given tensor (to reproduce a draw exactly, as the tests do).
Ties at tau are all kept.

The draw is defined for top_p in (0, 1], a temperature that is a finite number > 0 (temperature 0 is
greedy sampling, the argmax, as ``lib.engine`` treats it) and rows of logits without NaN or +inf that keep
at least one logit above -inf (-inf masks a token out). The arguments' types, shapes, dtypes and the
numbers given are checked at every call; the tensors' values where reading them costs no synchronisation
(on the CPU) or where the caller asks (``check``).

``top_p_torch`` is the sorting path as engines write it in PyTorch; ``top_p_reference`` the same choice
in float64 from given uniforms, the oracle of the tests.

Chapter: 7.
"""

from __future__ import annotations

import math
import numbers

import torch
import triton
import triton.language as tl

from lib.kernels import launch
from lib.kernels.skinny_gemm import _argmax_blocks_kernel

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
RADIX = tl.constexpr(4)  # bits of tau fixed per pass: 16 candidates
MASS_BLOCK = 256  # columns per step of the mass kernel: [256, 16] comparisons at a time
MASS_WARPS = 8


@triton.jit
def _keys(logits, BITS: tl.constexpr):
    """Signed integer keys in the order of the logits' values (IEEE floats of BITS bits): non-negative
    values keep their bit pattern, negative ones have their magnitude bits flipped."""
    if BITS == 16:  # int32 keys (cheaper to compare than int64)
        b = logits.to(tl.int16, bitcast=True).to(tl.int32)
    else:
        b = logits.to(tl.int32, bitcast=True).to(tl.int64)
    return tl.where(b >= 0, b, b ^ ((1 << (BITS - 1)) - 1))


@triton.jit
def _stats_kernel(L, TEMP, STATS, MASS, PREFIX, V, COLS, NB, stride_l,
                  BITS: tl.constexpr, BLOCK_N: tl.constexpr):
    """Block (n, row): the largest logit/T of its columns and the sum of exp(logit/T - that largest); also
    the search's starting point: no bit fixed (the lowest key), no mass."""
    n = tl.program_id(0)
    row = tl.program_id(1)
    inv_t = 1.0 / tl.load(TEMP + row).to(tl.float32)
    m = tl.full((BLOCK_N,), -1e38, tl.float32)
    s = tl.zeros((BLOCK_N,), tl.float32)
    end = tl.minimum(n * COLS + COLS, V)
    for c0 in range(n * COLS, end, BLOCK_N):
        cols = c0 + tl.arange(0, BLOCK_N)
        x = tl.load(L + row * stride_l + cols, mask=cols < end, other=float("-inf")).to(tl.float32) * inv_t
        m_new = tl.maximum(m, x)
        s = s * tl.exp(m - m_new) + tl.exp(x - m_new)
        m = m_new
    mx = tl.max(m, axis=0)
    tl.store(STATS + (row * NB + n) * 2, mx)
    tl.store(STATS + (row * NB + n) * 2 + 1, tl.sum(s * tl.exp(m - mx), axis=0))
    tl.store(MASS + (row * NB + n) * 16 + tl.arange(0, 16), tl.zeros((16,), tl.float32))
    if n == 0:
        tl.store(PREFIX + row, -(1 << (BITS - 1)))


@triton.jit
def _softmax_norm(STATS, row, NB, NBP: tl.constexpr):
    """The row's largest logit/T and the sum of exp(logit/T - largest), from the blocks' pieces."""
    b = tl.arange(0, NBP)
    bm = tl.load(STATS + (row * NB + b) * 2, mask=b < NB, other=-1e38)
    bs = tl.load(STATS + (row * NB + b) * 2 + 1, mask=b < NB, other=0.0)
    mx = tl.max(bm, axis=0)
    return mx, tl.sum(bs * tl.exp(bm - mx), axis=0)


@triton.jit
def _descend(MASS, PREFIX, TOP_P, row, B, NB, j, z, NBP: tl.constexpr, BITS: tl.constexpr):
    """The bits of tau fixed after pass j - 1: pass j - 1's prefix followed by the largest of its 16
    candidates whose mass, over all blocks, is at least p times the normaliser z."""
    b = tl.arange(0, NBP)
    t = tl.arange(0, 16)
    mass = tl.load(MASS + (((j - 1) * B + row) * NB + b[:, None]) * 16 + t[None, :], mask=(b < NB)[:, None], other=0.0)
    total = tl.sum(mass, axis=0)
    target = tl.load(TOP_P + row).to(tl.float32) * z
    best = tl.sum(((total >= target) & (t > 0)).to(tl.int64), axis=0)  # masses fall as t grows
    shift = BITS - RADIX * (j - 1)
    return tl.load(PREFIX + (j - 1) * B + row) + (best << shift)


@triton.jit
def _mass_kernel(L, TEMP, TOP_P, STATS, MASS, PREFIX, B, V, COLS, NB, j, stride_l,
                 BITS: tl.constexpr, NBP: tl.constexpr, BLOCK_N: tl.constexpr):
    """Pass j (1 ..) of the search, block (n, row): fix the bits the previous pass found, then sum the
    probability mass of this block's logits at or above each of the 16 candidates for the next four bits."""
    n = tl.program_id(0)
    row = tl.program_id(1)
    mx, z = _softmax_norm(STATS, row, NB, NBP)
    prefix = _descend(MASS, PREFIX, TOP_P, row, B, NB, j, z, NBP, BITS)
    if n == 0:
        tl.store(PREFIX + j * B + row, prefix)
    t = tl.arange(0, 16)
    cand = (prefix + (t.to(tl.int64) << (BITS - RADIX * j)))[None, :]
    if BITS == 16:
        cand = cand.to(tl.int32)
    inv_t = 1.0 / tl.load(TEMP + row).to(tl.float32)
    acc = tl.zeros((BLOCK_N, 16), tl.float32)  # added up once, after the loop
    end = tl.minimum(n * COLS + COLS, V)
    for c0 in range(n * COLS, end, BLOCK_N):
        cols = c0 + tl.arange(0, BLOCK_N)[:, None]  # a column of logits, so that each thread holds 16 candidates
        lg = tl.load(L + row * stride_l + cols, mask=cols < end, other=float("-inf"))
        w = tl.exp(lg.to(tl.float32) * inv_t - mx)
        acc += tl.where(_keys(lg, BITS) >= cand, w, 0.0)
    tl.store(MASS + ((j * B + row) * NB + n) * 16 + t, tl.sum(acc, axis=0))


@triton.jit
def _sample_kernel(L, TEMP, TOP_P, STATS, MASS, PREFIX, U, SEED, VAL, IDX, B, V, COLS, NB, stride_l, stride_u,
                   PASSES: tl.constexpr, BITS: tl.constexpr, NBP: tl.constexpr, HAS_U: tl.constexpr,
                   BLOCK_N: tl.constexpr):
    """Block (n, row): tau from the last pass, then the kept token of the largest logit/T - log(-log u)."""
    n = tl.program_id(0)
    row = tl.program_id(1)
    mx, z = _softmax_norm(STATS, row, NB, NBP)
    tau = _descend(MASS, PREFIX, TOP_P, row, B, NB, PASSES + 1, z, NBP, BITS)
    inv_t = 1.0 / tl.load(TEMP + row).to(tl.float32)
    best = tl.full((BLOCK_N,), float("-inf"), tl.float32)
    at = tl.zeros((BLOCK_N,), tl.int64)
    end = tl.minimum(n * COLS + COLS, V)
    for c0 in range(n * COLS, end, BLOCK_N):
        cols = c0 + tl.arange(0, BLOCK_N)
        lg = tl.load(L + row * stride_l + cols, mask=cols < end, other=float("-inf"))
        if HAS_U:
            u = tl.load(U + row * stride_u + cols, mask=cols < end, other=0.5)
        else:
            u = tl.rand(tl.load(SEED), row * V + cols)
        u = tl.minimum(tl.maximum(u, 1e-30), 0.99999994)
        score = lg.to(tl.float32) * inv_t - tl.log(-tl.log(u))
        score = tl.where((cols < end) & (_keys(lg, BITS) >= tau), score, float("-inf"))
        better = score > best
        best = tl.where(better, score, best)
        at = tl.where(better, cols.to(tl.int64), at)
    v, i = tl.max(best, axis=0, return_indices=True, return_indices_tie_break_left=True)
    tl.store(VAL + row * NB + n, v)
    tl.store(IDX + row * NB + n, tl.sum(tl.where(tl.arange(0, BLOCK_N) == i, at, 0), axis=0))


def _per_row(name: str, v, B: int, device) -> torch.Tensor:
    if isinstance(v, torch.Tensor):
        if v.shape != (B,) or not v.is_floating_point() or v.device != device:
            raise ValueError(f"{name} must be a float or a float tensor of shape ({B},) on {device}, got "
                             f"{tuple(v.shape)} {v.dtype} on {v.device}")
        return v.float().contiguous()
    return torch.full((B,), float(v), device=device)


def _real(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def _check_args(logits, top_p, temperature, block_n):
    """Refuse what the kernels cannot take, from types, shapes, dtypes and the scalars' values (no tensor
    values are read); the per-row top_p and temperature as float32 tensors [B]."""
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or logits.dtype not in DTYPES:
        raise ValueError(f"logits must be a 2-D fp16, bf16 or fp32 tensor [B, vocab], got "
                         f"{getattr(logits, 'shape', type(logits).__name__)} {getattr(logits, 'dtype', '')}")
    B, V = logits.shape
    if V == 0 and B:
        raise ValueError(f"logits {tuple(logits.shape)} has no columns: a row of an empty vocabulary has no token to "
                         f"draw; pass the logits over the whole vocabulary")
    if V > 1 and logits.stride(1) != 1:
        raise ValueError(f"logits must be contiguous in the vocabulary (stride 1), got strides {logits.stride()}: "
                         f"pass logits.contiguous()")
    if not isinstance(top_p, torch.Tensor) and not (_real(top_p) and 0.0 < top_p <= 1.0):
        raise ValueError(f"top_p must be a number in (0, 1] (the probability the kept set reaches; 1 keeps every "
                         f"token), got {top_p!r}")
    if not isinstance(temperature, torch.Tensor) and not (_real(temperature) and math.isfinite(temperature)
                                                          and temperature > 0.0):
        raise ValueError(f"temperature must be a finite number > 0 (logits are divided by it), got {temperature!r}: "
                         f"temperature 0 means greedy sampling, which is the argmax of the logits (logits.argmax(-1), "
                         f"or skinny_gemm.skinny_argmax fused into the head)")
    if block_n is not None and (not launch.whole(block_n) or block_n < 16 or block_n & (block_n - 1)):
        raise ValueError(f"block_n must be a power of two >= 16 (the columns a program's loop takes at a time, a "
                         f"Triton block; None: 1024 for 16-bit logits, 512 for float32), got {block_n!r}")
    return _per_row("top_p", top_p, B, logits.device), _per_row("temperature", temperature, B, logits.device)


def _check_values(logits, top_p, temp):
    """Refuse values the draw is undefined for: a top_p outside (0, 1] or a temperature that is not a finite
    number > 0 (NaN included), and logits with a NaN or +inf, or a row whose logits are all -inf (no token
    has any probability). Reads the values: on a GPU a synchronisation."""
    finite = logits.amax(1) > float("-inf")  # rows and columns: checked before
    bad_p = ~((top_p > 0) & (top_p <= 1))
    bad_t = ~(torch.isfinite(temp) & (temp > 0))
    nan, pos_inf = torch.isnan(logits), logits == float("inf")
    p_wrong, t_wrong, nan_wrong, inf_wrong, empty_wrong = torch.stack(
        [bad_p.any(), bad_t.any(), nan.any(), pos_inf.any(), (~finite).any()]).tolist()
    if p_wrong:
        b = int(bad_p.nonzero()[0, 0])
        raise ValueError(f"top_p[{b}] = {float(top_p[b])} is not in (0, 1]: top_p is the probability the kept set "
                         f"reaches (1 keeps every token); clamp it, or check the request's parameters")
    if t_wrong:
        b = int(bad_t.nonzero()[0, 0])
        raise ValueError(f"temperature[{b}] = {float(temp[b])} is not a finite number > 0 (the logits are divided by "
                         f"it): temperature 0 means greedy sampling, which is the argmax of the logits; draw only the "
                         f"rows of temperature > 0 here")
    for wrong, mask, what in ((nan_wrong, nan, "NaN"), (inf_wrong, pos_inf, "+inf")):
        if wrong:
            b, i = (int(v) for v in mask.nonzero()[0])
            raise ValueError(f"logits[{b}, {i}] is {what}: softmax(logits / T) is undefined with it, and the kernels "
                             f"would draw a token of no meaning; find where the logits went wrong (a token is masked "
                             f"out with -inf)")
    if empty_wrong:
        b = int((~finite).nonzero()[0, 0])
        raise ValueError(f"logits[{b}] is -inf everywhere: every token of the row is masked out, so none has any "
                         f"probability to draw; leave at least one token finite")


def _values_checked(check, logits, top_p, temp) -> None:
    """Check the values (``_check_values``) where ``check`` asks: True always (an error where they cannot be
    read), None on the CPU only (no synchronisation there), False never."""
    if (check or (check is None and logits.device.type == "cpu")) and launch.values_readable(check, logits, top_p, temp):
        _check_values(logits, top_p, temp)


def _search(logits, top_p, temp, block_n: int | None):
    """Launch the statistics and the passes: (stats, mass, prefix, layout). ``logits`` has rows and columns."""
    B, V = logits.shape
    bits = 16 if logits.element_size() == 2 else 32
    passes = bits // RADIX.value
    block_n = (1024 if bits == 16 else 512) if block_n is None else block_n
    programs = max(1, min(64, triton.cdiv(4 * launch.sm_count(logits.device), B)))  # per row
    cols = triton.cdiv(triton.cdiv(V, programs), block_n) * block_n
    nb = triton.cdiv(V, cols)
    dev = logits.device
    stats = torch.empty(B, nb, 2, device=dev, dtype=torch.float32)
    mass = torch.empty(passes + 1, B, nb, 16, device=dev, dtype=torch.float32)
    prefix = torch.empty(passes + 1, B, device=dev, dtype=torch.int64)
    lay = {"B": B, "V": V, "cols": cols, "nb": nb, "nbp": triton.next_power_of_2(nb), "bits": bits,
           "passes": passes, "block_n": block_n}
    _stats_kernel[(nb, B)](logits, temp, stats, mass, prefix, V, cols, nb, logits.stride(0), BITS=bits, BLOCK_N=block_n)
    for j in range(1, passes + 1):
        _mass_kernel[(nb, B)](logits, temp, top_p, stats, mass, prefix, B, V, cols, nb, j, logits.stride(0),
                              BITS=bits, NBP=lay["nbp"], BLOCK_N=min(MASS_BLOCK, block_n), num_warps=MASS_WARPS)
    return stats, mass, prefix, lay


def top_p_sample(logits: torch.Tensor, top_p=1.0, temperature=1.0, *, seed: torch.Tensor | int = 0,
                 uniform: torch.Tensor | None = None, block_n: int | None = None,
                 check: bool | None = None) -> torch.Tensor:
    """One token per row of ``logits`` [B, vocab] (fp16, bf16 or fp32), drawn from softmax(logits / T)
    restricted to the row's top-p set: [B] int64 (empty for B = 0). ``top_p`` in (0, 1] and ``temperature``
    > 0 (finite) are numbers or float tensors [B], one per request; temperature 0 is greedy sampling, the
    logits' argmax, which this function does not do. The uniforms come from ``seed`` (an int, or an int64
    tensor [1] on the device whose value a graph replay reads) or, to reproduce a draw, from ``uniform``
    [B, vocab] in (0, 1). ``block_n``: columns per step of a program's loop, a power of two >= 16.

    Numbers, shapes, dtypes and devices are checked at every call. ``check``: read the tensors' values
    and refuse a top_p outside (0, 1], a temperature that is not a finite number > 0, a NaN or +inf logit,
    or a row of logits all -inf (the draw is undefined for each). None (the default): on the CPU only,
    where it costs no synchronisation; True: always (on a GPU a synchronisation; refused during a CUDA
    graph capture); False: never (the caller vouches for them, e.g. inside a graph). Unchecked, such
    values give a token of no meaning."""
    top_p, temp = _check_args(logits, top_p, temperature, block_n)
    B, V = logits.shape
    if uniform is not None and (not isinstance(uniform, torch.Tensor) or uniform.shape != (B, V)
                                or uniform.dtype != torch.float32 or (V > 1 and uniform.stride(1) != 1)
                                or uniform.device != logits.device):
        raise ValueError(f"uniform must be a float32 tensor [{B}, {V}] on {logits.device}, contiguous in its last "
                         f"dimension, got {getattr(uniform, 'shape', type(uniform).__name__)} "
                         f"{getattr(uniform, 'dtype', '')}")
    if not isinstance(seed, torch.Tensor):
        seed = torch.tensor([int(seed)], device=logits.device, dtype=torch.int64)
    elif seed.numel() != 1 or seed.dtype != torch.int64 or seed.device != logits.device:
        raise ValueError(f"seed must be an int or an int64 tensor of one element on {logits.device}")
    if B == 0:
        return torch.empty(0, device=logits.device, dtype=torch.int64)
    _values_checked(check, logits, top_p, temp)
    stats, mass, prefix, lay = _search(logits, top_p, temp, block_n)
    nb = lay["nb"]
    val = torch.empty(B, nb, device=logits.device, dtype=torch.float32)
    idx = torch.empty(B, nb, device=logits.device, dtype=torch.int64)
    out = torch.empty(B, device=logits.device, dtype=torch.int64)
    u = uniform if uniform is not None else val
    _sample_kernel[(nb, B)](logits, temp, top_p, stats, mass, prefix, u, seed, val, idx, B, V, lay["cols"], nb,
                            logits.stride(0), u.stride(0), PASSES=lay["passes"], BITS=lay["bits"], NBP=lay["nbp"],
                            HAS_U=uniform is not None, BLOCK_N=lay["block_n"])
    _argmax_blocks_kernel[(B,)](val, idx, out, nb, BLOCK=lay["nbp"])
    return out


def top_p_mask(logits: torch.Tensor, top_p=1.0, temperature=1.0, *, block_n: int | None = None,
               check: bool | None = None) -> torch.Tensor:
    """The top-p set the kernels keep, as a bool tensor [B, vocab]: every token whose logit is at least the
    threshold tau that the search finds (the smallest set of the most probable tokens whose probability
    is at least p, with every token tied at tau). The arguments and ``check`` as for ``top_p_sample``."""
    top_p, temp = _check_args(logits, top_p, temperature, block_n)
    if logits.shape[0] == 0:
        return torch.zeros(logits.shape, device=logits.device, dtype=torch.bool)
    _values_checked(check, logits, top_p, temp)
    stats, mass, prefix, lay = _search(logits, top_p, temp, block_n)
    z = torch.stack([(s[:, 1] * torch.exp(s[:, 0] - s[:, 0].max())).sum() for s in stats])
    total = mass[-1].sum(1)  # [B, 16]
    best = ((total >= (top_p * z)[:, None]) & (torch.arange(16, device=logits.device) > 0)).sum(1)
    tau = prefix[-1] + best
    return keys(logits) >= tau[:, None]


def keys(logits: torch.Tensor) -> torch.Tensor:
    """The kernels' integer keys of ``logits`` (int64, in the order of the values), computed by PyTorch."""
    bits = 16 if logits.element_size() == 2 else 32
    b = logits.view(torch.int16 if bits == 16 else torch.int32).long()
    return torch.where(b >= 0, b, b ^ ((1 << (bits - 1)) - 1))


def top_p_torch(logits: torch.Tensor, top_p: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """Top-p sampling as serving engines write it in PyTorch (``top_p`` and ``temperature`` tensors [B]):
    scale, sort the vocabulary, a cumulative softmax, mask the tail, scatter back, then the
    exponential-race draw (probabilities over exponential noise, argmax). [B] int64."""
    x = logits.float() / temperature[:, None]
    srt, order = x.sort(dim=-1)
    tail = srt.softmax(-1).cumsum(-1) <= 1 - top_p[:, None]
    tail[:, -1] = False  # keep at least one token
    x = x.scatter(-1, order, srt.masked_fill(tail, float("-inf")))
    return (x.softmax(-1) / torch.empty_like(x).exponential_()).argmax(-1)


def top_p_reference(logits: torch.Tensor, top_p, temperature, uniform: torch.Tensor) -> torch.Tensor:
    """The kernels' choice in float64 from the same uniforms: the smallest set of the most probable tokens
    with probability at least p (every token tied with its last kept), then the Gumbel-max draw. [B] int64."""
    B = logits.shape[0]
    p = _per_row("top_p", top_p, B, logits.device).double()
    t = _per_row("temperature", temperature, B, logits.device).double()
    x = logits.double() / t[:, None]
    probs = x.softmax(-1)
    srt, order = probs.sort(dim=-1, descending=True)
    k = (srt.cumsum(-1) < p[:, None]).sum(-1).clamp(max=logits.shape[1] - 1)  # the last kept, in sorted order
    tau = logits.gather(-1, order.gather(-1, k[:, None])).double()
    score = x - torch.log(-torch.log(uniform.double().clamp(1e-30, 0.99999994)))
    return score.masked_fill(logits.double() < tau, float("-inf")).argmax(-1)
