"""Turn run summaries into a comparison: a markdown + CSV table, PNG plots and a TensorBoard layout.

python -m experiments compare runs/lm/demo          # rebuild the comparison of a sweep directory

A run's status is its summary's (finished, diverged, interrupted, crashed), except that a finished run
whose validation loss stays above ``STALL_RATIO`` x the data's baseline loss (for the LM: the unigram
entropy, what a model scores that ignores context) is reported as **stalled**: it ran to the end but
learned (almost) nothing beyond token frequencies, which is how Post-Norm fails at high learning rates
at small scale rather than blowing up.
"""

from __future__ import annotations

import csv
import json
import math
import sys
from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import yaml  # noqa: E402

from experiments.sweeps.profiles import plot_depth_profiles  # noqa: E402
from experiments.sweeps.tb_layout import write_layout  # noqa: E402

SWEEP_RECORD = "sweep.yaml"  # written by the sweep into its directory: its spec and run order
STALL_RATIO = 0.9  # stalled: final val loss > 90 % of the context-free baseline
COLUMNS = ["run", "scheme", "lr", "status", "steps", "train_loss", "val_loss", "metric", "diverged", "spikes",
           "wall_s", "params"]  # fmt: skip


def sweep_record(sweep_dir: Path) -> dict:
    """The spec the sweep ran with (``sweep.yaml``: runs in order, metric, ...); {} if absent."""
    path = sweep_dir / SWEEP_RECORD
    return (yaml.safe_load(path.read_text()) or {}) if path.is_file() else {}


def load_summaries(sweep_dir: Path, names: list[str] | None = None) -> dict[str, dict]:
    """``{run name: summary}`` for the given runs (default: the sweep's, in its order; else every run found)."""
    if names is None:
        names = sweep_record(sweep_dir).get("runs")
    if names is None:
        names = sorted(p.parent.name for p in sweep_dir.glob("*/summary.json"))
    out = {}
    for name in names:
        path = sweep_dir / name / "summary.json"
        out[name] = json.loads(path.read_text()) if path.exists() else {"status": "missing"}
    return out


def sweep_baseline(summaries: dict[str, dict]) -> float | None:
    """The baseline loss the runs report, when they agree on one (they share the data); else None.

    Summaries written before runs recorded it take this value, since it belongs to the data, not the run.
    """
    values = {round(s["baseline_loss"], 9) for s in summaries.values() if s.get("baseline_loss") is not None}
    return values.pop() if len(values) == 1 else None


def status_of(summary: dict, baseline: float | None) -> str:
    status = summary.get("status", "?")
    val_loss = (summary.get("final_val") or {}).get("val/loss")
    baseline = summary.get("baseline_loss") or baseline
    if status == "finished" and val_loss is not None and baseline and val_loss > STALL_RATIO * baseline:
        return "stalled"
    return status


def rows(summaries: dict[str, dict], metric: str) -> list[dict]:
    table, baseline = [], sweep_baseline(summaries)
    for name, s in summaries.items():
        val = s.get("final_val") or {}
        diverged = s.get("status") == "diverged"
        table.append(
            {
                "run": name,
                "scheme": s.get("scheme", "?"),
                "lr": s.get("lr"),
                "status": status_of(s, baseline),
                "steps": s.get("steps"),
                "train_loss": s.get("final_train_loss"),
                "val_loss": val.get("val/loss"),
                "metric": val.get(metric),
                "diverged": f"yes (step {s.get('diverged_at')})" if diverged else "no",
                "spikes": s.get("spikes", 0),
                "wall_s": s.get("wall_time_s"),
                "params": s.get("params"),
                **(s.get("test") or {}),  # test/<metric> of runs that were tested (sweep `test: true`)
            }
        )
    return table


def columns(table: list[dict]) -> list[str]:
    """The fixed columns, then every test metric some run has, in first-seen order."""
    tested = dict.fromkeys(key for r in table for key in r if key.startswith("test/"))
    return COLUMNS + list(tested)


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}" if math.isfinite(value) else str(value)
    if isinstance(value, int) and value > 10000:
        return f"{value:,}"
    return str(value)


def to_markdown(table: list[dict], metric: str, baseline: float | None = None) -> str:
    names = columns(table)
    header = [c if c != "metric" else metric for c in names]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_fmt(r.get(c)) for c in names) + " |" for r in table]
    if baseline is not None:
        lines += ["", f"Context-free baseline loss of the data: {baseline:.4f}. stalled = finished with val_loss above "
                  f"{STALL_RATIO:g} x baseline = {STALL_RATIO * baseline:.4f}."]  # fmt: skip
    return "\n".join(lines) + "\n"


def plot_curves(summaries: dict[str, dict], path: Path, metric: str) -> None:
    """Validation loss (left) and training loss (right) against steps, one line per run."""
    fig, (ax_val, ax_train) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, s in summaries.items():
        val = [(step, m.get("val/loss")) for step, m in s.get("val_curve", []) if m.get("val/loss") is not None]
        if val:
            ax_val.plot(*zip(*val, strict=True), marker="o", ms=3, label=name)
        train = s.get("train_curve", [])
        if train:
            ax_train.plot(*zip(*train, strict=True), lw=1, label=name)
    for ax, title in ((ax_val, "validation loss"), (ax_train, "training loss")):
        ax.set_xlabel("step")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_stability(table: list[dict], path: Path, metric: str) -> bool:
    """Scheme x learning-rate map: final metric per cell, coloured ok / spikes / diverged / crashed."""
    lrs = sorted({r["lr"] for r in table if r["lr"] is not None})
    schemes = list(dict.fromkeys(r["scheme"] for r in table))
    if len(lrs) < 2:
        return False
    colours = {"ok": "#9bd69b", "spikes": "#f5d76e", "stalled": "#f4a261", "diverged": "#e06666", "crashed": "#999999"}
    fig, ax = plt.subplots(figsize=(1.8 + 1.6 * len(lrs), 0.8 + 0.55 * len(schemes)))
    for i, scheme in enumerate(schemes):
        for j, lr in enumerate(lrs):
            cell = [r for r in table if r["scheme"] == scheme and r["lr"] == lr]
            if not cell:
                continue
            r = cell[0]
            if r["status"] == "diverged":
                state, text = "diverged", f"div @{r['diverged'].split()[-1].rstrip(')')}"
            elif r["status"] == "stalled":
                state, text = "stalled", f"stalled\n{_fmt(r['metric'])}"
            elif r["status"] != "finished":
                state, text = "crashed", r["status"]
            else:
                state = "spikes" if r["spikes"] else "ok"
                text = _fmt(r["metric"]) + (f"\n{r['spikes']} spikes" if r["spikes"] else "")
            ax.add_patch(plt.Rectangle((j, i), 1, 1, color=colours[state]))
            ax.text(j + 0.5, i + 0.5, text, ha="center", va="center", fontsize=8)
    ax.set_xlim(0, len(lrs))
    ax.set_ylim(0, len(schemes))
    ax.set_xticks([j + 0.5 for j in range(len(lrs))], [f"{lr:g}" for lr in lrs])
    ax.set_yticks([i + 0.5 for i in range(len(schemes))], schemes)
    ax.invert_yaxis()
    ax.set_xlabel("peak learning rate")
    ax.set_title(f"stability map: final {metric}\ngreen ok, yellow spikes, orange stalled, red diverged", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def plot_metric_vs_lr(table: list[dict], path: Path, metric: str) -> bool:
    """Final metric against peak learning rate, one line per scheme; diverged runs are crosses.

    Runs of one (scheme, lr) cell (seeds, warmups) are averaged over those that ran to the end. A diverged
    run's cross sits at its last value clipped to just outside the finished runs' range (a blown-up
    loss would otherwise flatten every line), or at the top edge when it never validated.
    """
    lrs = sorted({r["lr"] for r in table if r["lr"] is not None})
    if len(lrs) < 2:
        return False

    def value(r: dict) -> float | None:
        m = r["metric"]
        return float(m) if isinstance(m, int | float) and math.isfinite(m) else None

    ran = ("finished", "stalled")  # ran to the end: their metric is a real one
    done = [v for r in table if r["status"] in ran and (v := value(r)) is not None]
    lo, hi = (min(done), max(done)) if done else (0.0, 1.0)
    margin = 0.08 * (hi - lo) if hi > lo else 0.05 * max(abs(hi), 1e-3)
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for scheme in dict.fromkeys(r["scheme"] for r in table):
        runs = [r for r in table if r["scheme"] == scheme and r["lr"] is not None]
        points = []
        for lr in lrs:
            cell = [v for r in runs if r["lr"] == lr and r["status"] in ran and (v := value(r)) is not None]
            if cell:
                points.append((lr, sum(cell) / len(cell)))
        colour = ax.plot(*zip(*points, strict=True), marker="o", label=scheme)[0].get_color() if points else "#e06666"
        for r in runs:
            if r["status"] == "diverged":
                v = value(r)
                y = hi + margin if v is None else min(max(v, lo - margin), hi + margin)
                ax.plot([r["lr"]], [y], marker="x", ms=11, mew=2.5, color=colour, ls="none")
            elif r["status"] == "stalled" and (v := value(r)) is not None:
                ax.plot([r["lr"]], [v], marker="s", ms=12, mfc="none", mew=1.5, color=colour, ls="none")
    ax.plot([], [], marker="x", ms=9, mew=2, ls="none", color="k", label="diverged")
    if any(r["status"] == "stalled" for r in table):
        ax.plot([], [], marker="s", ms=9, mfc="none", ls="none", color="k", label="stalled (near baseline)")
    ax.set_xscale("log")
    ax.set_xticks(lrs, [f"{lr:g}" for lr in lrs])
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())  # only the swept rates are labelled
    ax.set_xlabel("peak learning rate")
    ax.set_ylabel(f"final {metric}")
    ax.set_title(f"final {metric} per scheme and learning rate")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def write_comparison(sweep_dir: Path, names: list[str] | None = None, metric: str | None = None) -> dict[str, Path]:
    """Writes the table, ``curves.png`` (+ ``stability.png``, ``metric_vs_lr.png`` with several rates,
    ``depth_profiles.png`` when the runs logged diagnostics) and a TensorBoard layout. ``metric``
    defaults to the sweep's (``sweep.yaml``), else ``val/loss``.

    Returns:
        ``{kind: path}`` of what was written.
    """
    metric = metric or sweep_record(sweep_dir).get("metric", "val/loss")
    summaries = load_summaries(sweep_dir, names)
    table = rows(summaries, metric)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    out = {"markdown": sweep_dir / "comparison.md", "csv": sweep_dir / "comparison.csv"}
    out["markdown"].write_text(to_markdown(table, metric, sweep_baseline(summaries)))
    with out["csv"].open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns(table))
        writer.writeheader()
        writer.writerows(table)
    out["curves"] = sweep_dir / "curves.png"
    plot_curves(summaries, out["curves"], metric)
    if plot_stability(table, sweep_dir / "stability.png", metric):
        out["stability"] = sweep_dir / "stability.png"
    if plot_metric_vs_lr(table, sweep_dir / "metric_vs_lr.png", metric):
        out["metric_vs_lr"] = sweep_dir / "metric_vs_lr.png"
    if plot_depth_profiles(sweep_dir, table, sweep_dir / "depth_profiles.png"):
        out["depth_profiles"] = sweep_dir / "depth_profiles.png"
    out["tb_layout"] = write_layout(sweep_dir, list(summaries), metric)
    return out


def main(argv: list[str] | None = None) -> None:
    """``python -m experiments compare SWEEP_DIR``: rebuilds the comparison from the run summaries."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 1 or argv[0] in ("-h", "--help") or not Path(argv[0]).is_dir():
        sys.exit("usage: python -m experiments compare SWEEP_DIR  (a directory of run directories)")
    for kind, p in write_comparison(Path(argv[0])).items():
        print(f"{kind}: {p}")


if __name__ == "__main__":
    main()
