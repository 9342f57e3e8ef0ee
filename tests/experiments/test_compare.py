"""The comparison a sweep writes: statuses (incl. stalled against the data's baseline), table, maps."""

from __future__ import annotations

import json
import math
from pathlib import Path

from experiments.sweeps import compare
from experiments.sweeps.profiles import depth_profile

BASELINE = 3.0  # stalled above 0.9 x 3.0 = 2.7


def summary(scheme: str, lr: float, status: str, val_loss: float | None, baseline: float | None = BASELINE) -> dict:
    return {
        "scheme": scheme,
        "lr": lr,
        "status": status,
        "steps": 300,
        "final_train_loss": val_loss,
        "final_val": {} if val_loss is None else {"val/loss": val_loss},
        "baseline_loss": baseline,
        "diverged_at": 42 if status == "diverged" else None,
        "spikes": 0,
        "train_curve": [[10, 5.0], [300, val_loss or 9.0]],
        "val_curve": [] if val_loss is None else [[300, {"val/loss": val_loss}]],
    }


def test_a_finished_run_at_the_baseline_is_stalled():
    assert compare.status_of(summary("post", 0.05, "finished", 3.03), None) == "stalled"
    assert compare.status_of(summary("post", 0.05, "finished", 2.71), None) == "stalled"
    assert compare.status_of(summary("pre", 0.05, "finished", 2.69), None) == "finished"
    assert compare.status_of(summary("pre", 0.05, "diverged", 3.5), None) == "diverged"  # not relabelled
    assert compare.status_of(summary("pre", 0.05, "finished", 3.03, baseline=None), None) == "finished"  # unknown


def test_runs_without_a_baseline_take_the_sweeps():
    runs = {"a": summary("pre", 0.01, "finished", 1.5), "old": summary("post", 0.05, "finished", 3.0, baseline=None)}
    assert compare.sweep_baseline(runs) == BASELINE
    assert [r["status"] for r in compare.rows(runs, "val/loss")] == ["finished", "stalled"]
    runs["other data"] = summary("pre", 0.05, "finished", 1.5, baseline=4.0)
    assert compare.sweep_baseline(runs) is None  # runs disagree: no sweep-wide value


def test_comparison_files_show_the_stalled_run(tmp_path: Path):
    cells = [("pre", 0.01, "finished", 1.5), ("pre", 0.05, "finished", 1.7),
             ("post", 0.01, "finished", 1.6), ("post", 0.05, "finished", 3.02),
             ("deepnorm", 0.01, "finished", 1.6), ("deepnorm", 0.05, "diverged", None)]  # fmt: skip
    for scheme, lr, status, val in cells:
        run = tmp_path / f"{scheme}-lr{lr:g}"
        run.mkdir()
        (run / "summary.json").write_text(json.dumps(summary(scheme, lr, status, val)))
    out = compare.write_comparison(tmp_path)
    table = out["markdown"].read_text()
    assert "| post-lr0.05 | post | 0.05 | stalled |" in table
    assert "| deepnorm-lr0.05 | deepnorm | 0.05 | diverged |" in table and "yes (step 42)" in table
    assert "Context-free baseline loss of the data: 3.0000. stalled = finished with val_loss above 0.9 x" in table
    for kind in ("stability", "metric_vs_lr", "curves"):
        assert out[kind].stat().st_size > 1000


def test_rebuilt_comparison_keeps_the_sweeps_run_order_and_metric(tmp_path: Path):
    for name in ("b", "a"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(json.dumps(summary("pre", 0.01, "finished", 1.0)))
    assert [r["run"] for r in compare.rows(compare.load_summaries(tmp_path), "val/loss")] == ["a", "b"]
    (tmp_path / compare.SWEEP_RECORD).write_text("runs: [b, a]\n")
    assert [r["run"] for r in compare.rows(compare.load_summaries(tmp_path), "val/loss")] == ["b", "a"]
    (tmp_path / compare.SWEEP_RECORD).write_text("runs: [b, a]\nmetric: val/acc1\n")
    assert "| val/acc1 |" in compare.write_comparison(tmp_path)["markdown"].read_text()  # the sweep's metric


def test_depth_profile_groups_tags_per_stream_and_block():
    values = {"diag/rms/post/block_0": 2.0, "diag/rms/post/block_1": 1.0, "diag/rms/pre/block_1": 9.0,
              "diag/grad_norm/block_0": 0.5, "diag/grad_norm/global": 7.0, "diag/max_abs/block_0": 3.0}  # fmt: skip
    profile = depth_profile(values)
    assert profile.keys() == {"rms/post", "rms/pre", "grad"}
    assert profile["rms/post"] == [2.0, 1.0] and profile["grad"] == [0.5]
    assert math.isnan(profile["rms/pre"][0]) and profile["rms/pre"][1] == 9.0  # block 0 never logged


def test_test_metrics_become_columns(tmp_path: Path):
    for name, acc in (("pre", 0.8), ("siamese", None)):
        (tmp_path / name).mkdir()
        record = summary(name, 1e-3, "finished", 0.5) | ({"test": {"test/acc1": acc}} if acc else {})
        (tmp_path / name / "summary.json").write_text(json.dumps(record))
    out = compare.write_comparison(tmp_path)
    table = out["markdown"].read_text().splitlines()
    assert table[0].endswith("| params | test/acc1 |")
    assert table[2].endswith("| 0.8 |") and table[3].endswith("| - |")  # an untested run shows a dash
    assert out["csv"].read_text().splitlines()[0].endswith(",params,test/acc1")
