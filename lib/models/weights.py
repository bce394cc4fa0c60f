"""A decoder's weights: the embedding, per layer the norms and the four products, the final norm and the head.

The projections are stored fused, as serving engines store them: Q, K and V in one matrix
[hidden, (H_q + 2 H_kv) d], gate and up in one [hidden, 2 mlp], so a layer runs few, large GEMMs. Every
product is stored [in, out] (``x @ w``).

``random_weights`` draws them from a seed on the device they will live on (16 GB of Llama-3-8B in bf16
are drawn in milliseconds on a GPU): weights of standard deviation 0.02, an embedding of 1, norms of
ones. They mean nothing, but no kernel looks at their values, so every timing holds, and the logits are
exactly reproducible.

Chapters: 5-10.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lib.models.config import ModelConfig

PRODUCTS = ("wqkv", "wo", "wgu", "wd")  # a layer's four products, in the order a step runs them
NORMS = ("attn_norm", "mlp_norm")


@dataclass
class Weights:
    """``layers``: one dict per layer with ``NORMS`` and ``PRODUCTS``."""

    embed: torch.Tensor
    layers: list[dict]
    norm: torch.Tensor
    head: torch.Tensor

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.dtype

    @property
    def device(self) -> torch.device:
        return self.embed.device

    def to(self, dtype: torch.dtype) -> Weights:
        """A copy in ``dtype`` (the float32 references the chapters check against)."""
        return Weights(self.embed.to(dtype), [{k: v.to(dtype) for k, v in L.items()} for L in self.layers],
                       self.norm.to(dtype), self.head.to(dtype))


def random_weights(cfg: ModelConfig, *, seed: int = 0, dtype: torch.dtype = torch.float32,
                   device: str | torch.device = "cpu") -> Weights:
    """Weights of ``cfg`` drawn on ``device`` in ``dtype`` from ``seed`` (see the module)."""
    cfg.check()
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(seed)

    def w(*shape, std=0.02):
        return torch.randn(*shape, generator=gen, device=device, dtype=dtype).mul_(std)

    def ones():
        return torch.ones(cfg.hidden, dtype=dtype, device=device)

    H, D = cfg.hidden, cfg.head_dim
    embed = w(cfg.vocab, H, std=1.0)
    layers = [{"attn_norm": ones(), "wqkv": w(H, (cfg.heads + 2 * cfg.kv_heads) * D), "wo": w(cfg.heads * D, H),
               "mlp_norm": ones(), "wgu": w(H, 2 * cfg.mlp), "wd": w(cfg.mlp, H)} for _ in range(cfg.layers)]
    return Weights(embed, layers, ones(), w(H, cfg.vocab))
