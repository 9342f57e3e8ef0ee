"""The comparison a sweep writes: statuses (incl. stalled against the data's baseline), table, maps."""

from __future__ import annotations

import csv
import io
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml
from scipy import stats as scipy_stats

from experiments.reliability.errors import SuiteError
from experiments.results import compare, palette, plots, stats, tables
from experiments.results.profiles import depth_profile
from experiments.results.verdicts import clear_caches


@pytest.fixture(autouse=True)
def _fresh_caches():
    """Every test computes its verdicts itself (a cached analysis would hide a change in the code)."""
    clear_caches()


ROOT = Path(__file__).resolve().parents[2]

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
    # The line itself: 0.9 x 10 = 9.0 exactly; "above" is strict, and the run's own baseline beats the sweep's.
    assert compare.status_of(summary("pre", 0.05, "finished", 9.0, baseline=10.0), None) == "finished"
    assert compare.status_of(summary("pre", 0.05, "finished", 9.001, baseline=10.0), None) == "stalled"
    assert compare.status_of(summary("pre", 0.05, "finished", 9.001, baseline=None), 10.0) == "stalled"
    assert compare.status_of(summary("pre", 0.05, "finished", 9.001, baseline=20.0), 10.0) == "finished"


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
    assert "| val/acc1 |" in Tables(tmp_path).markdown  # the sweep's metric


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
    out = Tables(tmp_path)
    runs = out.markdown.split("every run")[1].strip().splitlines()
    assert runs[0].endswith("| params | test/acc1 |")
    assert runs[2].endswith("| 0.8 |") and runs[3].endswith("| - |")  # an untested run shows a dash
    assert out.runs_csv[0][-2:] == ["params", "test/acc1"]


##################################################################################
#                     Cells over seeds, paired against a baseline               #
##################################################################################


def write_sweep(root: Path, runs: list[tuple[dict, dict]], baseline: str | None = "pre", metric: str = "val/loss"):
    """A sweep directory as the sweep writes it: ``sweep.yaml`` (runs, grid, baseline) and run summaries."""
    grid = []
    for coords, record in runs:
        grid.append({"overlay": None, "lr": 0.01, "warmup": None, **coords})
        (root / coords["name"]).mkdir(parents=True)
        (root / coords["name"] / "summary.json").write_text(json.dumps(record))
    spec = {"name": "seeds", "configs": ["configs/lm/tiny.yaml"], "baseline": baseline, "metric": metric,
            "runs": [g["name"] for g in grid], "grid": grid}  # fmt: skip
    (root / compare.SWEEP_RECORD).write_text(yaml.safe_dump(spec, sort_keys=False))
    return root


PRE = [1.530, 1.561, 1.505]
SIAMESE = [1.512, 1.538, 1.497]


def seeded(scheme: str, values: list[float | None], statuses: list[str] | None = None, trunk: str | None = None):
    statuses = statuses or ["finished"] * len(values)
    return [
        ({"name": f"{scheme}-s{seed}", "scheme": scheme, "seed": seed},
         summary(trunk or scheme, 0.01, status, value) | {"wall_time_s": 100.0 + seed / 3, "params": 1_083_968})
        for seed, value, status in zip((1, 2, 3)[: len(values)], values, statuses, strict=True)
    ]  # fmt: skip


class Tables:
    """The comparison's text outputs, built without drawing its plots (those tests are elsewhere)."""

    def __init__(self, root: Path) -> None:
        c = compare.load_comparison(root)
        self.markdown = c.markdown()
        runs_csv = root / "runs.csv"
        tables.write_runs_csv(runs_csv, c.table, c.metric)
        self.runs_csv = list(csv.reader(runs_csv.open()))
        self.cells_csv = list(csv.DictReader(io.StringIO(tables.cells_csv(c.cells, c.metric, c.baseline, c.table))))


def cells_table(markdown: str) -> list[list[str]]:
    """The first markdown table of ``markdown`` (the cells), as lists of cell texts."""
    lines = markdown.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return [[c.strip() for c in line.strip("|").split("|")] for line in lines[start:end]]


def test_cells_show_mean_ci_n_and_the_paired_difference_with_scipys_values(tmp_path: Path):
    write_sweep(tmp_path, seeded("pre", PRE) + seeded("siamese", SIAMESE))
    out = Tables(tmp_path)
    rows = cells_table(out.markdown)
    header = ["scheme", "val/loss", "Δ val/loss vs pre", "p (paired t, unadjusted)", "p (sign-flip)", "verdict", "runs"]
    assert rows[0] == header
    e, ref = stats.estimate(SIAMESE), scipy_stats.ttest_rel(SIAMESE, PRE)
    diff = scipy_stats.ttest_rel(SIAMESE, PRE).confidence_interval()
    half = (diff.high - diff.low) / 2
    assert rows[2][0] == "pre" and rows[2][2] == "(baseline)" and rows[2][-1] == "3 finished"
    assert rows[3][1] == f"{e.mean:.3f} ± {e.half_width:.3f} (n = 3)"  # half-width 0.052: 2 significant digits
    assert rows[3][2] == f"{np.mean(np.subtract(SIAMESE, PRE)):+.3f} ± {half:.3f} (n = 3)"
    assert rows[3][3] == f"{ref.pvalue:.2g}" and rows[3][4] == "0.25"  # 3 pairs: the sign-flip floor
    assert "smallest possible value with n = 3 pairs is 0.25" in out.markdown
    cells = out.cells_csv
    assert float(cells[1]["val/loss p_paired_t"]) == pytest.approx(ref.pvalue, rel=1e-12)
    assert float(cells[1]["val/loss diff_ci_low"]) == pytest.approx(diff.low, rel=1e-12)
    assert cells[1]["finished"] == "3" and cells[1]["val/loss n"] == "3"
    assert cells[1]["val/loss"] == rows[3][1] and cells[1]["Δ val/loss"] == rows[3][2]  # the markdown's text


def test_every_paired_cell_says_what_its_seeds_could_detect_and_how_many_its_difference_needs(tmp_path: Path):
    """siamese - pre = -0.018, -0.023, -0.008: mean -0.01633, paired sd 0.007638, effect 2.14 sd. statsmodels 0.15.0
    TTestPower (two-sided, alpha 0.05, power 0.8): solve_power(nobs=3) = 3.2640 sd, so 0.0249 is detectable;
    solve_power(effect_size=2.1385) = 3.98 pairs, so 4 seeds. post's seed 3 diverged: 2 pairs, +0.011 / +0.009,
    sd 0.001414, effect 7.07 sd; with 2 pairs 11.55 sd are needed (0.0163), at 3 pairs 3.26: 3 seeds."""
    post, statuses = [1.541, 1.570, None], ["finished", "finished", "diverged"]
    offset = [v + 0.01 for v in PRE]  # every seed exactly +0.01: no spread, no t-test
    runs = seeded("pre", PRE) + seeded("siamese", SIAMESE) + seeded("post", post, statuses) + seeded("hybrid", offset)
    write_sweep(tmp_path, runs + seeded("mixln", [1.6, None, None], ["finished", "diverged", "diverged"]))
    out = Tables(tmp_path)
    evidence = next(line for line in out.markdown.splitlines() if line.startswith("Evidence of each Δ"))
    assert "paired t-test (two-sided, alpha 0.05) finds with 80 % power" in evidence
    assert evidence.endswith(": siamese: 0.025 / ~4 seeds; post: 0.016 / ~3 seeds; hybrid: no spread: no t-test; "
                             "mixln: one pair, no test.")  # fmt: skip
    by_scheme = {row["scheme"]: row for row in out.cells_csv}
    siamese = by_scheme["siamese"]
    assert float(siamese["val/loss diff_std"]) == pytest.approx(0.007637626158259813, rel=1e-9)
    assert float(siamese["val/loss detectable_diff"]) == pytest.approx(3.264043552819638 * 0.007637626158259813,
                                                                       rel=1e-6)  # fmt: skip
    assert siamese["val/loss seeds_needed"] == "4" and siamese["val/loss evidence"] == "0.025 / ~4 seeds"
    assert by_scheme["post"]["val/loss diff_n"] == "2" and by_scheme["post"]["val/loss seeds_needed"] == "3"
    assert float(by_scheme["post"]["val/loss detectable_diff"]) == pytest.approx(11.549889754978167 * 0.002 / 2**0.5,
                                                                                 rel=1e-6)  # fmt: skip
    assert by_scheme["hybrid"]["val/loss detectable_diff"] == "" and by_scheme["hybrid"]["val/loss seeds_needed"] == ""
    assert by_scheme["pre"]["val/loss evidence"] == ""  # the baseline is not compared with itself
    pivot = compare.load_comparison(tmp_path).block("pivot")
    assert evidence in pivot  # the pivot's notes carry the same line


def test_compare_against_another_baseline_prints_the_pairs_and_writes_nothing(tmp_path: Path, capsys):
    """``--baseline siamese``: each cell paired with SiameseNorm's runs (e.g. a scheme against itself plus DyT)."""
    post = [1.541, 1.570, 1.533]
    write_sweep(tmp_path, seeded("pre", PRE) + seeded("siamese", SIAMESE) + seeded("post", post))
    before = sorted(p.name for p in tmp_path.iterdir())
    compare.main([str(tmp_path), "--baseline", "siamese"])
    rows = cells_table(capsys.readouterr().out)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # printed only
    assert rows[0][:3] == ["scheme", "val/loss", "Δ val/loss vs siamese"]
    by_scheme = {r[0]: r for r in rows[2:]}
    assert by_scheme["siamese"][2] == "(baseline)"
    for scheme, values in (("pre", PRE), ("post", post)):  # scheme - siamese, not siamese - scheme
        ref = scipy_stats.ttest_rel(values, SIAMESE)
        shown = float(by_scheme[scheme][2].split(" ± ")[0])
        assert shown == pytest.approx(np.mean(np.subtract(values, SIAMESE)), abs=1e-3)  # as shown
        assert by_scheme[scheme][3] == f"{ref.pvalue:.2g}"
    with pytest.raises(
        SuiteError, match=r"^--baseline deepnorm: not a scheme of this sweep; valid: pre, siamese, post$"
    ):
        compare.main([str(tmp_path), "--baseline", "deepnorm"])
    with pytest.raises(SuiteError, match="--baseline only prints"):
        compare.main([str(tmp_path), "--baseline", "pre", "--export", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def test_cells_pair_runs_by_seed_whatever_the_order_and_gaps(tmp_path: Path):
    """The scheme's runs listed in another order than the baseline's, its seed 2 diverged (a gap in the middle)
    and its seed 5 without a baseline run: the difference is over seeds 1, 3 and 4, each with its own baseline."""
    pre = {1: 1.530, 2: 1.561, 3: 1.505, 4: 1.560}
    siamese = {3: 1.497, 1: 1.512, 2: None, 5: 1.470, 4: 1.540}
    runs = []
    for scheme, by_seed in (("pre", pre), ("siamese", siamese)):
        for seed, value in by_seed.items():
            status = "finished" if value is not None else "diverged"
            runs.append(({"name": f"{scheme}-s{seed}", "scheme": scheme, "seed": seed},
                         summary(scheme, 0.01, status, value)))  # fmt: skip
    write_sweep(tmp_path, runs)
    cell = Tables(tmp_path).cells_csv[1]
    d = np.array([1.512 - 1.530, 1.497 - 1.505, 1.540 - 1.560])  # seeds 1, 3, 4: -18, -8, -20 (x 1e-3)
    mean, se = d.mean(), d.std(ddof=1) / np.sqrt(3)
    half = 4.302652729749462 * se  # t_{0.975, 2}
    assert cell["scheme"] == "siamese" and cell["val/loss diff_n"] == "3" and cell["diverged"] == "1"
    assert float(cell["val/loss diff_mean"]) == pytest.approx(-0.046 / 3, rel=1e-12)
    assert float(cell["val/loss diff_ci_low"]) == pytest.approx(mean - half, rel=1e-12)
    assert float(cell["val/loss diff_ci_high"]) == pytest.approx(mean + half, rel=1e-12)
    assert float(cell["val/loss p_paired_t"]) == pytest.approx(2 * scipy_stats.t.sf(abs(mean) / se, df=2), rel=1e-10)
    assert float(cell["val/loss p_sign_flip"]) == pytest.approx(0.25)  # all three negative: 2 of 8 patterns
    assert float(cell["val/loss mean"]) == pytest.approx((1.497 + 1.512 + 1.470 + 1.540) / 4, rel=1e-12)


def test_cells_come_from_the_grid_not_the_summarys_scheme(tmp_path: Path):
    # Both variants train the siamese_hybrid trunk: the summary says so, only the grid tells them apart.
    runs = seeded("pre", PRE) + seeded("siamese_hybrid", SIAMESE)
    runs += seeded("siamese_hybrid-no-input-norm", [1.6, 1.62, 1.58], trunk="siamese_hybrid")
    write_sweep(tmp_path, runs)
    rows = cells_table(Tables(tmp_path).markdown)
    assert [r[0] for r in rows[2:]] == ["pre", "siamese_hybrid", "siamese_hybrid-no-input-norm"]
    assert rows[4][1] == "1.600 ± 0.050 (n = 3)"


def test_failed_runs_are_counted_not_averaged(tmp_path: Path):
    runs = seeded("pre", PRE) + seeded("post", [1.6, 3.02, None], ["finished", "finished", "diverged"])
    runs += seeded("deepnorm", [3.03, 3.02, 3.04])  # all stalled at the context-free loss
    write_sweep(tmp_path, runs)
    rows = cells_table(Tables(tmp_path).markdown)
    post, deepnorm = rows[3], rows[4]
    assert post[1] == "1.6 (n = 1)" and post[-1] == "1 finished, 1 stalled, 1 diverged"
    assert post[2] == f"{1.6 - PRE[0]:+.4g} (n = 1)" and post[3] == post[4] == "-"  # one pair: no test
    assert deepnorm[1].startswith("stalled 3.030 ± ") and deepnorm[2] == "-" and deepnorm[-1] == "3 stalled"


def test_a_mean_curve_averages_what_its_table_row_averages():
    from experiments.results.cells import Cell
    from experiments.results.plots import averaged_runs

    runs = [{"run": f"post-s{i}", "status": status} for i, status in enumerate(["finished", "stalled", "finished"])]
    assert [r["run"] for r in averaged_runs(Cell(("post",), runs))] == ["post-s0", "post-s2"]  # the stalled one alone
    stalled = [{"run": f"hybrid-s{i}", "status": "stalled"} for i in range(3)]
    assert averaged_runs(Cell(("hybrid",), [*stalled, {"run": "x", "status": "diverged"}])) == stalled


def test_a_one_seed_cell_says_n_1_and_shows_no_interval(tmp_path: Path):
    write_sweep(tmp_path, seeded("pre", PRE[:1]) + seeded("siamese", SIAMESE[:1]))
    out = Tables(tmp_path)
    markdown = out.markdown
    rows = cells_table(markdown)
    assert rows[2][1] == "1.53 (n = 1)" and rows[3][1] == "1.512 (n = 1)" and "±" not in markdown
    assert rows[3][2] == "-0.018 (n = 1)" and rows[3][3] == rows[3][4] == "-"
    cell = out.cells_csv[1]
    assert cell["val/loss n"] == "1" and cell["val/loss ci_low"] == cell["val/loss std"] == ""


def test_pivot_puts_the_swept_axis_in_columns_with_the_paired_line(tmp_path: Path):
    runs = []
    for lr in (0.01, 0.05):
        for scheme, values in (("pre", PRE), ("siamese", SIAMESE)):
            for (coords, record), value in zip(seeded(scheme, values), values, strict=True):
                name = f"{scheme}-lr{lr:g}-s{coords['seed']}"
                runs.append(({**coords, "name": name, "lr": lr}, record | {"lr": lr}))
                assert record["final_val"]["val/loss"] == value
    write_sweep(tmp_path, runs)
    comparison = compare.load_comparison(tmp_path)
    pivot = comparison.block("pivot").splitlines()
    assert pivot[0] == "| scheme | lr 0.01 | lr 0.05 |"
    assert pivot[3].startswith("| siamese | 1.516 ± 0.052 (n = 3)<br>Δ -0.016 ± ")
    assert "(t, unadjusted), 0.25 (sign-flip)" in pivot[3] and pivot[3].count("<br>Δ") == 2
    assert compare.write_comparison(tmp_path)["metric_vs_lr"].stat().st_size > 1000


def test_the_csv_names_the_metric_and_formats_wall_time_one_way(tmp_path: Path):
    write_sweep(tmp_path, seeded("pre", PRE) + seeded("siamese", SIAMESE), metric="val/ppl")
    for run in tmp_path.glob("*/summary.json"):
        record = json.loads(run.read_text())
        record["final_val"]["val/ppl"] = math.exp(record["final_val"]["val/loss"])
        run.write_text(json.dumps(record))
    out = Tables(tmp_path)
    header, *lines = out.runs_csv
    assert "metric" not in header and "val/ppl" in header
    wall = [line[header.index("wall_s")] for line in lines]
    assert wall == ["100.3", "100.7", "101.0"] * 2  # one decimal everywhere
    runs = out.markdown.split("every run")[1]
    assert "| 100 | 1,083,968 |" in runs and "| 101 | 1,083,968 |" in runs  # whole seconds in markdown
    assert cells_table(out.markdown)[0][1] == "val/ppl"


def test_runs_under_different_test_protocols_are_not_ranked_silently(tmp_path: Path):
    fid = {"samples": 500, "sampler": "ddim", "steps": 50}
    runs = seeded("pre", PRE) + seeded("siamese", SIAMESE)
    for i, (_, record) in enumerate(runs):
        protocol = fid if i != 5 else fid | {"samples": 1000}  # siamese-s3 measured with more samples
        record |= {"test": {"test/fid": 140.0 + i}, "test_protocol": protocol}
    write_sweep(tmp_path, runs)
    markdown = Tables(tmp_path).markdown
    assert "**Test metrics were measured under 2 different protocols**" in markdown
    assert "P1 = samples=500, sampler=ddim, steps=50; P2 = samples=1000, sampler=ddim, steps=50" in markdown
    rows = cells_table(markdown)
    assert rows[2][6] == "141.0 ± 2.5 (n = 3)" and rows[3][6] == "mixed protocols"
    assert "| protocol |" in markdown.split("every run")[1] and "| P2 |" in markdown
    for i, (_, record) in enumerate(runs):  # one protocol for all: a single line names it, no column
        # what names the run (its weights, its samples file) is provenance, not a different protocol
        record["test_protocol"] = fid | {"weights_sha256": f"{i:016x}", "samples_file": f"run{i}/samples.npz"}
    shutil.rmtree(tmp_path)
    write_sweep(tmp_path, runs)
    markdown = Tables(tmp_path).markdown
    assert "Test protocol of every tested run: samples=500, sampler=ddim, steps=50." in markdown
    assert "| protocol |" not in markdown and "mixed" not in markdown


def test_downstream_scores_average_in_markdown_and_every_task_in_the_csv(tmp_path: Path):
    runs = seeded("pre", PRE[:1]) + seeded("siamese", SIAMESE[:1])
    for _, record in runs:
        record["test"] = {"test/ppl": 4.1, "test/downstream/hellaswag/acc": 0.3, "test/downstream/arc_easy/acc": 0.4,
                          "test/downstream/avg": 0.35}  # fmt: skip
    write_sweep(tmp_path, runs)
    out = Tables(tmp_path)
    assert "test/downstream/avg" in out.markdown and "hellaswag" not in out.markdown
    tasks = {"test/downstream/hellaswag/acc", "test/downstream/arc_easy/acc", "test/downstream/avg"}
    assert tasks <= set(out.runs_csv[0])
    assert "test/downstream/hellaswag/acc mean" in out.cells_csv[0]


def test_mean_curve_averages_the_steps_every_seed_has():
    steps, mean, low, high = plots.mean_curve([{10: 3.0, 20: 2.0, 30: 1.5}, {10: 3.2, 20: 2.2}])
    assert steps.tolist() == [10, 20] and mean.tolist() == pytest.approx([3.1, 2.1])
    e = stats.estimate([2.0, 2.2])
    assert (low[1], high[1]) == pytest.approx((e.low, e.high))
    assert plots.mean_curve([]) is None


def test_every_scheme_has_its_own_colour_in_every_plot():
    known = palette.SCHEME_COLOURS
    assert len(set(known.values())) == len(known)  # no two listed schemes share one
    shipped = {p.stem for p in (ROOT / "configs/norm").glob("*.yaml")}  # every scheme and named variant
    assert shipped <= set(known)  # every shipped scheme and variant is listed
    colours = palette.scheme_colours(["pre", "new-a", "new-b"])
    assert len(set(colours.values())) == 3 and colours["pre"] == known["pre"]


@pytest.mark.slow
def test_a_real_seeded_sweep_produces_the_cells_table(tmp_path: Path, monkeypatch, capsys):
    """Two schemes x two seeds through the real sweep runner and ``fit``: the table pairs them by seed. The runs
    are real fits in this process (tests/experiments/test_sweep.py proves the child-process side)."""
    from experiments.sweeps import sweep
    from tests.experiments.in_process import call_in_process
    from tests.experiments.tiny import tiny_lm

    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sweep.Children, "call", call_in_process)
    spec = {"name": "seeded", "configs": [str(ROOT / "configs/lm/tiny.yaml")], "schemes": ["pre", "siamese"],
            "seeds": [1, 2], "baseline": "pre", "parallel": 1, "runs_root": str(tmp_path / "runs"),
            "args": [*tiny_lm(), f"--data.init_args.data_dir={tmp_path / 'data'}", "--trainer.max_steps=80",
                     "--trainer.val_check_interval=80", "--model.init_args.optim.lr=0.01",
                     "--divergence.max_loss=50"]}  # fmt: skip  # 80 steps: below the stall line
    (tmp_path / "seeded.yaml").write_text(yaml.safe_dump(spec))
    sweep.main(["sweep", str(tmp_path / "seeded.yaml")])
    out = capsys.readouterr().out
    assert "## seeded: val/loss per cell, over seeds" in out  # printed at the end
    sweep_dir = tmp_path / "runs/lm/seeded"
    rows = cells_table((sweep_dir / "comparison.md").read_text())
    assert rows[0][:3] == ["scheme", "val/loss", "Δ val/loss vs pre"]
    assert rows[2][0] == "pre" and rows[2][1].endswith("(n = 2)") and rows[2][2] == "(baseline)"
    assert rows[3][0] == "siamese" and rows[3][2].endswith("(n = 2)") and rows[3][4] == "0.5"  # 2 pairs: floor 0.5
    assert {"pre-s1", "siamese-s2"} <= {line[0] for line in csv.reader((sweep_dir / "comparison.csv").open())}
    assert (sweep_dir / "curves.png").stat().st_size > 1000


def test_identical_runs_compare_as_no_difference_with_p_1(tmp_path: Path):
    write_sweep(tmp_path, seeded("pre", PRE) + seeded("siamese", PRE))  # the same numbers, seed by seed
    row = cells_table(Tables(tmp_path).markdown)[3]
    assert row[:5] == ["siamese", "1.532 ± 0.070 (n = 3)", "+0 ± 0 (n = 3)", "1", "1"]


def test_tables_only_rewrites_an_exports_tables_from_its_summaries(tmp_path: Path, capsys):
    sweep_dir = write_sweep(tmp_path / "sweep", seeded("pre", PRE) + seeded("siamese", SIAMESE))
    compare.main([str(sweep_dir), "--export", str(tmp_path / "export")])
    target = tmp_path / "export"
    before = {name: (target / name).read_text() for name in ("comparison.md", "comparison.csv", compare.CELLS_CSV)}
    for name in before:
        (target / name).write_text("stale")
    (target / "curves.png").unlink()
    shutil.rmtree(sweep_dir)  # the runs are gone: only the export's summaries are left
    compare.main([str(target), "--tables-only"])
    assert {name: (target / name).read_text() for name in before} == before
    assert not (target / "curves.png").exists()  # no plots, no TensorBoard layout
    assert "cells_csv" in capsys.readouterr().out
    with pytest.raises(SuiteError, match="--tables-only rewrites the directory's own tables"):
        compare.main([str(target), "--tables-only", "--baseline", "siamese"])


# statsmodels 0.15.0, ols("y ~ C(scheme, Treatment('pre')) + C(seed)") on the finished runs of the sweep below
# (post's seed 3 diverged, mixln has seed 1 only): residual df 5; and P(max |T| >= |t_i|) from a 4,000,000-draw
# Monte Carlo of the multivariate t with its correlation (Dunnett on the block model).
BLOCK_DUNNETT = {"hybrid": 0.07838075, "mixln": 8.75e-05, "post": 0.08205575, "siamese": 0.01189075}
BLOCK_UNADJUSTED = {"hybrid": 0.026717736085798468, "post": 0.02803953979993903, "siamese": 0.003865018723905448}


def test_every_cell_carries_its_slices_verdict_in_the_table_the_csv_and_the_notes(tmp_path: Path):
    post, statuses = [1.541, 1.570, None], ["finished", "finished", "diverged"]
    offset = [v + 0.01 for v in PRE]
    runs = seeded("pre", PRE) + seeded("siamese", SIAMESE) + seeded("post", post, statuses) + seeded("hybrid", offset)
    write_sweep(tmp_path, runs + seeded("mixln", [1.6, None, None], ["finished", "diverged", "diverged"]))
    out = Tables(tmp_path)
    by_scheme = {row["scheme"]: row for row in out.cells_csv}
    for scheme, p in BLOCK_DUNNETT.items():
        assert float(by_scheme[scheme]["verdict_p_adjusted"]) == pytest.approx(p, abs=2e-3)
    for scheme, p in BLOCK_UNADJUSTED.items():  # adjusted for 4 contrasts: larger than the block model's own p
        assert float(by_scheme[scheme]["verdict_p_adjusted"]) > p
    assert [by_scheme[s]["verdict"] for s in ("siamese", "post", "hybrid", "mixln")] == [
        "better", "undecided", "undecided", "worse"]  # fmt: skip
    assert by_scheme["post"]["verdict_n"] == "2" and by_scheme["mixln"]["verdict_n"] == "1"
    assert by_scheme["pre"]["verdict"] == "" and by_scheme["siamese"]["verdict_margin"] == "0.02"
    rows = {r[0]: r for r in cells_table(out.markdown)[2:]}
    assert rows["siamese"][5] == f"better (Dunnett, block model: p = {BLOCK_DUNNETT['siamese']:.2g}, n = 3)"
    assert rows["post"][5].startswith("undecided (Dunnett, block model: p = 0.082, n = 2): ~")
    assert "Dunnett, block model (4 contrasts, residual df 5, pooled SD 0.00395;" in out.markdown
    pivot = compare.load_comparison(tmp_path).block("pivot")
    assert "<br>**better (Dunnett, block model: p = 0.012, n = 3)**" in pivot
