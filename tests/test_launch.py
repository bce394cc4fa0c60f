"""lib.kernels.launch without a GPU: the planned launch's two paths, its guards, and what it shares.

The direct call's argument layout is checked against a stand-in compiled kernel that records what it is
given; the layout itself (grid, stream, function, packed metadata, launch metadata, two hooks, then
every argument, constexprs included, in signature order) is the one Triton's own ``JITFunction.run``
passes in the releases of ``DIRECT_VERSIONS``. The GPU tier (tests/gpu) runs the real thing.
"""

from __future__ import annotations

import types

import pytest
import torch

from lib.kernels import launch, stream

# Triton as the kernels imported it: lib.kernels chooses the interpreter (no GPU) before Triton loads
triton, tl = stream.triton, stream.tl


def _fake_fn(X, Y, n, scale, BLOCK: tl.constexpr, MODE: tl.constexpr = "fast", FLAG: tl.constexpr = False):
    """A kernel signature: three runtime arguments, then constexprs (two with defaults)."""


class FakeCompiled:
    """Stands for Triton's CompiledKernel: records its direct calls."""

    def __init__(self):
        self.function, self.packed_metadata, self.calls = "function-handle", ("packed",), []

    def run(self, *args):
        self.calls.append(args)


class FakeKernel:
    """Stands for a @triton.jit function: ``kernel[grid](*args, **kw)`` records the public launch."""

    def __init__(self):
        self.fn = _fake_fn
        self.public = []
        self.compiled = FakeCompiled()

    def __getitem__(self, grid):
        def launch_(*args, **kw):
            self.public.append((grid, args, kw))
            return self.compiled
        return launch_


@pytest.fixture
def gpu_like(monkeypatch):
    """A verified Triton release, no launch hook, and a stand-in current stream."""
    monkeypatch.setattr(launch, "DIRECT", True)
    monkeypatch.setattr(launch, "_hooks_quiet", lambda: True)
    monkeypatch.setattr(launch, "raw_stream", lambda index: 1000 + index)


def test_first_call_public_then_direct_with_the_documented_layout(gpu_like):
    k = FakeKernel()
    x, y = torch.zeros(4), torch.zeros(4)
    plan = launch.Launch(k, (3, 2), dict(BLOCK=64, FLAG=True), dict(num_warps=4), torch.device("cuda", 1))
    plan(x, y, 7, 0.5)
    assert k.public == [((3, 2), (x, y, 7, 0.5), dict(BLOCK=64, FLAG=True, num_warps=4))] and not k.compiled.calls
    assert plan.compiled is k.compiled
    plan(y, x, 9, 1.5)  # later calls: straight to the compiled kernel
    assert len(k.public) == 1
    # grid padded to three dimensions, the device's stream, function, packed metadata, no launch metadata and
    # no hooks, the runtime arguments, then every constexpr in signature order (MODE from its default)
    assert k.compiled.calls == [(3, 2, 1, 1001, "function-handle", ("packed",), None, None, None, y, x, 9, 1.5,
                                 64, "fast", True)]


def test_direct_false_and_unverified_releases_take_the_public_path(gpu_like, monkeypatch):
    k = FakeKernel()
    plan = launch.Launch(k, (1,), dict(BLOCK=16), {}, torch.device("cuda", 0))
    plan(1, 2, 3, 4.0, direct=False)  # arguments that specialize differently: never cached
    plan(1, 2, 3, 4.0, direct=False)
    assert len(k.public) == 2 and plan.compiled is None
    monkeypatch.setattr(launch, "DIRECT", False)  # a Triton release whose run() layout nobody checked
    for _ in range(3):
        plan(1, 2, 3, 4.0)
    assert len(k.public) == 5 and plan.compiled is None and not k.compiled.calls


def test_a_launch_hook_sends_calls_through_the_public_path(gpu_like, monkeypatch):
    """A profiler's launch hook is called by Triton's public path only: with one installed, no direct call."""
    k = FakeKernel()
    plan = launch.Launch(k, (1,), dict(BLOCK=16), {}, torch.device("cuda", 0))
    plan(1, 2, 3, 4.0)
    monkeypatch.setattr(launch, "_hooks_quiet", lambda: False)
    plan(1, 2, 3, 4.0)
    assert len(k.public) == 2 and not k.compiled.calls


def test_hooks_quiet_reads_triton_hook_chains():
    from triton import knobs

    assert launch._hooks_quiet()  # nothing installed in a plain process

    def hook(*args):
        pass

    knobs.runtime.launch_enter_hook.add(hook)
    try:
        assert not launch._hooks_quiet()
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    assert launch._hooks_quiet()


def test_off_a_gpu_every_call_is_public(monkeypatch):
    monkeypatch.setattr(launch, "DIRECT", True)
    k = FakeKernel()
    plan = launch.Launch(k, (1,), dict(BLOCK=16), {}, "cpu")
    plan(1, 2, 3, 4.0)
    plan(1, 2, 3, 4.0)
    assert len(k.public) == 2 and plan.compiled is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU the kernels are compiled, not interpreted")
def test_a_real_kernel_in_the_interpreter():
    """The stream kernel through a planned launch: the interpreter's result, nothing compiled to keep."""
    a, b = torch.arange(64.0), torch.ones(64)
    out = torch.zeros(2)
    plan = launch.Launch(stream._read_sum_kernel, (2,), dict(BLOCK=16), dict(num_warps=4), a.device)
    plan(a, b, out, 64, 32)
    assert torch.equal(out, torch.tensor([sum(range(32)) + 32.0, sum(range(32, 64)) + 32.0]))
    assert plan.compiled is None


def test_bad_plans_are_refused():
    k = FakeKernel()
    with pytest.raises(ValueError, match=r"no constexpr parameter \['BLOK'\]"):
        launch.Launch(k, (1,), dict(BLOK=16), {}, "cpu")
    with pytest.raises(ValueError, match=r"needs constexpr \['BLOCK'\]"):
        launch.Launch(k, (1,), {}, {}, "cpu")
    with pytest.raises(ValueError, match="grid must have 1 to 3"):
        launch.Launch(k, (1, 1, 1, 1), dict(BLOCK=16), {}, "cpu")
    with pytest.raises(TypeError, match="not a @triton.jit"):
        launch.Launch(lambda: None, (1,), {}, {}, "cpu")

    def early(X, BLOCK: tl.constexpr, n):
        pass

    with pytest.raises(ValueError, match="constexpr parameter must follow"):
        launch.Launch(types.SimpleNamespace(fn=early), (1,), dict(BLOCK=16), {}, "cpu")
    plan = launch.Launch(k, (1,), dict(BLOCK=16), {}, "cpu")
    with pytest.raises(TypeError, match="takes 4 runtime arguments, got 2"):
        plan(1, 2)


def test_aligned_and_sm_count():
    buf = torch.zeros(64, dtype=torch.float32)
    assert launch.aligned(buf, buf[4:]) and not launch.aligned(buf, buf[1:])  # 16 bytes = 4 floats
    assert launch.sm_count("cpu") == launch.CPU_SMS == launch.sm_count(torch.device("cpu"))


def test_the_directly_launched_releases_are_named_exactly():
    assert launch.DIRECT == (triton.__version__ in launch.DIRECT_VERSIONS)
    assert all(v.count(".") == 2 for v in launch.DIRECT_VERSIONS)  # whole release numbers, checked one by one


def test_descriptor_allocator_is_set_once_and_kept(monkeypatch):
    from triton.runtime import _allocation

    seen = []
    monkeypatch.setattr(triton, "set_allocator", lambda fn: seen.append(fn))
    token = _allocation._allocator.set(_allocation._NULL_ALLOCATOR)
    try:
        launch.ensure_descriptor_allocator()  # nothing set: ours
        assert seen == [launch._descriptor_memory]

        def callers(size, alignment, stream):
            return None

        _allocation._allocator.set(callers)
        launch.ensure_descriptor_allocator()  # the caller's allocator stays
        assert seen == [launch._descriptor_memory]
    finally:
        _allocation._allocator.reset(token)
    assert launch._descriptor_memory(256, 16, None).numel() == 256
