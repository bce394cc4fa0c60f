"""Where the book stands, read from results/ and the executed notebooks: the status and devices pages.

- ``status_rows``: for each chapter, the device, date, commit and library versions of its reference
  measurement, whether it is fresh (the code that measured it is unchanged), how many of the
  chapter's claims hold and its targets, met or missed (as its committed notebook glued them:
  ``Claims.glue``). ``target_rows`` lists every target with its chapter and the date its value was
  measured; ``summary`` is the page's one-line count of fresh chapters, claims held and targets met.
- ``HEADLINES`` and ``device_rows``: each chapter's headline numbers on every device that has results.
  The numbers are the ones the chapter's own notebook glues, so nothing is computed twice: for the
  reference device they come from the committed notebooks, for another device from the notebooks
  replayed on its results (``python tools/book.py devices`` writes them under ``_build/devices/``).

Chapters: the status page and the devices page (rendered by tools/site/book_ext.py).
"""

from __future__ import annotations

import ast
import json
import math
from pathlib import Path

from lib.bench import results

ROOT = Path(__file__).resolve().parents[2]
DEVICES_DIR = Path("_build") / "devices"

# (notebook, glue name, what it is, unit); every name is glued by that chapter's notebook, and the label
# names the case exactly: which shape, which statistic over which cases, GPU time or call time
HEADLINES = [
    ("00-the-machine", "copy_bw_GBps",
     "HBM copy bandwidth: best of cudaMemcpyAsync and a copy kernel, buffers >= 4x the L2 (bytes read + written)",
     "GB/s"),
    ("00-the-machine", "read_bw_GBps",
     "HBM read bandwidth: best of torch.sum and the book's read kernel, buffers >= 4x the L2", "GB/s"),
    ("00-the-machine", "bf16_tflops", "dense bf16 matmul rate: best over the square sizes and the layer shapes",
     "TFLOP/s"),
    ("00-the-machine", "launch_graph_us", "kernel launch: a one-element add, GPU time in a CUDA graph", "us"),
    ("00-the-machine", "launch_eager_us", "kernel launch: a one-element add, call time launched eagerly", "us"),
    ("01-matrix-shapes", "measured_knee_M",
     "knee of Y = XW, K = N = 4096 (the attention output layer), L2 cold: tokens M where time starts to grow",
     "tokens"),
    ("02-roofline", "ridge_flop_per_byte", "roofline ridge: bf16 matmul rate / HBM copy bandwidth", "FLOP/byte"),
    ("02-roofline", "model_median_abs_err",
     "roofline model: median |measured / model - 1| over every L2-cold point", "-"),
    ("03-kv-cache", "seed_paged_GBps",
     "decode attention, paged kernel (pages of 16): K/V bytes / GPU time at B = 8, L = 4096, H_q = 32, "
     "H_kv = 8, d = 128", "GB/s"),
    ("03-kv-cache", "seed_sdpa_GBps",
     "decode attention, SDPA: K/V bytes / GPU time at B = 8, L = 4096, H_q = 32, H_kv = 8, d = 128", "GB/s"),
    ("03-kv-cache", "speedup_vs_sdpa_seed",
     "decode attention at B = 8, L = 4096, H_q = 32, H_kv = 8, d = 128: SDPA's GPU time / the paged kernel's", "x"),
    ("04-grouped-gemm", "speedup_vs_grouped_mm_median",
     "grouped GEMM: torch._grouped_mm's GPU time / the book's kernel's (interleaved pairs), median over every case",
     "x"),
    ("04-grouped-gemm", "speedup_vs_loop_e64",
     "grouped GEMM: the eager per-expert loop's call time / the book's kernel's, worst case over E >= 64", "x"),
    ("05-prefix-caching", "speedup_90pct_8k",
     "prefill of an 8192-token prompt, 1.1B model: GPU time uncached / with its first 90% cached", "x"),
    ("05-prefix-caching", "decode_us_min",
     "decode step, 1.1B model, batch 1, 1024-token context (the shortest): GPU time", "us"),
    ("06-batching", "fit_err_median",
     "step-cost model: median |model / measured - 1| over the measured prefill and decode steps", "-"),
    ("06-batching", "incident_ttft_p95_ratio",
     "incident, simulated on the measured step costs: chat requests' TTFT P95 after the change / before", "x"),
    ("07-decode-step", "step_fused_b1_ms",
     "decode step of Llama-3-8B's shapes, batch 1, 1024-token context, fused kernels in a CUDA graph: GPU time", "ms"),
    ("07-decode-step", "step_over_floor_b1",
     "that step's GPU time / its floor (weights and K/V bytes over chapter 0's read rate)", "x"),
    ("07-decode-step", "step_over_floor_b64",
     "decode step of Llama-3-8B's shapes, batch 64, 4096-token contexts, fused, in a CUDA graph: GPU time / floor", "x"),
    ("08-serving-engine", "offline_tps_over_predicted",
     "the book's engine, Llama-3-8B's shapes, every request at once: output tokens/s over what chapter 7's step "
     "predicts", "-"),
    ("08-serving-engine", "sim_vs_engine_tpot_p95_err_max",
     "chapter 6's simulator with step costs fitted to the engine's other runs: largest |simulated / measured - 1| "
     "of TPOT P95 over five open-loop runs", "-"),
    ("09-quantization", "int4_g128_speedup_m1_min",
     "int4 weights (groups of 128), one row, Llama-3-8B's layer products: least speedup over bf16 cuBLAS", "x"),
    ("09-quantization", "step_int4_speedup_b1",
     "decode step of Llama-3-8B's shapes, batch 1, int4 weights: speedup over the bf16 step", "x"),
    ("09-quantization", "fp8_kv_speedup_16k_min",
     "decode attention over an FP8 KV cache, contexts from 16k tokens: least speedup over the bf16 cache", "x"),
    ("10-parallelism", "tp2_rank_speedup_b1",
     "one rank of tensor parallelism 2, Llama-3-8B's decode step at batch 1, before its all-reduces: speedup over "
     "one GPU", "x"),
    ("10-parallelism", "tp2_breakeven_b1_us",
     "predicted all-reduce latency at which TP 2 stops paying for that step at batch 1", "us"),
    ("10-parallelism", "ep_hot_rank_slowdown_measured_max",
     "MoE layer, experts on 2 to 8 ranks, skewed routing: slowest rank's expert time over the mean rank's", "x"),
]


def chapter_notebooks(root: Path = ROOT) -> list[str]:
    """The chapters' notebook names, in order (00-the-machine, ...)."""
    return sorted(p.stem for p in (Path(root) / "notebooks").glob("[0-9][0-9]-*.ipynb"))


def glued(notebook_path: Path) -> dict:
    """The values a notebook glued (numbers as floats, texts as strings), from its saved outputs."""
    nb = json.loads(Path(notebook_path).read_text())
    out = {}
    for cell in nb.get("cells", []):
        for o in cell.get("outputs", []):
            book = o.get("metadata", {}).get("scrapbook", {})
            name = book.get("name")
            text = o.get("data", {}).get(book.get("mime_prefix", "") + "text/plain")
            if name is None or text is None:
                continue
            text = "".join(text) if isinstance(text, list) else text
            try:
                out[name] = float(text)
            except ValueError:
                try:  # a glued string is saved as its repr
                    value = ast.literal_eval(text.strip())
                except (ValueError, SyntaxError):
                    value = None
                out[name] = value if isinstance(value, str) else text.strip().strip("'\"")
    return out


def targets_of(glued_values: dict) -> list[dict]:
    """The targets a notebook recorded (``Claims.target``, glued as ``book_targets``): a list of
    {target, value, goal, met}; empty when it recorded none."""
    raw = glued_values.get("book_targets")
    if raw is None:
        return []
    try:
        goals = json.loads(raw)
    except (TypeError, ValueError) as e:
        raise ValueError(f"book_targets is not the JSON list Claims.glue writes: {raw!r}") from e
    if not isinstance(goals, list) or any(set(g) != {"target", "value", "goal", "met"} for g in goals):
        raise ValueError(f"book_targets does not hold {{target, value, goal, met}} records: {raw!r}")
    return goals


def devices(results_dir: Path | None = None) -> list[str]:
    """Device slugs with at least one chapter's results, the reference first."""
    base = Path(results_dir or results.RESULTS)
    slugs = sorted(p.name for p in base.iterdir() if p.is_dir() and any(p.glob("[0-9][0-9]-*.json")))
    return sorted(slugs, key=lambda s: (s != results.REFERENCE, s))


def status_rows(results_dir: Path | None = None, root: Path = ROOT, slug: str = results.REFERENCE) -> list[dict]:
    """One row per chapter: its reference measurement's provenance, freshness and claims."""
    rows = []
    for nb in chapter_notebooks(root):
        path = results.path_for(nb, slug, results_dir)
        row = {"chapter": nb, "results": path.exists()}
        if path.exists():
            rec = results.read(path, nb, slug)
            prov = rec["provenance"]
            stale = results.stale_reasons(rec, root, path)
            row.update(device=prov.get("name"), date=str(prov.get("date", ""))[:10],
                       commit=(prov.get("commit") or "")[:7] + ("+" if prov.get("dirty") else ""),
                       torch=prov.get("torch"), triton=prov.get("triton"), cuda=prov.get("cuda"),
                       driver=prov.get("driver"), fresh=not stale, stale=stale)
        g = glued(Path(root) / "notebooks" / f"{nb}.ipynb")
        row["claims_held"] = g.get("claims_held")
        row["claims_total"] = g.get("claims_total")
        row["targets"] = targets_of(g)
        rows.append(row)
    return rows


def target_rows(rows: list[dict]) -> list[dict]:
    """Every target of ``rows`` (``status_rows``), in chapter order: {chapter, date, target, value, goal,
    met}; ``date`` is the date of the reference measurement the value comes from ("" when the chapter has
    no results)."""
    return [{"chapter": r["chapter"], "date": r.get("date") or "", **g} for r in rows for g in r["targets"]]


def summary(rows: list[dict]) -> str:
    """The status page's one line: fresh chapters, claims held, and targets met and missed."""
    fresh = sum(1 for r in rows if r.get("fresh"))
    held = sum(r["claims_held"] or 0 for r in rows)
    total = sum(r["claims_total"] or 0 for r in rows)
    goals = target_rows(rows)
    missed = [g for g in goals if not g["met"]]
    by = sorted({g["chapter"] for g in missed})
    return (f"{fresh} of {len(rows)} chapters have fresh reference results; {held:.0f} of {total:.0f} claims hold. "
            f"The chapters set {len(goals)} targets for the book's own code: {len(goals) - len(missed)} met, "
            f"{len(missed)} missed" + (f" (in {', '.join(by)})." if by else "."))


def headline_values(notebook_dir: Path) -> dict[tuple[str, str], float]:
    """HEADLINES' values glued by the notebooks in ``notebook_dir`` (those that are there)."""
    out = {}
    for nb in sorted({h[0] for h in HEADLINES}):
        path = Path(notebook_dir) / f"{nb}.ipynb"
        if path.exists():
            g = glued(path)
            for h in HEADLINES:
                if h[0] == nb and isinstance(g.get(h[1]), float):
                    out[(nb, h[1])] = g[h[1]]
    return out


def device_rows(results_dir: Path | None = None, root: Path = ROOT, replayed: Path | None = None):
    """(devices, rows, missing): each headline's value on every device, and its ratio to the reference.

    The reference's values come from the committed notebooks; another device's from its replayed
    notebooks under ``replayed/<slug>/``. ``missing`` lists the devices whose replayed notebooks are not
    there (run ``python tools/book.py devices``)."""
    replayed = Path(replayed or Path(root) / DEVICES_DIR)
    slugs = devices(results_dir)
    values, missing = {}, []
    for slug in slugs:
        where = Path(root) / "notebooks" if slug == results.REFERENCE else replayed / slug
        values[slug] = headline_values(where) if where.exists() else {}
        if slug != results.REFERENCE and not values[slug]:
            missing.append(slug)
    shown = [s for s in slugs if s not in missing]
    rows = []
    for nb, name, what, unit in HEADLINES:
        row = {"chapter": nb, "name": name, "quantity": what, "unit": unit}
        ref = values.get(results.REFERENCE, {}).get((nb, name))
        for slug in shown:
            v = values[slug].get((nb, name))
            row[slug] = v
            if slug != results.REFERENCE:
                ok = v is not None and ref not in (None, 0) and math.isfinite(v) and math.isfinite(ref)
                row[f"{slug} / {results.REFERENCE}"] = v / ref if ok else None
        rows.append(row)
    return shown, rows, missing
