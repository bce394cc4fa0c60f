"""The model runner: one engine step on the model, and the tokens it samples.

A step's tokens (the prefill chunks' and one per decoding request) are laid out as one
``lib.models.batch.StepBatch`` and run through the model in one forward pass (``Llama.forward``):
every token goes through the same GEMMs together (M = all the step's tokens, so a step costs what the
step-cost model says: a function of its token count), and only attention is per request: each prefill
chunk attends over its request's pages gathered whole (causal, after the tokens already in the pool),
the decodes in one launch of chapter 3's paged decode-attention kernel. The new tokens' K and V are
written into the pool first.

A step that only decodes (most steps, once prompts are in) runs the same model under chapter 7's fused
parts (``lib.models.FUSED``) captured in a CUDA graph, one graph per batch size of
``EngineConfig.graph_batch_sizes`` and sampling mode: a batch of B requests replays the smallest graph
of at least B, its extra rows decoding a padding token into a block no request owns. The greedy graph
takes the next token from the fused output head (the logits are never written); the sampling graph
writes the logits, takes their argmax for greedy requests and draws top-p tokens
(``lib.kernels.sampling``) for the others. Without a GPU (or beyond the largest graph) the decode step
runs through ``forward`` too.

The runner reports each step's GPU time (CUDA events around the model's work) and how long the host
waited for it, so the engine can tell host time from GPU time.

Chapters: 8.
"""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass

import torch

from lib.engine.config import EngineConfig
from lib.engine.scheduler import Plan
from lib.kernels import sampling
from lib.kv_pool import KVPool
from lib.models import FUSED, Llama, ModelConfig
from lib.models.batch import Segment, StepBatch, page_rows


@dataclass
class StepResult:
    """What the model gave for one step: a token per sampled request, the GPU time (s, NaN on a CPU), how
    long the host waited for the device (s), and whether a CUDA graph ran it."""

    tokens: list[int]
    gpu_s: float
    wait_s: float
    graph: bool


def kv_bytes_per_block(cfg: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    """Bytes one block of the pool takes: K and V of ``block_size`` tokens in every layer."""
    return 2 * cfg.layers * cfg.kv_heads * block_size * cfg.head_dim * torch.empty((), dtype=dtype).element_size()


def pool_blocks(m: Llama, config: EngineConfig) -> int:
    """The pool's size: ``config.num_blocks``, or what the device's free memory holds times
    ``gpu_memory_utilization`` (a CPU run must give ``num_blocks``)."""
    if config.num_blocks is not None:
        return config.num_blocks
    if m.device.type != "cuda":
        raise ValueError("num_blocks must be given on a CPU: the pool's size is derived from free GPU memory only")
    free, _ = torch.cuda.mem_get_info(m.device)
    return int(free * config.gpu_memory_utilization // kv_bytes_per_block(m.cfg, config.block_size, m.dtype))


class ModelRunner:
    """Runs the engine's steps on ``m`` with its KV in ``pool`` (see the module)."""

    def __init__(self, m: Llama, pool: KVPool, config: EngineConfig, *, graphs: bool | None = None):
        self.m, self.pool, self.config = m, pool, config
        self.device = m.device
        self.cuda = self.device.type == "cuda"
        self.pad_block = pool.allocate(1)[0]  # padding rows of a graph write here; no request owns it
        self.width = -(-config.max_model_len // pool.block_size)  # block-table columns
        self.step_count = 0
        self.seed = torch.zeros(1, dtype=torch.int64, device=self.device)
        self.graphs = {}  # (batch size, mode) -> _Graph
        self.graph_pool = None  # one memory pool shared by the runner's graphs (a pool outlives no runner)
        self.fused = m.with_parts(FUSED)  # the same weights under chapter 7's fused parts: the graphs' step
        self.use_graphs = self.cuda if graphs is None else graphs
        if self.use_graphs and not self.cuda:
            raise ValueError("CUDA graphs need a GPU: pass graphs=False (or None) on a CPU")

    # ------------------------------------------------------------------ one step
    def run(self, plan: Plan) -> StepResult:
        self.step_count += 1
        sampled = plan.sampled
        params = [x.params for x in sampled]
        if (not plan.prefills and self.use_graphs and len(plan.decodes) <= self.config.graph_batch_sizes[-1]):
            return self._run_graph(plan.decodes, all(p.greedy for p in params))
        start, end = self._events()
        logits = self._forward(plan)
        tokens = self._sample(logits, params)
        if end is not None:
            end.record()
        t = time.perf_counter()
        out = tokens.tolist()
        if end is not None:
            end.synchronize()  # the copy above waited for the stream, not necessarily for the event
        wait = time.perf_counter() - t
        return StepResult(out, start.elapsed_time(end) / 1e3 if end is not None else float("nan"), wait, False)

    def _events(self):
        if not self.cuda:
            return None, None
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        return start, end

    def _forward(self, plan: Plan) -> torch.Tensor:
        """The step's rows laid out as a ``StepBatch`` (one copy to the device), and their logits."""
        bs = self.pool.block_size
        ids, pos, blk, slots, segments, out_rows, row = [], [], [], [], [], [], 0
        pages_of = []
        for x, s, e in plan.prefills:
            toks, blocks = x.tokens, x.lease.blocks
            ids += toks[s:e]
            pos += range(s, e)
            blk += [blocks[p // bs] for p in range(s, e)]
            slots += [p % bs for p in range(s, e)]
            pages_of.append(blocks[: -(-e // bs)])
            segments.append((row, e - s, e))
            row += e - s
            if e == x.target:
                out_rows.append(row - 1)
        first_decode = row
        for x in plan.decodes:
            n, blocks = x.length, x.lease.blocks
            ids.append(x.last_token)
            pos.append(n - 1)
            blk.append(blocks[(n - 1) // bs])
            slots.append((n - 1) % bs)
            out_rows.append(row)
            row += 1
        dev, H = self.device, self.m.cfg.kv_heads
        host = torch.tensor([ids, pos, blk, slots], dtype=torch.long)
        ids_t, pos_t, blk_t, slots_t = host.to(dev, non_blocking=True).unbind(0)
        segs = [Segment(first, n, page_rows(torch.tensor(pages, dtype=torch.long), H).to(dev), ctx)
                for (first, n, ctx), pages in zip(segments, pages_of)]
        decode = None
        if plan.decodes:
            table = torch.full((len(plan.decodes), self.width), self.pad_block, dtype=torch.int32)
            for i, x in enumerate(plan.decodes):
                table[i, : len(x.lease.blocks)] = torch.tensor(x.lease.blocks, dtype=torch.int32)
            lens = torch.tensor([x.length for x in plan.decodes], dtype=torch.int32)
            decode = (first_decode, table.to(dev), lens.to(dev))
        out = torch.tensor(out_rows, dtype=torch.long, device=dev)
        return self.m.forward(StepBatch(ids_t, pos_t, segs, decode, blk_t, slots_t, out), self.pool)

    def _sample(self, logits: torch.Tensor, params) -> torch.Tensor:
        """Greedy tokens for greedy requests, top-p draws for the others."""
        tokens = logits.argmax(-1)
        drawn = [i for i, p in enumerate(params) if not p.greedy]
        if drawn:
            idx = torch.tensor(drawn, device=self.device)
            top_p = torch.tensor([params[i].top_p for i in drawn], dtype=torch.float32, device=self.device)
            temp = torch.tensor([params[i].temperature for i in drawn], dtype=torch.float32, device=self.device)
            self.seed.fill_(self.config.seed * 1_000_003 + self.step_count)
            tokens[idx] = sampling.top_p_sample(logits[idx].contiguous(), top_p, temp, seed=self.seed)
        return tokens

    # ------------------------------------------------------------------ CUDA graphs of decode steps
    def _run_graph(self, decodes, greedy: bool) -> StepResult:
        sizes = self.config.graph_batch_sizes
        b = sizes[bisect.bisect_left(sizes, len(decodes))]
        g = self.graphs.get((b, greedy))
        if g is None:
            g = self.graphs[(b, greedy)] = _Graph(self, b, greedy)
        start, end = self._events()
        g.fill(decodes, self.config.seed * 1_000_003 + self.step_count)
        g.graph.replay()
        end.record()
        t = time.perf_counter()
        out = g.out[: len(decodes)].tolist()
        end.synchronize()
        wait = time.perf_counter() - t
        return StepResult(out, start.elapsed_time(end) / 1e3, wait, True)

    def capture(self, batch_sizes=None, modes=(True, False)) -> None:
        """Capture the decode graphs ahead of the first requests (else each is captured at its first use)."""
        for b in batch_sizes or self.config.graph_batch_sizes:
            for greedy in modes:
                if (b, greedy) not in self.graphs:
                    self.graphs[(b, greedy)] = _Graph(self, b, greedy)


class _Graph:
    """One captured decode step of ``b`` rows (see the module): static inputs, filled before each replay."""


    def __init__(self, runner: ModelRunner, b: int, greedy: bool):
        r, dev = runner, runner.device
        self.runner, self.b, self.greedy = r, b, greedy
        self.host = torch.zeros(5, b, dtype=torch.float64).pin_memory()
        self.host_table = torch.full((b, r.width), r.pad_block, dtype=torch.int32).pin_memory()
        self.rows = [None] * b
        self.tokens = torch.zeros(b, dtype=torch.long, device=dev)
        self.lens = torch.ones(b, dtype=torch.int32, device=dev)
        self.table = torch.full((b, r.width), r.pad_block, dtype=torch.int32, device=dev)
        self.top_p = torch.ones(b, dtype=torch.float32, device=dev)
        self.temp = torch.ones(b, dtype=torch.float32, device=dev)
        self.take_drawn = torch.zeros(b, dtype=torch.bool, device=dev)
        step = r.fused

        def body():
            if greedy:
                return step.greedy(self.tokens, r.pool, self.table, self.lens)
            logits = step(self.tokens, r.pool, self.table, self.lens)
            drawn = sampling.top_p_sample(logits, self.top_p, self.temp, seed=r.seed)
            return torch.where(self.take_drawn, drawn, logits.argmax(-1))

        torch.cuda.synchronize(dev)
        stream = torch.cuda.Stream(dev)
        stream.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(stream):
            body()  # compiles and plans outside the capture
        torch.cuda.current_stream(dev).wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        if runner.graph_pool is None:
            runner.graph_pool = torch.cuda.graph_pool_handle()
        with torch.cuda.graph(self.graph, pool=runner.graph_pool):
            self.out = body()

    def fill(self, decodes, seed: int) -> None:
        """Copy the batch's tokens, lengths, sampling parameters and block tables into the graph's inputs;
        rows past the batch decode a padding token of length 1."""
        n, h, t = len(decodes), self.host.numpy(), self.host_table.numpy()  # views of the pinned buffers
        h[0, :n] = [x.last_token for x in decodes]
        h[1, :n] = [x.length for x in decodes]
        h[2, :n] = [x.params.top_p for x in decodes]
        h[3, :n] = [x.params.temperature or 1.0 for x in decodes]
        h[4, :n] = [0.0 if x.params.greedy else 1.0 for x in decodes]
        h[:, n:] = 1.0
        h[0, n:] = h[4, n:] = 0.0
        rows = self.rows  # the (request, blocks held) each table row was last written for: rewrite what changed
        for i, x in enumerate(decodes):
            blocks = x.lease.blocks
            key = (x.id, x.preemptions, len(blocks))  # a pre-empted request comes back with other blocks
            if rows[i] != key:
                t[i, : len(blocks)] = blocks
                t[i, len(blocks):] = self.runner.pad_block
                rows[i] = key
        for i in range(n, self.b):
            if rows[i] is not None:
                t[i] = self.runner.pad_block
                rows[i] = None
        dev = self.tokens.device
        hd = self.host.to(dev, non_blocking=True)
        self.tokens.copy_(hd[0])
        self.lens.copy_(hd[1])
        self.top_p.copy_(hd[2])
        self.temp.copy_(hd[3])
        self.take_drawn.copy_(hd[4] > 0)
        self.table.copy_(self.host_table, non_blocking=True)
        self.runner.seed.fill_(seed)
