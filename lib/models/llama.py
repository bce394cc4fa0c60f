"""The one Llama decoder of the book: one layer loop over a step's batch, with swappable parts.

Per layer: norm -> QKV product -> RoPE and the K/V write into the paged pool -> attention -> O product
(+ residual) -> norm -> gate-up product -> SiLU(gate) * up -> down product (+ residual); then the final
norm and the output head. The rows of a ``StepBatch`` (prefill chunks and decodes together) go through
every product at once (M = all the step's tokens); only attention is per request. RMSNorm, rotary
position embeddings (RoPE), grouped-query attention and a SwiGLU MLP, as in Llama.

What each arrow runs is a part (``lib.models.layers``), so every step the chapters time is this loop:

- ``EAGER`` (the default): PyTorch operators and cuBLAS; chapter 7's unfused step;
- ``FUSED``: chapter 7's fused kernels and skinny products (``m.with_parts(FUSED)``), captured in CUDA
  graphs by the engine;
- ``compiled()``: the eager parts with the code around attention compiled by ``torch.compile``;
- ``quantized("int8" | "int4", group)``: chapter 9's quantized products in the fused step;
- chapter 10's rank of a tensor-parallel group: the eager parts with row-parallel O and down products
  (``lib.parallel.tp``).

``with_parts`` gives the same weights (shared, not copied) under other parts; a quantized product
quantizes its weights once, there. Entry points: ``forward`` (a ``StepBatch``: the engine's runner),
``prefill`` (one request, after an optional cached prefix), ``decode`` and calling the model (one
decode step for a batch, ``(tokens, pool, block_table, seq_lens)``), ``greedy`` and ``sample`` (a
decode step and its next tokens, with the head's own sampling). With tensors on the device and
``check=False``, a step reads nothing back and can be captured in a CUDA graph.

Chapters: 5-10.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import lib.kernels  # noqa: F401  (first: it chooses Triton's interpreter without a GPU, before torch imports Triton)
from lib.kv_pool import KVPool
from lib.models import batch as batches
from lib.models import layers
from lib.models.config import ModelConfig
from lib.models.layers import EAGER, FUSED, Parts
from lib.models.weights import PRODUCTS, Weights, random_weights


class Llama:
    """A decoder of ``cfg`` on ``weights`` with ``parts`` (see the module)."""

    def __init__(self, cfg: ModelConfig, weights: Weights, parts: Parts = EAGER):
        cfg.check()
        if not isinstance(parts, Parts):
            raise TypeError(f"parts must be a lib.models.layers.Parts (EAGER, FUSED, ...), got {type(parts).__name__}")
        self.cfg, self.weights, self.parts = cfg, weights, parts
        self.dtype, self.device = weights.dtype, weights.device
        # every layer's weights as the parts use them: the norms as they are, the products prepared by their
        # linear method (the same tensors for dense products)
        self.layers = [{**L, **{p: parts.linear[p].prepare(L[p]) for p in PRODUCTS}} for L in weights.layers]
        D = cfg.head_dim
        self.inv_freq = (1.0 / cfg.rope_theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D)).to(self.device)
        self.inv_freq32 = self.inv_freq.float()
        self.plans = {}  # decode-attention launches, by shape
        if parts.compile is None:
            self._pre, self._post, self._final = self._pre_attention, self._post_attention, self._final_norm_head
        else:
            self._pre = torch.compile(self._pre_attention, **parts.compile)
            self._post = torch.compile(self._post_attention, **parts.compile)
            self._final = torch.compile(self._final_norm_head, **parts.compile)

    @classmethod
    def random(cls, cfg: ModelConfig, *, seed: int = 0, dtype: torch.dtype = torch.float32,
               device: str | torch.device = "cpu", parts: Parts = EAGER) -> Llama:
        """A model of ``cfg`` with weights drawn on ``device`` from ``seed`` (``lib.models.weights``)."""
        return cls(cfg, random_weights(cfg, seed=seed, dtype=dtype, device=device), parts)

    def with_parts(self, parts: Parts) -> Llama:
        """The same weights (shared) under other parts."""
        return Llama(self.cfg, self.weights, parts)

    def to(self, dtype: torch.dtype) -> Llama:
        """A copy of the weights in ``dtype`` under the same parts (the float32 references)."""
        return Llama(self.cfg, self.weights.to(dtype), self.parts)

    def new_pool(self, num_blocks: int, block_size: int) -> KVPool:
        c = self.cfg
        return KVPool(num_blocks, block_size, layers=c.layers, kv_heads=c.kv_heads, head_dim=c.head_dim,
                      dtype=self.dtype, device=self.device)

    def layer_weight_bytes(self) -> int:
        """Bytes the layers' four products take as stored (quantized ones with their scales): what a step
        reads of them."""
        return sum(self.parts.linear[p].weight_bytes(L[p]) for L in self.layers for p in PRODUCTS)

    # ------------------------------------------------------------------ the layer loop
    def _pre_attention(self, x, res, norm_w, wqkv, k, v, rot):
        """norm -> QKV -> RoPE and the K/V write: the layer's queries, and the residual stream."""
        P, c = self.parts, self.cfg
        h, res = P.norm(x, res, norm_w, c.eps)
        qkv = P.linear["wqkv"](h, wqkv, partial=P.partial)
        return P.rotary(qkv, k, v, rot, c.heads, c.kv_heads, c.head_dim), res

    def _post_attention(self, x, res, o, wo, norm_w, wgu, wd):
        """O product (+ residual) -> norm -> gate-up -> activation -> down (+ residual)."""
        P, c = self.parts, self.cfg
        add = None if P.norm.adds_residual else res
        x = P.linear["wo"](o.reshape(o.shape[0], -1), wo, residual=add, partial=P.partial)
        h, res = P.norm(x, res, norm_w, c.eps)
        add = None if P.norm.adds_residual else res
        return P.linear["wd"](P.act(P.linear["wgu"](h, wgu)), wd, residual=add, partial=P.partial), res

    def _final_norm_head(self, x, res, rows):
        return self.parts.head.linear(self._final_norm(x, res, rows), self.weights.head)

    def _final_norm(self, x, res, rows):
        return self.parts.norm.final(x, res, self.weights.norm, self.cfg.eps, rows)

    def _layers(self, batch: batches.StepBatch, pool: KVPool):
        """The residual stream after the last layer: (x, res) as the norm part takes them."""
        P, D = self.parts, self.cfg.head_dim
        rot = P.rotary.prepare(self, batch, pool.block_size)
        x, res = F.embedding(batch.ids, self.weights.embed), None
        for li, L in enumerate(self.layers):
            k, v = pool.k[li], pool.v[li]
            q, res = self._pre(x, res, L["attn_norm"], L["wqkv"], *P.rotary.cache_views(k, v, D), rot)
            o = layers.attention(q, k, v, batch, self.plans, li == 0, D)
            x, res = self._post(x, res, o, L["wo"], L["mlp_norm"], L["wgu"], L["wd"])
        return x, res

    @torch.no_grad()
    def forward(self, batch: batches.StepBatch, pool: KVPool) -> torch.Tensor:
        """Logits [rows, vocab] of the batch's ``out_rows``."""
        x, res = self._layers(batch, pool)
        return self._final(x, res, batch.out_rows)

    # ------------------------------------------------------------------ entry points
    @torch.no_grad()
    def prefill(self, tokens, pool: KVPool, blocks, start: int = 0, *, last_only: bool = False,
                check: bool = False) -> torch.Tensor:
        """Logits [n - start, vocab] of tokens[start:]; the K/V of positions < start are read from the pool
        (a prefix-cache hit), the new tokens' written there. ``last_only``: only the last token's logits
        [1, vocab], all a server needs for the first output token. ``tokens`` and ``blocks`` may be lists or
        tensors on the model's device; ``check=True`` also checks token ids held on a GPU (a
        synchronisation)."""
        c = self.cfg
        return self.forward(batches.prefill(tokens, blocks, start, pool.block_size, c.kv_heads, c.vocab,
                                            self.device, last_only=last_only, check=check), pool)

    @torch.no_grad()
    def decode(self, tokens, pool: KVPool, block_table: torch.Tensor, seq_lens: torch.Tensor, *,
               check: bool = True) -> torch.Tensor:
        """One decode step for a batch: logits [B, vocab] of the new tokens ``tokens`` [B] (request b's at
        position ``seq_lens[b] - 1``, in its blocks ``block_table[b]``). ``check=False`` skips the checks
        that read the lengths and GPU-held token ids back, so the step can be captured in a CUDA graph."""
        return self.forward(self._decode_batch(tokens, pool, block_table, seq_lens, check), pool)

    def __call__(self, tokens, pool, block_table, seq_lens):
        """``decode`` without the checks that read values back (the step the chapters time)."""
        return self.decode(tokens, pool, block_table, seq_lens, check=False)

    @torch.no_grad()
    def greedy(self, tokens, pool, block_table, seq_lens) -> torch.Tensor:
        """A decode step's next token per request [B] int64, by the head's greedy sampling (fused into the
        output product with ``FUSED``: the logits are never written); the argmax of the step's logits."""
        x, res = self._layers(self._decode_batch(tokens, pool, block_table, seq_lens, False), pool)
        return self.parts.head.greedy(self._final_norm(x, res, None), self.weights.head)

    @torch.no_grad()
    def sample(self, tokens, pool, block_table, seq_lens, top_p, temperature, seed) -> torch.Tensor:
        """A decode step's next token per request [B] int64, drawn from softmax(logits / temperature) over its
        top-p set by the head's sampler; ``top_p`` and ``temperature`` floats or tensors [B], ``seed`` an
        int64 tensor [1] on the device (read at each call or graph replay; the PyTorch sampler of
        ``EAGER`` draws from torch's generator instead)."""
        return self.parts.head.sample(self(tokens, pool, block_table, seq_lens), top_p, temperature, seed)

    def _decode_batch(self, tokens, pool, block_table, seq_lens, check: bool) -> batches.StepBatch:
        return batches.decode(tokens, block_table, seq_lens, pool.block_size, self.cfg.vocab, self.device,
                              check=check)


def dequantized(m: Llama, fmt: str, group: int = 128) -> Llama:
    """``m``'s weights with the four layer products quantized and dequantized again (in ``m``'s dtype), under
    the fused parts: the weights a quantized step effectively uses, what it is checked against."""
    q = layers.Quantized(fmt, group)
    w = m.weights
    dq = [{**L, **{p: q.prepare(L[p]).dequantize(L[p].dtype) for p in PRODUCTS}} for L in w.layers]
    return Llama(m.cfg, Weights(w.embed, dq, w.norm, w.head), FUSED)
