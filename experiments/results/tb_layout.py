"""A sweep's TensorBoard views: the "Custom Scalars" layout it writes, and the URL that opens its comparison.

``tensorboard --logdir runs/<task>/<sweep>`` then shows, under CUSTOM SCALARS
(``http://localhost:6006/#custom_scalars``), the schemes' losses compared first (validation loss, the
sweep's metric, training loss), then the stability signals, the residual RMS per block, the norm scales
and the learning rate, each with a line per run and stream. Only charts whose tags some run logged are
included: a sweep without ``Diagnostics`` gets no empty "stability" group.

What the log directory cannot decide, the URL can (:func:`comparison_url`). TensorBoard opens on TIME
SERIES, sorts its groups by tag prefix (``diag/`` < ``test/`` < ``train/`` < ``val/``) and expands the
first two; its smoothing (0.6) and "ignore outliers" (on) defaults come from the browser's storage. A URL
may set the tab (``#timeseries``), TIME SERIES' smoothing and pinned cards (query ``smoothing``,
``pinnedCards``: pins sit above every group) and CUSTOM SCALARS' smoothing (``#custom_scalars&
_smoothingWeight=0``); "ignore outliers" stays in the browser's storage, so the sweep must log enough
validation points that dropping each chart's extreme 5 % cannot hide a run.

Where the layout lives: each chart is a tag regex the plugin applies to every run of the log directory,
and the plugin merges the layouts it finds in all runs (identical charts once). So the layout is written
into each run directory of the sweep, in an event file of its own (suffix ``.sweep_layout``), rather than
into the sweep directory itself, where TensorBoard would list it as an extra, empty run named ``.``.
Rebuilding the comparison replaces those files, never the runs' own event files.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from urllib.parse import urlencode

import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.tensorboard import SummaryWriter

Layout = dict[str, dict[str, list]]  # {category: {chart title: ["Multiline", [tag regex, ...]]}}
LAYOUT_SUFFIX = ".sweep_layout"
EVENTS = "events.out.tfevents.*"
TENSORBOARD_URL = "http://localhost:6006/"  # TensorBoard's default; it takes the next free port if that one is busy


def _exact(tag: str) -> str:
    return f"^{re.escape(tag)}$"


def sweep_depth(sweep_dir: Path, names: list[str]) -> int | None:
    """The largest trunk depth among the runs' saved ``config.yaml`` files (None if none is readable)."""
    depths = []
    for name in names:
        path = sweep_dir / name / "config.yaml"
        if not path.is_file():
            continue
        try:
            config = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError:
            continue
        trunk = ((config.get("model") or {}).get("init_args") or {}).get("trunk") or {}
        if isinstance(trunk.get("depth"), int):
            depths.append(trunk["depth"])
    return max(depths) if depths else None


def run_tags(run_dir: Path) -> set[str]:
    """The scalar tags a run logged (from its own event files; empty without any)."""
    if not any(p for p in run_dir.glob(EVENTS) if not p.name.endswith(LAYOUT_SUFFIX)):
        return set()
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 1, "tensors": 1, "histograms": 1, "images": 1})
    acc.Reload()
    return set(acc.Tags()["scalars"])


def loss_tags(metric: str = "val/loss") -> list[str]:
    """The tags a sweep is compared by, in display order: validation loss, the sweep's metric, training loss."""
    return list(dict.fromkeys(["val/loss", metric, "train/loss"]))


def comparison_url(metric: str = "val/loss", base: str = TENSORBOARD_URL) -> str:
    """TIME SERIES with the validation loss and the sweep's metric pinned above every group, smoothing off.

    TensorBoard reads both from the query (its ``pinnedCards`` JSON list and ``smoothing``); pins are kept in
    the browser, so a later visit without the query opens with them too. The training loss is left to its
    group: still falling fast at the end of a short run, its best run's last points are what "ignore
    outliers" drops, and the first screen should show every run's end.
    """
    pins = [{"plugin": "scalars", "tag": tag} for tag in dict.fromkeys(["val/loss", metric])]
    query = urlencode({"smoothing": 0, "pinnedCards": json.dumps(pins, separators=(",", ":"))})
    return f"{base}?{query}#timeseries"


def build_layout(metric: str = "val/loss", depth: int | None = None, tags: set[str] | None = None) -> Layout:
    """The sweep layout: losses first, then stability signals, residual RMS per block, norm scales, learning rate.

    Args:
        metric: the sweep's key metric, charted after the validation loss when it is not ``val/loss``.
        depth: trunk depth, for one RMS chart per block (None: one chart with every block).
        tags: the scalar tags the runs logged; a chart none of whose regexes matches one is left out, and
            so is a category left empty (None: keep every chart).

    Returns:
        The layout in the form ``SummaryWriter.add_custom_scalars`` takes, categories in display order.
    """
    losses = {tag: [_exact(tag)] for tag in loss_tags(metric)}
    stability = {
        "grad norm, global (pre-clip)": [_exact("diag/grad_norm/global")],
        "grad norm per block (pre-clip)": [r"^diag/grad_norm/block_\d+$"],
        "max |activation|": [_exact("diag/max_abs_activation")],
        "loss spikes": [_exact("train/spikes")],
    }
    if depth:  # every stream of every run on the chart of its block
        rms = {f"block {b}": [rf"^diag/rms/[^/]+/block_{b}$"] for b in range(depth)}
    else:
        rms = {"every block": [r"^diag/rms/"]}
    scales = {
        "fusion / readout norms": [r"^diag/scale/[^/]+$"],
        "X-stream norm N_X per sublayer": [r"^diag/scale/norm_x/"],
        "Y-stream norm N_Y per sublayer": [r"^diag/scale/norm_y/"],
        "branch-input norm N_in per sublayer": [r"^diag/scale/norm_in/"],
    }
    schedule = {"learning rate": [r"^train/lr(/|$)"]}  # LearningRateMonitor: train/lr/pg1, train/lr/pg2 ...
    categories = {
        "losses": losses, "stability": stability, "residual RMS": rms, "norm scales": scales, "schedule": schedule,
    }  # fmt: skip
    layout: Layout = {}
    for title, charts in categories.items():
        kept = {
            name: ["Multiline", regexes]
            for name, regexes in charts.items()
            if tags is None or any(re.search(rx, tag) for rx in regexes for tag in tags)
        }
        if kept:
            layout[title] = kept
    return layout


def write_layout(sweep_dir: Path, names: list[str], metric: str = "val/loss") -> Path | None:
    """Writes the layout into every existing run directory of ``names`` (replacing earlier ones) and removes
    a sweep-level layout an earlier version wrote; returns one of the files (None without a run directory)."""
    for old in sweep_dir.glob(EVENTS):  # the former sweep-level layout (the empty run "."); runs are below
        old.unlink(missing_ok=True)  # another comparison may remove it first
    run_dirs = [sweep_dir / n for n in names if (sweep_dir / n).is_dir()]
    tags = set().union(*(run_tags(d) for d in run_dirs)) if run_dirs else set()
    layout = build_layout(metric, sweep_depth(sweep_dir, names), tags)
    written = None
    for run_dir in run_dirs:
        for old in run_dir.glob(EVENTS + LAYOUT_SUFFIX):
            old.unlink(missing_ok=True)
        if not layout:
            continue
        writer = SummaryWriter(log_dir=str(run_dir), filename_suffix=LAYOUT_SUFFIX)
        writer.add_custom_scalars(layout)
        writer.close()
        written = written or next(run_dir.glob(EVENTS + LAYOUT_SUFFIX))
    return written
