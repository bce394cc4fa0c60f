"""A small Llama-style decoder with random weights, whose prefill reads and writes a paged KV pool.

RMSNorm, rotary position embeddings (RoPE), grouped-query attention and a SwiGLU MLP, as in Llama; the
weights are drawn from a fixed seed (nothing is downloaded), so logits mean nothing but are exactly
reproducible. ``prefill`` computes only the tokens from ``start`` on: the K and V of positions before
``start`` must already be in the request's blocks of the pool (a prefix-cache hit), and the new tokens'
K and V are written there. With ``start = 0`` it is an ordinary prefill; with one new token, a decode
step.

Token ids must lie in the vocabulary, [0, vocab): an id outside it is an error, never another token
(indexing the embedding with -1 would read the last row). Ids held on the host (a list, a tuple, a numpy
array, a CPU tensor) are always checked, which costs no device synchronisation; ids in a tensor on a GPU
are checked by value when ``check=True``, which reads them back (a host synchronisation, which a CUDA
graph cannot capture). Unchecked, an out-of-vocabulary id on a GPU still stops the step: the embedding is
looked up with ``F.embedding``, which refuses negative ids as well as those past the end (there, as a
device-side assert).

Sizes: ``CONFIGS["tiny"]`` runs on a CPU in milliseconds; ``CONFIGS["1b"]`` has about 1.1 billion
parameters for timings on a GPU.

Chapters: 5.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

import lib.kernels  # noqa: F401  (first: it chooses Triton's interpreter without a GPU, before torch imports Triton)
from lib.kv_pool import KVPool, integer_ids


@dataclass(frozen=True)
class Config:
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


# how far two ways of computing the same logits may differ, relative to the largest logit, by dtype and device
LOGITS_TOLERANCE = {("float32", "cpu"): 2e-5, ("float32", "cuda"): 5e-3, ("bfloat16", "cpu"): 0.1,
                    ("bfloat16", "cuda"): 0.1}


def config_for(name: str, dtype: str) -> Config:
    """The configuration called ``name``, checked with a ``dtype`` the logits checks know."""
    if name not in CONFIGS:
        raise ValueError(f"config must be one of {sorted(CONFIGS)}, got {name!r}")
    if dtype not in {d for d, _ in LOGITS_TOLERANCE}:
        raise ValueError(f"dtype must be one of {sorted({d for d, _ in LOGITS_TOLERANCE})} (a model dtype the checks "
                         f"know), got {dtype!r}")
    return CONFIGS[name]


def check_logits(what: str, got: torch.Tensor, expected: torch.Tensor, dtype: str, device: str) -> float:
    """Raise unless ``got`` equals ``expected`` (logits of the same shape) within ``LOGITS_TOLERANCE[dtype,
    device]`` of the largest expected logit; return the largest difference. Chapters 5 and 6 check every path
    they time this way (a cached prefill against the whole prompt, a decode step against a prefill)."""
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


CONFIGS = {
    "tiny": Config(vocab=97, hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, mlp=128),
    "1b": Config(vocab=32000, hidden=2048, layers=16, heads=32, kv_heads=8, head_dim=64, mlp=8192),
}


def _causal_attention(q, k, v, mask):
    """Causal attention of the last ``m`` of ``n`` positions: q [H_q, m, d], k and v [H_kv, n, d].

    ``mask`` (from ``_causal_mask``) aligns the causal mask to the bottom right (query i sits at position
    n - m + i), as a prefill after a cached prefix needs; nothing of size m x n is built, and the fused
    kernels skip the masked tiles, so the attention costs what the causal FLOPs say. GQA groups are
    expanded inside the kernel. On a GPU only fused kernels are allowed: the unfused fallback would
    materialise H_q x m x n scores (128 GiB at 32k tokens), so a shape no fused kernel takes raises an
    error instead."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if q.is_cuda and q.dtype == torch.float32:  # flash takes 16-bit types; memory-efficient takes fp32, not groups
        g = q.shape[0] // k.shape[0]
        k, v = k.repeat_interleave(g, 0), v.repeat_interleave(g, 0)
    q, k, v = q[None], k[None], v[None]  # fused kernels take [batch, heads, tokens, d]
    if q.is_cuda:
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]):
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True, **mask)[0]
    return F.scaled_dot_product_attention(q, k, v, enable_gqa=True, **mask)[0]


def _causal_mask(m: int, n: int) -> dict:
    from torch.nn.attention.bias import causal_lower_right

    return dict(is_causal=True) if m == n else dict(attn_mask=causal_lower_right(m, n))


class TinyLlama:
    """The projections are stored fused, as serving engines store them: Q, K and V in one matrix
    [hidden, (H_q + 2 H_kv) d], gate and up in one [hidden, 2 mlp], so a layer runs few, large GEMMs."""

    def __init__(self, cfg: Config, *, seed: int = 0, dtype: torch.dtype = torch.float32,
                 device: str | torch.device = "cpu"):
        if cfg.heads % cfg.kv_heads:
            raise ValueError(f"heads ({cfg.heads}) must be a multiple of kv_heads ({cfg.kv_heads})")
        if cfg.head_dim % 2:
            raise ValueError(f"head_dim must be even for rotary embeddings, got {cfg.head_dim}")
        self.cfg, self.dtype, self.device = cfg, dtype, torch.device(device)
        gen = torch.Generator(device="cpu").manual_seed(seed)

        def w(*shape, std=0.02):
            return (torch.randn(*shape, generator=gen) * std).to(dtype=dtype, device=device)

        H, D = cfg.hidden, cfg.head_dim
        self.embed = w(cfg.vocab, H, std=1.0)
        self.layers = []
        for _ in range(cfg.layers):
            wq, wk, wv = w(H, cfg.heads * D), w(H, cfg.kv_heads * D), w(H, cfg.kv_heads * D)
            wo = w(cfg.heads * D, H)
            wg, wu, wd = w(H, cfg.mlp), w(H, cfg.mlp), w(cfg.mlp, H)
            self.layers.append({
                "attn_norm": torch.ones(H, dtype=dtype, device=device), "wqkv": torch.cat([wq, wk, wv], 1), "wo": wo,
                "mlp_norm": torch.ones(H, dtype=dtype, device=device), "wgu": torch.cat([wg, wu], 1), "wd": wd})
        self.norm = torch.ones(H, dtype=dtype, device=device)
        self.head = w(H, cfg.vocab)
        inv = 1.0 / cfg.rope_theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D)
        self._inv_freq = inv.to(device)

    def new_pool(self, num_blocks: int, block_size: int) -> KVPool:
        c = self.cfg
        return KVPool(num_blocks, block_size, layers=c.layers, kv_heads=c.kv_heads, head_dim=c.head_dim,
                      dtype=self.dtype, device=self.device)

    def _rope_tables(self, pos):
        """cos and sin [m, 1, d/2] of the rotary angles at positions ``pos``, once per forward pass."""
        ang = pos.to(torch.float64)[:, None] * self._inv_freq[None, :]
        return ang.cos().to(self.dtype)[:, None, :], ang.sin().to(self.dtype)[:, None, :]

    @staticmethod
    def _rope(x, cos, sin):
        """Rotate pairs (x[..., :d/2], x[..., d/2:]) by the angles; x: [m, heads, d]."""
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)

    def _token_ids(self, tokens, check: bool) -> torch.Tensor:
        """``tokens`` as a one-dimensional integer tensor on the model's device, checked to lie in the vocabulary
        (see the module: a GPU tensor's values only with ``check``)."""
        vocab = self.cfg.vocab
        if not isinstance(tokens, torch.Tensor):
            return torch.tensor(integer_ids(tokens, "token", vocab, "the vocabulary"), dtype=torch.long,
                                device=self.device)
        if tokens.dtype.is_floating_point or tokens.dtype.is_complex or tokens.dtype == torch.bool:
            raise TypeError(f"token ids must be integers, got a tensor of {tokens.dtype}")
        if tokens.dim() != 1:
            raise ValueError(f"token ids must be one-dimensional, got a tensor of shape {tuple(tokens.shape)}")
        if (tokens.device.type == "cpu" or check) and len(tokens):
            lo, hi = (int(v) for v in torch.aminmax(tokens))  # one read back from a GPU
            if lo < 0 or hi >= vocab:
                integer_ids(tokens, "token", vocab, "the vocabulary")  # raises, naming the first id outside it
        return tokens.to(device=self.device, dtype=torch.long)

    def _norm(self, x, weight):
        return F.rms_norm(x, (x.shape[-1],), weight, self.cfg.eps)

    def _slot_rows(self, pool, blocks, slots):
        """Rows of a layer's K (or V) storage viewed as [blocks * H_kv * page, d] for tokens at (blocks,
        slots): [m * H_kv], token-major, so one index_copy_ writes all heads of all new tokens."""
        heads = torch.arange(self.cfg.kv_heads, device=self.device)
        return ((blocks[:, None] * self.cfg.kv_heads + heads[None, :]) * pool.block_size + slots[:, None]).reshape(-1)

    def _attn_in(self, li, L, x, rope, pool, rows):
        """The layer's query [m, H_q, d], and its new K and V (RoPE applied) written into the pool."""
        c = self.cfg
        h = self._norm(x, L["attn_norm"])
        qkv = (h @ L["wqkv"]).view(-1, c.heads + 2 * c.kv_heads, c.head_dim)
        qk = self._rope(qkv[:, : c.heads + c.kv_heads], *rope)
        pool.k[li].view(-1, c.head_dim).index_copy_(0, rows, qk[:, c.heads:].reshape(-1, c.head_dim))
        pool.v[li].view(-1, c.head_dim).index_copy_(0, rows, qkv[:, c.heads + c.kv_heads:].reshape(-1, c.head_dim))
        return qk[:, : c.heads]

    def _attn_out_and_mlp(self, L, x, o):
        """Residual add of the attention output [m, heads, d], then the SwiGLU MLP block."""
        x = torch.addmm(x, o.reshape(-1, self.cfg.heads * self.cfg.head_dim), L["wo"])
        g, u = (self._norm(x, L["mlp_norm"]) @ L["wgu"]).chunk(2, dim=-1)
        return torch.addmm(x, F.silu(g) * u, L["wd"])

    @torch.no_grad()
    def prefill(self, tokens, pool: KVPool, blocks: list[int], start: int = 0, *, last_only: bool = False,
                check: bool = False) -> torch.Tensor:
        """Logits [n - start, vocab] of tokens[start:]; K/V of positions < start are read from the pool.

        ``last_only``: only the last token's logits [1, vocab], all a server needs for the first output
        token (the output head then runs once instead of n - start times). ``tokens`` and ``blocks`` may
        be lists or tensors on the model's device; with tensors a prefill has no host synchronisation and
        can be captured in a CUDA graph. ``check=True`` also checks token ids held on a GPU (see the
        module), at the price of that synchronisation."""
        c = self.cfg
        ids = self._token_ids(tokens, check)
        n = len(ids)
        bs = pool.block_size
        if not 0 <= start < n:
            raise ValueError(f"start must be in [0, {n}) for {n} tokens, got {start}")
        if len(blocks) < -(-n // bs):
            raise ValueError(f"{n} tokens need {-(-n // bs)} blocks of {bs}, got {len(blocks)}")
        blk = torch.as_tensor(blocks, device=self.device)
        pos = torch.arange(start, n, device=self.device)
        rows = self._slot_rows(pool, blk[pos // bs], pos % bs)  # where the new tokens' K and V go
        # a layer's storage viewed as pages [blocks * H_kv, page * d]: one page holds one head's keys of one
        # block, contiguous. Gathering the request's pages head by head gives [H_kv, pages * page, d] in one
        # index_select of whole pages (not of single token rows, which reads at a fraction of the bandwidth)
        pages = -(-n // bs)
        heads = torch.arange(c.kv_heads, device=self.device)
        gather = (blk[:pages][None, :] * c.kv_heads + heads[:, None]).reshape(-1)
        rope, mask = self._rope_tables(pos), _causal_mask(n - start, n)
        x = F.embedding(ids[start:], self.embed)
        for li, L in enumerate(self.layers):
            q = self._attn_in(li, L, x, rope, pool, rows)
            K = pool.k[li].view(-1, bs * c.head_dim).index_select(0, gather).view(c.kv_heads, -1, c.head_dim)[:, :n]
            V = pool.v[li].view(-1, bs * c.head_dim).index_select(0, gather).view(c.kv_heads, -1, c.head_dim)[:, :n]
            x = self._attn_out_and_mlp(L, x, _causal_attention(q.transpose(0, 1), K, V, mask).transpose(0, 1))
        if last_only:
            x = x[-1:]
        return self._norm(x, self.norm) @ self.head

    @torch.no_grad()
    def decode(self, tokens, pool: KVPool, block_table: torch.Tensor, seq_lens: torch.Tensor, *,
               check: bool = True) -> torch.Tensor:
        """One decode step for a batch: logits [B, vocab] of the new tokens ``tokens`` [B].

        Request b's new token sits at position ``seq_lens[b] - 1`` (``seq_lens`` counts it); its K and V
        are written into the request's blocks (``block_table`` [B, pages], int32) and attention over the
        request's ``seq_lens[b]`` tokens runs in ``lib.kernels.decode_attention``, one launch per layer.
        ``check=False`` skips the checks that read the lengths and the token ids back from a GPU (see the
        module for the ids): without them the step has no host synchronisation and can be captured in a CUDA
        graph.
        """
        from lib.kernels import decode_attention as da

        bs = pool.block_size
        ids = self._token_ids(tokens, check)
        lens = seq_lens.to(device=self.device, dtype=torch.int32)
        table = block_table.to(device=self.device, dtype=torch.int32)
        if not len(ids) == len(lens) == len(table):
            raise ValueError(f"a decode step takes one token, one length and one block-table row per request: got "
                             f"{len(ids)} tokens, {len(lens)} lengths and {len(table)} rows")
        pos = lens.long() - 1
        if check and ((pos < 0).any() or (lens > table.shape[1] * bs).any()):
            raise ValueError("every seq_len must be at least 1 and fit in the request's blocks")
        batch = torch.arange(len(ids), device=self.device)
        rows = self._slot_rows(pool, table[batch, pos // bs].long(), pos % bs)
        rope = self._rope_tables(pos)
        x = F.embedding(ids, self.embed)
        plan = None
        for li, L in enumerate(self.layers):
            q = self._attn_in(li, L, x, rope, pool, rows).contiguous()
            kc, vc = pool.k[li], pool.v[li]
            if plan is None:
                plan = da.DecodeAttention(q, kc, vc, table, lens, check=check)
            x = self._attn_out_and_mlp(L, x, plan(q, kc, vc, table, lens))
        return self._norm(x, self.norm) @ self.head
