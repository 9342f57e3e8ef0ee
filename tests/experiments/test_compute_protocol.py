"""``protocol.compute_multiples``: the baseline's longer runs on the fresh seeds and each better scheme's
effective-compute multiplier. Runs are the stand-ins of test_sweep_protocol.py (a summary written from a known
loss table); a longer run's loss comes from CURVE, so each seed's multiplier is checked against a log-linear
interpolation worked out here by hand, and the interval against scipy's t quantile."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml
from scipy import stats as scipy_stats

from experiments.__main__ import main as suite_main
from experiments.sweeps import sweep
from tests.experiments.test_sweep_protocol import FRESH, LOSS, NOISE, fake_fit, protocol_spec, quiet_plots  # noqa: F401
from tests.experiments.test_sweep_spec import one_line_error, write_spec

ROOT = Path(__file__).resolve().parents[2]
MULTIPLES = [1.25, 1.5, 2.0]
ARGS = ["--trainer.max_steps=120", "--model.init_args.optim.warmup_steps=12"]
# The baseline (pre, picked 1e-2) on fresh seed s: its 1x loss is FRESH + s / 100 + NOISE; the longer runs lose
# these amounts below it at 1.25x, 1.5x, 2x. siamese's fresh losses (1.71, 1.72, 1.732) sit 0.154, 0.150, 0.148
# below pre's (1.864, 1.87, 1.88): seed 1 between 1.25x and 1.5x, seeds 2 and 3 between 1.5x and 2x.
DROP = {1: (0.06, 0.16, 0.25), 2: (0.05, 0.12, 0.20), 3: (0.10, 0.14, 0.30)}
# What the code before compute_multiples wrote for protocol_spec() with ARGS (run on that code, git b7243ec):
# tuning.yaml, and sweep.yaml's runs, grid and protocol (yaml.safe_dump of those three keys; the rest of it is the
# spec's other fields, which the option does not touch and a later field may extend).
OLD_TUNING_SHA = "9b1a8f40fb2781f140be59104e2393bf3158a0be6bd1cc2e8f945a43e614c7cf"
OLD_RECORD_SHA = "04361d2f78ebedde409d4d9d4744bd383d2dc4b4d61948af8c73a96c5e4f7e23"


def fresh_loss(scheme: str, seed: int) -> float:
    return FRESH[scheme] + seed / 100 + NOISE.get((scheme, seed), 0)


def fit_with_curves(calls: list[list[str]]):
    """fake_fit, and for a longer run (``-x<m>``) the baseline's loss at that multiple from DROP."""
    fit = fake_fit(calls, LOSS)

    def call(self, argv: list[str], **kwargs) -> int:
        opts = dict(a[2:].split("=", 1) for a in argv if a.startswith("--") and "=" in a)  # the last one wins
        if "-x" not in opts["run_name"]:
            return fit(self, argv, **kwargs)
        calls.append(argv)
        seed, steps = int(opts["seed_everything"]), int(opts["trainer.max_steps"])
        value = fresh_loss("pre", seed) - DROP[seed][[150, 180, 240].index(steps)]
        run_dir = Path(opts["runs_root"]) / "lm" / opts["experiment"] / opts["run_name"]
        run_dir.mkdir(parents=True, exist_ok=True)
        summary = {"scheme": "pre", "lr": float(opts["model.init_args.optim.lr"]), "status": "finished",
                   "steps": steps, "final_val": {"val/loss": value}, "baseline_loss": 3.0,
                   "train_curve": [[1, 5.5]], "val_curve": [[steps, {"val/loss": value}]]}  # fmt: skip
        (run_dir / "summary.json").write_text(json.dumps(summary))
        return 0

    return call


def by_hand(seed: int) -> float:
    """siamese's multiplier on ``seed``: log-linear between the two multiples whose losses bracket its loss."""
    base, loss = fresh_loss("pre", seed), fresh_loss("siamese", seed)
    curve = dict(zip([1.0, *MULTIPLES], [base, *(base - d for d in DROP[seed])], strict=True))
    lo, hi = (1.25, 1.5) if seed == 1 else (1.5, 2.0)
    assert curve[lo] >= loss >= curve[hi]
    fraction = (curve[lo] - loss) / (curve[lo] - curve[hi])
    return lo * (hi / lo) ** fraction  # exp(log lo + fraction * (log hi - log lo))


def run_sweep(tmp_path: Path, monkeypatch, **protocol) -> tuple[list[list[str]], Path, Path]:
    monkeypatch.chdir(ROOT)
    calls: list[list[str]] = []
    monkeypatch.setattr(sweep.Children, "call", fit_with_curves(calls))
    path = protocol_spec(tmp_path, **protocol)
    spec = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**spec, "args": ARGS}))
    assert suite_main(["sweep", str(path)]) in (0, None)
    return calls, path, tmp_path / "runs/lm/s"


def _name(argv: list[str]) -> str:
    return next(a for a in argv if a.startswith("--run_name=")).split("=", 1)[1]


@pytest.mark.usefixtures("quiet_plots")
def test_longer_baseline_runs_and_each_better_schemes_multiplier(tmp_path, monkeypatch, capsys):
    calls, path, sweep_dir = run_sweep(tmp_path, monkeypatch, compute_multiples=MULTIPLES)
    out = capsys.readouterr().out
    # The tuning and fresh runs as without the option, then only the baseline at its picked rate (1e-2), per fresh
    # seed, per multiple: m x 120 steps, warmup m x 12, given last so they win over the spec's args.
    longer = calls[27:]
    assert [_name(a) for a in longer] == [f"pre-lr0.01-s{s}-x{m:g}" for s in (1, 2, 3) for m in MULTIPLES]
    for argv, (seed, m) in zip(longer, [(s, m) for s in (1, 2, 3) for m in MULTIPLES], strict=True):
        assert argv[-2:] == [
            f"--trainer.max_steps={round(120 * m)}",
            f"--model.init_args.optim.warmup_steps={round(12 * m)}",
        ]
        assert f"--seed_everything={seed}" in argv and "--model.init_args.optim.lr=0.01" in argv
        assert "configs/norm/pre.yaml" in " ".join(argv)
    assert yaml.safe_load((sweep_dir / "sweep.yaml").read_text())["runs"] == [
        f"{s}-lr{lr}-s{seed}"
        for s, lr in (("pre", "0.01"), ("post", "0.001"), ("siamese", "0.01"))
        for seed in (1, 2, 3)
    ]  # the comparison reads the fresh runs only

    record = yaml.safe_load((sweep_dir / "compute.yaml").read_text())
    siamese = record["groups"]["siamese"]
    assert siamese["verdict"] == "better" and siamese["n"] == 3
    expected = [by_hand(seed) for seed in (1, 2, 3)]
    assert [s["multiplier"] for s in siamese["seeds"]] == pytest.approx(expected, rel=1e-12)
    assert expected == pytest.approx([1.4837, 1.6709, 1.5217], abs=1e-4)
    logs = np.log(expected)
    half = scipy_stats.t.ppf(0.975, df=2) * logs.std(ddof=1) / math.sqrt(3)
    assert (siamese["multiplier"], siamese["low"], siamese["high"]) == pytest.approx(
        (math.exp(logs.mean()), math.exp(logs.mean() - half), math.exp(logs.mean() + half)), rel=1e-12
    )
    # post is worse than pre: no number, and the table says why.
    assert record["groups"]["post"]["multiplier"] is None and record["groups"]["post"]["verdict"] == "worse"
    assert record["groups"]["post"]["note"] == "no better than pre (worse): no multiplier"
    table = (sweep_dir / "compute.md").read_text()
    assert f"| siamese | better | {siamese['multiplier']:.3g}x |" in table and table in out
    assert "| post | worse | no better than pre (worse): no multiplier |" in table

    # Resumed: nothing reruns; a longer run gone makes its seed and siamese's interval pending, in --status too.
    assert suite_main(["sweep", str(path)]) in (0, None) and len(calls) == 36
    (sweep_dir / "pre-lr0.01-s2-x1.5" / "summary.json").unlink()
    capsys.readouterr()
    suite_main(["sweep", str(path), "--status"])
    status = capsys.readouterr().out
    assert "36 runs" in status and "pre-lr0.01-s2-x1.5" in status
    siamese = yaml.safe_load((sweep_dir / "compute.yaml").read_text())["groups"]["siamese"]
    assert siamese["multiplier"] is None and siamese["low"] is None and siamese["note"].startswith("pending")
    assert [s["multiplier"] is None for s in siamese["seeds"]] == [False, True, False]
    assert siamese["seeds"][1]["note"] == "pending: pre-lr0.01-s2-x1.5 not started"
    assert "| siamese | better | pending: pending: pre-lr0.01-s2-x1.5 not started |" in status
    suite_main(["sweep", str(path), "--collect"])  # --collect prints (and rewrites) it too
    assert "| siamese | better | pending: pending: pre-lr0.01-s2-x1.5 not started |" in capsys.readouterr().out
    assert len(calls) == 36


@pytest.mark.usefixtures("quiet_plots")
def test_a_protocol_without_the_option_runs_and_records_what_it_did(tmp_path, monkeypatch):
    """The same runs in the same order, byte for byte the tuning.yaml, and the runs, grid and protocol of sweep.yaml
    the code before the option wrote (their sha256 hard-coded); nothing about compute written."""
    calls, path, sweep_dir = run_sweep(tmp_path, monkeypatch)
    tuning = [f"{s}-lr{lr}-s{seed}" for s in FRESH for lr in ("0.001", "0.01", "0.1") for seed in (10, 11)]
    fresh = [f"{s}-lr{lr}-s{seed}" for s, lr in (("pre", "0.01"), ("post", "0.001"), ("siamese", "0.01"))
             for seed in (1, 2, 3)]  # fmt: skip
    assert [_name(a) for a in calls] == tuning + fresh and not (sweep_dir / "compute.yaml").exists()
    assert hashlib.sha256((sweep_dir / "tuning.yaml").read_bytes()).hexdigest() == OLD_TUNING_SHA
    record = yaml.safe_load((sweep_dir / "sweep.yaml").read_text())
    kept = yaml.safe_dump({key: record[key] for key in ("runs", "grid", "protocol")})
    assert hashlib.sha256(kept.encode()).hexdigest() == OLD_RECORD_SHA


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (1.25, "protocol.compute_multiples=1.25"),
        ([], "protocol.compute_multiples=[]"),
        ([1.0, 1.5], "protocol.compute_multiples[0]=1.0"),
        ([1.5, 1.25], "protocol.compute_multiples=[1.5, 1.25]"),
        ([125], "protocol.compute_multiples[0]=125"),
        (["abc"], "protocol.compute_multiples[0]='abc' is not a finite number"),
        ([1.5, 1.5000001], "protocol.compute_multiples=[1.5, 1.5000001]"),
    ],
)
def test_bad_multiples_are_one_line_before_anything_runs(tmp_path, monkeypatch, capsys, value, message):
    monkeypatch.chdir(ROOT)
    line = one_line_error(protocol_spec(tmp_path, compute_multiples=value), capsys=capsys)
    assert message in line and "spec.yaml" in line and "valid:" in line, line
    assert not (tmp_path / "runs").exists()


def test_multiples_need_a_baseline_and_a_budget_in_steps(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    protocol = {"kind": "tune_then_compare", "lrs": [1e-3, 1e-2], "tuning_seeds": [10], "fresh_seeds": [1, 2],
                "compute_multiples": [2.0]}  # fmt: skip
    line = one_line_error(write_spec(tmp_path, schemes=["pre", "post"], protocol=protocol), capsys=capsys)
    assert "without a baseline" in line and "valid:" in line
    path = write_spec(tmp_path, schemes=["pre", "post"], baseline="pre", protocol=protocol,
                      args=["--trainer.max_steps=-1", "--trainer.max_epochs=2"])  # fmt: skip
    for extra in ((), ("--dry-run", "--no-memory")):
        line = one_line_error(path, *extra, capsys=capsys)
        assert "resolves trainer.max_steps=-1; valid: a budget in optimizer steps" in line, line
    assert not (tmp_path / "runs").exists()


def test_dry_run_lists_the_longer_runs_and_their_cost(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    path = protocol_spec(tmp_path, compute_multiples=MULTIPLES)
    spec = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**spec, "args": ARGS}))
    assert suite_main(["sweep", str(path), "--dry-run", "--no-memory"]) in (0, None)
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if "longer runs" in x)
    assert "then: 9 longer runs of the baseline pre" in line and "150 (x1.25, warmup 15)" in line
    assert "240 (x2, warmup 24)" in line and "pre-lr<picked>-s1-x1.25" in line and "FLOPs" in line
    flops = float(line.rsplit(": ", 1)[1].split(" FLOPs")[0])
    tuning = float(next(x for x in out.splitlines() if "grid: 18 runs" in x).split(", ")[1].split(" ")[0])
    assert flops == pytest.approx(tuning / 18 * 3 * (1.25 + 1.5 + 2.0), rel=1e-2)  # 3 seeds, 4.75 budgets each
