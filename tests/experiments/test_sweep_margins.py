"""``margins: {metric: delta}`` in a sweep file: checked on load (one line, exit 2, nothing written), recorded in
``sweep.yaml`` and used by the sweep's own tables and by every later ``compare`` of the directory."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import yaml

from experiments.__main__ import main as suite_main
from experiments.results.verdicts import clear_caches
from experiments.sweeps import sweep
from experiments.sweeps.spec import load_specs
from tests.experiments.test_compare import cells_table
from tests.experiments.test_sweep_measure import fake_fit as measure_fit
from tests.experiments.test_sweep_protocol import quiet_plots  # noqa: F401 - the fixture
from tests.experiments.test_sweep_spec import one_line_error, write_spec

ROOT = Path(__file__).resolve().parents[2]
WIGGLE = {0: 0.08, 1: -0.09, 2: 0.06}  # siamese - pre - (-0.1) per seed: a paired spread for TOST


def fake_fit(self, argv: list[str], **kwargs) -> int:
    """test_sweep_measure's stand-in run, siamese moved by a seed-specific wiggle."""
    code = measure_fit(self, argv, **kwargs)
    opts = dict(a[2:].split("=", 1) for a in argv if a.startswith("--") and "=" in a)
    if "siamese" in opts["run_name"]:
        path = Path(opts["runs_root"]) / "lm" / opts["experiment"] / opts["run_name"] / "summary.json"
        record = json.loads(path.read_text())
        record["final_val"]["val/loss"] += WIGGLE[int(opts["seed_everything"])]
        path.write_text(json.dumps(record))
    return code


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"margins": {"val/loss": 0}}, "margins.val/loss=0"),
        ({"margins": {"val/loss": "wide"}}, "margins.val/loss='wide'"),
        ({"margins": {"loss": 0.02}}, "margins key 'loss'"),
        ({"margins": 0.02}, "margins=0.02"),
    ],
)
def test_bad_margins_are_one_line(tmp_path, monkeypatch, capsys, keys, message):
    monkeypatch.chdir(ROOT)
    line = one_line_error(write_spec(tmp_path, **keys), capsys=capsys)
    assert message in line and "spec.yaml" in line, line
    assert not (tmp_path / "runs").exists()


def test_declared_margins_reach_sweep_yaml_and_every_compare(tmp_path, monkeypatch, capsys, quiet_plots):  # noqa: F811
    """siamese - pre = -0.02, -0.19, -0.04 by seed (scipy ttest_rel p = 0.26: no difference shown): at the default
    0.02 that cannot be equivalent; at a declared 0.5 TOST says so (statsmodels 0.14 ttost_paired with -0.5, 0.5:
    p = 0.008087459909982296), and a later compare agrees."""
    monkeypatch.chdir(ROOT)
    clear_caches()
    monkeypatch.setattr(sweep.Children, "call", fake_fit)
    path = write_spec(tmp_path, schemes=["pre", "siamese"], baseline="pre", seeds=[0, 1, 2],
                      margins={"val/loss": 0.5, "test/acc1": 0.01})  # fmt: skip
    (spec,) = load_specs(str(path))
    assert spec.margins == {"val/loss": 0.5, "test/acc1": 0.01}
    assert suite_main(["sweep", str(path)]) in (0, None)
    capsys.readouterr()
    sweep_dir = tmp_path / "runs/lm/s"
    assert yaml.safe_load((sweep_dir / "sweep.yaml").read_text())["margins"] == {"val/loss": 0.5, "test/acc1": 0.01}
    first = (sweep_dir / "comparison.md").read_text()
    assert cells_table(first)[3][5] == "equivalent within ±0.5 (Dunnett, block model, TOST p = 0.0081, n = 3)"
    siamese = list(csv.DictReader((sweep_dir / "comparison_cells.csv").open()))[1]
    assert float(siamese["verdict_p_tost"]) == pytest.approx(0.008087459909982296, rel=1e-9)
    assert "margin δ = 0.5, declared by the sweep's margins for val/loss" in first
    (sweep_dir / "comparison.md").unlink()
    assert suite_main(["compare", str(sweep_dir), "--tables-only"]) in (0, None)
    assert (sweep_dir / "comparison.md").read_text() == first
