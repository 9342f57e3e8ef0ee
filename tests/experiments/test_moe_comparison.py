"""An MoE sweep's comparison shows the router's statistics per cell (mean ± CI (n)) next to the loss."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import yaml

from experiments.results import compare

T_975_DF2 = 4.302652729911275  # two-sided 95 % t quantile with 2 degrees of freedom (tables)
# (scheme, seed) -> (val/loss, moe_aux, moe_entropy, moe_load_max, moe_load_min, moe_load_ratio)
RUNS = {
    ("pre", 1): (2.00, 4.10, 0.90, 1.60, 0.50, 3.0),
    ("pre", 2): (2.10, 4.20, 0.92, 1.50, 0.60, 2.5),
    ("pre", 3): (2.20, 4.30, 0.94, 1.40, 0.70, 2.0),
    ("siamese", 1): (1.90, 4.60, 0.80, 2.00, 0.20, 10.0),
    ("siamese", 2): (2.00, 4.50, 0.85, 1.90, 0.30, 6.0),
    ("siamese", 3): (2.05, 4.40, 0.90, 1.80, 0.40, 4.0),
}
NAMES = ("val/loss", "val/moe_aux", "val/moe_entropy", "val/moe_load_max", "val/moe_load_min", "val/moe_load_ratio")


def write_sweep(root: Path, moe: bool = True) -> Path:
    grid = []
    for (scheme, seed), values in RUNS.items():
        name = f"{scheme}-s{seed}"
        final = dict(zip(NAMES, values, strict=True)) if moe else {"val/loss": values[0]}
        summary = {"task": "lm", "scheme": scheme, "lr": 0.01, "status": "finished", "steps": 120,
                   "final_val": final, "train_curve": [[0, 5.5], [120, values[0]]],
                   "val_curve": [[120, final]]}  # fmt: skip
        (root / name).mkdir(parents=True)
        (root / name / "summary.json").write_text(json.dumps(summary))
        grid.append({"name": name, "scheme": scheme, "lr": 0.01, "seed": seed})
    record = {"name": "moe", "metric": "val/loss", "baseline": "pre", "runs": [g["name"] for g in grid], "grid": grid}
    (root / "sweep.yaml").write_text(yaml.safe_dump(record))
    return root


def test_cells_table_shows_routing_next_to_the_loss(tmp_path: Path):
    text = compare.load_comparison(write_sweep(tmp_path)).block("table")
    header = text.splitlines()[0]
    assert header == ("| scheme | val/loss | Δ val/loss vs pre | p (paired t, unadjusted) | p (sign-flip) | verdict | "
                      "val/moe_aux | val/moe_entropy | val/moe_load_ratio | runs |")  # fmt: skip
    # entropy, pre: 0.90 / 0.92 / 0.94 -> mean 0.92, std 0.02, half-width t * 0.02 / sqrt(3) = 0.0497
    # siamese: 0.80 / 0.85 / 0.90 -> mean 0.85, std 0.05, half-width 0.124; load ratio 10 / 6 / 4: std 3.06, 7.6
    assert f"{T_975_DF2 * 0.02 / 3**0.5:.3f}" == "0.050" and f"{T_975_DF2 * 0.05 / 3**0.5:.2f}" == "0.12"
    pre, siamese = text.splitlines()[2:4]
    assert pre.startswith(
        "| pre | 2.10 ± 0.25 (n = 3) | (baseline) |  |  |  | 4.20 ± 0.25 (n = 3) | 0.920 ± 0.050 (n = 3) |"
    )
    assert "| 2.5 ± 1.2 (n = 3) | 3 finished |" in pre
    assert "| 4.50 ± 0.25 (n = 3) | 0.85 ± 0.12 (n = 3) | 6.7 ± 7.6 (n = 3) | 3 finished |" in siamese
    assert "`val/moe_entropy` = expert-usage entropy / ln E" in text and "The router is dropless" in text


def test_cells_csv_pairs_every_routing_statistic_with_the_baseline(tmp_path: Path):
    compare.write_comparison(write_sweep(tmp_path))
    rows = list(csv.DictReader(io.StringIO((tmp_path / compare.CELLS_CSV).read_text())))
    siamese = next(r for r in rows if r["scheme"] == "siamese")
    # load_min, siamese - pre per seed: -0.3, -0.3, -0.3 -> a constant difference
    assert abs(float(siamese["val/moe_load_min diff_mean"]) + 0.3) < 1e-12
    # entropy differences -0.10, -0.07, -0.04: mean -0.07
    assert abs(float(siamese["val/moe_entropy diff_mean"]) + 0.07) < 1e-12
    assert siamese["val/moe_load_max"] == "1.90 ± 0.25 (n = 3)"
    per_run = list(csv.DictReader(io.StringIO((tmp_path / "comparison.csv").read_text())))
    assert [float(r["val/moe_load_ratio"]) for r in per_run] == [3.0, 2.5, 2.0, 10.0, 6.0, 4.0]


def test_dense_sweep_has_no_routing_columns(tmp_path: Path):
    comparison = compare.load_comparison(write_sweep(tmp_path, moe=False))
    assert "moe" not in comparison.block("table") and "moe" not in comparison.block("runs")
