"""Chapter 6's simulator and chapter 8's engine are one code path: the simulator's steps are planned by the
engine's ``Scheduler`` (the same class, the same ``Plan`` objects), so a rule changed in the scheduler
changes both, and a hand-traced schedule comes out of both step for step.

The cost is ``Ticks`` (a step of M tokens lasts 1 + M seconds), so every time is a whole number.

Chapters: 6, 8.
"""

from __future__ import annotations

import importlib

import pytest

from lib import simulator
from lib.engine import EngineConfig, LLMEngine, replay
from lib.engine import scheduler as scheduler_module

simulate_module = importlib.import_module("lib.simulator.simulate")  # the module, which the function's name hides


class Ticks:
    def step(self, tokens, prefill_ctx_work, decode_kv_tokens):
        return 1.0 + tokens


def req(id_, arrival, input_, output):
    return {"id": id_, "arrival": float(arrival), "kind": "chat", "input": input_, "output": output}


# A: 3 in, 3 out at 0 s; B: 2 in, 2 out at 1 s; C: 1 in, 1 out at 2 s
THREE = [req(0, 0, 3, 3), req(1, 1, 2, 2), req(2, 2, 1, 1)]
# by hand, continuous batching with no limit that binds (as in test_simulator_traces):
#   step 1 [0, 4]:  prefill A (3 tokens)
#   step 2 [4, 9]:  B and C arrived meanwhile: prefill B 2 and C 1, decode A (4 tokens); C done
#   step 3 [9, 12]: decode A and B; both done
HAND = [(0.0, 4.0, {0: 3}, []), (4.0, 9.0, {1: 2, 2: 1}, [0]), (9.0, 12.0, {}, [0, 1])]


def engine_config(**kw) -> EngineConfig:
    """Engine settings whose policy is ``simulator.Policy("continuous")``'s, on a pool that never binds."""
    return EngineConfig(max_num_seqs=256, max_num_batched_tokens=8192, enable_chunked_prefill=False,
                        enable_prefix_caching=False, block_size=1, num_blocks=1000, max_model_len=64, **kw)


def simulated(reqs, policy):
    plans, trace = [], []
    res = simulator.simulate(reqs, Ticks(), policy, trace=trace, on_plan=plans.append)
    return res, trace, plans


def on_engine(reqs, config):
    e = LLMEngine.virtual(config, Ticks(), vocab=50)
    res = replay(e, reqs, [[1] * r["input"] for r in reqs])
    return res, e.steps


def test_the_simulator_plans_with_the_engine_s_scheduler():
    """Every plan the simulator runs is a ``lib.engine.scheduler.Plan``, made by a
    ``lib.engine.scheduler.Scheduler`` (spied on: each of its ``schedule`` calls is one the simulator made)."""
    made = []
    real = scheduler_module.Scheduler.schedule

    def spy(self, now):
        plan = real(self, now)
        made.append((self, plan))
        return plan

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(scheduler_module.Scheduler, "schedule", spy)
        _, trace, plans = simulated(THREE, simulator.Policy("continuous"))
    assert simulate_module.Scheduler is scheduler_module.Scheduler
    assert len(plans) == len(made) == len(trace) == 3
    assert all(p is q for p, (_, q) in zip(plans, made))  # the very objects the scheduler returned
    assert all(type(p) is scheduler_module.Plan for p in plans)
    assert len({id(s) for s, _ in made}) == 1 and type(made[0][0]) is scheduler_module.Scheduler


def test_a_hand_traced_schedule_comes_out_of_the_simulator_and_the_engine():
    res, trace, _ = simulated(THREE, simulator.Policy("continuous"))
    assert [(s["start"], s["end"], s["prefill"], s["decode"]) for s in trace] == HAND
    eres, steps = on_engine(THREE, engine_config())
    assert [(s["start"], s["end"], s["prefill"], s["decode"]) for s in steps] == HAND
    # A: tokens at 4, 9, 12; B: arrived at 1, admitted at 4, tokens at 9 and 12; C: arrived at 2, its one
    # token at 9; B and C spent step 2 (5 s) in prefill, A step 1 (4 s)
    keys = ("id", "ttft", "e2e", "queue", "prefill", "tokens")
    want = [[0, 4.0, 12.0, 0.0, 4.0, 3], [1, 8.0, 11.0, 3.0, 5.0, 2], [2, 7.0, 7.0, 2.0, 5.0, 1]]
    assert [[r[k] for k in keys] for r in res] == [[r[k] for k in keys] for r in eres] == want
    assert [r["tpot"] for r in res[:2]] == [r["tpot"] for r in eres[:2]] == [4.0, 3.0]


def test_a_rule_changed_in_the_scheduler_changes_the_simulator_and_the_engine_alike(monkeypatch):
    """A planted rule, one more running request per step at most: by hand, step 2 [4, 8] then prefills B only
    (2 tokens) beside A's decode, C waits for step 3 [8, 12], which prefills C (1 token) and decodes A and B;
    all three finish with it. The simulator has no admission of its own to keep the old schedule."""
    real = scheduler_module.Scheduler.admit

    def one_at_a_time(self, now):
        held = self.policy.max_running
        object.__setattr__(self.policy, "max_running", len(self.running) + 1)
        try:
            return real(self, now)
        finally:
            object.__setattr__(self.policy, "max_running", held)

    monkeypatch.setattr(scheduler_module.Scheduler, "admit", one_at_a_time)
    want = [(0.0, 4.0, {0: 3}, []), (4.0, 8.0, {1: 2}, [0]), (8.0, 12.0, {2: 1}, [0, 1])]
    _, trace, _ = simulated(THREE, simulator.Policy("continuous"))
    _, steps = on_engine(THREE, engine_config())
    assert [(s["start"], s["end"], s["prefill"], s["decode"]) for s in trace] == want
    assert [(s["start"], s["end"], s["prefill"], s["decode"]) for s in steps] == want
