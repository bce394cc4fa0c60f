"""Chapter 6's simulator: the engine's scheduler on a virtual clock, a cost model giving each step's time.

- ``lib.simulator.simulate``: ``simulate``, the discrete-event loop (arrivals, the clock, the progress
  check); the scheduling rules are the engine's (``lib.engine.scheduler``).
- Re-exported for chapter 6: the batching policy (``Policy``, ``Bucket``: ``lib.engine.policy``), the cost
  model it fits (``MeasuredCostModel``: ``lib.engine.cost``) and the request metrics (``summary``,
  ``goodput``, ``percentile``: ``lib.engine.metrics``, where ``summary`` is ``request_summary``).

Chapters: 6.
"""

from lib.engine.cost import MeasuredCostModel
from lib.engine.metrics import goodput, percentile
from lib.engine.metrics import request_summary as summary
from lib.engine.policy import Bucket, Policy
from lib.simulator.simulate import simulate

__all__ = ["Bucket", "MeasuredCostModel", "Policy", "goodput", "percentile", "simulate", "summary"]
