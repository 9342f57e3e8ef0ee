"""Depth profiles of a sweep: per-block residual RMS of every stream and pre-clip gradient norm per block.

Read from the runs' TensorBoard event files (the :class:`experiments.monitoring.diagnostics.Diagnostics` tags
``diag/rms/<stream>/block_<b>`` and ``diag/grad_norm/block_<b>``) at the last logged step, and drawn
as one row per facet (learning rate, shape ...): residual RMS against depth on the left (the paper's
"hidden-state norms grow with depth in Pre-Norm, not in the Post-Norm-like stream"), gradient norm
against depth on the right (vanishing gradients in the lower blocks are how Post-Norm stalls). Line
colour is the scheme (the suite's palette), line style the stream, both keyed in one legend below the panels (a zoo of
28 cells stays readable); seeds are averaged, a diverged run is drawn alone (dotted, x).
"""

from __future__ import annotations

import math
import re
import warnings
from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

from experiments.results.cells import Cell, varying_axes  # noqa: E402
from experiments.results.palette import scheme_colours  # noqa: E402
from experiments.results.plots import RAN, facet_label, save_figure  # noqa: E402

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


def _positive(values) -> np.ndarray:
    v = np.asarray(values, dtype=np.float64)
    return np.where(np.isfinite(v) & (v > 0), v, np.nan)  # log axes: drop 0, inf, NaN


def _draw(ax, values: np.ndarray, colour: str, ls: str = "-", marker: str = "o", band: bool = True) -> None:
    """One profile: the mean over the runs (rows of ``values``) and, with several, the band they span."""
    with warnings.catch_warnings():  # a block no run logged is NaN in every row
        warnings.simplefilter("ignore", RuntimeWarning)
        mean, lo, hi = np.nanmean(values, axis=0), np.nanmin(values, axis=0), np.nanmax(values, axis=0)
    blocks = np.arange(values.shape[1])
    ax.plot(blocks, mean, color=colour, ls=ls, marker=marker, ms=3)
    if band and values.shape[0] > 1:
        ax.fill_between(blocks, lo, hi, color=colour, alpha=0.15, lw=0)


def plot_depth_profiles(sweep_dir: Path, cells: list[Cell], path: Path) -> bool:
    """Draws ``path`` for the runs of ``cells`` (:func:`experiments.results.cells.group`); False if no run
    logged diagnostics.

    One row per facet (learning rate, shape, warmup: the cells' coordinates besides the scheme), colour per
    scheme (:mod:`experiments.results.palette`), line style per stream. The runs of a cell that ran to the
    end are averaged, the band spans them (min to max over seeds); a diverged run is drawn alone, dotted;
    runs still running or crashed are left out.
    """
    runs = [r["run"] for c in cells for r in c.runs if r["status"] != "running"]  # a running run's files: unread
    profiles = {run: depth_profile(last_diagnostics(sweep_dir / run)) for run in runs}
    cells = [c for c in cells if any(profiles.get(r["run"]) for r in c.runs)]
    if not cells:
        return False
    axes_names = varying_axes(cells)
    facets: dict[str, list[Cell]] = {}
    for cell in cells:
        facets.setdefault(facet_label(cell, axes_names), []).append(cell)
    colours = scheme_colours(c.scheme for c in cells)
    fig, axes = plt.subplots(len(facets), 2, figsize=(12, 3.6 * len(facets)), squeeze=False)
    streams: dict[str, dict[str, None]] = {}  # line style -> the streams drawn with it, in order
    any_diverged = False
    for row, (facet, members) in enumerate(facets.items()):
        ax_rms, ax_grad = axes[row]
        for cell in members:
            colour = colours[cell.scheme]
            ran = [profiles[r["run"]] for r in cell.runs if r["status"] in RAN and profiles[r["run"]]]
            alone = [(r["status"], profiles[r["run"]]) for r in cell.runs if r["status"] == "diverged"]
            alone = [(status, p) for status, p in alone if p]
            groups = [(ran, False)] + [([p], True) for _, p in alone]  # a diverged run alone, marked x
            any_diverged = any_diverged or bool(alone)
            for runs, diverged in groups:
                if not runs:
                    continue
                for key in dict.fromkeys(k for p in runs for k in p):
                    depth = max(len(p.get(key, [])) for p in runs)
                    values = np.full((len(runs), depth), np.nan)
                    for i, p in enumerate(runs):
                        values[i, : len(p.get(key, []))] = _positive(p.get(key, []))
                    marker = "x" if diverged else "o"
                    if key == "grad":
                        _draw(ax_grad, values, colour, ls=":" if diverged else "-", marker=marker)
                        continue
                    stream = key.split("/", 1)[1]
                    ls = ":" if diverged else STREAM_STYLE.get(stream, "-")
                    streams.setdefault(STREAM_STYLE.get(stream, "-"), {})[stream] = None
                    _draw(ax_rms, values, colour, ls=ls, marker=marker)
        where = f", {facet}" if facet else ""
        for ax, title in ((ax_rms, "residual RMS after each block"), (ax_grad, "gradient norm per block (pre-clip)")):
            ax.set_yscale("log")
            ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
            ax.set_xlabel("block")
            ax.set_ylabel("RMS" if ax is ax_rms else "gradient norm")
            ax.set_title(title + where, fontsize=10)
            ax.grid(alpha=0.3, which="both")
    # one legend for the figure, below it: a colour per scheme, then what each line style is (many cells: readable)
    handles = [Line2D([], [], color=c, lw=2, label=name) for name, c in colours.items()]
    for ls, names in streams.items():
        label = "streams: " + ", ".join("residual" if n == "x" else n for n in names)
        handles.append(Line2D([], [], color="#888888", ls=ls, marker="o", ms=3, label=label))
    if any_diverged:
        handles.append(Line2D([], [], color="#888888", ls=":", marker="x", label="a diverged run (not in the mean)"))
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 5), fontsize=8, frameon=False)
    fig.suptitle("depth profiles at the last logged step: mean over seeds, band: their range", fontsize=11)
    legend = 0.25 + 0.22 * math.ceil(len(handles) / 5)  # inches below the panels
    fig.set_figheight(3.6 * len(facets) + legend)
    fig.tight_layout(rect=(0, legend / fig.get_figheight(), 1, 1))
    save_figure(fig, path, dpi=110)
    return True
