"""``protocol: tune_then_compare``: each scheme tuned over a rate grid on tuning seeds, compared at its own best rate
on fresh seeds. Runs are stand-ins (a summary written from a known loss table) so the picks, the sensitivity and
what is compared can be checked against values computed here by hand; real runs are proven in test_sweep.py."""

from __future__ import annotations

import hashlib
import json
import statistics
from pathlib import Path

import pytest
import yaml

from experiments.__main__ import main as suite_main
from experiments.sweeps import sweep
from tests.experiments.test_sweep_spec import one_line_error, write_spec

ROOT = Path(__file__).resolve().parents[2]
INITIAL = 5.5
LRS = [1e-3, 1e-2, 1e-1]
# (scheme, lr) -> final val/loss of tuning seed 10 and 11; None: diverged; > 0.9 x 3.0 (the baseline): stalled.
LOSS = {
    ("pre", 1e-3): (2.0, 2.1), ("pre", 1e-2): (1.8, 1.9), ("pre", 1e-1): (2.4, 2.3),
    ("post", 1e-3): (1.9, 1.9), ("post", 1e-2): (2.2, 2.0), ("post", 1e-1): (None, None),
    ("siamese", 1e-3): (2.2, 2.0), ("siamese", 1e-2): (1.7, 1.8), ("siamese", 1e-1): (2.9, 1.6),
}  # fmt: skip
FRESH = {"pre": 1.85, "post": 1.95, "siamese": 1.70}  # fresh seeds: this + seed / 100 + NOISE
NOISE = {("pre", 1): 0.004, ("post", 2): -0.003, ("siamese", 3): 0.002}


def fake_fit(calls: list[list[str]], losses: dict):
    """A stand-in for a run: writes the summary a fit would, with the loss the tables above give it."""

    def call(self, argv: list[str], **kwargs) -> int:
        calls.append(argv)
        opts = dict(a[2:].split("=", 1) for a in argv if a.startswith("--") and "=" in a)
        scheme = Path(argv[argv.index("-c", argv.index("-c") + 1) + 1]).stem
        lr, seed = float(opts["model.init_args.optim.lr"]), int(opts["seed_everything"])
        fresh = FRESH.get(scheme, 0) + seed / 100 + NOISE.get((scheme, seed), 0)
        value = losses[(scheme, lr)][seed - 10] if seed >= 10 else fresh
        run_dir = Path(opts["runs_root"]) / "lm" / opts["experiment"] / opts["run_name"]
        run_dir.mkdir(parents=True, exist_ok=True)
        val = {} if value is None else {"val/loss": value}
        summary = {"scheme": scheme, "lr": lr, "status": "diverged" if value is None else "finished", "steps": 10,
                   "final_val": val, "baseline_loss": 3.0, "train_curve": [[1, INITIAL]],
                   "val_curve": [[10, val]] if val else []}  # fmt: skip
        (run_dir / "summary.json").write_text(json.dumps(summary))
        return 0

    return call


def protocol_spec(tmp_path: Path, **protocol) -> Path:
    return write_spec(
        tmp_path,
        schemes=["pre", "post", "siamese"],
        baseline="pre",
        protocol={
            "kind": "tune_then_compare",
            "lrs": LRS,
            "tuning_seeds": [10, 11],
            "fresh_seeds": [1, 2, 3],
            **protocol,
        },  # fmt: skip
    )


@pytest.fixture
def quiet_plots(monkeypatch):
    from experiments.results import compare as compare_module

    for name in ("plot_curves", "plot_stability", "plot_metric_vs_lr"):
        monkeypatch.setattr(compare_module.plots, name, lambda *args, **kwargs: False)
    monkeypatch.setattr(compare_module, "plot_depth_profiles", lambda *args, **kwargs: False)


def reference(scheme: str) -> tuple[float, float, float | None]:
    """(picked lr, Wortsman sensitivity, largest stable lr) by hand: a diverged or stalled seed counts as INITIAL."""
    capped = {}
    for lr in LRS:
        seeds = [INITIAL if v is None or v > 0.9 * 3.0 else min(v, INITIAL) for v in LOSS[(scheme, lr)]]
        capped[lr] = statistics.fmean(seeds)
    stable = [lr for lr in LRS if all(v is not None and v <= 0.9 * 3.0 for v in LOSS[(scheme, lr)])]
    best = min(capped, key=capped.get)
    return best, statistics.fmean(capped.values()) - capped[best], max(stable) if stable else None


def test_each_scheme_is_compared_at_its_own_best_rate_on_fresh_seeds(tmp_path, monkeypatch, capsys, quiet_plots):
    monkeypatch.chdir(ROOT)
    calls: list[list[str]] = []
    monkeypatch.setattr(sweep.Children, "call", fake_fit(calls, LOSS))
    path = protocol_spec(tmp_path)
    assert suite_main(["sweep", str(path)]) in (0, None)
    out = capsys.readouterr().out
    sweep_dir = tmp_path / "runs/lm/s"
    tuning = yaml.safe_load((sweep_dir / "tuning.yaml").read_text())
    # siamese's 1e-1: one seed stalls (2.9 > 2.7), the other is the lowest loss of all (1.6): capped mean 3.55
    assert {g: reference(g) for g in FRESH} == {"pre": (1e-2, pytest.approx(0.7 / 3), 1e-1),
                                                "post": (1e-3, pytest.approx(3.8 / 3), 1e-2),
                                                "siamese": (1e-2, pytest.approx(2.15 / 3), 1e-2)}  # fmt: skip
    for scheme in FRESH:
        best, sensitivity, stable = reference(scheme)
        entry = tuning["groups"][scheme]
        assert entry["picked_lr"] == best and entry["largest_stable_lr"] == stable and entry["tuning_runs"] == 6
        assert entry["sensitivity"] == pytest.approx(sensitivity, abs=1e-12)
    # Equal tuning budget: every scheme ran every rate on both tuning seeds; then only its picked rate, fresh seeds.
    ran = [(Path(a[a.index("-c", a.index("-c") + 1) + 1]).stem, a[-1]) for a in calls]
    assert len(calls) == 9 * 2 + 3 * 3
    fresh = [a for a in calls if "--seed_everything=1" in a or "--seed_everything=2" in a or "--seed_everything=3" in a]
    assert len(fresh) == 9 and all(f"--model.init_args.optim.lr={reference(s)[0]}" in a for (s, _), a in
                                   zip(ran[18:], fresh, strict=True))  # fmt: skip
    record = yaml.safe_load((sweep_dir / "sweep.yaml").read_text())
    assert record["runs"] == [f"{s}-lr{reference(s)[0]:g}-s{seed}" for s in FRESH for seed in (1, 2, 3)]
    table = (sweep_dir / "comparison.md").read_text()
    assert "-s10" not in table and "-s11" not in table  # the tuning seeds never count in the claim
    cells = (sweep_dir / "comparison_cells.csv").read_text()
    verdicts = {line.split(",")[0]: line.split(",")[11] for line in cells.splitlines()[1:]}
    assert verdicts == {"pre": "", "post": "worse", "siamese": "better"}  # one slice: each at its own rate
    assert "| siamese | 0.01 | 0.7167 | 0.01 | 6 |" in out and "LR sensitivity" in out

    # Resumed: nothing reruns, and the picks stand even when a tuning summary changes afterwards.
    pre_best = sweep_dir / "pre-lr0.001-s10" / "summary.json"
    summary = json.loads(pre_best.read_text())
    pre_best.write_text(json.dumps(summary | {"final_val": {"val/loss": 0.5}}))
    before = hashlib.sha256((sweep_dir / "tuning.yaml").read_bytes()).hexdigest()
    assert suite_main(["sweep", str(path)]) in (0, None)
    assert len(calls) == 27 and hashlib.sha256((sweep_dir / "tuning.yaml").read_bytes()).hexdigest() == before
    assert "already done" in capsys.readouterr().out

    # --status lists tuning and fresh runs; another protocol on this directory is refused before anything runs.
    suite_main(["sweep", str(path), "--status"])
    status = capsys.readouterr().out
    assert "27 runs" in status and status.count("-s10 ") == 9 and status.count("-s1 ") == 3
    other = protocol_spec(tmp_path, lrs=[1e-3, 1e-2])
    line = one_line_error(other, capsys=capsys)
    assert "tuning.yaml picked its rates under another lrs" in line and "valid:" in line
    assert hashlib.sha256((sweep_dir / "tuning.yaml").read_bytes()).hexdigest() == before and len(calls) == 27


def test_no_rate_is_picked_until_every_tuning_run_has_ended(tmp_path, monkeypatch, capsys, quiet_plots):
    monkeypatch.chdir(ROOT)
    calls: list[list[str]] = []
    fit = fake_fit(calls, LOSS)

    def crash_once(self, argv, **kwargs):
        if "--run_name=post-lr0.01-s11" in argv and not any("--run_name=post-lr0.01-s11" in a for a in calls):
            calls.append(argv)
            return 1
        return fit(self, argv, **kwargs)

    monkeypatch.setattr(sweep.Children, "call", crash_once)
    path = protocol_spec(tmp_path)
    with pytest.raises(SystemExit) as exc:
        suite_main(["sweep", str(path)])
    assert exc.value.code == 1
    assert "no rate is picked until they have" in capsys.readouterr().out
    sweep_dir = tmp_path / "runs/lm/s"
    assert not (sweep_dir / "tuning.yaml").exists() and len(calls) == 18  # no fresh run started
    assert yaml.safe_load((sweep_dir / "sweep.yaml").read_text())["runs"] == []
    assert suite_main(["sweep", str(path)]) in (0, None)  # the crashed run reruns, then picks and fresh runs
    assert len(calls) == 18 + 1 + 9 and (sweep_dir / "tuning.yaml").exists()


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"protocol": {"kind": "tune", "lrs": LRS, "tuning_seeds": [1], "fresh_seeds": [2, 3]}},
         "protocol.kind='tune'"),
        ({"protocol": {"kind": "tune_then_compare", "lrs": [1e-3, 2e-3, 1e-1], "tuning_seeds": [1],
                       "fresh_seeds": [2, 3]}}, "is not log-spaced"),
        ({"protocol": {"kind": "tune_then_compare", "lrs": LRS, "tuning_seeds": [1, 2], "fresh_seeds": [2, 3]}},
         "protocol.fresh_seeds share [2] with tuning_seeds"),
        ({"protocol": {"kind": "tune_then_compare", "lrs": LRS, "tuning_seeds": [1], "fresh_seeds": [2]}},
         "fresh_seeds=[2]"),
        ({"lrs": [1e-3], "protocol": {"kind": "tune_then_compare", "lrs": LRS, "tuning_seeds": [1],
                                      "fresh_seeds": [2, 3]}}, "lrs=[0.001] beside protocol"),
        ({"metric": "test/acc1", "protocol": {"kind": "tune_then_compare", "lrs": LRS, "tuning_seeds": [1],
                                              "fresh_seeds": [2, 3]}}, "metric='test/acc1' with protocol"),
        ({"protocol": {"kind": "tune_then_compare", "lrs": LRS, "tuning_seeds": [1], "fresh_seeds": [2, 3],
                       "budget": 3}}, "unknown protocol keys ['budget']"),
        ({"protocol": {"kind": "tune_then_compare", "lrs": "1e-3", "tuning_seeds": [1], "fresh_seeds": [2, 3]}},
         "lrs='1e-3'"),
    ],
)  # fmt: skip
def test_bad_protocols_are_one_line_before_anything_runs(tmp_path, monkeypatch, capsys, keys, message):
    monkeypatch.chdir(ROOT)
    line = one_line_error(write_spec(tmp_path, **keys), capsys=capsys)
    assert message in line and "spec.yaml" in line and "valid:" in line, line
    assert not (tmp_path / "runs").exists()


def test_the_shipped_lr_robustness_sweep(tmp_path, monkeypatch, capsys):
    """Loaded and planned, never run here (hours of CPU): 6 schemes x >= 6 log-spaced rates from 1e-3 to 1e-1, then
    the fresh seeds and the baseline's longer runs. Planned into an empty runs root: a sweep of it already on this
    machine (runs/lm/lr-robustness, with its picks) would plan its fresh and longer runs as known rows."""
    monkeypatch.chdir(ROOT)
    spec = sweep.SweepSpec.load("configs/sweeps/lr-robustness.yaml")
    assert spec.schemes == ["pre", "post", "deepnorm", "hybrid", "siamese", "siamese_hybrid"]
    lrs = spec.protocol["lrs"]
    assert len(lrs) >= 6 and lrs[0] == 1e-3 and lrs[-1] == 1e-1 and spec.baseline == "pre"
    shipped = yaml.safe_load((ROOT / "configs/sweeps/lr-robustness.yaml").read_text())
    copy = tmp_path / "lr-robustness.yaml"
    copy.write_text(yaml.safe_dump({**shipped, "runs_root": str(tmp_path / "runs")}))
    assert suite_main(["sweep", str(copy), "--dry-run", "--no-memory"]) in (0, None)
    out = capsys.readouterr().out
    tuning, fresh = 6 * len(lrs) * len(spec.protocol["tuning_seeds"]), len(spec.protocol["fresh_seeds"])
    assert f"grid: {tuning} runs" in out and f"then: {6 * fresh} fresh runs" in out, out
    assert f"then: {3 * fresh} longer runs of the baseline pre" in out, out  # compute_multiples: 1.25, 1.5, 2
    assert not (tmp_path / "runs").exists()
