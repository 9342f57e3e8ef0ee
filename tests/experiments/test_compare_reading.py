"""``compare`` reads a sweep the way the sweep ran it: the margins its spec declared, its ``last_evals``
measurement and, for a staged sweep, each cell at its own look (``stages.yaml``).

Through the command line (``python -m experiments compare DIR --tables-only``, in-process); reference values from
scipy / statsmodels, hard-coded: with two schemes per slice the block model is the paired t-test and Holm over one
cell changes nothing, so statsmodels' ``ttost_paired`` and scipy's ``ttest_rel`` are the verdicts' own numbers.
"""

from __future__ import annotations

import csv
import io
import json
import math
import statistics
from pathlib import Path

import pytest
import yaml

from experiments.__main__ import main as suite_main
from experiments.results.verdicts import clear_caches
from tests.experiments.test_compare import PRE, cells_table, seeded, summary, write_sweep


@pytest.fixture(autouse=True)
def _fresh_caches():
    clear_caches()
    yield
    clear_caches()


def compare_tables(sweep_dir: Path, capsys) -> str:
    """``python -m experiments compare DIR --tables-only`` in-process; the comparison.md it wrote."""
    assert suite_main(["compare", str(sweep_dir), "--tables-only"]) in (0, None)
    capsys.readouterr()
    return (sweep_dir / "comparison.md").read_text()


def set_record(sweep_dir: Path, **keys) -> None:
    path = sweep_dir / "sweep.yaml"
    path.write_text(yaml.safe_dump({**yaml.safe_load(path.read_text()), **keys}, sort_keys=False))


def one_line(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        suite_main(argv)
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2, err
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
    return err


##################################################################################
#                                   Margins                                      #
##################################################################################

# siamese - pre = -0.020, +0.024, -0.012 (mean -0.00267, SD 0.02344): statsmodels 0.14 ttost_paired(siamese, pre,
# -delta, +delta)[0] = 0.16434144332869072 at delta 0.02 (the val/loss default), 0.02572247286067656 at 0.06.
NEAR = [1.510, 1.585, 1.493]
TOST_AT_002, TOST_AT_006 = 0.16434144332869072, 0.02572247286067656


def test_compare_reads_the_margin_the_sweep_declared_and_says_which(tmp_path: Path, capsys):
    write_sweep(tmp_path, seeded("pre", PRE) + seeded("siamese", NEAR))
    rows = cells_table(compare_tables(tmp_path, capsys))
    assert rows[3][5].startswith("undecided (Dunnett, block model: p = "), rows[3]  # TOST p 0.16 at 0.02
    text = (tmp_path / "comparison.md").read_text()
    assert "(margin δ = 0.02, the documented default for val/loss)" in text
    cells = list(csv.DictReader(io.StringIO((tmp_path / "comparison_cells.csv").read_text())))
    assert float(cells[1]["verdict_p_tost"]) == pytest.approx(TOST_AT_002, rel=1e-9)

    set_record(tmp_path, margins={"val/loss": 0.06})  # what a sweep file's margins: {val/loss: 0.06} records
    rows = cells_table(compare_tables(tmp_path, capsys))
    assert rows[3][5] == "equivalent within ±0.06 (Dunnett, block model, TOST p = 0.026, n = 3)", rows[3]
    text = (tmp_path / "comparison.md").read_text()
    assert "(margin δ = 0.06, declared by the sweep's margins for val/loss)" in text
    cells = list(csv.DictReader(io.StringIO((tmp_path / "comparison_cells.csv").read_text())))
    assert float(cells[1]["verdict_p_tost"]) == pytest.approx(TOST_AT_006, rel=1e-9)
    assert float(cells[1]["verdict_margin"]) == 0.06


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"margins": {"val/loss": -0.1}}, "margins.val/loss=-0.1; valid: a positive number"),
        ({"margins": [0.02]}, "margins=[0.02]; valid: a mapping"),
        ({"last_evals": 0}, "last_evals=0; valid: a whole number from 1 to 1000"),
        ({"stages": [3, 5], "seeds": [1, 2, 3]}, "stages=[3, 5] with seeds=[1, 2, 3]"),
    ],
)
def test_a_sweep_record_no_sweep_writes_is_one_line_before_anything_is_written(tmp_path, capsys, keys, message):
    write_sweep(tmp_path, seeded("pre", PRE) + seeded("siamese", NEAR))
    set_record(tmp_path, **keys)
    err = one_line(["compare", str(tmp_path), "--tables-only"], capsys)
    assert message in err and "sweep.yaml" in err, err
    assert not (tmp_path / "comparison.md").exists()


##################################################################################
#                                  last_evals                                    #
##################################################################################


def curve(scheme: str, seed: int) -> list[float]:
    base = {"pre": 2.0, "siamese": 1.95}[scheme] + 0.013 * seed
    return [base + 0.4, base + 0.021 * seed, base - 0.012, base + 0.004 * seed * seed]


def test_compare_measures_each_run_as_the_sweep_did(tmp_path: Path, capsys):
    """``last_evals: 3`` in sweep.yaml: the cells' means are means of each run's last 3 validations, and the
    table puts the seed SD beside the measurement's own SD (each run's SD over its last 3, root mean square)."""
    runs = []
    for scheme in ("pre", "siamese"):
        for seed in (1, 2, 3):
            values = curve(scheme, seed)
            record = summary(scheme, 0.01, "finished", values[-1]) | {
                "val_curve": [[10 * (i + 1), {"val/loss": v}] for i, v in enumerate(values)]
            }
            runs.append(({"name": f"{scheme}-s{seed}", "scheme": scheme, "seed": seed}, record))
    write_sweep(tmp_path, runs)
    set_record(tmp_path, last_evals=3)
    rows = cells_table(compare_tables(tmp_path, capsys))
    assert rows[0][:3] == ["scheme", "val/loss", "SD: seeds / a run's last 3 evals"]
    cells = {r["scheme"]: r for r in csv.DictReader(io.StringIO((tmp_path / "comparison_cells.csv").read_text()))}
    for row, scheme in zip(rows[2:], ("pre", "siamese"), strict=True):
        means = [statistics.fmean(curve(scheme, s)[-3:]) for s in (1, 2, 3)]
        within = math.sqrt(statistics.fmean(statistics.variance(curve(scheme, s)[-3:]) for s in (1, 2, 3)))
        assert float(cells[scheme]["val/loss mean"]) == pytest.approx(statistics.fmean(means), abs=1e-12)
        assert float(cells[scheme]["measurement_sd"]) == pytest.approx(within, rel=1e-12)
        assert row[2] == f"{statistics.stdev(means):.2g} / {within:.2g}", row
    assert "mean of its last 3 validations" in (tmp_path / "comparison.md").read_text()
    assert (tmp_path / "measurement.md").is_file()  # the sweep's measurement table, rebuilt by compare too


##################################################################################
#                                Staged verdicts                                 #
##################################################################################

# Looks after 3, 6, 9 of 9 seeds (fractions 1/3, 2/3, 1): Lan-DeMets O'Brien-Fleming two-sided nominal levels
# 0.00069 / 0.0161 / 0.0439 (docs/results.md; test_sequential_compute checks them with scipy's multivariate normal).
LEVELS = (0.00069, 0.0161, 0.0439)
PRE_HIGH = [2.440, 2.470, 2.410, 2.455, 2.430, 2.462]
SIAMESE_HIGH = [2.390, 2.460, 2.380, 2.395, 2.430, 2.422]
P_HIGH_6 = 0.020366435849970534  # scipy ttest_rel(SIAMESE_HIGH, PRE_HIGH).pvalue: above look 2's 0.0161
SIAMESE_LOW = [1.430, 1.459, 1.404]
P_LOW_3 = 3.267493343353747e-05  # scipy ttest_rel(SIAMESE_LOW, PRE).pvalue: below look 1's 0.00069


def staged_sweep(root: Path) -> None:
    """lr 0.01: siamese decided at look 1 (3 seeds); lr 0.05: undecided at looks 1 and 2 (6 seeds), look 3 running."""
    runs = []
    for lr, scheme, values in ((0.01, "pre", PRE), (0.01, "siamese", SIAMESE_LOW), (0.05, "pre", PRE_HIGH),
                               (0.05, "siamese", SIAMESE_HIGH)):  # fmt: skip
        for seed, value in enumerate(values, 1):
            coords = {"name": f"{scheme}-lr{lr:g}-s{seed}", "scheme": scheme, "seed": seed, "lr": lr}
            runs.append((coords, summary(scheme, lr, "finished", value)))
    write_sweep(root, runs)
    set_record(root, stages=[3, 6, 9], seeds=list(range(1, 10)), last_evals=1)
    high = ["pre-lr0.05", "siamese-lr0.05"]
    looks = [
        {"look": 1, "seeds_per_cell": 3, "verdicts": {"siamese-lr0.01": {"word": "better"},
                                                      "siamese-lr0.05": {"word": "undecided"}}, "continue": high},
        {"look": 2, "seeds_per_cell": 6, "verdicts": {"siamese-lr0.05": {"word": "undecided"}}, "continue": high},
    ]  # fmt: skip
    record = {"stages": [3, 6, 9], "seeds": list(range(1, 10)), "metric": "val/loss", "baseline": "pre",
              "last_evals": 1, "alpha": 0.05, "looks": looks}  # fmt: skip
    (root / "stages.yaml").write_text(yaml.safe_dump(record, sort_keys=False))


def test_a_staged_cell_is_read_at_its_looks_level_and_says_the_look(tmp_path: Path, capsys):
    staged_sweep(tmp_path)
    compare_tables(tmp_path, capsys)
    cells = {r["lr"]: r for r in csv.DictReader(io.StringIO((tmp_path / "comparison_cells.csv").read_text()))
             if r["scheme"] == "siamese"}  # fmt: skip
    low, high = cells["0.01"], cells["0.05"]
    assert low["verdict"] == "better" and low["verdict_look"] == "1 of 3"
    assert float(low["verdict_p_adjusted"]) == pytest.approx(P_LOW_3, rel=1e-9)
    assert float(low["verdict_level"]) == pytest.approx(LEVELS[0], rel=0.01)
    assert low["verdict_text"] == "better (Dunnett, block model: p < 0.001, n = 3, look 1 of 3 at p < 0.00069)"
    # at a fixed alpha of 0.05 p = 0.020 over 6 seeds would be "better"; at look 2's level it is not yet
    assert high["verdict"] == "undecided" and high["verdict_look"] == "2 of 3" and high["verdict_n"] == "6"
    assert float(high["verdict_p_adjusted"]) == pytest.approx(P_HIGH_6, rel=1e-9)
    assert float(high["verdict_level"]) == pytest.approx(LEVELS[1], rel=0.01)
    assert high["verdict_text"].startswith(
        "undecided (Dunnett, block model: p = 0.02, n = 6, look 2 of 3 at p < 0.016)"
    )
    note = (tmp_path / "comparison.md").read_text()
    assert "Seeds in stages [3, 6, 9] (2 look(s) recorded in stages.yaml)" in note
    assert "look 1: 3 seeds, p < 0.00069" in note and "look 3: 9 seeds, p < 0.044" in note

    # paired against another scheme the looks do not apply: one fixed-sample reading
    suite_main(["compare", str(tmp_path), "--baseline", "siamese"])
    assert "look 2 of 3" not in capsys.readouterr().out


def test_a_stages_record_of_another_sweep_is_one_line(tmp_path: Path, capsys):
    staged_sweep(tmp_path)
    record = yaml.safe_load((tmp_path / "stages.yaml").read_text())
    (tmp_path / "stages.yaml").write_text(yaml.safe_dump({**record, "baseline": "post"}))
    err = one_line(["compare", str(tmp_path), "--tables-only"], capsys)
    assert "stages.yaml recorded its looks under another baseline" in err, err
    (tmp_path / "stages.yaml").write_text(json.dumps([1, 2]))
    err = one_line(["compare", str(tmp_path), "--tables-only"], capsys)
    assert "is not the stages record a sweep writes" in err, err
    assert not (tmp_path / "comparison.md").exists()


def test_a_pages_verdicts_block_is_generated_from_the_export(tmp_path: Path, monkeypatch, capsys):
    """``<!-- results:DIR:verdicts -->``: the verdicts as prose, one line per word, regenerated by ``readme``."""
    write_sweep(tmp_path / "exp", seeded("pre", PRE) + seeded("siamese", NEAR))
    set_record(tmp_path / "exp", margins={"val/loss": 0.06})
    page = tmp_path / "page.md"
    page.write_text("What holds:\n<!-- results:exp:verdicts -->\nstale\n<!-- /results -->\n")
    monkeypatch.chdir(tmp_path)
    assert suite_main(["readme", str(page)]) in (0, None)
    capsys.readouterr()
    assert page.read_text() == (
        "What holds:\n<!-- results:exp:verdicts -->\n- **Equivalent to pre** (val/loss): siamese within ±0.06 "
        "(Dunnett, block model, TOST p = 0.026, n = 3).\n<!-- /results -->\n"
    )
