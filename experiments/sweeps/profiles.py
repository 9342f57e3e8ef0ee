"""Depth profiles of a sweep: per-block residual RMS of every stream and pre-clip gradient norm per block.

Read from the runs' TensorBoard event files (the :class:`experiments.monitoring.diagnostics.Diagnostics` tags
``diag/rms/<stream>/block_<b>`` and ``diag/grad_norm/block_<b>``) at the last logged step, and drawn
as one row per learning rate: residual RMS against depth on the left (the paper's "hidden-state norms
grow with depth in Pre-Norm, not in the Post-Norm-like stream"), gradient norm against depth on the
right (vanishing gradients in the lower blocks are how Post-Norm stalls). Line colour is the run
without its learning rate (the scheme, plus warmup / seed when the sweep varies them), line style the
stream.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

RMS_TAG = re.compile(r"^diag/rms/(?P<stream>[^/]+)/block_(?P<block>\d+)$")
GRAD_TAG = re.compile(r"^diag/grad_norm/block_(?P<block>\d+)$")
STREAM_STYLE = {"x": "-", "pre": "-", "h0": "-", "hybrid": "-", "post": "--", "delta": ":", "h1": "-."}

Profile = dict[str, list[float]]  # {"rms/<stream>" | "grad": value per block, NaN where missing}


def last_diagnostics(run_dir: Path) -> dict[str, float]:
    """``{tag: value}`` of every ``diag/`` scalar of a run at its last logged step ({} without any)."""
    if not any(run_dir.glob("events.out.tfevents.*")):
        return {}
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 1})  # the reservoir always keeps the last
    acc.Reload()
    return {tag: acc.Scalars(tag)[-1].value for tag in acc.Tags()["scalars"] if tag.startswith("diag/")}


def depth_profile(values: dict[str, float]) -> Profile:
    """Groups ``diag/`` scalars into per-block lists: one per residual stream, one for gradient norms."""
    found: dict[str, dict[int, float]] = {}
    for tag, value in values.items():
        if m := RMS_TAG.match(tag):
            found.setdefault(f"rms/{m['stream']}", {})[int(m["block"])] = value
        elif m := GRAD_TAG.match(tag):
            found.setdefault("grad", {})[int(m["block"])] = value
    return {key: [blocks.get(b, math.nan) for b in range(max(blocks) + 1)] for key, blocks in found.items()}


def _positive(values: list[float]) -> list[float]:
    return [v if math.isfinite(v) and v > 0 else math.nan for v in values]  # log axes: drop 0, inf, NaN


def plot_depth_profiles(sweep_dir: Path, table: list[dict], path: Path) -> bool:
    """Draws ``path`` from the runs of ``table`` (rows of :func:`experiments.sweeps.compare.rows`); False if no
    run logged diagnostics."""
    profiles = {r["run"]: depth_profile(last_diagnostics(sweep_dir / r["run"])) for r in table}
    runs = [r for r in table if profiles[r["run"]]]
    if not runs:
        return False
    lrs = sorted({r["lr"] for r in runs if r["lr"] is not None}) or [None]
    variant = {r["run"]: re.sub(r"-lr[^-]+", "", r["run"]) for r in runs}  # one colour across the rows
    colour = {v: plt.get_cmap("tab10")(i % 10) for i, v in enumerate(dict.fromkeys(variant.values()))}
    fig, axes = plt.subplots(len(lrs), 2, figsize=(12, 3.6 * len(lrs)), squeeze=False)
    for row, lr in enumerate(lrs):
        ax_rms, ax_grad = axes[row]
        for r in runs:
            if r["lr"] != lr and lr is not None:
                continue
            name = variant[r["run"]]
            profile, c = profiles[r["run"]], colour[name]
            for key, values in profile.items():
                if key == "grad":
                    ax_grad.plot(range(len(values)), _positive(values), color=c, marker="o", ms=3, label=name)
                    continue
                stream = key.split("/", 1)[1]
                label = name if stream == "x" else f"{name} ({stream})"
                ax_rms.plot(range(len(values)), _positive(values), color=c, ls=STREAM_STYLE.get(stream, "-"),
                            marker="o", ms=3, label=label)  # fmt: skip
        where = "" if lr is None else f", peak lr {lr:g}"
        for ax, title in ((ax_rms, "residual RMS after each block"), (ax_grad, "gradient norm per block (pre-clip)")):
            ax.set_yscale("log")
            ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
            ax.set_xlabel("block")
            ax.set_title(title + where, fontsize=10)
            ax.grid(alpha=0.3, which="both")
            ax.legend(fontsize=7, ncol=2)
    fig.suptitle("depth profiles at the last logged step", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
