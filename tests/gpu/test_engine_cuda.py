"""The serving engine on a CUDA GPU: decode steps replayed as CUDA graphs give the tokens of the eager path,
with pre-emption and with greedy and top-p requests in one batch; the pool's blocks all come back. Skipped
without CUDA."""

from __future__ import annotations

import pytest
import torch

from lib import models
from lib.engine import EngineConfig, LLMEngine, SamplingParams

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(scope="module")
def tiny():
    return models.Llama.random(models.CONFIGS["tiny"], seed=0, device="cuda")  # float32


def prompts(n):
    g = torch.Generator().manual_seed(0)
    return [torch.randint(0, models.CONFIGS["tiny"].vocab, (3 + 5 * i,), generator=g).tolist() for i in range(n)]


def outputs(m, cfg, sps, graphs):
    e = LLMEngine.from_model(m, cfg, graphs=graphs)
    ids = [e.add_request(p, sp) for p, sp in zip(prompts(len(sps)), sps)]
    e.run()
    assert e.pool.free_count + len(e.scheduler.cache.evictable) == e.usable_blocks
    return [e.requests[i].output for i in ids], e


def test_graph_steps_give_the_eager_tokens_with_preemption(tiny):
    cfg = EngineConfig(block_size=16, num_blocks=9, max_model_len=128, max_num_seqs=8, max_num_batched_tokens=64)
    sps = [SamplingParams(max_tokens=24) for _ in range(10)]
    graph, e = outputs(tiny, cfg, sps, True)
    eager, _ = outputs(tiny, cfg, sps, False)
    assert sum(s["graph"] for s in e.steps) > 10 and e.scheduler.preemptions > 0
    assert graph == eager


def test_greedy_and_top_p_in_one_graph(tiny):
    cfg = EngineConfig(block_size=16, num_blocks=256, max_model_len=256, max_num_seqs=8)
    greedy = [SamplingParams(max_tokens=12) for _ in range(6)]
    mixed = [SamplingParams(max_tokens=12, temperature=1.0, top_p=0.9) if i % 2 else sp for i, sp in enumerate(greedy)]
    ref, _ = outputs(tiny, cfg, greedy, False)
    got, e = outputs(tiny, cfg, mixed, True)
    assert any(not s["graph"] for s in e.steps) and sum(s["graph"] for s in e.steps) > 5
    for i, (a, b) in enumerate(zip(got, ref)):
        if i % 2 == 0:
            assert a == b  # greedy rows of a sampling graph take the argmax
        else:
            assert len(a) == 12 and all(0 <= t < models.CONFIGS["tiny"].vocab for t in a)
    assert got[1::2] != ref[1::2]  # the drawn rows are drawn
