"""A TensorBoard "Custom Scalars" layout for a sweep directory: every run of the sweep on one chart.

``tensorboard --logdir runs/<task>/<sweep>`` then shows, under CUSTOM SCALARS, one chart per quantity
(validation and training loss, pre-clip gradient norm, max |activation|, residual RMS per block, norm
scales) with a line per run and stream. Each chart is a tag regex; the plugin applies it to every run
of the log directory, so the runs need nothing special. The layout lives in an event file directly in
the sweep directory (the plugin's run ``.``) and is rewritten, not appended, when the sweep reruns:
the plugin only reads the first layout of a run.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from torch.utils.tensorboard import SummaryWriter

Layout = dict[str, dict[str, list]]  # {category: {chart title: ["Multiline", [tag regex, ...]]}}


def _exact(tag: str) -> str:
    return f"^{re.escape(tag)}$"


def sweep_depth(sweep_dir: Path, names: list[str]) -> int | None:
    """The largest trunk depth among the runs' saved ``config.yaml`` files (None if none is readable)."""
    depths = []
    for name in names:
        path = sweep_dir / name / "config.yaml"
        if not path.is_file():
            continue
        config = yaml.safe_load(path.read_text()) or {}
        trunk = ((config.get("model") or {}).get("init_args") or {}).get("trunk") or {}
        if isinstance(trunk.get("depth"), int):
            depths.append(trunk["depth"])
    return max(depths) if depths else None


def build_layout(metric: str = "val/loss", depth: int | None = None) -> Layout:
    """The sweep layout: losses, stability signals, residual RMS per block, norm scales.

    Args:
        metric: the sweep's key metric, charted next to the losses when it is not ``val/loss``.
        depth: trunk depth, for one RMS chart per block (None: one chart with every block).

    Returns:
        The layout in the form ``SummaryWriter.add_custom_scalars`` takes.
    """
    losses = {"val/loss": [_exact("val/loss")], "train/loss": [_exact("train/loss")]}
    if metric not in losses:
        losses[metric] = [_exact(metric)]
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
    categories = {"losses": losses, "stability": stability, "residual RMS": rms, "norm scales": scales}
    return {
        title: {name: ["Multiline", regexes] for name, regexes in charts.items()}
        for title, charts in categories.items()
    }


def write_layout(sweep_dir: Path, names: list[str], metric: str = "val/loss") -> Path:
    """Writes the layout into ``sweep_dir`` (replacing an earlier one); returns the event file."""
    sweep_dir.mkdir(parents=True, exist_ok=True)
    for old in sweep_dir.glob("events.out.tfevents.*"):  # run directories are below, untouched
        old.unlink()
    writer = SummaryWriter(log_dir=str(sweep_dir))
    writer.add_custom_scalars(build_layout(metric, sweep_depth(sweep_dir, names)))
    writer.close()
    return next(sweep_dir.glob("events.out.tfevents.*"))
