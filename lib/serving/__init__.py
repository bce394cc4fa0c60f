"""A serving engine's schedule, simulated: the batching policy, the cost of a step, the simulator, the metrics.

- ``lib.serving.policy``: ``Policy`` and ``Bucket``, what a step may admit.
- ``lib.serving.cost_model``: ``MeasuredCostModel``, seconds per step fitted to measured steps.
- ``lib.serving.simulate``: ``simulate``, a discrete-event run of requests through the engine.
- ``lib.serving.metrics``: ``summary``, ``goodput`` and ``percentile`` over its results.

Chapters: 6.
"""

from lib.serving.cost_model import MeasuredCostModel
from lib.serving.metrics import goodput, percentile, summary
from lib.serving.policy import Bucket, Policy
from lib.serving.simulate import simulate

__all__ = ["Bucket", "MeasuredCostModel", "Policy", "goodput", "percentile", "simulate", "summary"]
