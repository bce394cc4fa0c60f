"""Chapter 3's experiment (lib.experiments.kv_cache) measured at its smoke size on the CPU.

The paths are the notebook's own: its code cells up to the run cell (the imports, ``plans``, ``paths``,
``floors``) are executed here, so what is tested is what the notebook times. The data must have the
structure of the stored H200 results, which replay through the same analysis; a path that computes
something else than attention, or a read-only kernel that skips bytes, must stop the run.
"""

from __future__ import annotations

import json

import pytest
import torch

from lib.bench import results
from lib.experiments import kv_cache
from tests.conftest import ROOT

NOTEBOOK = ROOT / "notebooks" / "03-kv-cache.ipynb"
REFERENCE = results.load("03-kv-cache")


def notebook_definitions() -> dict:
    """The namespace of the notebook's code cells before its run cell (the one calling measure_or_replay)."""
    ns: dict = {}
    for cell in json.loads(NOTEBOOK.read_text())["cells"]:
        src = "".join(cell["source"])
        if cell["cell_type"] != "code":
            continue
        if "measure_or_replay" in src:
            return ns
        exec(compile(src, str(NOTEBOOK), "exec"), ns)
    raise AssertionError("the notebook has no run cell calling measure_or_replay")


NB = notebook_definitions()
SMOKE = kv_cache.sweep("smoke")


def definitions(paths=None, floors=None):
    return NB["plans"], paths or NB["paths"], floors or NB["floors"]


@pytest.fixture(scope="module")
def data():
    return kv_cache.measure(SMOKE, "cpu", *definitions())


def test_unknown_size_is_refused():
    with pytest.raises(ValueError, match="'full' or 'smoke'"):
        kv_cache.sweep("medium")


def row_keys(rows):
    """{kind of row: its keys in order}, a row's kind being its path (or layout or page) without numbers."""
    out = {}
    for r in rows:
        out.setdefault(r.get("path", r.get("layout", "").split(" ")[0]), list(r))
    return out


def test_smoke_data_has_the_structure_of_the_reference(data):
    ref = REFERENCE["data"]
    assert list(data) == list(ref)
    for section in ("check", "points", "pages", "paging", "short"):
        have, want = row_keys(data[section]), row_keys(ref[section])
        assert set(have) <= set(want), f"{section}: rows of kinds the reference lacks: {set(have) - set(want)}"
        for kind, keys in have.items():
            assert keys == want[kind], f"{section} {kind!r}: keys {keys}, the reference's {want[kind]}"
    for r, ref_r in ((data["points"][0], ref["points"][0]), (data["short"][0], ref["short"][0])):
        timing = r["timing"] if "timing" in r else r["rounds"][0]
        ref_timing = ref_r["timing"] if "timing" in ref_r else ref_r["rounds"][0]
        assert list(timing) == list(ref_timing) and list(timing["gpu_us"]) == list(ref_timing["gpu_us"])


def test_every_path_runs_once_at_the_seed_shape(data):
    B, L, H_kv = SMOKE["seed"]
    assert [[r["B"], r["L"], r["H_kv"]] for r in data["points"]] == [SMOKE["seed"]] * len(data["points"])
    assert [r["path"] for r in data["points"]] == [
        "sdpa", "kernel dense", "kernel paged 16", "kernel paged 16, one launch", "kernel paged 16, two launches",
        "kernel paged 16, no prefetch", "kernel paged 16, 4 warps", "kernel paged 16, split pass alone", "naive",
        "read-only", "read-only paged 16", "kernel paged 16, unplanned"]
    # hand-worked: K and V of 1 request, 32 tokens, 1 head of 16 float32 elements: 2 * 32 * 16 * 4 bytes
    assert {r["Q"] for r in data["points"]} == {4096} and {r["sets"] for r in data["points"]} == {1}
    by = {r["path"]: r for r in data["points"]}
    for path, r in by.items():
        if r["err"] is not None:
            assert 0 <= r["err"] < 1e-4, path
        assert r["timing"]["method"] == "cpu-wall" and r["timing"]["gpu_us"]["n"] == SMOKE["reps"]
    assert by["kernel paged 16, one launch"]["combine"] == "inline"
    assert by["kernel paged 16, two launches"]["combine"] == "kernel"
    # the split pass's splits are read from its partials: the two-launch plan's
    assert by["kernel paged 16, split pass alone"]["splits"] == by["kernel paged 16, two launches"]["splits"] == 2
    assert by["kernel paged 16"]["warps"] == 1 and by["kernel paged 16, 4 warps"]["warps"] == 4
    for path in ("read-only", "read-only paged 16"):
        assert tuple(by[path]["read_config"]) in kv_cache.READ_LAUNCHES[path]
    assert by["kernel paged 16, unplanned"]["err"] is None


def test_checks_pages_paging_and_short_contexts(data):
    c = SMOKE["check"]
    assert [(r["H_kv"], r["page"]) for r in data["check"]] == [(h, pg) for h in c["Hkvs"] for pg in c["pages"]]
    for r in data["check"]:
        assert r["lens"][:2] == [1, c["L"]] and r["guard_intact"] and r["err"] < 1e-4
    assert [r["page"] for r in data["pages"]] == ["dense", 1, 16]
    assert [r["layout"] for r in data["paging"]] == ["in order", "random 1"]
    assert all(r["pairs"]["ratio"]["n"] == SMOKE["paging"]["pairs"] for r in data["paging"])
    short = data["short"]
    assert [(r["L"], r["path"]) for r in short] == [(L, p) for L in SMOKE["short"]["Ls"]
                                                   for p in ("sdpa", "kernel paged 16", "read-only paged 16")]
    assert all(len(r["rounds"]) == SMOKE["short"]["rounds"] for r in short)
    assert [r["launch"] is not None for r in short] == [p == "kernel paged 16" for _, p in
                                                        ((r["L"], r["path"]) for r in short)]


def one_shape(**kw):
    B, L, H_kv = SMOKE["seed"]
    return kv_cache.measure_shape(B, L, H_kv, SMOKE, "cpu", torch.Generator().manual_seed(0), 0, *definitions(**kw))


def test_a_path_that_computes_something_else_stops_the_run():
    def paths(x, plan, p):  # the paged kernel handed K where V belongs
        return {"kernel paged 16, V from K": lambda: plan["kernel paged 16"](x.q, x.kc, x.kc, x.bt, x.lens)}
    with pytest.raises(kv_cache.WrongResult, match="V from K"):
        one_shape(paths=paths)


def test_wrong_partials_of_a_split_pass_stop_the_run():
    def paths(x, plan, p):  # the split pass's partials with one split's maximum off by one (a factor 2)
        def wrong():
            acc, m, l_sum = plan["kernel paged 16, two launches"].partials(x.q, x.kc, x.vc, x.bt, x.lens)
            m = m.clone()
            m[..., 0] += 1
            return acc, m, l_sum
        return {"split pass": wrong}
    with pytest.raises(kv_cache.WrongResult, match="split pass"):
        one_shape(paths=paths)


def test_a_read_only_kernel_that_skips_bytes_stops_the_run():
    def paths(x, plan, p):
        return {}

    def floors(x):  # K read twice, V never
        return {"read-only": lambda launch: NB["stream"].read_sum(x.k, x.k, **launch)}
    with pytest.raises(kv_cache.WrongResult, match="read-only"):
        one_shape(paths=paths, floors=floors)


def test_a_read_only_kernel_without_launches_is_refused():
    def floors(x):
        return {"read-only, another": lambda launch: NB["stream"].read_sum(x.k, x.v, **launch)}
    with pytest.raises(ValueError, match="READ_LAUNCHES"):
        one_shape(paths=lambda x, plan, p: {}, floors=floors)


def test_check_output_refuses_nan():
    ref = torch.ones(1, 2, 16)
    assert kv_cache.check_output("p", ref.clone(), ref, SMOKE, "here") == 0.0
    with pytest.raises(kv_cache.WrongResult, match="p at here"):
        kv_cache.check_output("p", torch.full_like(ref, float("nan")), ref, SMOKE, "here")
