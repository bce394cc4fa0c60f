"""A small serving engine on the book's parts: continuous batching, chunked prefill, a paged KV pool with a
prefix cache, decode through chapter 7's fused step in CUDA graphs, greedy and top-p sampling.

- ``lib.engine.config``: ``EngineConfig`` (the settings, by the names serving engines use) and
  ``SamplingParams``; ``RequestError`` for a request the engine refuses.
- ``lib.engine.policy``: ``Policy`` and ``Bucket``, the batching policy the scheduler consults (chapter 6's
  static, dynamic and continuous batching, queues by length, windows).
- ``lib.engine.scheduler``: ``Scheduler``, who runs each step, with which KV; the one set of scheduling
  rules, which chapter 6's simulator (``lib.simulator``) runs too.
- ``lib.engine.kv``: the KV the scheduler holds: ``BlockKV`` (the paged pool and prefix cache) or
  ``TokenKV`` (the simulator's counted tokens).
- ``lib.engine.cost``: the step-cost protocol, the cost models and their fits (calibration and service).
- ``lib.engine.runner``: ``ModelRunner``, the step on the model (one forward pass; decode steps as CUDA
  graphs).
- ``lib.engine.engine``: ``LLMEngine``, the loop and its records; ``replay`` runs a workload through it.
- ``lib.engine.server``: ``AsyncEngine``, the asyncio front end (a stream of tokens per request).
- ``lib.engine.metrics``: latency percentiles, goodput and the Prometheus exporter.

Chapters: 6, 8.
"""

from lib.engine.config import EngineConfig, RequestError, SamplingParams
from lib.engine.engine import CostRunner, EngineOverloaded, LLMEngine, VirtualClock, replay

__all__ = ["CostRunner", "EngineConfig", "EngineOverloaded", "LLMEngine", "RequestError", "SamplingParams",
           "VirtualClock", "replay"]
