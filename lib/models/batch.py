"""What one forward pass computes: a step's tokens, where their K and V go, and what each attends over.

A ``StepBatch`` lays a step out as rows: first the prefill chunks (each a run of consecutive positions of
one request), then the decodes (one new token per request). Every row has a token id and a position;
the rows go through the same GEMMs together, and only attention is per request:

- a prefill ``Segment`` of ``n`` rows starting at row ``first`` attends causally over the request's
  first ``ctx`` positions (its own ``n`` new tokens last), whose K and V are gathered from its pages
  (``gather``: the rows of a layer's storage viewed as [blocks * H_kv, page * d], page by page);
- the decode rows attend over their requests' pages through a block table [B, pages] and lengths [B]
  (each length counts the new token), in one launch of the paged decode-attention kernel.

The new tokens' K and V are written at (``blocks``, ``slots``): the block and the slot in it of each row
(for decode rows they follow from the block table and the lengths, and may be left out).
``out_rows`` picks the rows whose logits are wanted (None: all): a prefill needs only its last token's.

Chapters: 5-10.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from lib.kv_pool import integer_ids


@dataclass(frozen=True)
class Segment:
    first: int
    n: int
    gather: torch.Tensor
    ctx: int


@dataclass
class StepBatch:
    ids: torch.Tensor
    pos: torch.Tensor
    segments: list[Segment] = field(default_factory=list)
    decode: tuple | None = None  # (first row, block table [B, pages] int32, lengths [B] int32)
    blocks: torch.Tensor | None = None
    slots: torch.Tensor | None = None
    out_rows: object = None  # None, a slice or an index tensor
    check: bool = False  # check the decode rows' lengths and block table by value (reads them back)

    @property
    def decodes_only(self) -> bool:
        return not self.segments and self.decode is not None


def token_ids(tokens, vocab: int, device: torch.device, check: bool) -> torch.Tensor:
    """``tokens`` as a one-dimensional integer tensor on ``device``, checked to lie in [0, vocab): ids held on
    the host (a list, a tuple, a numpy array, a CPU tensor) always, which costs no device synchronisation;
    ids in a tensor on a GPU only with ``check``, which reads them back (a host synchronisation, which a
    CUDA graph cannot capture). Unchecked, an id outside the vocabulary still stops the step: the embedding
    is looked up with ``F.embedding``, which refuses negative ids as well as those past the end."""
    if not isinstance(tokens, torch.Tensor):
        return torch.tensor(integer_ids(tokens, "token", vocab, "the vocabulary"), dtype=torch.long, device=device)
    if tokens.dtype.is_floating_point or tokens.dtype.is_complex or tokens.dtype == torch.bool:
        raise TypeError(f"token ids must be integers, got a tensor of {tokens.dtype}")
    if tokens.dim() != 1:
        raise ValueError(f"token ids must be one-dimensional, got a tensor of shape {tuple(tokens.shape)}")
    if (tokens.device.type == "cpu" or check) and len(tokens):
        lo, hi = (int(v) for v in torch.aminmax(tokens))  # one read back from a GPU
        if lo < 0 or hi >= vocab:
            integer_ids(tokens, "token", vocab, "the vocabulary")  # raises, naming the first id outside it
    return tokens.to(device=device, dtype=torch.long)


def page_rows(pages: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """The rows of a layer's storage viewed as [blocks * H_kv, page * d] that hold ``pages`` (a request's
    blocks, in order), head by head: gathered, they give its K (or V) as [H_kv, pages * page, d] in one
    index_select of whole pages (not of single token rows, which reads at a fraction of the bandwidth)."""
    heads = torch.arange(kv_heads, device=pages.device)
    return (pages[None, :] * kv_heads + heads[:, None]).reshape(-1)


def prefill(tokens, blocks, start: int, block_size: int, kv_heads: int, vocab: int, device: torch.device, *,
            last_only: bool = False, check: bool = False) -> StepBatch:
    """The batch of one request's prefill of ``tokens[start:]`` (positions before ``start`` are in its
    ``blocks`` already: a prefix-cache hit)."""
    ids = token_ids(tokens, vocab, device, check)
    n, bs = len(ids), block_size
    if not 0 <= start < n:
        raise ValueError(f"start must be in [0, {n}) for {n} tokens, got {start}")
    if len(blocks) < -(-n // bs):
        raise ValueError(f"{n} tokens need {-(-n // bs)} blocks of {bs}, got {len(blocks)}")
    blk = torch.as_tensor(blocks, device=device)
    pos = torch.arange(start, n, device=device)
    seg = Segment(0, n - start, page_rows(blk[: -(-n // bs)], kv_heads), n)
    return StepBatch(ids[start:], pos, [seg], None, blk[pos // bs], pos % bs,
                     slice(-1, None) if last_only else None, check)


def decode(tokens, block_table: torch.Tensor, seq_lens: torch.Tensor, block_size: int, vocab: int,
           device: torch.device, *, check: bool = True) -> StepBatch:
    """The batch of one decode step: request b's new token ``tokens[b]`` sits at position ``seq_lens[b] - 1``
    (``seq_lens`` counts it), in its blocks ``block_table[b]``. ``check`` also reads back the lengths (each at
    least 1 and within the request's blocks) and GPU-held token ids."""
    ids = token_ids(tokens, vocab, device, check)
    lens = seq_lens.to(device=device, dtype=torch.int32)
    table = block_table.to(device=device, dtype=torch.int32)
    if not len(ids) == len(lens) == len(table):
        raise ValueError(f"a decode step takes one token, one length and one block-table row per request: got "
                         f"{len(ids)} tokens, {len(lens)} lengths and {len(table)} rows")
    pos = lens.long() - 1
    if check and ((pos < 0).any() or (lens > table.shape[1] * block_size).any()):
        raise ValueError("every seq_len must be at least 1 and fit in the request's blocks")
    return StepBatch(ids, pos, [], (0, table, lens), check=check)
