"""README's paper table row for the learning-rate robustness claim (Table 1), every scheme at its own best rate:
read from a ``tune_then_compare`` sweep's export (its ``tuning.yaml`` and fresh-seed summaries).

The sweep is the stand-in of test_sweep_protocol (a known loss per scheme, rate and seed), exported through the
command line (``compare DIR --export DIR``); the picked rates, sensitivities and largest stable rates are that
test's hand-computed ``reference``, the verdicts' p-values scipy's paired t-test (two schemes per slice: the block
model's contrast is the paired t-test; three schemes: Dunnett, checked against the sweep's own exported verdicts).
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import yaml

from experiments.__main__ import main as suite_main
from experiments.results import paper
from experiments.results.verdicts import clear_caches
from experiments.sweeps import sweep
from tests.experiments.test_sweep_protocol import LOSS, fake_fit, protocol_spec, quiet_plots, reference  # noqa: F401

ROOT = Path(__file__).resolve().parents[2]
ROW = {
    "claim": "Table 1: learning-rate robustness, LM",
    "paper": "SiameseNorm ahead of Pre-Norm at every rate",
    "export": "docs/results/lr",
    "command": "python -m experiments sweep configs/sweeps/lr-robustness.yaml",
    "better": "lower",
    "tuned": ["post", "siamese"],
}


def paper_file(root: Path) -> str:
    (root / "paper.yaml").write_text(yaml.safe_dump({"alpha": 0.05, "overhead": {}, "rows": [ROW]}))
    return "paper.yaml"


def test_a_tuned_row_is_pending_until_the_export_exists(tmp_path: Path):
    table = paper.render(tmp_path, paper_file(tmp_path))
    row = next(line for line in table.splitlines() if line.startswith("| Table 1"))
    assert "| pending: the sweep has not finished |" in row and row.endswith("| pending |")


def test_a_tuned_row_shows_each_schemes_pick_sensitivity_stable_rate_and_fresh_seed_verdict(
    tmp_path,
    monkeypatch,
    capsys,
    quiet_plots,  # noqa: F811
):
    monkeypatch.chdir(ROOT)
    clear_caches()
    monkeypatch.setattr(sweep.Children, "call", fake_fit([], LOSS))
    assert suite_main(["sweep", str(protocol_spec(tmp_path))]) in (0, None)
    export = tmp_path / "docs/results/lr"
    assert suite_main(["compare", str(tmp_path / "runs/lm/s"), "--export", str(export)]) in (0, None)
    capsys.readouterr()
    assert (export / "tuning.yaml").is_file() and (export / "tuning.md").is_file()  # the picks travel along

    table = paper.render(tmp_path, paper_file(tmp_path))
    row = next(line for line in table.splitlines() if line.startswith("| Table 1"))
    measured, verdict = row.split(" | ")[2], row.split(" | ")[4].removesuffix(" |")
    for scheme in ("pre", "post", "siamese"):  # test_sweep_protocol's hand-computed picks
        best, sensitivity, stable = reference(scheme)
        assert f"{scheme}: lr {best:g}, LR sensitivity {sensitivity:.3g}, largest stable lr {stable:g}" in measured
    assert measured.startswith("`val/loss` at each scheme's picked rate, fresh seeds; pre: lr 0.01")
    assert "-s10" not in row and "-s11" not in row
    exported = {r["scheme"]: r for r in csv.DictReader((export / "comparison_cells.csv").open())}
    assert verdict == (f"post vs pre: {exported['post']['verdict_text']}<br>"
                       f"siamese vs pre: {exported['siamese']['verdict_text']}")  # fmt: skip
    assert verdict.startswith("post vs pre: worse (Dunnett") and "siamese vs pre: better (Dunnett" in verdict
    assert "LR sensitivity (Wortsman et al. 2023" in table

    broken = export / "tuning.yaml"
    broken.write_text("groups: [1]\n")
    with pytest.raises(Exception, match="is not the tuning record a sweep writes"):
        paper.render(tmp_path, "paper.yaml")
