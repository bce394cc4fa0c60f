"""Cost formulas: FLOPs, bytes and intensity of the operators the book measures, and the roofline model.

For a linear layer Y = XW with X of shape [M, K] and W of shape [K, N], in elements of b bytes:

    F = 2 M K N                      (a multiply-add counts 2)
    Q = b (M K + K N + M N)          (each input read once, the output written once: an idealization)
    I = F / Q                        ~ 2M / b when the weight's K N dominates

The roofline lower bound of an operation is T >= max(F / P, Q / BW), and with the host in the picture
T >= max(F / P, Q / BW, kernels * t_launch). Its ridge P / BW is the intensity where the two first
terms meet; for a linear layer in b-byte elements that is M ~ b P / (2 BW).

For decode attention over a KV cache (chapter 3), one step of B requests with L cached tokens each
reads, per layer, K and V of H_kv heads of dimension d:

    Q_KV = 2 B L H_kv d b

and the whole cache of a model of ``layers`` layers holds M_KV = 2 layers B T H_kv d b for T tokens
per request: one decode step reads all of it, once per step.

Chapters: 1 (linear layers, the seed's worked numbers, the decode layer stack), 2 (the roofline and
the memory-bound operators), 3 (the KV cache).
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

# Llama-3-8B: hidden 4096, 32 query heads and 8 KV heads of dimension 128, MLP 14336, 32 layers,
# vocabulary 128256. Its linear layers as (K, N) of Y = XW, per layer.
LLAMA3_8B = {
    "layers": 32,
    "hidden": 4096,
    "vocab": 128256,
    "heads": 32,
    "kv_heads": 8,
    "head_dim": 128,
    "linears": {
        "qkv": (4096, 6144),  # 32 query heads + 2 x 8 KV heads, of 128
        "o": (4096, 4096),
        "gate_up": (4096, 28672),  # gate and up projections fused, 2 x 14336
        "down": (14336, 4096),
    },
}


def _check_dims(**dims: int) -> None:
    for name, v in dims.items():
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ValueError(f"{name} must be a non-negative int, got {v!r}")


def linear_flops(M: int, K: int, N: int) -> int:
    """F = 2MKN for Y = XW, X [M, K], W [K, N]."""
    _check_dims(M=M, K=K, N=N)
    return 2 * M * K * N


def linear_bytes(M: int, K: int, N: int, b: int = 2) -> int:
    """Q = b(MK + KN + MN): X and W read once, Y written once."""
    _check_dims(M=M, K=K, N=N, b=b)
    return b * (M * K + K * N + M * N)


def kv_step_bytes(B: int, L: int, H_kv: int, d: int, b: int = 2) -> int:
    """Bytes of K and V that one decode step of B requests of L cached tokens reads in one layer."""
    _check_dims(B=B, L=L, H_kv=H_kv, d=d, b=b)
    return 2 * B * L * H_kv * d * b


def kv_cache_bytes(layers: int, B: int, T: int, H_kv: int, d: int, b: int = 2) -> int:
    """Bytes of the KV cache of B requests of T tokens in a model of ``layers`` layers."""
    _check_dims(layers=layers, T=T)  # kv_step_bytes checks the rest, under the same names
    return layers * kv_step_bytes(B, T, H_kv, d, b)


def intensity(flops: float, nbytes: float) -> float:
    """I = F / Q in FLOP per byte."""
    if nbytes <= 0:
        raise ValueError(f"intensity needs a positive byte count, got {nbytes}")
    return flops / nbytes


def ridge_M(b: int, P_flops: float, BW_Bps: float) -> float:
    """The batch M at which a large linear layer's I ~ 2M/b reaches the ridge P/BW: M ~ b P / (2 BW)."""
    if P_flops <= 0 or BW_Bps <= 0:
        raise ValueError(f"P and BW must be positive, got {P_flops} and {BW_Bps}")
    return b * P_flops / (2 * BW_Bps)


@dataclass(frozen=True)
class Roofline:
    """A machine as the model sees it: peak rate, bandwidth and the cost of one kernel launch."""

    P_flops: float  # FLOP/s
    BW_Bps: float  # bytes/s
    t_launch_s: float = 0.0  # seconds per kernel

    @classmethod
    def from_ceilings(cls, c: dict, launch: str = "graph") -> Roofline:
        """From lib.bench.ceilings: bf16 rate, copy bandwidth, and the launch cost in a graph or eagerly."""
        if launch not in ("graph", "eager"):
            raise ValueError(f"launch must be 'graph' or 'eager', got {launch!r}")
        return cls(c["bf16_tflops"] * 1e12, c["copy_bw_GBps"] * 1e9, c[f"launch_{launch}_us"] * 1e-6)

    @property
    def ridge(self) -> float:
        """P / BW in FLOP per byte."""
        return self.P_flops / self.BW_Bps

    def time(self, flops: float, nbytes: float, kernels: int = 1) -> float:
        """The lower bound max(F/P, Q/BW, kernels * t_launch), in seconds."""
        if flops < 0 or nbytes < 0 or kernels < 0:
            raise ValueError(f"flops, bytes and kernels must be non-negative, got {flops}, {nbytes}, {kernels}")
        return max(flops / self.P_flops, nbytes / self.BW_Bps, kernels * self.t_launch_s)

    def bound(self, flops: float, nbytes: float, kernels: int = 1) -> str:
        """Which term sets the bound: 'compute', 'memory' or 'launch'."""
        terms = {"compute": flops / self.P_flops, "memory": nbytes / self.BW_Bps, "launch": kernels * self.t_launch_s}
        return max(terms, key=terms.get)


def matches(computed: float, printed: str) -> bool:
    """Whether ``computed``, rounded to the decimals of the seed's ``printed`` value, equals it.

    The seeds print rounded numbers ("33.55", "0.336", "1"): a computed 33.554 matches "33.55",
    a computed 33.6 does not.
    """
    p = Decimal(printed)
    decimals = max(0, -p.as_tuple().exponent)
    return round(float(computed), decimals) == float(p)
