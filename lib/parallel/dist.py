"""A group of ranks on one machine: ``run(fn, world, *args)`` starts ``world`` processes, joins them in a
``torch.distributed`` process group and returns what ``fn(rank, world, *args)`` returned in each, by rank.

The processes are started with the ``spawn`` method (a fresh interpreter each: CUDA cannot be used in a
forked child), rendezvous through a file in a temporary folder, and use gloo on the CPU (the ranks see
no GPU, so the book's kernels run in Triton's interpreter there, on any machine) or NCCL when
``backend="nccl"`` (rank r takes GPU r). ``fn`` must be importable by name (a module-level function) and
its arguments and result picklable; tensors in the result come back on the CPU. A rank that raises stops
the run: ``run`` raises ``RankFailed`` with that rank's traceback (a rank that failed on its own before one
that only lost its connection to it: ``first_cause``), and ranks still running are ended, so a failure
never hangs the caller until ``timeout_s``. On a GPU machine keep NVLink multicast off in every
rank (``NCCL_ENV``, set here before NCCL starts).

Chapter: 10.
"""

from __future__ import annotations

import io
import multiprocessing
import os
import queue
import tempfile
import time
import traceback

import torch

NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
BACKENDS = ("gloo", "nccl")


class RankFailed(RuntimeError):
    """A rank of ``run`` raised; the message holds its traceback."""


# what a rank says when a peer ended under it: a consequence of another rank's failure, not a cause
PEER_LOST = ("closed by peer", "reset by peer", "remote worker", "Broken pipe", "connectFullMesh failed")
GRACE_S = 2.0  # after a first failure, how long the other ranks' failures are awaited


def first_cause(failures: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """``failures`` (rank, traceback) with the ranks that failed on their own first and those that lost a peer
    after them (each group in the order they came): when one rank raises, a rank still talking to it fails
    too, and its error says only that the connection closed."""
    return sorted(failures, key=lambda f: any(m in f[1] for m in PEER_LOST))


def _cpu(value):
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, (list, tuple)):
        return type(value)(_cpu(v) for v in value)
    if isinstance(value, dict):
        return {k: _cpu(v) for k, v in value.items()}
    return value


def _pack(value) -> bytes:
    """``value`` as bytes (``torch.save``): a tensor put on a queue as it is would be shared through a file
    descriptor that dies with its process, and a rank may end before the caller reads its result."""
    buf = io.BytesIO()
    torch.save(_cpu(value), buf)
    return buf.getvalue()


def _rank_main(rank, world, backend, init_file, fn, args, results):
    import torch.distributed as dist

    try:
        if backend == "nccl":
            os.environ.update(NCCL_ENV)
            torch.cuda.set_device(rank)
        dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world)
        try:
            out = fn(rank, world, *args)
            results.put((rank, True, _pack(out)))
        finally:
            dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - every failure is sent to the parent, which raises it
        results.put((rank, False, traceback.format_exc()))


def run(fn, world: int, *args, backend: str = "gloo", timeout_s: float = 300.0) -> list:
    """``[fn(0, world, *args), ..., fn(world - 1, world, *args)]``, each run in its own process of a process
    group of ``world`` ranks (see the module)."""
    if not (isinstance(world, int) and world >= 1):
        raise ValueError(f"world = {world!r}: a group needs at least one rank; pass a positive int")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "nccl" and torch.cuda.device_count() < world:
        raise RuntimeError(f"NCCL with {world} ranks needs {world} GPUs, this machine has "
                           f"{torch.cuda.device_count()}: run on a machine with more GPUs, or use gloo on the CPU")
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        procs = [ctx.Process(target=_rank_main, args=(r, world, backend, os.path.join(tmp, "rendezvous"), fn, args,
                                                      results), daemon=True) for r in range(world)]
        hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
        if backend == "gloo":  # gloo ranks run on the CPU: they see no GPU (lib.kernels then interprets Triton)
            os.environ["CUDA_VISIBLE_DEVICES"] = ""
        try:
            for p in procs:
                p.start()
        finally:
            if hidden is None:
                os.environ.pop("CUDA_VISIBLE_DEVICES", None)
            else:
                os.environ["CUDA_VISIBLE_DEVICES"] = hidden
        out, failed = {}, None
        try:
            deadline = time.monotonic() + timeout_s
            while len(out) < world and failed is None:
                try:
                    rank, ok, value = results.get(timeout=1.0)
                except queue.Empty:
                    dead = [r for r, p in enumerate(procs) if p.exitcode is not None and r not in out]
                    if dead and results.empty():  # a process that ended without a result never sends one
                        time.sleep(0.5)  # the result of a rank that ended just now may still be in the pipe
                        if results.empty():
                            failed = (dead[0], f"the process ended (exit code {procs[dead[0]].exitcode}) before giving "
                                      "a result: was fn importable, and the script guarded by "
                                      "if __name__ == '__main__'?")
                    elif time.monotonic() > deadline:
                        raise TimeoutError(f"{world - len(out)} of {world} ranks gave no result in {timeout_s:.0f} s: "
                                           "a collective that not every rank called waits forever") from None
                    continue
                if ok:
                    out[rank] = torch.load(io.BytesIO(value), weights_only=False)
                else:
                    failed = (rank, value)
            failures = [failed] if failed is not None else []
            grace = time.monotonic() + GRACE_S
            while failures and len(failures) + len(out) < world and time.monotonic() < grace:
                try:  # the others' failures, for a moment: the first to arrive may be a consequence
                    rank, ok, value = results.get(timeout=0.1)
                except queue.Empty:
                    continue
                if not ok:
                    failures.append((rank, value))
        finally:
            for p in procs:
                p.join(timeout=5 if failed is None else 0.5)
                if p.is_alive():
                    p.terminate()
                    p.join()
    if failed is not None:
        (rank, tb), *others = first_cause(failures)
        also = "".join(f"\nrank {r} failed too: {t.strip().splitlines()[-1]}" for r, t in others)
        raise RankFailed(f"rank {rank} of {world} raised:\n{tb}{also}")
    return [out[r] for r in range(world)]
