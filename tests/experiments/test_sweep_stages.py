"""``stages: [3, 5, 8]``: seeds added look by look to the undecided cells only, each look read at its Lan-DeMets
O'Brien-Fleming level; stand-in runs with known losses (real runs are proven in test_sweep.py)."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import pytest
import yaml

from experiments.__main__ import main as suite_main
from experiments.results.verdicts import clear_caches
from experiments.sweeps import sweep
from tests.experiments.test_sweep_protocol import quiet_plots  # noqa: F401 - the fixture
from tests.experiments.test_sweep_spec import one_line_error, write_spec

ROOT = Path(__file__).resolve().parents[2]
SEEDS = list(range(8))
NOISE = [0.003, -0.004, 0.001, -0.002, 0.004, -0.001, 0.002, -0.003]
SHIFT = {"pre": 0.0, "siamese": -0.5, "hybrid": 0.016, "post": 0.0}  # vs pre: much better, a little worse, same


def value(scheme: str, seed: int) -> float:
    rotate = {"pre": 0, "siamese": 3, "hybrid": 5, "post": 6}[scheme]  # each cell its own noise, the same spread
    return 2.0 + SHIFT[scheme] + NOISE[(seed + rotate) % 8]


def fake_fit(calls: list[list[str]]):
    def call(self, argv: list[str], **kwargs) -> int:
        calls.append(argv)
        opts = dict(a[2:].split("=", 1) for a in argv if a.startswith("--") and "=" in a)
        scheme = Path(argv[argv.index("-c", argv.index("-c") + 1) + 1]).stem
        v = value(scheme, int(opts["seed_everything"]))
        run_dir = Path(opts["runs_root"]) / "lm" / opts["experiment"] / opts["run_name"]
        run_dir.mkdir(parents=True, exist_ok=True)
        summary = {"scheme": scheme, "status": "finished", "steps": 10, "final_val": {"val/loss": v},
                   "baseline_loss": 3.0, "val_curve": [[10, {"val/loss": v}]]}  # fmt: skip
        (run_dir / "summary.json").write_text(json.dumps(summary))
        return 0

    return call


def seeds_of(calls: list[list[str]], scheme: str) -> list[int]:
    return [int(a.split("=")[1]) for argv in calls if f"configs/norm/{scheme}.yaml" in argv
            for a in argv if a.startswith("--seed_everything=")]  # fmt: skip


def test_only_undecided_cells_get_more_seeds_at_each_looks_level(tmp_path, monkeypatch, capsys, quiet_plots):  # noqa: F811
    monkeypatch.chdir(ROOT)
    clear_caches()
    calls: list[list[str]] = []
    monkeypatch.setattr(sweep.Children, "call", fake_fit(calls))
    path = write_spec(tmp_path, schemes=["pre", "siamese", "hybrid", "post"], baseline="pre", seeds=SEEDS,
                      stages=[3, 5, 8])  # fmt: skip
    assert suite_main(["sweep", str(path)]) in (0, None)
    out = capsys.readouterr().out
    sweep_dir = tmp_path / "runs/lm/s"
    record = yaml.safe_load((sweep_dir / "stages.yaml").read_text())
    looks = record["looks"]
    # Look 1's level is the spending function itself at t = 3/8: 2 - 2 Phi(1.95996 / sqrt(3/8)), by hand here.
    first = math.erfc(1.959963984540054 / math.sqrt(3 / 8) / math.sqrt(2))
    assert looks[0]["nominal_difference"] == pytest.approx(first, rel=1e-6) and looks[0]["alpha_spent"] == (
        pytest.approx(first, rel=1e-6))  # fmt: skip
    assert [look["fraction"] for look in looks] == [3 / 8, 5 / 8, 1.0][: len(looks)]
    words = {cell: v["word"] for cell, v in looks[0]["verdicts"].items()}
    assert words == {"siamese": "better", "post": "equivalent", "hybrid": "undecided"}
    p_hybrid = looks[0]["verdicts"]["hybrid"]["p"]
    assert looks[0]["nominal_difference"] < p_hybrid < 0.05  # a fixed-sample reading would have stopped it here
    assert looks[0]["continue"] == ["hybrid", "pre"]  # the baseline of its slice too: the seeds are paired blocks
    # siamese and post stopped at 3 seeds; hybrid and pre went on to the look that decided hybrid.
    assert seeds_of(calls, "siamese") == seeds_of(calls, "post") == [0, 1, 2]
    last = looks[-1]
    assert seeds_of(calls, "hybrid") == seeds_of(calls, "pre") == SEEDS[: last["seeds_per_cell"]]
    assert last["verdicts"]["hybrid"]["word"] == "worse" and last["verdicts"]["hybrid"]["p"] < (
        last["nominal_difference"])  # fmt: skip
    assert record["spending"].startswith("Lan-DeMets O'Brien-Fleming") and "| look | seeds per cell |" in out
    assert sorted(yaml.safe_load((sweep_dir / "sweep.yaml").read_text())["runs"]) == sorted([
        f"{s}-s{seed}" for s in ("pre", "siamese", "hybrid", "post") for seed in SEEDS
        if seed < 3 or (s in ("pre", "hybrid") and seed < last["seeds_per_cell"])])  # fmt: skip

    # Resumed: nothing reruns and the recorded looks stand; other stages on this directory: one line, untouched.
    before = hashlib.sha256((sweep_dir / "stages.yaml").read_bytes()).hexdigest()
    n = len(calls)
    assert suite_main(["sweep", str(path)]) in (0, None)
    assert len(calls) == n and hashlib.sha256((sweep_dir / "stages.yaml").read_bytes()).hexdigest() == before
    capsys.readouterr()
    suite_main(["sweep", str(path), "--collect"])
    assert "| hybrid | worse" in capsys.readouterr().out
    other = write_spec(tmp_path, schemes=["pre", "siamese", "hybrid", "post"], baseline="pre", seeds=SEEDS,
                       stages=[4, 8])  # fmt: skip
    line = one_line_error(other, capsys=capsys)
    assert "stages.yaml recorded its looks under another stages" in line
    assert hashlib.sha256((sweep_dir / "stages.yaml").read_bytes()).hexdigest() == before and len(calls) == n


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"seeds": SEEDS, "stages": [3, 5, 7], "baseline": "pre"}, "ends at 7 but seeds holds 8"),
        ({"seeds": SEEDS, "stages": [5, 3, 8], "baseline": "pre"}, "two or more increasing seed counts"),
        ({"seeds": SEEDS, "stages": [1, 8], "baseline": "pre"}, "stages[0]=1"),
        ({"seeds": SEEDS, "stages": [3, 8]}, "without a baseline"),
        ({"seeds": SEEDS, "stages": "3,5,8", "baseline": "pre"}, "stages='3,5,8'"),
    ],
)
def test_bad_stages_are_one_line_before_anything_runs(tmp_path, monkeypatch, capsys, keys, message):
    monkeypatch.chdir(ROOT)
    line = one_line_error(write_spec(tmp_path, schemes=["pre", "post"], **keys), capsys=capsys)
    assert message in line and "spec.yaml" in line and "valid" in line, line
    assert not (tmp_path / "runs").exists()


def test_dry_run_lists_the_first_look(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    path = write_spec(tmp_path, schemes=["pre", "post"], baseline="pre", seeds=SEEDS, stages=[3, 8])
    assert suite_main(["sweep", str(path), "--dry-run", "--no-memory"]) in (0, None)
    out = capsys.readouterr().out
    assert "grid: 6 runs" in out and "look 1 of 2 (3 seeds per cell" in out and "up to 10 more runs" in out
    assert not (tmp_path / "runs").exists()
