"""A batching policy: which queued requests an engine step admits (static, dynamic, continuous; buckets).

Chapters: 6.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Bucket:
    name: str
    max_input: int  # prompts up to this many tokens (the last bucket should take the rest)
    priority: int = 0  # lower is admitted first
    max_running: int | None = None
    max_wait: float | None = None  # this bucket's batching window (None: the policy's max_wait)


@dataclass(frozen=True)
class Policy:
    kind: str = "continuous"
    max_batch: int = 32
    max_wait: float = 0.0
    max_running: int = 256
    token_budget: int = 8192
    chunk: int | None = None
    buckets: tuple[Bucket, ...] = ()
    kv_capacity: int | None = None
    prefill_first: bool = False  # steps with prefill work run no decode (prefill pre-empts decode)

    def check(self) -> None:
        if self.kind not in ("static", "dynamic", "continuous"):
            raise ValueError(f"kind must be 'static', 'dynamic' or 'continuous', got {self.kind!r}")
        if self.max_batch < 1 or self.max_running < 1 or self.token_budget < 1 or self.max_wait < 0:
            raise ValueError("max_batch, max_running and token_budget must be >= 1 and max_wait >= 0")
        if self.chunk is not None and self.chunk < 1:
            raise ValueError(f"chunk must be >= 1 tokens or None, got {self.chunk}")
        if self.buckets and self.kind != "continuous":
            raise ValueError("buckets need the continuous policy")
        if self.buckets and sorted(b.max_input for b in self.buckets) != [b.max_input for b in self.buckets]:
            raise ValueError("buckets must be listed by increasing max_input")
        if any(b.max_running is not None and b.max_running < 1 for b in self.buckets):
            raise ValueError("a bucket's max_running must be at least 1 (or None)")
        if any(b.max_wait is not None and b.max_wait < 0 for b in self.buckets):
            raise ValueError("a bucket's max_wait must be >= 0 s (or None)")
        if self.kv_capacity is not None and self.kv_capacity < 1:
            raise ValueError("kv_capacity must be a positive number of tokens or None")
