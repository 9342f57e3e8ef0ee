"""README's "Paper numbers next to this suite's" table, generated from fixture exports: verdicts computed from
the slice's block analysis (better, worse, equivalent within ±δ, undecided), a row whose export is missing,
failures, parameters, the bench."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
import yaml
from scipy import stats as scipy_stats

from experiments.reliability.errors import SuiteError
from experiments.results import paper, readme
from experiments.results.verdicts import clear_caches


@pytest.fixture(autouse=True)
def _fresh_caches():
    """Every test computes its verdicts itself (a cached analysis would hide a change in the code)."""
    clear_caches()


BENCH_FIELDS = [
    "task",
    "size",
    "group",
    "name",
    "baseline",
    "step_ratio",
    "act_ratio",
    "param_ratio",
    "step_ms_p25",
    "step_ms_p75",
]


def write_export(root: Path, name: str, runs: dict[tuple[str, int], float | str], metric: str = "val/loss") -> None:
    """An exported comparison: ``runs`` maps (scheme, seed) to the metric, or to a status for a failed run."""
    export, grid = root / "docs" / "results" / name, []
    for (scheme, seed), value in runs.items():
        run = f"{scheme}-s{seed}"
        failed = isinstance(value, str)
        val = {"val/loss": 3.0 if failed else (value if metric == "val/loss" else 1.0)}
        summary = {"task": "lm", "scheme": scheme, "lr": 0.01, "status": value if failed else "finished",
                   "steps": 10, "final_val": val, "train_curve": [[10, 1.0]], "val_curve": []}  # fmt: skip
        if metric.startswith("test/") and not failed:
            summary["test"] = {metric: value}
            summary["test_protocol"] = {"samples": 500}
        (export / run).mkdir(parents=True)
        (export / run / "summary.json").write_text(json.dumps(summary))
        grid.append({"name": run, "scheme": scheme, "lr": 0.01, "seed": seed})
    record = {"name": name, "metric": metric, "baseline": "pre", "runs": [g["name"] for g in grid], "grid": grid}
    (export / "sweep.yaml").write_text(yaml.safe_dump(record))


def three_seeds(pre: list[float], siamese: list[float]) -> dict:
    return {**{("pre", i + 1): v for i, v in enumerate(pre)}, **{("siamese", i + 1): v for i, v in enumerate(siamese)}}


PRE = [2.0, 2.1, 2.2]
# "mixed": Δ -0.20, +0.10, -0.05, mean -0.05, paired sd 0.15 (deviations -0.15, +0.15, 0): effect 1/3 sd.
# statsmodels 0.15.0 TTestPower (two-sided, alpha 0.05, power 0.8): solve_power(effect_size=1/3) = 72.58 pairs, so
# 73 seeds; solve_power(nobs=3) = 3.2640 sd, so 3.264 x 0.15 = 0.49 is the smallest detectable difference.
# Two schemes on complete seeds: the block model is the paired t-test, so its Dunnett p is the paired t's p.
MIXED_VERDICT = "undecided (Dunnett, block model: p = {p}, n = 3): ~73 seeds; detectable 0.49"
SAME = [0.001, -0.002, 0.0015]  # Δ per seed: within ±0.02 (val/loss's margin) with a tiny spread
EXPORTS = {
    "better": three_seeds(PRE, [1.80, 1.92, 2.00]),  # Δ -0.20, -0.18, -0.20: lower on every seed
    "worse": three_seeds(PRE, [2.20, 2.31, 2.39]),  # Δ +0.20, +0.21, +0.19
    "mixed": three_seeds(PRE, [1.80, 2.20, 2.15]),  # Δ -0.20, +0.10, -0.05
    "same": three_seeds(PRE, [p + d for p, d in zip(PRE, SAME, strict=True)]),
}


def row(claim: str, **how) -> dict:
    return {"claim": claim, "paper": f"paper value of {claim}", "command": f"sweep {claim}", **how}


def write_paper(root: Path, rows: list[dict]) -> None:
    overhead = {"setting": "15B MoE", "parameters": 0.001, "throughput": -0.005, "activation_memory": 0.02}
    data = {"alpha": 0.05, "rows": rows, "overhead": overhead}
    (root / "paper.yaml").write_text(yaml.safe_dump(data, sort_keys=False))


def table_rows(text: str) -> dict[str, list[str]]:
    """``{claim: [paper, this suite, command, verdict]}`` of a rendered table."""
    out = {}
    for line in text.splitlines()[2:]:
        if not line.startswith("| "):
            break
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        out[cells[0]] = cells[1:]
    return out


def p_text(p: float) -> str:
    return "p < 0.001" if p < 0.001 else f"p = {p:.2g}"


def tost_p(diffs: list[float], margin: float) -> float:
    """TOST by its formula: the larger one-sided p of (mean + margin) / se and (mean - margin) / se."""
    n = len(diffs)
    mean = sum(diffs) / n
    se = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1)) / math.sqrt(n)
    return max(scipy_stats.t.sf((mean + margin) / se, n - 1), scipy_stats.t.cdf((mean - margin) / se, n - 1))


def paired_t_p(diffs: list[float]) -> float:
    """Two-sided p of the paired t-test, from its formula: t = mean / (sd / sqrt(n)) on n - 1 degrees of freedom."""
    n = len(diffs)
    mean = sum(diffs) / n
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
    return 2 * scipy_stats.t.sf(abs(mean / (sd / math.sqrt(n))), n - 1)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    for name, runs in EXPORTS.items():
        write_export(tmp_path, name, runs)
    write_export(tmp_path, "stability", {("pre", 1): 2.0, ("post", 1): "stalled", ("post", 2): "diverged"})
    write_paper(
        tmp_path,
        [
            row("a holds", export="docs/results/better", better="lower", compare=[{"scheme": "siamese"}]),
            row("a does not", export="docs/results/worse", better="lower", compare=[{"scheme": "siamese"}]),
            row("an inconclusive", export="docs/results/mixed", better="lower", compare=[{"scheme": "siamese"}]),
            row("an equivalent", export="docs/results/same", better="lower", compare=[{"scheme": "siamese"}]),
            row("a missing", export="docs/results/moe", better="lower", compare=[{"scheme": "siamese"}]),
            row("failures", export="docs/results/stability", fail=[{"scheme": "post"}], here="tiny LM"),
        ],
    )
    return tmp_path


def test_verdicts_follow_the_paired_difference(root: Path):
    rows = table_rows(paper.render(root, "paper.yaml"))
    p_better, p_worse = paired_t_p([-0.20, -0.18, -0.20]), paired_t_p([0.20, 0.21, 0.19])
    p_mixed = paired_t_p([-0.20, 0.10, -0.05])
    p_same = tost_p(SAME, 0.02)
    assert p_same < 0.05 and f"{p_same:.2g}" == "0.0015"
    assert [r[3] for r in rows.values()] == [
        f"better (Dunnett, block model: {p_text(p_better)}, n = 3)",
        f"worse (Dunnett, block model: {p_text(p_worse)}, n = 3)",
        MIXED_VERDICT.format(p=f"{p_mixed:.2g}"),
        f"equivalent within ±0.02 (Dunnett, block model, TOST {p_text(p_same)}, n = 3)",
        "not measured yet",
        "holds",  # failures: one of them diverged
    ]
    better = rows["a holds"][1]
    p = p_better
    assert p < 0.01 and p_text(p) in better
    assert better.startswith("`val/loss`, siamese 1.91 ± 0.25 (n = 3)") and "vs pre 2.10 ± 0.25 (n = 3)" in better
    assert "Δ -0.193 ± 0.029 (n = 3)" in better  # sd 0.01155 x t(0.975, 2) = 4.303 / sqrt(3)
    assert p_text(paired_t_p([0.20, 0.21, 0.19])) in rows["a does not"][1]
    assert p_text(paired_t_p([-0.20, 0.10, -0.05])) in rows["an inconclusive"][1]
    assert rows["a missing"][1:3] == ["not measured yet", "`sweep a missing`"]
    assert rows["failures"][1] == "*tiny LM*<br>post: 2 of 2 runs failed (1 diverged, 1 stalled)"


def test_a_row_starts_rendering_numbers_when_its_export_appears(root: Path):
    (root / "README.md").write_text("# x\n\n<!-- results:paper.yaml:paper -->\nstale\n<!-- /results -->\n")
    assert readme.main([str(root / "README.md")]) == 0
    assert readme.main([str(root / "README.md"), "--check"]) == 0
    assert "| a missing | paper value of a missing | not measured yet |" in (root / "README.md").read_text()
    write_export(root, "moe", EXPORTS["better"])
    assert readme.main([str(root / "README.md"), "--check"]) == 1  # the table no longer says what the exports say
    readme.main([str(root / "README.md")])
    assert table_rows((root / "README.md").read_text().split("-->\n", 1)[1])["a missing"][3].startswith("better (")


def test_test_metric_rows_pair_within_one_protocol(tmp_path: Path):
    acc = {("pre", 1): 0.80, ("pre", 2): 0.81, ("pre", 3): 0.79, ("siamese", 1): 0.82, ("siamese", 2): 0.84,
           ("siamese", 3): 0.81}  # fmt: skip
    write_export(tmp_path, "vit", acc, metric="test/acc1")
    write_paper(tmp_path, [row("vit", export="docs/results/vit", better="higher", compare=[{"scheme": "siamese"}])])
    (measured, verdict) = table_rows(paper.render(tmp_path, "paper.yaml"))["vit"][1::2]
    p = paired_t_p([0.02, 0.03, 0.02])
    assert measured.startswith("`test/acc1`, siamese 0.823") and p_text(p) in measured
    assert p < 0.05 and verdict == f"better (Dunnett, block model: {p_text(p)}, n = 3)"  # higher accuracy
    summary = tmp_path / "docs/results/vit/siamese-s2/summary.json"
    data = json.loads(summary.read_text())
    summary.write_text(json.dumps({**data, "test_protocol": {"samples": 1000}}))  # one run measured otherwise
    assert table_rows(paper.render(tmp_path, "paper.yaml"))["vit"][3].startswith("not comparable")


def test_a_sampled_metric_says_whether_samples_or_seeds_dominate(root: Path):
    spread = root / "spread.csv"
    # every run's metric has a sampling std of 0.1: each paired difference has a sampling variance of 0.02,
    # against the observed paired variance 0.15^2 = 0.0225: 89 %, so the sample count dominates
    spread.write_text("run,std\n" + "".join(f"{s}-s{i},0.1\n" for s in ("pre", "siamese") for i in (1, 2, 3)))
    write_paper(root, [row("sampled", export="docs/results/mixed", better="lower", compare=[{"scheme": "siamese"}],
                           sampling="spread.csv")])  # fmt: skip
    measured = table_rows(paper.render(root, "paper.yaml"))["sampled"][1]
    assert measured.endswith("; SD of Δ from the sample count alone 0.14 of 0.15 (89 % of its variance): the sample "
                             "count dominates")  # fmt: skip
    spread.write_text("run,std\n" + "".join(f"{s}-s{i},0.05\n" for s in ("pre", "siamese") for i in (1, 2, 3)))
    measured = table_rows(paper.render(root, "paper.yaml"))["sampled"][1]  # 0.005 / 0.0225 = 22 %
    assert measured.endswith("alone 0.071 of 0.15 (22 % of its variance): the seeds dominate")
    spread.write_text("run,std\npre-s1,0.1\n")  # a run without its spread: nothing claimed
    assert "sample count" not in table_rows(paper.render(root, "paper.yaml"))["sampled"][1]


def test_overhead_rows_from_the_presets_and_a_bench_export(tmp_path: Path):
    bench = tmp_path / "bench.csv"
    with bench.open("w", newline="") as f:
        writer = csv.DictWriter(f, BENCH_FIELDS)
        writer.writeheader()
        for values in (
            ["moe", "small", "schemes", "pre", "pre", 1, 1, 1, 90, 110],  # step time 100 ms, quartiles 90-110
            ["moe", "small", "schemes", "siamese", "pre", 1.25, 1.01, 1.0, 115, 135],  # 125 ms: apart from pre's
            ["moe", "small", "schemes", "siamese_hybrid", "pre", 1.02, 1.03, 1.0, 95, 115],  # 102 ms: overlapping
        ):
            writer.writerow(dict(zip(BENCH_FIELDS, values, strict=True)))
    write_paper(tmp_path, [
        row("params", params=["lm-tiny"]),
        row("throughput", bench="bench.csv", measure="throughput"),
        row("memory", bench="bench.csv", measure="activation_memory"),
        row("no bench yet", bench="missing.csv", measure="throughput"),
    ])  # fmt: skip
    rows = table_rows(paper.render(tmp_path, "paper.yaml"))
    extra = (4 * 4 + 2) * 128  # SiameseNorm adds 4L + 2 RMSNorm weights of width D to the 4 x d128 LM
    assert "lm-tiny: +" in rows["params"][1] and f"({extra:,} of " in rows["params"][1]
    assert rows["params"][3] == "does not"  # 0.2 % of a 1.1 M-parameter model: above the paper's 0.1 %
    # 1 / 1.25 - 1 = -20 % throughput with quartiles apart: does not; 1 / 1.02 - 1 = -2.0 % within the noise
    assert rows["throughput"][1:] == [
        "moe/small siamese vs pre: -20.0 %<br>moe/small siamese_hybrid vs pre: -2.0 %",
        "`sweep throughput`",
        "siamese: does not<br>siamese_hybrid: inconclusive (step-time quartiles overlap)",
    ]
    # activation bytes do not depend on the load: +1 % is within the paper's +2 %, +3 % is not
    assert rows["memory"][1] == "moe/small siamese vs pre: +1.0 %<br>moe/small siamese_hybrid vs pre: +3.0 %"
    assert rows["memory"][3] == "siamese: holds<br>siamese_hybrid: does not"
    assert rows["no bench yet"][3] == "not measured yet"


def test_a_bad_paper_file_is_one_line(tmp_path: Path):
    write_paper(tmp_path, [row("two ways", export="x", compare=[{"scheme": "s"}], params=["lm-tiny"], better="lower")])
    with pytest.raises(SuiteError, match=r"row 1 \(two ways\): has \['compare', 'params'\] .* valid: exactly one"):
        paper.render(tmp_path, "paper.yaml")
    write_paper(tmp_path, [row("direction", export="x", compare=[{"scheme": "s"}], better="smaller")])
    with pytest.raises(SuiteError, match="better='smaller'; valid: lower, higher"):
        paper.render(tmp_path, "paper.yaml")


def test_the_shipped_paper_file_names_every_claim():
    data = paper.load_paper(Path(__file__).resolve().parents[2] / "docs" / "results" / "paper.yaml")
    claims = " ".join(r["claim"] for r in data["rows"])
    for words in ("Table 1", "Downstream", "Table 2", "Table 3", "MoE", "DeiT", "DiT", "parameters", "throughput"):
        assert words in claims
    assert data["overhead"] == {"setting": "15B MoE on GPUs", "parameters": 0.001, "throughput": -0.005,
                                "activation_memory": 0.02}  # fmt: skip
