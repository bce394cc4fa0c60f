"""How the book's kernels are launched: once through Triton's public path, then straight to the compiled kernel.

A Triton kernel called as ``kernel[grid](*args, **meta)`` does a fair amount of host work on every call: it
binds the arguments, works out how each one specializes the kernel (dtypes, 16-byte alignment, integers
equal to 1 or divisible by 16), looks the result up in its cache, builds launch metadata, and only then
launches. For kernels of a few microseconds that host work is as long as the kernel itself (chapter 0
measures call time against GPU time; chapters 3 and 4 show it for their kernels).

A planned launch (``Launch``) does that work once. Its first call goes through the public path, which
compiles the kernel (or finds it in Triton's cache) and returns the compiled kernel; later calls hand
the arguments straight to the compiled kernel's ``run``, with the grid, the current stream and the
constexprs fixed at planning. Triton's kernels are specialized on their arguments, so the caller
promises (``direct=True``) that a call's arguments specialize as the planned ones do: the same
non-tensor values and tensors of the same dtypes, aligned to 16 bytes (``aligned`` checks that
cheaply). Anything else goes through the public path, which handles every case.

The direct call relies on Triton internals: the positional layout of ``CompiledKernel.run`` (grid,
stream, function, packed metadata, launch metadata, the two launch hooks, then every argument of the
kernel, constexprs included, in its signature's order). It is taken only on the Triton releases in
``DIRECT_VERSIONS``, whose sources were read for that layout, only on a CUDA device, and only while no
launch hook is installed (a profiler such as Proton installs one; the public path calls it). On any
other release, or when an internal is missing, every call takes the public path: slower on the host,
the same on the GPU.

The module also owns what the kernels' plans share: the number of SMs (``sm_count``), the current
stream's raw handle (``raw_stream``), the global memory Triton needs to build TMA descriptors on the
device (``ensure_descriptor_allocator``), and the checks of what a kernel is given before it launches:

- every argument is a tensor (``tensors``): a list gets an error that says how to make the tensor;
- an output shares no memory with an input (``span``, ``overlap``): the byte range from a tensor's first
  element to the end of its last, compared with another's (a range, so views that interleave without
  sharing an element are refused too; the message says to pass a separate tensor);
- an index tensor's values (block-table entries, lengths, offsets) are read only where they can be
  (``values_readable``): never for meta tensors, which hold none, nor while the current CUDA stream
  captures a graph (a captured launch replays on whatever the tensors hold at replay). Reading them from a
  GPU costs a synchronisation, which is why the planned launches check them at planning and on request.

Chapters: 0 (call time against GPU time), 3 and 4 (the kernels that use it).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping

import torch
import triton

# Triton releases whose CompiledKernel.run takes (gridX, gridY, gridZ, stream, function, packed_metadata,
# launch_metadata, launch_enter_hook, launch_exit_hook, *every argument, constexprs included)
DIRECT_VERSIONS = frozenset({"3.6.0", "3.7.1"})
DIRECT = triton.__version__ in DIRECT_VERSIONS
# the attributes of a compiled kernel the direct call uses
_COMPILED_ATTRS = ("run", "function", "packed_metadata")
# the number of SMs planned for off a GPU (Triton's interpreter): small, so that CPU tests still split work
CPU_SMS = 4


@functools.cache
def sm_count(device: torch.device | str) -> int:
    """Streaming multiprocessors of ``device`` (``CPU_SMS`` off a CUDA device): the unit in which the
    kernels' rules count waves of programs."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return CPU_SMS


_raw_stream_of = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def raw_stream(index: int) -> int:
    """The handle of device ``index``'s current CUDA stream, as Triton's launcher takes it. Torch's
    internal getter skips building a ``torch.cuda.Stream`` object; where a build lacks it, the public
    ``torch.cuda.current_stream(index).cuda_stream``."""
    if _raw_stream_of is not None:
        return _raw_stream_of(index)
    return torch.cuda.current_stream(index).cuda_stream


try:  # where Triton keeps its launch hooks (read at every call: a profiler may install one at any time)
    from triton import knobs as _knobs

    _RUNTIME = _knobs.runtime
except (ImportError, AttributeError):
    _RUNTIME = None


def _hooks_quiet() -> bool:
    """True when no launch hook is installed (the direct call passes none): each hook is None, or a
    HookChain whose list of calls is empty. False where the hooks cannot be read."""
    if _RUNTIME is None:
        return False
    for hook in (_RUNTIME.launch_enter_hook, _RUNTIME.launch_exit_hook):
        if hook is not None and (type(getattr(hook, "calls", None)) is not list or hook.calls):
            return False
    return True


def aligned(*tensors: torch.Tensor) -> bool:
    """Whether every tensor's data starts on a 16-byte boundary, as Triton assumes of a pointer argument
    it specialized as aligned."""
    ptr = 0
    for t in tensors:
        ptr |= t.data_ptr()
    return not ptr % 16


def whole(value) -> bool:
    """Whether ``value`` is an integer and not a bool (True would pass for 1 as a count or a size)."""
    return isinstance(value, int) and not isinstance(value, bool)


def tensors(**named) -> None:
    """Refuse any argument that is not a torch.Tensor, naming it and how to make one: a kernel takes
    pointers, and a list or an array has none (``name=(value, "what it holds")``)."""
    for name, (value, what) in named.items():
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor ({what}); got {type(value).__name__}: make one with "
                            f"torch.as_tensor({name}, dtype=..., device=...) on the other arguments' device")


def span(t: torch.Tensor) -> int:
    """Bytes from a tensor's first element to the end of its last (0 for an empty tensor): the range of
    memory it may touch."""
    if t.numel() == 0:
        return 0
    return (sum((n - 1) * s for n, s in zip(t.shape, t.stride())) + 1) * t.element_size()


def overlap(out: torch.Tensor, inputs: Mapping[str, torch.Tensor], out_name: str = "out") -> None:
    """Refuse an output whose memory range meets an input's: the kernel would read what it has already
    overwritten (``out=x``), or write a tensor it reads from. Meta tensors hold no memory: nothing to
    compare."""
    if out.device.type == "meta":
        return
    o, o_span = out.data_ptr(), span(out)
    for name, t in inputs.items():
        p, p_span = t.data_ptr(), span(t)
        if o_span and p_span and p < o + o_span and o < p + p_span:
            raise ValueError(f"{out_name} shares memory with {name}: the kernel would overwrite what it still reads; "
                             f"pass a separate tensor as {out_name} (torch.empty_like, or the default None)")


def internal_overlap(t: torch.Tensor) -> bool:
    """Whether two elements of ``t`` share memory (a stride of 0, or strides smaller than the dimensions
    inside them span): an output laid out so would be written by several programs at once."""
    dims = sorted((s, n) for n, s in zip(t.shape, t.stride()) if n > 1)
    reach = 1  # elements spanned by the dimensions seen so far, innermost first
    for s, n in dims:
        if s < reach:
            return True
        reach = s * (n - 1) + reach
    return False


def values_readable(check: bool | None, *index: torch.Tensor) -> bool:
    """Whether to read (and check) the values of the index tensors ``index``: ``check`` True asks for it
    (an error where they cannot be read), False declines it, None reads them where they can be read:
    not meta tensors (no values), not while the current CUDA stream captures a graph (a capture cannot
    read memory back, and the graph replays on the values the tensors hold at replay)."""
    if check is False:
        return False
    why = None
    if any(t.device.type == "meta" for t in index):
        why = "meta tensors hold no values"
    elif any(t.is_cuda for t in index) and torch.cuda.is_current_stream_capturing():
        why = "the current CUDA stream is capturing a graph, which cannot read memory back"
    if why is None:
        return True
    if check:
        raise ValueError(f"check=True asks to read the index tensors' values, but {why}: check them before "
                         f"(with check=True outside the capture) and pass check=False here")
    return False


def _descriptor_memory(size: int, alignment: int, stream) -> torch.Tensor:
    """Global memory for the tensor descriptors a kernel builds on the device (128 bytes each): a torch
    allocation on the current CUDA device (in a CUDA graph, from the graph's pool)."""
    return torch.empty(size, dtype=torch.int8, device="cuda" if torch.cuda.is_available() else "cpu")


_set_blind = False  # set once where the current allocator cannot be read


def ensure_descriptor_allocator() -> None:
    """Kernels that build TMA descriptors on the device (``tl.make_tensor_descriptor``) need global
    memory at launch, which Triton asks of the allocator set by ``triton.set_allocator``. Set one that
    allocates through torch, unless the caller has set one. Triton keeps the allocator per thread
    (a context variable), so this runs before every launch of such a kernel; it costs a lookup. Where
    the current allocator cannot be read (an internal moved), ours is set once per process."""
    global _set_blind
    try:
        from triton.runtime import _allocation

        unset = isinstance(_allocation._allocator.get(), _allocation.NullAllocator)
    except (ImportError, AttributeError):
        unset, _set_blind = not _set_blind, True
    if unset:
        triton.set_allocator(_descriptor_memory)


def _is_constexpr(param: inspect.Parameter) -> bool:
    """Whether a kernel parameter is annotated ``tl.constexpr`` (a string under postponed annotations)."""
    ann = param.annotation
    if ann is inspect.Parameter.empty:
        return False
    return "constexpr" in (ann if isinstance(ann, str) else getattr(ann, "__name__", repr(ann)))


@functools.cache
def _parameters(fn) -> tuple[int, tuple[inspect.Parameter, ...]]:
    """A kernel's number of runtime parameters and its constexpr parameters, read once per kernel (a plan is
    made on every call of the plain functions: reading a signature costs more than the rest of a plan)."""
    params = list(inspect.signature(fn).parameters.values())
    is_constexpr = [_is_constexpr(p) for p in params]
    n_runtime = is_constexpr.index(True) if True in is_constexpr else len(params)
    if any(not c for c in is_constexpr[n_runtime:]):
        raise ValueError(f"{fn.__name__}: every constexpr parameter must follow the runtime ones for a direct "
                         f"launch; {[p.name for p, c in zip(params, is_constexpr) if c][:1]} comes too early")
    return n_runtime, tuple(params[n_runtime:])


class Launch:
    """One kernel at one grid with its constexprs and compile options fixed: ``launch(*args, direct=...)``.

    ``args`` are the kernel's runtime (non-constexpr) arguments, in its signature's order; the
    constexprs come from ``meta`` (or their defaults) and must follow every runtime argument in the
    signature. The first call with ``direct=True`` on a CUDA device goes through ``kernel[grid]`` and
    keeps the compiled kernel; later calls with ``direct=True`` launch it directly (see the module's
    docstring for when that is allowed). ``direct=False`` always takes the public path: for arguments
    that specialize differently from the planned ones. ``compiled`` is the kept compiled kernel (None
    before the first direct call, and always in Triton's interpreter)."""

    def __init__(self, kernel, grid: tuple[int, ...], meta: Mapping, options: Mapping, device: torch.device):
        fn = getattr(kernel, "fn", None)
        if fn is None:
            raise TypeError(f"{kernel!r} is not a @triton.jit function")
        n_runtime, constexprs = _parameters(fn)
        unknown = set(meta) - {c.name for c in constexprs}
        if unknown:
            raise ValueError(f"{fn.__name__} has no constexpr parameter {sorted(unknown)}; it has "
                             f"{[c.name for c in constexprs]}")
        missing = [c.name for c in constexprs if c.name not in meta and c.default is inspect.Parameter.empty]
        if missing:
            raise ValueError(f"{fn.__name__} needs constexpr {missing} in meta (they have no default)")
        if not 1 <= len(grid) <= 3:
            raise ValueError(f"grid must have 1 to 3 dimensions, got {grid}")
        self.kernel = kernel
        self.grid = tuple(grid)
        self.meta = dict(meta)
        self.options = dict(options)
        self.n_args = n_runtime
        self.name = fn.__name__
        self.tail = tuple(meta[c.name] if c.name in meta else c.default for c in constexprs)
        self.grid3 = (*self.grid, 1, 1)[:3]
        device = torch.device(device)
        self.index = (device.index if device.index is not None else torch.cuda.current_device()) \
            if device.type == "cuda" else None
        self.compiled = None

    def __call__(self, *args, direct: bool = True):
        if len(args) != self.n_args:
            raise TypeError(f"{self.name} takes {self.n_args} runtime arguments, got {len(args)}")
        direct = direct and DIRECT and self.index is not None and _hooks_quiet()
        ck = self.compiled if direct else None
        if ck is not None:
            ck.run(*self.grid3, raw_stream(self.index), ck.function, ck.packed_metadata, None, None, None, *args,
                   *self.tail)
            return ck
        ck = self.kernel[self.grid](*args, **self.meta, **self.options)
        if direct and all(hasattr(ck, a) for a in _COMPILED_ATTRS):
            self.compiled = ck
        return ck
