"""The comparison's PNGs: loss curves (mean over seeds with a 95 % CI band, and a zoom on the final part),
the scheme x learning-rate stability map, and the final metric against the learning rate with CI bands.

Colours are the schemes' (:mod:`experiments.results.palette`), the same in every plot. A cell's mean curve
averages the runs its table row averages: the finished ones (a cell whose runs all stalled shows the mean of
the stalled runs, as its row does). Any other run (stalled beside finished ones, diverged, crashed,
interrupted) is drawn on its own as a thin dashed line (an ``x`` where it diverged), never averaged in.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib
import matplotlib.ticker
import numpy as np

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from experiments.results.cells import PRIMARY, Cell, CellStats, cell_stats, finite, varying_axes  # noqa: E402
from experiments.results.palette import scheme_colours  # noqa: E402
from experiments.results.stats import CI_NAME, interval_bands  # noqa: E402
from experiments.results.tables import fmt, fmt_estimate  # noqa: E402
from fileio import atomic_file  # noqa: E402

RAN = ("finished", "stalled")  # ran to the end: a curve and a final value that mean something
ZOOM_FROM = 0.5  # the zoom panels show the last half of the steps
TRAIN_SMOOTHING = 5  # the zoomed training loss is a trailing mean over this many logged points


def save_figure(fig, path: Path, dpi: int) -> None:
    """Saves ``fig`` as a PNG atomically (two comparisons at once: each file is one of them, whole) and closes it."""
    with atomic_file(path) as f:
        fig.savefig(f, format="png", dpi=dpi)
    plt.close(fig)


def facet_label(cell: Cell, axes: list[str]) -> str:
    """The cell's coordinates other than the scheme (``lr 0.01``, ``tiny-depth-d16``), for rows and lines."""
    parts = []
    for axis in axes:
        value = cell.coords.get(axis)
        if axis == "scheme" or value is None:
            continue
        parts.append(f"{axis} {value:g}" if isinstance(value, float) else str(value) if axis == "overlay" else
                     f"{axis} {value}")  # fmt: skip
    return ", ".join(parts)


def _curve(summary_curve: list, val: bool) -> dict[int, float]:
    points = {}
    for step, value in summary_curve or []:
        v = finite(value.get("val/loss") if val else value)
        if v is not None:
            points[int(step)] = v
    return points


def _smooth(values: np.ndarray, k: int) -> np.ndarray:
    """Trailing mean over ``k`` points along the last axis (fewer at the start)."""
    cumulative = np.cumsum(values, axis=-1)
    out = cumulative.copy()
    out[..., k:] = cumulative[..., k:] - cumulative[..., :-k]
    counts = np.minimum(np.arange(1, values.shape[-1] + 1), k)
    return out / counts


def mean_curve(curves: list[dict[int, float]], smooth: int = 1) -> tuple[np.ndarray, ...] | None:
    """Steps every curve has, and the mean with its t-interval over the curves (None without any)."""
    if not curves:
        return None
    steps = sorted(set.intersection(*(set(c) for c in curves)))
    if not steps:
        return None
    values = np.asarray([[c[s] for s in steps] for c in curves])  # (replicates, steps)
    if smooth > 1:
        values = _smooth(values, smooth)
    return (np.asarray(steps), *interval_bands(values))


def _ylim(ax, series: list[np.ndarray], pad: float = 0.12) -> None:
    values = np.concatenate([s[np.isfinite(s)] for s in series]) if series else np.array([])
    if values.size:
        lo, hi = float(values.min()), float(values.max())
        margin = pad * (hi - lo) if hi > lo else 0.05 * max(abs(hi), 1e-3)
        ax.set_ylim(lo - margin, hi + margin)


def averaged_runs(cell: Cell) -> list[dict]:
    """The runs a cell's mean curve averages, those its table row averages: the finished runs, or, when none
    finished, the stalled ones (the row's ``stalled`` mean)."""
    finished = [r for r in cell.runs if r["status"] == "finished"]
    return finished or [r for r in cell.runs if r["status"] == "stalled"]


def plot_curves(cells: list[Cell], summaries: dict[str, dict], path: Path, title: str) -> None:
    """One row per facet (the cells' coordinates besides the scheme); columns: validation loss, its zoom on
    the last half of the steps, training loss, its zoom (smoothed). Mean over seeds, band: 95 % CI."""
    axes_names = varying_axes(cells)
    facets: dict[str, list[Cell]] = {}
    for cell in cells:
        facets.setdefault(facet_label(cell, axes_names), []).append(cell)
    colours = scheme_colours(c.scheme for c in cells)
    fig, grid = plt.subplots(len(facets), 4, figsize=(18, 3.4 * len(facets) + 1.2), squeeze=False)
    last = max((s for r in summaries.values() for s, _ in r.get("train_curve") or []), default=1)
    for row, (facet, members) in enumerate(facets.items()):
        panels = grid[row]
        ranges: dict[int, list[np.ndarray]] = {i: [] for i in range(4)}
        for cell in members:
            colour = colours[cell.scheme]
            averaged = averaged_runs(cell)
            ran = [summaries[r["run"]] for r in averaged]
            for col, val, smooth in ((0, True, 1), (1, True, 1), (2, False, 1), (3, False, TRAIN_SMOOTHING)):
                curve = mean_curve([_curve(s.get("val_curve" if val else "train_curve"), val) for s in ran], smooth)
                if curve is None:
                    continue
                steps, mean, low, high = curve
                n = len(ran)
                panels[col].plot(steps, mean, color=colour, lw=1.6, marker="o" if val else None, ms=3)
                if col == 1 and n < len(cell.runs):  # fewer seeds than the others: say so at the line's end
                    panels[col].annotate(f"n = {n}", (steps[-1], mean[-1]), xytext=(4, 0), textcoords="offset points",
                                         fontsize=7, color=colour, va="center")  # fmt: skip
                if n > 1:
                    panels[col].fill_between(steps, low, high, color=colour, alpha=0.18, lw=0)
                stalled = all(r["status"] == "stalled" for r in averaged)
                if col in (1, 3):
                    keep = steps >= ZOOM_FROM * last
                    if not stalled and keep.any():  # a stalled cell sits far above: it would flatten the zoom
                        ranges[col].append(mean[keep])
                else:
                    ranges[col] += [mean, low, high]
            for r in cell.runs:  # runs not in the mean: drawn alone
                if r in averaged:
                    continue
                for col, val in ((0, True), (2, False)):
                    points = _curve(summaries[r["run"]].get("val_curve" if val else "train_curve"), val)
                    if points:
                        xs, ys = zip(*sorted(points.items()), strict=True)
                        panels[col].plot(xs, ys, color=colour, lw=0.8, ls="--")
                        if r["status"] == "diverged":
                            panels[col].plot(xs[-1:], ys[-1:], color=colour, marker="x", ms=8, mew=2)
        where = f"{facet}: " if facet else ""
        zoom = f"zoom (last {(1 - ZOOM_FROM) * 100:.0f} %"
        titles = ("validation loss", f"validation loss, {zoom} of steps)", "training loss",
                  f"training loss, {zoom}, {TRAIN_SMOOTHING}-point mean)")  # fmt: skip
        for col, ax in enumerate(panels):
            ax.set_title(where + titles[col], fontsize=9)
            ax.set_xlabel("step")
            ax.set_ylabel("val/loss" if col < 2 else "train/loss")
            ax.grid(alpha=0.3)
            if col in (1, 3):
                ax.set_xlim(ZOOM_FROM * last, last * 1.02)
            _ylim(ax, ranges[col], pad=0.15 if col in (1, 3) else 0.05)
    handles = [Line2D([], [], color=c, lw=2, label=name) for name, c in colours.items()]
    alone = "run not in the mean (stalled, crashed; x: diverged)"
    handles += [
        Patch(color="#888888", alpha=0.3, label=f"band: {CI_NAME} of the mean over seeds"),
        Line2D([], [], color="#888888", ls="--", marker="x", label=alone),
    ]
    height = fig.get_figheight()
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 5), fontsize=8, frameon=False)
    fig.suptitle(title + f"\nmean over seeds per cell; band: {CI_NAME}", fontsize=11)
    rows_of_legend = math.ceil(len(handles) / 5)
    fig.tight_layout(rect=(0, (0.25 + 0.22 * rows_of_legend) / height, 1, 1))
    save_figure(fig, path, dpi=110)


def _state(stats: CellStats) -> str:
    counts = stats.cell.counts()
    if counts.get("diverged"):
        return "diverged"
    if counts.get("stalled"):
        return "stalled"
    if set(counts) - {"finished"}:
        return "crashed"
    return "spikes" if any(r.get("spikes") for r in stats.cell.runs) else "ok"


def plot_stability(cells: list[Cell], path: Path, metric: str) -> bool:
    """Cells x learning rate: ``mean ± CI (n)`` of the metric, coloured by the worst status in the cell."""
    lrs = sorted({c.coords.get("lr") for c in cells if c.coords.get("lr") is not None})
    if len(lrs) < 2:
        return False
    axes_names = [a for a in varying_axes(cells) if a != "lr"]
    label = {c.key: " ".join(x for x in (c.scheme, facet_label(c, axes_names)) if x) for c in cells}
    rows = list(dict.fromkeys(label.values()))
    colours = {"ok": "#9bd69b", "spikes": "#f5d76e", "stalled": "#f4a261", "diverged": "#e06666", "crashed": "#999999"}
    fig, ax = plt.subplots(figsize=(2.2 + 2.1 * len(lrs), 0.9 + 0.62 * len(rows)))
    for stats in cell_stats(cells, PRIMARY, metric=metric):
        i, j = rows.index(label[stats.cell.key]), lrs.index(stats.cell.coords["lr"])
        text = fmt_estimate(stats.value) if stats.value else (f"stalled\n{fmt_estimate(stats.stalled)}"
                                                              if stats.stalled else "-")  # fmt: skip
        failed = {k: v for k, v in stats.cell.counts().items() if k != "finished"}
        if stats.value is None and stats.stalled is not None:
            failed.pop("stalled", None)  # the text says so already
        if failed:
            text += "\n" + ", ".join(f"{v} {k}" for k, v in failed.items())
        spikes = sum(r.get("spikes") or 0 for r in stats.cell.runs)
        if spikes:
            text += f"\n{spikes} spikes"
        ax.add_patch(plt.Rectangle((j, i), 1, 1, color=colours[_state(stats)]))
        ax.text(j + 0.5, i + 0.5, text.replace(" (n", "\n(n", 1), ha="center", va="center", fontsize=7)
    ax.set_xlim(0, len(lrs))
    ax.set_ylim(0, len(rows))
    ax.set_xticks([j + 0.5 for j in range(len(lrs))], [f"{lr:g}" for lr in lrs])
    ax.set_yticks([i + 0.5 for i in range(len(rows))], rows)
    ax.invert_yaxis()
    ax.set_xlabel("peak learning rate")
    ax.set_title(f"stability map: final {metric}, mean ± {CI_NAME} (n)\n"
                 "green ok, yellow spikes, orange stalled, red diverged, grey crashed", fontsize=10)  # fmt: skip
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    return True


def plot_metric_vs_lr(cells: list[Cell], path: Path, metric: str) -> bool:
    """Final metric against peak learning rate: per scheme (and other swept axis) the mean over seeds with
    its 95 % CI band; diverged runs are crosses (clipped just outside the finished range, at the top edge
    when they never validated), stalled runs open squares."""
    lrs = sorted({c.coords.get("lr") for c in cells if c.coords.get("lr") is not None})
    if len(lrs) < 2:
        return False
    axes_names = [a for a in varying_axes(cells) if a != "lr"]
    stats = cell_stats(cells, PRIMARY, metric=metric)
    done = [v for s in stats for v in s.cell.values().values()] + [v for s in stats for v in s.cell.values(
        PRIMARY, "stalled").values()]  # fmt: skip
    lo, hi = (min(done), max(done)) if done else (0.0, 1.0)
    margin = 0.08 * (hi - lo) if hi > lo else 0.05 * max(abs(hi), 1e-3)
    colours = scheme_colours(c.scheme for c in cells)
    styles = ["-", "--", "-.", ":"]
    lines: dict[str, list[CellStats]] = {}
    for s in stats:
        lines.setdefault(" ".join(x for x in (s.cell.scheme, facet_label(s.cell, axes_names)) if x), []).append(s)
    fig, ax = plt.subplots(figsize=(7, 4.8))
    facets = list(dict.fromkeys(facet_label(s.cell, axes_names) for s in stats))
    for name, members in lines.items():
        colour = colours[members[0].cell.scheme]
        ls = styles[facets.index(facet_label(members[0].cell, axes_names)) % len(styles)]
        points = sorted((s.cell.coords["lr"], s.value) for s in members if s.value is not None)
        if points:
            xs = [lr for lr, _ in points]
            ax.plot(xs, [e.mean for _, e in points], marker="o", color=colour, ls=ls, label=name)
            band = [(lr, e) for lr, e in points if e.low is not None]
            if len(band) > 1:
                ax.fill_between([lr for lr, _ in band], [e.low for _, e in band], [e.high for _, e in band],
                                color=colour, alpha=0.15, lw=0)  # fmt: skip
            for lr, e in band if len(band) == 1 else []:
                ax.errorbar([lr], [e.mean], yerr=[[e.mean - e.low], [e.high - e.mean]], color=colour, capsize=3)
        for s in members:
            for r in s.cell.runs:
                v = finite(r.get(PRIMARY))
                if r["status"] == "diverged":
                    y = hi + margin if v is None else min(max(v, lo - margin), hi + margin)
                    ax.plot([r["lr"]], [y], marker="x", ms=11, mew=2.5, color=colour, ls="none")
                elif r["status"] == "stalled" and v is not None:
                    ax.plot([r["lr"]], [v], marker="s", ms=12, mfc="none", mew=1.5, color=colour, ls="none")
    ax.plot([], [], marker="x", ms=9, mew=2, ls="none", color="k", label="diverged run")
    if any(c.counts().get("stalled") for c in cells):
        ax.plot([], [], marker="s", ms=9, mfc="none", ls="none", color="k", label="stalled run (near baseline)")
    ax.set_xscale("log")
    ax.set_xticks(lrs, [f"{lr:g}" for lr in lrs])
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())  # only the swept rates are labelled
    ax.set_xlabel("peak learning rate")
    ax.set_ylabel(f"final {metric}")
    n = max((len(c.values()) for c in cells), default=0)
    ax.set_title(f"final {metric}: mean over seeds, band {CI_NAME}" + (" (n = 1: no band)" if n < 2 else ""))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    return True


def model_title(record: dict, summaries: dict[str, dict], seeds: list, metric: str) -> str:
    """``<experiment>: <task> <configs> (<params>), seeds 1, 2, 3``: what the curves are of."""
    configs = [Path(c).stem for c in record.get("configs") or []]
    overlays = [Path(c).stem for c in record.get("overlays") or []]
    params = sorted(p for s in summaries.values() if isinstance(p := s.get("params"), int))
    size = ""
    if params:
        lo, hi = params[0] / 1e6, params[-1] / 1e6
        size = f" ({lo:.2f} M params)" if math.isclose(lo, hi, rel_tol=0.005) else f" ({lo:.2f}-{hi:.2f} M params)"
    tasks = sorted({s.get("task") for s in summaries.values() if s.get("task")})
    model = " + ".join(configs) + (f", shapes {', '.join(overlays)}" if overlays else "")
    seeds_text = ", ".join(fmt(s) for s in seeds) if seeds else "one run per cell"
    name = record.get("name") or "sweep"
    return f"{name}: {'/'.join(tasks) or 'runs'} {model}{size}; seeds {seeds_text}; key metric {metric}"
