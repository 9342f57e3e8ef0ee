"""``last_evals: k``: a sweep's metric as the mean of each run's last k validations, with the measurement's own
spread beside the seed spread; stand-in runs with known validation curves."""

from __future__ import annotations

import csv
import io
import json
import math
import statistics
from pathlib import Path

import pytest

from experiments.__main__ import main as suite_main
from experiments.results.verdicts import clear_caches
from experiments.sweeps import sweep
from tests.experiments.test_sweep_protocol import quiet_plots  # noqa: F401 - the fixture
from tests.experiments.test_sweep_spec import one_line_error, write_spec

ROOT = Path(__file__).resolve().parents[2]


def curve(scheme: str, seed: int) -> list[float]:
    """Four validations; the last three differ by a run-specific wiggle."""
    base = {"pre": 2.0, "siamese": 1.9}[scheme] + 0.01 * seed
    return [base + 0.5, base + 0.02 * (seed + 1), base - 0.01, base + 0.003 * seed]


def fake_fit(self, argv: list[str], **kwargs) -> int:
    opts = dict(a[2:].split("=", 1) for a in argv if a.startswith("--") and "=" in a)
    scheme = Path(argv[argv.index("-c", argv.index("-c") + 1) + 1]).stem
    values = curve(scheme, int(opts["seed_everything"]))
    run_dir = Path(opts["runs_root"]) / "lm" / opts["experiment"] / opts["run_name"]
    run_dir.mkdir(parents=True, exist_ok=True)
    points = [[10 * (i + 1), {"val/loss": v}] for i, v in enumerate(values)]
    summary = {"scheme": scheme, "status": "finished", "steps": 40, "final_val": {"val/loss": values[-1]},
               "baseline_loss": 3.0, "val_curve": points}  # fmt: skip
    (run_dir / "summary.json").write_text(json.dumps(summary))
    return 0


def cell_means(sweep_dir: Path) -> dict[str, float]:
    rows = csv.DictReader(io.StringIO((sweep_dir / "comparison_cells.csv").read_text()))
    column = next(c for c in rows.fieldnames if c.startswith("val/loss") and "mean" in c)
    return {row["scheme"]: float(row[column]) for row in rows}


@pytest.mark.parametrize("k", [1, 3])
def test_the_metric_is_the_mean_of_the_last_k_validations(tmp_path, monkeypatch, capsys, quiet_plots, k):  # noqa: F811
    monkeypatch.chdir(ROOT)
    clear_caches()
    monkeypatch.setattr(sweep.Children, "call", fake_fit)
    extra = {"last_evals": k} if k > 1 else {}
    path = write_spec(tmp_path, schemes=["pre", "siamese"], baseline="pre", seeds=[0, 1, 2], **extra)
    assert suite_main(["sweep", str(path)]) in (0, None)
    out = capsys.readouterr().out
    sweep_dir = tmp_path / "runs/lm/s"
    expected = {s: statistics.fmean(statistics.fmean(curve(s, seed)[-k:]) for seed in range(3))
                for s in ("pre", "siamese")}  # fmt: skip
    assert cell_means(sweep_dir) == pytest.approx(expected, abs=1e-12)
    if k == 1:  # today's behaviour: the final validation, no measurement table
        assert not (sweep_dir / "measurement.md").exists()
        return
    # The measurement's spread: each run's SD over its last 3, pooled as a root mean square; beside the seed SD.
    for s in ("pre", "siamese"):
        within = [statistics.stdev(curve(s, seed)[-3:]) for seed in range(3)]
        seeds = [statistics.fmean(curve(s, seed)[-3:]) for seed in range(3)]
        row = f"| {s} | 3 | {expected[s]:.4f} | {statistics.stdev(seeds):.4g} | "
        row += f"{math.sqrt(statistics.fmean(w * w for w in within)):.4g} |"
        assert row in (sweep_dir / "measurement.md").read_text() and row in out, row


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"last_evals": 0}, "last_evals=0"),
        ({"last_evals": "three"}, "last_evals='three'"),
        ({"last_evals": 3, "metric": "test/loss"}, "last_evals=3 with metric='test/loss'"),
    ],
)
def test_bad_last_evals_are_one_line(tmp_path, monkeypatch, capsys, keys, message):
    monkeypatch.chdir(ROOT)
    line = one_line_error(write_spec(tmp_path, **keys), capsys=capsys)
    assert message in line and "spec.yaml" in line, line
    assert not (tmp_path / "runs").exists()
