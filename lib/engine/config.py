"""The engine's settings and a request's sampling parameters, checked where they are written.

``EngineConfig`` uses the names a serving engine's users know (vLLM's): ``max_num_seqs`` (requests
running at once), ``max_num_batched_tokens`` (prompt tokens one step may prefill), ``block_size``
(tokens per KV block), ``num_blocks`` (blocks in the pool), ``max_model_len`` (prompt plus output),
``enable_prefix_caching`` and ``enable_chunked_prefill`` (a prompt prefilled in pieces of at most
``long_prefill_token_threshold`` tokens). The book's batching policies of chapter 6 are selected by
``policy`` ("static", "dynamic" or "continuous"), with ``max_wait`` (a batching window, in seconds),
``buckets`` (queues by prompt length, each with a priority: ``lib.engine.policy.Bucket``) and
``prefill_first`` (a step that prefills runs no decode). ``as_policy`` gives the same settings as the
scheduler's ``lib.engine.policy.Policy``, which chapter 6's simulator runs too.

``max_num_batched_tokens`` counts prompt tokens only, as the simulator's ``token_budget`` does; vLLM also
counts one token per decoding request.

Chapters: 8.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from numbers import Integral, Real

from lib.engine.policy import KINDS, Bucket, Policy


class RequestError(ValueError):
    """A request the engine refuses; the message says what is wrong and how to fix it. Nothing changed."""


def _whole(value, at_least: int = 1) -> bool:
    return isinstance(value, Integral) and not isinstance(value, bool) and value >= at_least


def _real(value) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool)


@dataclass(frozen=True)
class SamplingParams:
    """How one request's tokens are chosen. ``temperature`` 0 is greedy (the most likely token); above 0 a
    token is drawn from softmax(logits / temperature) over the smallest set of most likely tokens whose
    probability reaches ``top_p`` (``lib.kernels.sampling``). The request ends after ``max_tokens`` tokens,
    or at a token of ``stop_token_ids`` (kept in the output) unless ``ignore_eos``."""

    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self):
        if not _whole(self.max_tokens):
            raise RequestError(f"max_tokens must be a whole number >= 1, got {self.max_tokens!r}: a request must "
                               "ask for at least one token")
        if not (_real(self.temperature) and math.isfinite(self.temperature) and self.temperature >= 0):
            raise RequestError(f"temperature must be a finite number >= 0 (0 for greedy), got {self.temperature!r}")
        if not (_real(self.top_p) and 0 < self.top_p <= 1):
            raise RequestError(f"top_p must lie in (0, 1] (1 keeps every token), got {self.top_p!r}")
        stops = self.stop_token_ids
        if isinstance(stops, (str, bytes)) or not hasattr(stops, "__iter__"):
            hint = f": write one stop token as ({stops!r},)" if _whole(stops, 0) else ""
            raise RequestError(f"stop_token_ids must be a tuple or list of token ids (ints >= 0), got "
                               f"{type(stops).__name__} {stops!r}{hint}")
        stops = tuple(stops)
        if not all(_whole(t, 0) for t in stops):
            raise RequestError(f"stop_token_ids must be token ids (ints >= 0), got {self.stop_token_ids!r}")
        object.__setattr__(self, "stop_token_ids", stops)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass(frozen=True)
class EngineConfig:
    """The engine's settings (see the module). ``num_blocks`` None: as many as the device memory left
    after the weights allows, times ``gpu_memory_utilization`` (a CPU run needs a number).
    ``graph_batch_sizes``: the batch sizes at which decode steps are captured in CUDA graphs (a step of B
    requests replays the smallest graph of at least B; beyond the largest it runs without a graph)."""

    max_num_seqs: int = 64
    max_num_batched_tokens: int = 8192
    block_size: int = 16
    num_blocks: int | None = None
    max_model_len: int = 16384
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int | None = None
    policy: str = "continuous"
    max_wait: float = 0.0
    buckets: tuple[Bucket, ...] = ()
    prefill_first: bool = False
    max_queue: int | None = None
    graph_batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128)
    gpu_memory_utilization: float = 0.9
    seed: int = 0
    extra: tuple = field(default=())

    def __post_init__(self):
        counts = {"max_num_seqs": self.max_num_seqs, "max_num_batched_tokens": self.max_num_batched_tokens,
                  "block_size": self.block_size, "max_model_len": self.max_model_len}
        bad = {k: v for k, v in counts.items() if not _whole(v)}
        if bad:
            raise ValueError(f"{', '.join(bad)} must be whole numbers >= 1, got {bad}")
        for name, v in (("num_blocks", self.num_blocks), ("long_prefill_token_threshold",
                                                           self.long_prefill_token_threshold),
                        ("max_queue", self.max_queue)):
            if v is not None and not _whole(v):
                raise ValueError(f"{name} must be a whole number >= 1 or None, got {v!r}")
        if self.policy not in KINDS:
            raise ValueError(f"policy must be one of {KINDS}, got {self.policy!r}")
        if not (_real(self.max_wait) and math.isfinite(self.max_wait) and self.max_wait >= 0):
            raise ValueError(f"max_wait must be a finite number of seconds >= 0, got {self.max_wait!r}")
        sizes = tuple(self.graph_batch_sizes)
        if not all(_whole(b) for b in sizes) or list(sizes) != sorted(set(sizes)):
            raise ValueError(f"graph_batch_sizes must be increasing whole numbers >= 1, got {self.graph_batch_sizes!r}")
        object.__setattr__(self, "graph_batch_sizes", sizes)
        if not (_real(self.gpu_memory_utilization) and 0 < self.gpu_memory_utilization <= 1):
            raise ValueError(f"gpu_memory_utilization must lie in (0, 1], got {self.gpu_memory_utilization!r}")
        self.as_policy()  # the policy checks the rest (buckets, chunking with a batch policy)

    @property
    def chunk(self) -> int | None:
        """Most prompt tokens of one request per step: None without chunked prefill."""
        if not self.enable_chunked_prefill:
            return None
        return self.long_prefill_token_threshold or self.max_num_batched_tokens

    def as_policy(self, kv_capacity: int | None = None) -> Policy:
        """These settings as the scheduler's ``lib.engine.policy.Policy`` (``kv_capacity`` in tokens, if bounded)."""
        return Policy(self.policy, max_batch=self.max_num_seqs, max_wait=self.max_wait, max_running=self.max_num_seqs,
                      token_budget=self.max_num_batched_tokens,
                      chunk=self.chunk if self.policy == "continuous" else None, buckets=tuple(self.buckets),
                      kv_capacity=kv_capacity, prefill_first=self.prefill_first)
