"""Every model configuration of the book, in one place, and how two ways of computing logits are compared.

A ``ModelConfig`` holds a Llama-style decoder's shapes: vocabulary, width, layers, query and KV heads of
``head_dim``, the SwiGLU width, the RoPE base and the RMSNorm epsilon. ``CONFIGS`` names the three the
chapters run:

- ``"tiny"``: Llama-3-8B's proportions shrunk to run on a CPU in milliseconds (tests and smoke runs);
- ``"1b"``: about 1.1 billion parameters (chapters 5, 6 and 8 on a GPU);
- ``"8b"``: Llama-3-8B (32 layers, width 4096, 32 query and 8 KV heads of 128, SwiGLU of 14336,
  vocabulary 128256, RoPE base 500000; chapters 7-10).

Chapters: 5-10.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ModelConfig:
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    mlp: int
    rope_theta: float = 10000.0
    eps: float = 1e-5

    def params(self) -> int:
        attn = self.hidden * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
        return self.layers * (attn + 3 * self.hidden * self.mlp + 2 * self.hidden) + 2 * self.vocab * self.hidden + self.hidden

    def flops_per_token(self, context: int) -> float:
        """Forward FLOPs of one token: 2 per weight of the layers and the head, plus attention over ``context``
        earlier tokens (scores and weighted sum: 4 context head_dim per query head and layer)."""
        weights = self.params() - self.vocab * self.hidden - (2 * self.layers + 1) * self.hidden
        return 2 * weights + 4 * self.layers * self.heads * self.head_dim * context

    def product_shapes(self) -> dict:
        """(K, N) of each layer product x @ w [K, N]: the fused QKV, O, the fused gate-up, down."""
        qkv = (self.heads + 2 * self.kv_heads) * self.head_dim
        return {"qkv": [self.hidden, qkv], "o": [self.heads * self.head_dim, self.hidden],
                "gate_up": [self.hidden, 2 * self.mlp], "down": [self.mlp, self.hidden]}

    def check(self) -> None:
        """Raise ``ValueError`` unless the shapes make a decoder: whole query heads per KV head, an even
        head_dim (RoPE rotates pairs)."""
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")


def crossover_M(shapes: dict) -> float:
    """The M at which a set of linear layers' activations, sum of (MK + MN), weigh as much as their
    weights, sum of KN: M = sum KN / sum (K + N)."""
    if not shapes:
        raise ValueError("no layers: pass a dict name -> (K, N), e.g. lib.costs.LLAMA3_8B['linears']")
    for name, (K, N) in shapes.items():
        for what, v in ((f"{name}: K", K), (f"{name}: N", N)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{what} must be a positive int, got {v!r}")
    return sum(K * N for K, N in shapes.values()) / sum(K + N for K, N in shapes.values())


CONFIGS = {
    "tiny": ModelConfig(vocab=97, hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, mlp=96, rope_theta=500000.0),
    "1b": ModelConfig(vocab=32000, hidden=2048, layers=16, heads=32, kv_heads=8, head_dim=64, mlp=8192),
    "8b": ModelConfig(vocab=128256, hidden=4096, layers=32, heads=32, kv_heads=8, head_dim=128, mlp=14336,
                      rope_theta=500000.0),
}
LLAMA3_8B = CONFIGS["8b"]

# how far two ways of computing the same logits may differ, relative to the largest logit, by dtype and device
LOGITS_TOLERANCE = {("float32", "cpu"): 2e-5, ("float32", "cuda"): 5e-3, ("bfloat16", "cpu"): 0.1,
                    ("bfloat16", "cuda"): 0.1}


def config_for(name: str, dtype: str) -> ModelConfig:
    """The configuration called ``name``, checked with a ``dtype`` the logits checks know."""
    if name not in CONFIGS:
        raise ValueError(f"config must be one of {sorted(CONFIGS)}, got {name!r}")
    if dtype not in {d for d, _ in LOGITS_TOLERANCE}:
        raise ValueError(f"dtype must be one of {sorted({d for d, _ in LOGITS_TOLERANCE})} (a model dtype the checks "
                         f"know), got {dtype!r}")
    return CONFIGS[name]


def check_logits(what: str, got: torch.Tensor, expected: torch.Tensor, dtype: str, device: str) -> float:
    """Raise unless ``got`` equals ``expected`` (logits of the same shape) within ``LOGITS_TOLERANCE[dtype,
    device]`` of the largest expected logit; return the largest difference. The chapters check every path
    they time this way (a cached prefill against the whole prompt, a fused step against the eager one)."""
    got, expected = got.float(), expected.float()
    if tuple(got.shape) != tuple(expected.shape):
        raise AssertionError(f"{what}: logits of shape {tuple(got.shape)}, expected {tuple(expected.shape)}")
    err = float((got - expected).abs().max())
    tol = LOGITS_TOLERANCE[dtype, device]
    bound = tol * float(expected.abs().max())
    if not err <= bound:  # a NaN fails too
        raise AssertionError(f"{what}: logits differ from another way of computing them by up to {err:.4g}, more "
                             f"than {bound:.4g} ({tol} of the largest logit in {dtype} on {device}): the path "
                             "computes something else")
    return err
