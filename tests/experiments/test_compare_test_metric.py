"""A sweep compared by one of its test metrics (``metric: test/acc1``, as the ViT sweep): the metric column,
the paired difference and the notes come from the runs' test results, within one test protocol."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from experiments.results import compare


def write_sweep(root: Path, acc: dict[tuple[str, int], float], protocols: dict[str, int] | None = None) -> Path:
    grid = []
    for (scheme, seed), value in acc.items():
        name = f"{scheme}-s{seed}"
        summary = {"task": "vit", "scheme": scheme, "status": "finished", "steps": 10, "final_val": {"val/loss": 1.0},
                   "test": {"test/acc1": value}, "train_curve": [[10, 1.0]], "val_curve": [],
                   "test_protocol": {"samples": (protocols or {}).get(name, 10000)}}  # fmt: skip
        (root / name).mkdir(parents=True)
        (root / name / "summary.json").write_text(json.dumps(summary))
        grid.append({"name": name, "scheme": scheme, "seed": seed})
    record = {"metric": "test/acc1", "baseline": "pre", "runs": [g["name"] for g in grid], "grid": grid}
    (root / "sweep.yaml").write_text(yaml.safe_dump(record))
    return root


ACC = {("pre", 1): 0.80, ("pre", 2): 0.82, ("siamese", 1): 0.83, ("siamese", 2): 0.84}


def test_the_metric_column_and_the_paired_difference_come_from_the_test_results(tmp_path: Path):
    comparison = compare.load_comparison(write_sweep(tmp_path, ACC))
    table = comparison.block("table").splitlines()
    assert table[0] == (
        "| scheme | test/acc1 | Δ test/acc1 vs pre | p (paired t, unadjusted) | p (sign-flip) | verdict | runs |"
    )  # once
    # siamese 0.83 / 0.84: mean 0.835, sd 0.00707, half-width t(0.975, 1) = 12.706 x 0.005 = 0.064
    # differences +0.03, +0.02: mean +0.025, the same half-width
    assert table[3].startswith("| siamese | 0.835 ± 0.064 (n = 2) | +0.025 ± 0.064 (n = 2) |")
    assert "with n = 2 pairs is 0.5" in comparison.notes()  # two seeds per cell, not "one finished run"
    assert comparison.block("runs").splitlines()[0].count("test/acc1") == 1


def test_runs_tested_under_two_protocols_get_no_mean(tmp_path: Path):
    comparison = compare.load_comparison(write_sweep(tmp_path, ACC, {"siamese-s2": 500}))
    siamese = comparison.block("table").splitlines()[3]
    assert siamese.startswith("| siamese | - | - |")  # 10,000 and 500 samples are not averaged together
