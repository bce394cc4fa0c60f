"""The engine loop's diagram: every stage of a step drawn, in order, with the module that does it."""

from __future__ import annotations

import importlib

from lib.diagrams import engine


def test_every_stage_is_drawn_with_a_module_that_exists():
    fig = engine.engine_loop()
    texts = [t.get_text() for t in fig.axes[0].texts]
    for name, what, module in engine.STAGES:
        assert name in texts and what in texts and module in texts
        importlib.import_module("lib." + module)
    assert len(fig.axes[0].patches) == len(engine.STAGES)
