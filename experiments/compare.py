"""Turn run summaries into a comparison: a markdown + CSV table and PNG plots.

python -m experiments.compare runs/lm/demo          # rebuild the comparison of a sweep directory
"""

from __future__ import annotations

import csv
import json
import math
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

COLUMNS = ["run", "scheme", "lr", "status", "steps", "train_loss", "val_loss", "metric", "diverged", "spikes",
           "wall_s", "params"]  # fmt: skip


def load_summaries(sweep_dir: Path, names: list[str] | None = None) -> dict[str, dict]:
    """``{run name: summary}`` for the given runs (or every run directory with a summary)."""
    if names is None:
        names = sorted(p.parent.name for p in sweep_dir.glob("*/summary.json"))
    out = {}
    for name in names:
        path = sweep_dir / name / "summary.json"
        out[name] = json.loads(path.read_text()) if path.exists() else {"status": "missing"}
    return out


def rows(summaries: dict[str, dict], metric: str) -> list[dict]:
    table = []
    for name, s in summaries.items():
        val = s.get("final_val") or {}
        diverged = s.get("status") == "diverged"
        table.append(
            {
                "run": name,
                "scheme": s.get("scheme", "?"),
                "lr": s.get("lr"),
                "status": s.get("status", "?"),
                "steps": s.get("steps"),
                "train_loss": s.get("final_train_loss"),
                "val_loss": val.get("val/loss"),
                "metric": val.get(metric),
                "diverged": f"yes (step {s.get('diverged_at')})" if diverged else "no",
                "spikes": s.get("spikes", 0),
                "wall_s": s.get("wall_time_s"),
                "params": s.get("params"),
            }
        )
    return table


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}" if math.isfinite(value) else str(value)
    if isinstance(value, int) and value > 10000:
        return f"{value:,}"
    return str(value)


def to_markdown(table: list[dict], metric: str) -> str:
    header = [c if c != "metric" else metric for c in COLUMNS]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_fmt(r[c]) for c in COLUMNS) + " |" for r in table]
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
    colours = {"ok": "#9bd69b", "spikes": "#f5d76e", "diverged": "#e06666", "crashed": "#999999"}
    fig, ax = plt.subplots(figsize=(1.8 + 1.6 * len(lrs), 0.8 + 0.55 * len(schemes)))
    for i, scheme in enumerate(schemes):
        for j, lr in enumerate(lrs):
            cell = [r for r in table if r["scheme"] == scheme and r["lr"] == lr]
            if not cell:
                continue
            r = cell[0]
            if r["status"] == "diverged":
                state, text = "diverged", f"div @{r['diverged'].split()[-1].rstrip(')')}"
            elif r["status"] not in ("finished",):
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
    ax.set_title(f"stability map ({metric}; green ok, yellow spikes, red diverged)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def write_comparison(sweep_dir: Path, names: list[str] | None = None, metric: str = "val/loss") -> dict[str, Path]:
    """Writes ``comparison.md``, ``comparison.csv``, ``curves.png`` (+ ``stability.png``); returns paths."""
    summaries = load_summaries(sweep_dir, names)
    table = rows(summaries, metric)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    out = {"markdown": sweep_dir / "comparison.md", "csv": sweep_dir / "comparison.csv"}
    out["markdown"].write_text(to_markdown(table, metric))
    with out["csv"].open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(table)
    out["curves"] = sweep_dir / "curves.png"
    plot_curves(summaries, out["curves"], metric)
    if plot_stability(table, sweep_dir / "stability.png", metric):
        out["stability"] = sweep_dir / "stability.png"
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2 or not Path(sys.argv[1]).is_dir():
        sys.exit("usage: python -m experiments.compare SWEEP_DIR  (a directory of run directories)")
    for kind, p in write_comparison(Path(sys.argv[1])).items():
        print(f"{kind}: {p}")
