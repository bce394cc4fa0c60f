"""Chapter 7's fused decode step with its four layer products' weights quantized (chapter 9).

``QuantStep(m, fmt, group)`` quantizes every layer's QKV, O, gate-up and down weights of ``m`` once
(``lib.quant``: "int8" per output channel, "int4" in groups of ``group`` rows) and runs the step of
``lib.llama.FusedStep`` with those products through ``lib.kernels.quant_gemm``; the embedding, the norms,
attention, the KV cache and the output head stay as they are (engines keep the head in 16 bits too). Called
as ``FusedStep`` is, ``(tokens, pool, table, lens)``, it returns the logits [B, vocab]; ``greedy`` picks the
next tokens with the head's fused argmax. ``dequantized(m, fmt, group)`` is the same model with the weights
the step effectively uses, in ``m``'s dtype: what the step is checked against.

Chapters: 9.
"""

from __future__ import annotations

import copy

from lib import llama, quant
from lib.kernels import fused, quant_gemm, skinny_gemm

PRODUCTS = ("wqkv", "wo", "wgu", "wd")
FORMATS = ("int8", "int4")


def _quantize(w, fmt: str, group: int):
    if fmt == "int8":
        return quant.quantize_int8(w)
    if fmt == "int4":
        return quant.quantize_int4(w, group)
    raise ValueError(f"fmt must be one of {FORMATS}, got {fmt!r}")


def dequantized(m, fmt: str, group: int = 128):
    """A shallow copy of ``m`` whose layers' four products hold the dequantized weights (in ``m``'s dtype)."""
    out = copy.copy(m)
    out.layers = [{**L, **{k: _quantize(L[k], fmt, group).dequantize(L[k].dtype) for k in PRODUCTS}} for L in m.layers]
    return out


class QuantStep(llama.FusedStep):
    """The fused decode step of ``m`` with quantized layer weights (see the module)."""

    def __init__(self, m, fmt: str = "int4", group: int = 128):
        super().__init__(m)
        self.fmt, self.group = fmt, group
        self.weights = [{k: _quantize(L[k], fmt, group) for k in PRODUCTS} for L in m.layers]
        self._mm = quant_gemm.w8_mm if fmt == "int8" else quant_gemm.w4_mm

    def bytes_per_step(self) -> int:
        """Bytes the four products' weights and scales take, over all layers: what a step reads of them."""
        total = 0
        for W in self.weights:
            for q in W.values():
                parts = (q.q, q.scale) if self.fmt == "int8" else (q.packed, q.scale)
                total += sum(t.numel() * t.element_size() for t in parts)
        return total

    def greedy(self, tokens, pool, table, lens):
        h = self._final_hidden(tokens, pool, table, lens)
        if h.shape[0] > skinny_gemm.MAX_M:
            return llama._mm(h, self.m.head).argmax(-1)
        return skinny_gemm.skinny_argmax(h, self.m.head)

    def _final_hidden(self, tokens, pool, table, lens):
        m, c, mm = self.m, self.m.cfg, self._mm
        pos = lens.long() - 1
        x = llama.F.embedding(tokens, m.embed)
        res = None
        for li, (L, W) in enumerate(zip(m.layers, self.weights)):
            h, res = fused.rmsnorm(x, L["attn_norm"], c.eps, residual=res)
            q = fused.rope_write(mm(h, W["wqkv"]), pos, self.inv_freq, pool.k[li], pool.v[li], table, c.heads)
            o = llama._plan(self.plans, q, pool.k[li], pool.v[li], table, lens)(q, pool.k[li], pool.v[li], table, lens)
            h, res = fused.rmsnorm(mm(o.reshape(len(tokens), -1), W["wo"]), L["mlp_norm"], c.eps, residual=res)
            x = mm(fused.silu_mul(mm(h, W["wgu"])), W["wd"])
        h, _ = fused.rmsnorm(x, m.norm, c.eps, residual=res)
        return h
