"""The engine loop of ``lib.engine`` as a diagram: what one step does, from requests to tokens.

``engine_loop`` draws the loop as boxes in the order a step visits them: requests arrive in the front end
and wait in the queues; the scheduler admits, plans the step's prefill chunks and decodes, and takes KV
blocks from the pool through the prefix cache (pre-empting when none is left); the runner runs the step,
an eager forward pass when it prefills or a CUDA-graph replay of the fused decode step; the sampler picks
each request's token; tokens stream back, finished requests free their blocks, and the step's record feeds
the metrics. ``STAGES`` names the boxes and what each does.

Chapters: 8.
"""

from __future__ import annotations

from lib.bench import plots

# (name, what it does, module under lib), in the order a step visits them
STAGES = (
    ("front end", "requests in,\ntokens out", "engine.server"),
    ("queues", "one per bucket,\nby priority", "engine.scheduler"),
    ("scheduler", "admit, plan\nchunks, decodes", "engine.scheduler"),
    ("KV blocks", "paged, cached;\npre-empt if full", "prefix_cache"),
    ("runner", "prefill: eager\ndecode: graph", "engine.runner"),
    ("sampler", "greedy or top-p,\non the GPU", "kernels.sampling"),
    ("records", "TTFT, TPOT,\nqueue, KV", "engine.metrics"),
)


def engine_loop():
    """The loop (see the module): seven boxes on a ring, arrows in the order of a step, the step's two
    branches (eager prefill, graph decode) inside the runner's box."""
    import matplotlib.patches as mpatches

    fig, ax = plots.plt.subplots(figsize=(plots.WIDTH_IN, 5.0))
    ax.set_xlim(0, 10)
    ax.set_ylim(0, 5.4)
    ax.axis("off")
    # positions of the boxes' centres: the top row left to right, then the bottom row right to left
    pos = [(1.2, 4.3), (3.7, 4.3), (6.2, 4.3), (8.7, 4.3), (8.7, 1.4), (5.0, 1.4), (1.2, 1.4)]
    w, h = 2.3, 1.6
    for (name, what, module), (x, y) in zip(STAGES, pos):
        box = mpatches.FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.03", linewidth=0.9,
                                      edgecolor="0.25", facecolor="C0" if name == "runner" else "0.93",
                                      alpha=0.35 if name == "runner" else 1.0)
        ax.add_patch(box)
        ax.text(x, y + 0.5, name, ha="center", va="center", fontsize=11, weight="bold")
        ax.text(x, y - 0.05, what, ha="center", va="center", fontsize=10)
        ax.text(x, y - 0.6, module, ha="center", va="center", fontsize=10, color="0.35")
    for (x0, y0), (x1, y1) in zip(pos, pos[1:]):
        dx = w / 2 if y0 == y1 else 0
        dy = h / 2 if x0 == x1 else 0
        sx = 1 if x1 > x0 else -1 if x1 < x0 else 0
        sy = 1 if y1 > y0 else -1 if y1 < y0 else 0
        ax.annotate("", xy=(x1 - sx * dx, y1 - sy * dy), xytext=(x0 + sx * dx, y0 + sy * dy),
                    arrowprops={"arrowstyle": "->", "lw": 1.1, "color": "0.2"})
    (x0, y0), (x1, y1) = pos[-1], pos[0]
    ax.annotate("", xy=(x1, y1 - h / 2), xytext=(x0, y0 + h / 2),
                arrowprops={"arrowstyle": "->", "lw": 1.1, "color": "0.2", "linestyle": "--"})
    ax.text(0.5, 2.85, "next step", fontsize=10, color="0.3", ha="left", va="center")
    ax.set_title("One engine step, from requests to tokens", fontsize=11)
    fig.tight_layout()
    return fig
