"""Llama-3-8B's decode step on ``lib.model``'s decoder, three ways (chapter 7).

``LLAMA3_8B`` is the configuration (32 layers, width 4096, 32 query and 8 KV heads of 128, SwiGLU of
14336, vocabulary 128256, RoPE base 500000) of the same ``lib.model.TinyLlama`` code that chapter 5 runs
at 1.1B. ``random_model`` builds it with random weights drawn on the device (16 GB in bf16 are drawn in
milliseconds there, in minutes on a CPU); the weights mean nothing, but no kernel looks at their values,
so every timing holds.

A decode step (``TinyLlama.decode``) is, per layer: RMSNorm, the fused QKV GEMM, RoPE, the K/V write into
the paged pool, chapter 3's decode attention, the O GEMM with the residual, RMSNorm, the fused gate-up
GEMM, SiLU, the product, the down GEMM with the residual; then the final norm and the output head.

- ``FusedStep``: the same step with ``lib.kernels.fused``: the residual add moved into the next RMSNorm
  (one kernel), RoPE and the K/V write in one kernel, SiLU and the product in one; the products go through
  ``lib.kernels.skinny_gemm`` where it beats cuBLAS (every product at batch 1), and a product split along K
  leaves the sum of its pieces to the norm or the RoPE kernel that reads it; greedy sampling fused into
  the output head (``greedy``) and top-p sampling without a sort (``sample``).
- ``CompiledStep``: the same step with the parts around the attention kernel compiled by ``torch.compile``
  (Inductor fuses the small operators itself); the book's attention kernel runs between them.

Each returns the logits [B, vocab] and can be captured in a CUDA graph (no value is read back).

Chapter: 7.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lib import model
from lib.kernels import decode_attention as da
from lib.kernels import fused, sampling, skinny_gemm

LLAMA3_8B = model.Config(vocab=128256, hidden=4096, layers=32, heads=32, kv_heads=8, head_dim=128, mlp=14336,
                         rope_theta=500000.0)
# the same shapes, small enough for a CPU (chapter 7's tests and smoke runs)
TINY = model.Config(vocab=97, hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, mlp=96, rope_theta=500000.0)
CONFIGS = {"8b": LLAMA3_8B, "tiny": TINY}


def random_model(cfg: model.Config, *, seed: int = 0, dtype: torch.dtype = torch.bfloat16,
                 device: str | torch.device = "cuda") -> model.TinyLlama:
    """A ``lib.model.TinyLlama`` of ``cfg`` whose weights are drawn on ``device`` from ``seed``: the same
    layout and scales as ``TinyLlama(cfg)`` (weights of standard deviation 0.02, an embedding of 1, norms
    of ones), other values (that constructor draws on the CPU)."""
    if cfg.heads % cfg.kv_heads or cfg.head_dim % 2:
        raise ValueError(f"heads ({cfg.heads}) must be a multiple of kv_heads ({cfg.kv_heads}) and head_dim "
                         f"({cfg.head_dim}) even")
    m = model.TinyLlama.__new__(model.TinyLlama)
    m.cfg, m.dtype, m.device = cfg, dtype, torch.device(device)
    gen = torch.Generator(device=m.device).manual_seed(seed)

    def w(*shape, std=0.02):
        return torch.randn(*shape, generator=gen, device=m.device, dtype=dtype).mul_(std)

    H, D = cfg.hidden, cfg.head_dim
    m.embed = w(cfg.vocab, H, std=1.0)
    m.layers = [{"attn_norm": torch.ones(H, dtype=dtype, device=m.device),
                 "wqkv": w(H, (cfg.heads + 2 * cfg.kv_heads) * D), "wo": w(cfg.heads * D, H),
                 "mlp_norm": torch.ones(H, dtype=dtype, device=m.device), "wgu": w(H, 2 * cfg.mlp),
                 "wd": w(cfg.mlp, H)} for _ in range(cfg.layers)]
    m.norm = torch.ones(H, dtype=dtype, device=m.device)
    m.head = w(H, cfg.vocab)
    m._inv_freq = (1.0 / cfg.rope_theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D)).to(m.device)
    return m


def _mm(x: torch.Tensor, w: torch.Tensor, reduce: bool = True) -> torch.Tensor:
    """x @ w through the book's skinny GEMM where it beats cuBLAS (``skinny_gemm.use_for``), else cuBLAS; with
    ``reduce=False`` a split-K product may return its partial sums [splits, M, N] for the next fused kernel
    to add."""
    if skinny_gemm.use_for(x.shape[0], w.shape[1], w.shape[0]):
        return skinny_gemm.skinny_mm(x, w, reduce=reduce)
    return x @ w


def _plan(plans: dict, q, kc, vc, table, lens) -> da.DecodeAttention:
    """The attention launch planned for these shapes (planned once per shape, reused by every layer)."""
    key = (tuple(q.shape), tuple(kc.shape), tuple(table.shape), q.dtype, q.device)
    if key not in plans:
        plans[key] = da.DecodeAttention(q, kc, vc, table, lens, check=False)
    return plans[key]


class FusedStep:
    """One decode step of ``m`` with the fused kernels of ``lib.kernels.fused`` and the skinny GEMM; called as
    ``m.decode`` is, with ``(tokens, pool, table, lens)``, it returns the logits [B, vocab]. Per layer: norm
    (with the residual add), QKV GEMM, RoPE + K/V write, attention, O GEMM, norm (with the residual add),
    gate-up GEMM, SiLU x up, down GEMM."""

    def __init__(self, m: model.TinyLlama):
        self.m = m
        self.inv_freq = m._inv_freq.float()
        self.plans = {}  # one attention launch plan per shape

    def __call__(self, tokens, pool, table, lens):
        return _mm(self._final_hidden(tokens, pool, table, lens), self.m.head)

    def greedy(self, tokens, pool, table, lens):
        """The step with greedy sampling fused into the output head: each request's next token [B] int64, the
        logits never written (``skinny_gemm.skinny_argmax``); the same tokens as ``self(...).argmax(-1)``."""
        h = self._final_hidden(tokens, pool, table, lens)
        if h.shape[0] > skinny_gemm.MAX_M:
            return _mm(h, self.m.head).argmax(-1)
        return skinny_gemm.skinny_argmax(h, self.m.head)

    def sample(self, tokens, pool, table, lens, top_p, temperature, seed):
        """The step with top-p sampling (``sampling.top_p_sample``, no sort): each request's next token [B]
        int64, drawn from softmax(logits / temperature) over its top-p set; ``top_p`` and ``temperature`` are
        floats or tensors [B], ``seed`` an int64 tensor [1] on the device (read at each call or graph replay)."""
        return sampling.top_p_sample(self(tokens, pool, table, lens), top_p, temperature, seed=seed)

    def _final_hidden(self, tokens, pool, table, lens):
        m, c = self.m, self.m.cfg
        pos = lens.long() - 1
        x = F.embedding(tokens, m.embed)
        res = None  # the residual stream, updated by each norm
        for li, L in enumerate(m.layers):
            h, res = fused.rmsnorm(x, L["attn_norm"], c.eps, residual=res)
            # split-K products hand their partial sums to the next fused kernel, which adds them as it loads
            q = fused.rope_write(_mm(h, L["wqkv"], False), pos, self.inv_freq, pool.k[li], pool.v[li], table, c.heads)
            o = _plan(self.plans, q, pool.k[li], pool.v[li], table, lens)(q, pool.k[li], pool.v[li], table, lens)
            h, res = fused.rmsnorm(_mm(o.reshape(len(tokens), -1), L["wo"], False), L["mlp_norm"], c.eps, residual=res)
            x = _mm(fused.silu_mul(_mm(h, L["wgu"])), L["wd"], False)
        h, _ = fused.rmsnorm(x, m.norm, c.eps, residual=res)
        return h


def _before_attention(x, norm_w, wqkv, cos, sin, k_rows, v_rows, rows, heads: int, kv_heads: int, head_dim: int,
                      eps: float):
    """RMSNorm, QKV, RoPE and the K/V write of ``TinyLlama._attn_in``, with explicit tensors (for compiling)."""
    h = F.rms_norm(x, (x.shape[-1],), norm_w, eps)
    qkv = (h @ wqkv).view(-1, heads + 2 * kv_heads, head_dim)
    qk = model.TinyLlama._rope(qkv[:, : heads + kv_heads], cos, sin)
    k_rows.index_copy_(0, rows, qk[:, heads:].reshape(-1, head_dim))
    v_rows.index_copy_(0, rows, qkv[:, heads + kv_heads:].reshape(-1, head_dim))
    return qk[:, :heads].contiguous()


def _after_attention(x, o, wo, norm_w, wgu, wd, eps: float):
    """The O GEMM with the residual and the SwiGLU MLP of ``TinyLlama._attn_out_and_mlp``."""
    x = torch.addmm(x, o.reshape(x.shape[0], -1), wo)
    g, u = (F.rms_norm(x, (x.shape[-1],), norm_w, eps) @ wgu).chunk(2, dim=-1)
    return torch.addmm(x, F.silu(g) * u, wd)


def _final(x, norm_w, head, eps: float):
    return F.rms_norm(x, (x.shape[-1],), norm_w, eps) @ head


class CompiledStep:
    """One decode step of ``m`` with the code around the attention kernel compiled by ``torch.compile``
    (one compiled function before the attention, one after, one for the head, each reused by every layer);
    called and returning as ``FusedStep``."""

    def __init__(self, m: model.TinyLlama, mode: str | None = None, backend: str = "inductor"):
        self.m = m
        opts = dict(mode=mode, dynamic=False, backend=backend)
        self.before = torch.compile(_before_attention, **opts)
        self.after = torch.compile(_after_attention, **opts)
        self.final = torch.compile(_final, **opts)
        self.plans = {}

    def __call__(self, tokens, pool, table, lens):
        m, c = self.m, self.m.cfg
        pos = lens.long() - 1
        batch = torch.arange(len(tokens), device=m.device)
        rows = m._slot_rows(pool, table[batch, pos // pool.block_size].long(), pos % pool.block_size)
        cos, sin = m._rope_tables(pos)
        x = F.embedding(tokens, m.embed)
        for li, L in enumerate(m.layers):
            kc, vc = pool.k[li], pool.v[li]
            q = self.before(x, L["attn_norm"], L["wqkv"], cos, sin, kc.view(-1, c.head_dim), vc.view(-1, c.head_dim),
                            rows, c.heads, c.kv_heads, c.head_dim, c.eps)
            o = _plan(self.plans, q, kc, vc, table, lens)(q, kc, vc, table, lens)
            x = self.after(x, o, L["wo"], L["mlp_norm"], L["wgu"], L["wd"], c.eps)
        return self.final(x, m.norm, m.head, c.eps)
