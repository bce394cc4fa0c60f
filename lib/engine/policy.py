"""The scheduler's batching policy: which queued requests a step may admit, and how the queue is split.

The engine's scheduler (``lib.engine.scheduler``) consults one ``Policy``; chapter 6's teaching policies are
values of it, and the engine's settings give one (``EngineConfig.as_policy``).

``Policy.kind`` is one of

- ``static``: a batch of up to ``max_batch`` requests starts once that many wait (or every request has
  arrived) and runs to completion; nobody joins it meanwhile.
- ``dynamic``: the same, but a batch also starts once its oldest request has waited ``max_wait`` s.
- ``continuous``: every step, queued requests join while fewer than ``max_running`` run and the step's
  prompt tokens stay within ``token_budget``. Options: ``chunk`` (chunked prefill: at most that many
  prompt tokens of one request per step), ``prefill_first`` (a step that prefills runs no decode),
  ``max_wait`` > 0 (a batching window: prompts are held until the oldest has waited that long or together
  they fill the budget) and ``buckets`` (queues split by prompt length, each with a priority, a limit of
  running requests and a window of its own).

``kv_capacity`` (any kind) bounds the tokens of KV the running requests hold in the simulator
(``lib.simulator``); the engine's bound is its pool of blocks. A policy checks itself when it is made, so a
bad one fails where it is written.

Chapters: 6, 8.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Integral, Real

KINDS = ("static", "dynamic", "continuous")


def _whole(value, at_least: int = 1) -> bool:
    return isinstance(value, Integral) and not isinstance(value, bool) and value >= at_least


def _wait(value) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool) and not math.isnan(value) and value >= 0


@dataclass(frozen=True)
class Bucket:
    """One queue of the continuous policy: prompts of at most ``max_input`` tokens that no earlier bucket
    took (the last bucket takes the rest whatever its ``max_input``). A lower ``priority`` is admitted
    first; ``max_running`` caps this bucket's running requests (None: no cap of its own); ``max_wait`` is
    its batching window in seconds (None: the policy's ``max_wait``)."""

    name: str
    max_input: int
    priority: int = 0
    max_running: int | None = None
    max_wait: float | None = None

    def __post_init__(self):
        if not _whole(self.max_input):
            raise ValueError(f"bucket {self.name!r}: max_input must be a whole number of tokens >= 1, got "
                             f"{self.max_input!r}")
        if self.max_running is not None and not _whole(self.max_running):
            raise ValueError(f"bucket {self.name!r}: max_running must be at least 1 (or None for no cap), got "
                             f"{self.max_running!r}")
        if self.max_wait is not None and not _wait(self.max_wait):
            raise ValueError(f"bucket {self.name!r}: max_wait must be >= 0 s (or None for the policy's), got "
                             f"{self.max_wait!r}")


@dataclass(frozen=True)
class Policy:
    """What an engine step may admit (see the module). Counts are whole numbers of requests or tokens,
    ``max_wait`` is seconds; ``kv_capacity`` None means unbounded KV."""

    kind: str = "continuous"
    max_batch: int = 32
    max_wait: float = 0.0
    max_running: int = 256
    token_budget: int = 8192
    chunk: int | None = None
    buckets: tuple[Bucket, ...] = ()
    kv_capacity: int | None = None
    prefill_first: bool = False  # steps with prefill work run no decode (prefill pre-empts decode)

    def __post_init__(self):
        self.check()

    def check(self) -> None:
        """Raise ValueError, saying what to change, if the policy cannot be simulated."""
        if self.kind not in KINDS:
            raise ValueError(f"kind must be 'static', 'dynamic' or 'continuous', got {self.kind!r}")
        counts = {"max_batch": self.max_batch, "max_running": self.max_running, "token_budget": self.token_budget}
        bad = {k: v for k, v in counts.items() if not _whole(v)}
        if bad or not _wait(self.max_wait):
            raise ValueError(f"max_batch, max_running and token_budget must be whole numbers >= 1 and max_wait "
                             f">= 0 s; got {bad or {'max_wait': self.max_wait}}")
        if self.chunk is not None and not _whole(self.chunk):
            raise ValueError(f"chunk must be >= 1 tokens or None, got {self.chunk!r}")
        if self.chunk is not None and self.kind != "continuous":
            raise ValueError("chunk (chunked prefill) needs the continuous policy: a static or dynamic batch "
                             "prefills whole prompts")
        if self.buckets and self.kind != "continuous":
            raise ValueError("buckets need the continuous policy")
        if not all(isinstance(b, Bucket) for b in self.buckets):
            raise ValueError(f"buckets must be a tuple of Bucket, got {self.buckets!r}")
        if [b.max_input for b in self.buckets] != sorted(b.max_input for b in self.buckets):
            raise ValueError("buckets must be listed by increasing max_input")
        if self.kv_capacity is not None and not _whole(self.kv_capacity):
            raise ValueError(f"kv_capacity must be a positive number of tokens or None, got {self.kv_capacity!r}")

    @property
    def queue_count(self) -> int:
        """How many queues the engine keeps: one per bucket, or one."""
        return max(1, len(self.buckets))

    def bucket_of(self, prompt_tokens: int) -> int:
        """The queue of a prompt: the first bucket whose ``max_input`` holds it, else the last (0 without
        buckets)."""
        for i, b in enumerate(self.buckets):
            if prompt_tokens <= b.max_input:
                return i
        return max(0, len(self.buckets) - 1)

    def bucket_name(self, queue: int) -> str:
        """The name of a queue's bucket ("" without buckets), as the results report it."""
        return self.buckets[queue].name if self.buckets else ""

    def admission_order(self) -> list[int]:
        """The queues in the order a step admits from them: by priority, ties by position."""
        return sorted(range(len(self.buckets)), key=lambda i: (self.buckets[i].priority, i)) or [0]

    def window(self, queue: int) -> float:
        """The batching window of a queue, in seconds: its bucket's ``max_wait``, else the policy's."""
        own = self.buckets[queue].max_wait if self.buckets else None
        return self.max_wait if own is None else own

    def running_cap(self, queue: int) -> int | None:
        """How many of a queue's requests may run at once (None: only ``max_running`` applies)."""
        return self.buckets[queue].max_running if self.buckets else None
