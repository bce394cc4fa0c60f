"""tools/check_kernels.py: the book's kernels compile for sm_90a without a GPU, on the installed Triton.

Each test runs the check in a process of its own: the check must define the kernels compiled (not
interpreted), while this test process runs them in Triton's interpreter. A small subset only: the
whole check takes minutes (see the tool's docstring).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT / "tools" / "check_kernels.py"


def run(args=(), code=None, timeout=600):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cmd = [sys.executable, "-c", textwrap.dedent(code)] if code else [sys.executable, str(TOOL), *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def test_a_few_kernels_compile_for_sm_90a():
    """Two launches of the read-only kernels and two of each chapter's kernels, compiled to cubins."""
    for group in ("stream", "decode_attention,grouped_gemm"):
        r = run(["--only", group, "--limit", "2", "--jobs", "1", "-v"])
        assert r.returncode == 0, r.stdout + r.stderr
        assert "compiled" in r.stdout and "FAILED" not in r.stdout


def test_a_rejected_kernel_is_named_with_its_configuration(tmp_path):
    """A kernel the frontend refuses (a block that is not a power of two) fails the check, and the message
    names the kernel and the configuration."""
    (tmp_path / "bad_kernels.py").write_text(textwrap.dedent('''
        import triton
        import triton.language as tl

        @triton.jit
        def bad_kernel(X, n, BLOCK: tl.constexpr):
            offs = tl.arange(0, BLOCK)
            tl.store(X + offs, tl.load(X + offs, mask=offs < n))
    '''))
    r = run(code=f'''
        import sys
        sys.path[:0] = [{str(ROOT / "tools")!r}, {str(tmp_path)!r}]
        import check_kernels as ck  # first: kernels defined after it are compiled, not interpreted
        import torch
        import bad_kernels
        x = torch.empty(64, device="meta")
        jobs = [ck.job_for(bad_kernels.bad_kernel, (x, 64), dict(BLOCK=b, num_warps=4), "a test") for b in (24, 32)]
        failures = ck.run(jobs)
        print("FAILURES", len(failures))
    ''')
    assert r.returncode == 0, r.stderr
    assert "FAILURES 1" in r.stdout, r.stdout + r.stderr
    assert "FAILED bad_kernel {'BLOCK': 24}" in r.stdout and "(from a test)" in r.stdout
    assert "{'BLOCK': 32}" not in r.stdout.split("FAILURES")[0]  # the good block compiled silently


def test_specialization_matches_triton_and_the_plans():
    """The check specializes arguments as Triton's launcher does (compared with Triton's own
    specialization where this release exposes it), and its chapter-3 jobs are what DecodeAttention plans
    at the seed's shape for an H200."""
    r = run(code='''
        import json, sys
        sys.path.insert(0, "tools")
        import check_kernels as ck
        import torch
        from lib.kernels import decode_attention as da, launch
        values = [1, 2, 16, 17, 48, -16, 2**31 - 1, 2**31, 2**33, 0.5, True, None,
                  torch.empty(8, dtype=torch.bfloat16), torch.empty(8, dtype=torch.int32)]
        mine = [list(ck.specialize(v)) for v in values]
        try:
            from triton.backends.compiler import BaseBackend
            from triton.runtime.jit import native_specialize_impl
            theirs = [list(native_specialize_impl(BaseBackend, v, False, True, True)) for v in values]
            theirs = [[k, a or ""] if k != "constexpr" else [k, a] for k, a in theirs]
        except ImportError:
            theirs = None
        launch.sm_count = lambda device: ck.H200_SMS
        q, lens = ck._meta(8, 32, 128), ck._meta(8, dtype=torch.int32)
        kc, bt = ck._meta(8 * 256, 8, 16, 128), ck._meta(8, 256, dtype=torch.int32)
        plan = da.DecodeAttention(q, kc, kc, bt, lens)
        jobs = ck.plan_jobs(["decode_attention"])
        found = [j.shown for j in jobs if j.name == "_decode_kernel" and j.options == plan.options]
        print(json.dumps({"mine": mine, "theirs": theirs, "planned": plan.meta in found,
                          "names": sorted({j.name for j in jobs})}))
    ''')
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["mine"][:3] == [["constexpr", 1], ["i32", ""], ["i32", "D"]]
    assert out["mine"][8] == ["i64", "D"] and out["mine"][12] == ["*bf16", "D"]
    if out["theirs"] is not None:
        assert out["mine"] == out["theirs"]
    assert out["planned"], "the check's jobs do not include the seed's planned launch"
    assert out["names"] == ["_combine_kernel", "_decode_kernel"]
