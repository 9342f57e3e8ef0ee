"""Divergence / spike detection, and the sweep: skip what is done, resume what was stopped, compare."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from statistics import median
from types import SimpleNamespace

import pytest
import torch
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.custom_scalar import layout_pb2, metadata

from experiments.cli import main as cli_main
from experiments.monitoring.divergence import DivergenceDetector
from experiments.monitoring.records import RUN_MARKER
from experiments.results.tb_layout import LAYOUT_SUFFIX, comparison_url
from experiments.sweeps import progress as sweep_progress
from experiments.sweeps import sweep
from tests.experiments.in_process import call_in_process
from tests.experiments.tiny import tiny_lm

ROOT = Path(__file__).resolve().parents[2]
TINY = [*tiny_lm(), "--divergence.max_loss=50"]  # ln(256) = 5.5 at init: 50 only when the run has blown up


##################################################################################
#                               Divergence detector                              #
##################################################################################


def feed(detector: DivergenceDetector, losses: list[float]) -> SimpleNamespace:
    """Calls the callback as Lightning does after each optimizer step; stops where the trainer would."""
    trainer = SimpleNamespace(global_step=0, should_stop=False)
    module = SimpleNamespace(log=lambda *a, **k: None)
    for loss in losses:
        trainer.global_step += 1
        detector.on_train_batch_end(trainer, module, {"loss": torch.tensor(loss)}, None, 0)
        if trainer.should_stop:
            break
    return trainer


def test_spikes_and_divergence_on_a_synthetic_loss_sequence():
    losses = [3.0, 2.9, 2.8, 2.7, 2.6, 4.5, 2.5, 2.45, 3.9, 2.4, 2.35, 10.5, 2.3]
    detector = DivergenceDetector(window=4, spike_factor=1.5, diverge_factor=4.0, min_steps=3)
    trainer = feed(detector, losses)
    # Reference: running median of the last 4 accepted losses (once 3 exist); spike > 1.5x, divergence > 4x.
    history, spikes, diverged = [], 0, None
    for step, loss in enumerate(losses, start=1):
        ref = median(history[-4:]) if len(history) >= 3 else None
        if ref is not None and loss > 4.0 * ref:
            diverged = step
            break
        spikes += ref is not None and loss > 1.5 * ref
        history.append(loss)
    assert (spikes, diverged) == (2, 12)  # 4.5 > 1.5 x 2.75 and 3.9 > 1.5 x 2.55 spike; 10.5 > 4 x 2.425
    assert (detector.spikes, detector.diverged_at, trainer.should_stop) == (spikes, diverged, True)
    assert trainer.global_step == 12  # stopped at the divergence, the last loss never seen


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 60.0])
def test_non_finite_or_above_max_loss_diverges_at_once(bad: float):
    detector = DivergenceDetector(max_loss=50.0, min_steps=20)
    feed(detector, [5.5, 5.4, bad, 5.3])
    assert detector.diverged_at == 3 and detector.spikes == 0


def test_exploding_run_stops_and_is_recorded_as_diverged(tmp_path: Path):
    cli_main(
        ["fit", "-c", str(ROOT / "configs/lm/tiny.yaml"), f"--runs_root={tmp_path}",
         f"--data.init_args.data_dir={tmp_path / 'data'}", "--model.init_args.optim.lr=1000",
         "--model.init_args.optim.warmup_steps=0", "--trainer.max_steps=20", "--trainer.val_check_interval=10", *TINY]
    )  # fmt: skip
    summary = json.loads((tmp_path / "lm/tiny/pre/summary.json").read_text())
    assert summary["status"] == "diverged"
    assert 1 <= summary["diverged_at"] == summary["steps"] < 20  # stopped right there, not at max_steps


##################################################################################
#                                     Sweep                                      #
##################################################################################


def layout_of(sweep_dir: Path) -> layout_pb2.Layout:
    events = sorted(sweep_dir.glob(f"*/events.out.tfevents.*{LAYOUT_SUFFIX}"))[0]  # each run holds it
    acc = EventAccumulator(str(events))
    acc.Reload()
    (point,) = acc.Tensors(metadata.CONFIG_SUMMARY_TAG)
    return layout_pb2.Layout.FromString(point.tensor_proto.string_val[0])


def scalar_tags(run_dir: Path) -> list[str]:
    acc = EventAccumulator(str(run_dir))
    acc.Reload()
    return acc.Tags()["scalars"]


@pytest.mark.slow
def test_sweep_reruns_killed_runs_skips_done_ones_and_compares(tmp_path: Path, monkeypatch, capsys):
    """Real fits run in this process, one after the other (parallel child processes: test_sweep_cluster.py's
    process-launcher sweep and the SIGTERM test below); then what a rerun decides, with a stand-in run."""
    monkeypatch.chdir(ROOT)  # runs stack configs/norm/<scheme>.yaml relative to the repository
    monkeypatch.setattr(sweep.Children, "call", call_in_process)
    spec = {
        "name": "mini",
        "configs": [str(ROOT / "configs/lm/tiny.yaml")],
        "schemes": ["siamese"],
        "lrs": [1e-3, 1000.0],  # the second one explodes
        "args": [*TINY, f"--data.init_args.data_dir={tmp_path / 'data'}", "--trainer.max_steps=3",
                 "--trainer.val_check_interval=3", "--trainer.log_every_n_steps=1",
                 "--trainer.callbacks+=experiments.monitoring.diagnostics.Diagnostics",
                 "--trainer.callbacks.every_n_steps=1"],
        "runs_root": str(tmp_path / "runs"),
    }  # fmt: skip
    sweep_file = tmp_path / "mini.yaml"
    sweep_file.write_text(yaml.safe_dump(spec))
    sweep_dir = tmp_path / "runs" / "lm" / "mini"

    sweep.main(["sweep", str(sweep_file)])
    out = capsys.readouterr().out
    assert re.search(r"\[1/2\] siamese-lr0\.001: finished in \d+ s val/loss", out), out
    assert "[2/2] siamese-lr1000: diverged" in out, out
    assert f"then open: {comparison_url('val/loss')}" in out  # the URL that opens on the losses
    for name in ("comparison.md", "comparison.csv", "curves.png", "stability.png", "metric_vs_lr.png",
                 "depth_profiles.png"):  # fmt: skip
        assert (sweep_dir / name).stat().st_size > 100, name
    table = (sweep_dir / "comparison.md").read_text()
    assert "| siamese-lr1000 | siamese | 1000 | diverged |" in table
    record = yaml.safe_load((sweep_dir / "sweep.yaml").read_text())  # the spec as run, for the record
    assert record["runs"] == ["siamese-lr0.001", "siamese-lr1000"] and record["lrs"] == [1e-3, 1000.0]
    # Three steps learn nothing beyond byte frequencies: the finished run is stalled against the unigram baseline.
    assert "| siamese-lr0.001 | siamese | 0.001 | stalled |" in table and "Context-free baseline loss" in table

    # The custom-scalars layout: its chart regexes pick the runs' own tags, one RMS chart per block.
    charts = {c.title: list(c.multiline.tag) for cat in layout_of(sweep_dir).category for c in cat.chart}
    tags = scalar_tags(sweep_dir / "siamese-lr0.001")
    for title in ("val/loss", "train/loss", "grad norm, global (pre-clip)", "max |activation|"):
        assert any(re.match(charts[title][0], t) for t in tags), title
    picked = sorted(t for t in tags if re.match(charts["block 1"][0], t))
    assert picked == ["diag/rms/post/block_1", "diag/rms/pre/block_1"]
    assert "block 2" not in charts  # depth 2, read from the runs' config.yaml

    # An unfinished run (killed mid-way: summary says running; crashed; interrupted) resumes from its
    # newest checkpoint; without one, or with --restart, it runs again from an emptied directory. The
    # diverged one is skipped. Real runs were proven above (and resuming below): here a stand-in run.
    run_dir, calls = sweep_dir / "siamese-lr0.001", []

    def fake_run(self, argv, **kwargs) -> int:
        calls.append(argv)
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "summary.json").write_text(json.dumps({"scheme": "siamese", "lr": 1e-3, "status": "finished"}))
        return 0

    monkeypatch.setattr(sweep.Children, "call", fake_run)
    # The figures were checked above; each rerun below would draw them again (seconds of matplotlib per rerun).
    from experiments.results import compare as compare_module

    for name in ("plot_curves", "plot_stability", "plot_metric_vs_lr"):
        monkeypatch.setattr(compare_module.plots, name, lambda *args, **kwargs: False)
    monkeypatch.setattr(compare_module, "plot_depth_profiles", lambda *args, **kwargs: False)
    checkpoint = run_dir / "checkpoints" / "last.ckpt"
    assert checkpoint.exists()
    cases = [
        ("running", [], True),
        ("crashed", [], True),
        ("interrupted", [], True),
        ("interrupted", ["--restart"], False),
    ]
    for previous, flags, resumes in cases:
        if not checkpoint.exists():  # removed by the --restart case
            checkpoint.parent.mkdir(parents=True, exist_ok=True)
            checkpoint.write_bytes(b"checkpoint")
        summary = json.loads((run_dir / "summary.json").read_text())
        (run_dir / "summary.json").write_text(json.dumps(summary | {"status": previous}))
        sweep.main(["sweep", str(sweep_file), *flags])
        out = capsys.readouterr().out
        how = "resuming from its last checkpoint" if resumes else "rerunning from scratch"
        assert f"[1/2] siamese-lr0.001: previous attempt {previous}, {how}" in out, out
        assert "[1/2] siamese-lr0.001: finished in" in out, out
        assert "[2/2] siamese-lr1000: already done (diverged), skipped" in out, out
        assert ("--ckpt_path=last" in calls[-1]) == resumes and checkpoint.exists() == resumes
    (run_dir / "summary.json").write_text(json.dumps({"status": "running"}))  # killed before any checkpoint
    sweep.main(["sweep", str(sweep_file)])
    assert "previous attempt running, rerunning from scratch" in capsys.readouterr().out
    assert len(calls) == 5 and all("--model.init_args.optim.lr=0.001" in argv for argv in calls)
    assert not list(sweep_dir.glob("events.out.tfevents.*"))  # no empty run "." in TensorBoard
    assert len(list(run_dir.glob(f"events.out.tfevents.*{LAYOUT_SUFFIX}"))) == 1  # replaced, not added

    sweep.main(["sweep", str(sweep_file)])  # everything done: nothing runs
    assert capsys.readouterr().out.count("skipped") == 2 and len(calls) == 5


@pytest.mark.slow
def test_sigterm_stops_the_sweep_and_starting_it_again_resumes(tmp_path: Path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    spec = {
        "name": "stop",
        "configs": [str(ROOT / "configs/lm/tiny.yaml")],
        "schemes": ["pre"],
        "lrs": [1e-3, 2e-3],
        "args": [*TINY, f"--data.init_args.data_dir={tmp_path / 'data'}", "--trainer.max_steps=16",
                 "--trainer.val_check_interval=5", "--trainer.num_sanity_val_steps=0", "--trainer.limit_val_batches=1",
                 "--summary.log_every_n_steps=1",
                 "--trainer.callbacks+=tests.experiments.pacing.HoldForSignal",
                 f"--trainer.callbacks.ready={tmp_path / 'holding'}", "--trainer.callbacks.at_step=6"],
        "runs_root": str(tmp_path / "runs"),
    }  # fmt: skip
    sweep_file = tmp_path / "stop.yaml"
    sweep_file.write_text(yaml.safe_dump(spec))
    first, second = tmp_path / "runs/lm/stop/pre-lr0.001", tmp_path / "runs/lm/stop/pre-lr0.002"
    proc = subprocess.Popen(
        [sys.executable, "-m", "experiments", "sweep", str(sweep_file)], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 300  # a busy machine starts Python slowly
        while not (tmp_path / "holding").exists():  # the first run holds at step 6, one past its checkpoint
            assert proc.poll() is None and time.monotonic() < deadline, "the run never reached step 6"
            time.sleep(0.1)
        assert (first / "checkpoints" / "last.ckpt").exists()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 143, out
    stopped = json.loads((first / "summary.json").read_text())
    assert stopped["status"] == "interrupted" and 5 <= stopped["steps"] < 16
    assert f"[1/2] pre-lr0.001: interrupted at step {stopped['steps']}" in out, out
    assert (first / "checkpoints" / "interrupted.ckpt").exists()
    assert not second.exists() and "[2/2]" not in out  # nothing new started after the signal

    # Starting it again: the resume and the next run in this process (the process side was proven above).
    monkeypatch.setattr(sweep.Children, "call", call_in_process)
    sweep.main(["sweep", str(sweep_file)])
    out = capsys.readouterr().out
    assert "[1/2] pre-lr0.001: previous attempt interrupted, resuming from its last checkpoint" in out, out
    resumed = json.loads((first / "summary.json").read_text())
    assert resumed["status"] == "finished" and resumed["steps"] == 16
    assert [step for step, _ in resumed["train_curve"]] == list(range(1, 17))  # one curve, no gap, no repeat
    assert resumed["wall_time_s"] > stopped["wall_time_s"]  # the clock continues too
    assert json.loads((second / "summary.json").read_text())["status"] == "finished"


@pytest.mark.parametrize(
    ("name", "columns"),
    [
        ("demo", ["norm_scheme"]),
        ("stability", ["norm_scheme", "optim/lr", "seed"]),
        ("depth", ["norm_scheme", "seed", "trunk/depth", "trunk/dim"]),
    ],
)
def test_runs_show_in_hparams_only_what_the_grid_varies(name: str, columns: list[str], monkeypatch):
    monkeypatch.chdir(ROOT)
    spec = sweep.SweepSpec.load(f"configs/sweeps/{name}.yaml")
    assert f"--hparams_columns=[{','.join(columns)}]" in sweep.grid(spec)[0].argv(spec)


BUDGETS = {  # runs, steps
    "stability": (36, 120), "warmup": (6, 300), "ablation": (21, 150), "depth": (24, 150), "moe": (18, 120)
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(BUDGETS))
def test_shipped_sweeps_parse_with_diagnostics_enabled(name: str, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    spec = sweep.SweepSpec.load(f"configs/sweeps/{name}.yaml")
    runs = sweep.grid(spec)
    n_runs, steps = BUDGETS[name]
    assert len(runs) == n_runs
    argv = runs[-1].argv(spec)[3:]  # drop "python -m experiments"
    with pytest.raises(SystemExit) as exc:
        cli_main([*argv, "--print_config"])
    assert exc.value.code in (0, None)
    config = yaml.safe_load(capsys.readouterr().out)
    callbacks = {c["class_path"]: c.get("init_args", {}) for c in config["trainer"]["callbacks"]}
    assert callbacks["experiments.monitoring.diagnostics.Diagnostics"]["every_n_steps"] == 25
    assert "lightning.pytorch.callbacks.ModelCheckpoint" in callbacks  # appended, not replaced
    assert config["model"]["init_args"]["optim"]["lr"] == runs[-1].lr and config["trainer"]["max_steps"] == steps
    if runs[-1].seed is not None:  # a seed is a replicate: model init and data order
        assert config["seed_everything"] == config["data"]["init_args"]["seed"] == runs[-1].seed


def test_a_finished_run_stopped_during_its_test_is_only_tested(tmp_path: Path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    spec = {"name": "t", "configs": [str(ROOT / "configs/lm/tiny.yaml")], "schemes": ["pre"], "test": True,
            "runs_root": str(tmp_path / "runs")}  # fmt: skip
    sweep_file = tmp_path / "t.yaml"
    sweep_file.write_text(yaml.safe_dump(spec))
    run_dir = tmp_path / "runs/lm/t/pre"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / RUN_MARKER).write_text("{}")  # what every run writes when it starts
    torch.save({"global_step": 4}, run_dir / "checkpoints" / "last.ckpt")  # tested from its highest recorded step
    (run_dir / "summary.json").write_text(json.dumps({"scheme": "pre", "status": "finished"}))
    calls = []

    def fake_run(self, argv, **kwargs) -> int:
        calls.append(argv)
        (run_dir / "summary.json").write_text(json.dumps({"scheme": "pre", "status": "finished", "test": {}}))
        return 0

    monkeypatch.setattr(sweep.Children, "call", fake_run)
    sweep.main(["sweep", str(sweep_file)])
    assert "[1/1] pre: finished but not tested, testing" in capsys.readouterr().out
    ((_, _, _, sub, *rest),) = calls  # python -m experiments test ... --ckpt_path=<the checkpoint>
    assert sub == "test" and rest[-1] == f"--ckpt_path={run_dir / 'checkpoints' / 'last.ckpt'}"
    skipped = []
    monkeypatch.setattr(sweep_progress.GridProgress, "skip", lambda self, run: skipped.append(run))
    sweep.main(["sweep", str(sweep_file)])  # tested now: skipped, and not counted as waiting
    assert "already done (finished), skipped" in capsys.readouterr().out and len(calls) == 1
    assert skipped == ["pre"]


def test_previous_status(tmp_path: Path):
    path = tmp_path / "summary.json"
    assert sweep.previous_status(path) is None
    path.write_text('{"status": "interrupted"}')
    assert sweep.previous_status(path) == "interrupted"
    path.write_text('{"status": "fini')  # a half-written file from a hard kill
    assert sweep.previous_status(path) == "crashed"


def test_a_stopping_sweep_starts_no_process(tmp_path: Path):
    children = sweep.Children()
    marker = tmp_path / "started"
    assert children.call([sys.executable, "-c", f"open({str(marker)!r}, 'w')"]) == 0 and marker.exists()
    marker.unlink()
    assert children.stop(signal.SIGTERM) == 0  # nothing was running
    assert children.call([sys.executable, "-c", f"open({str(marker)!r}, 'w')"]) is None and not marker.exists()


def test_the_demo_budget_fits_five_minutes(monkeypatch):
    """make demo: pre, post and siamese at once, 120 steps each (under 4 minutes on 2 idle cores, measured in
    README); the 3-seed check runs the very same runs, and the old 400-step comparison keeps its spec."""
    monkeypatch.chdir(ROOT)
    demo = sweep.SweepSpec.load("configs/sweeps/demo.yaml")
    assert demo.schemes == ["pre", "post", "siamese"] and demo.parallel == len(sweep.grid(demo)) == 3
    assert "--trainer.max_steps=120" in demo.args and demo.test
    seeds = sweep.SweepSpec.load("configs/sweeps/demo-seeds.yaml")
    assert len(seeds.seeds) == 3 and (seeds.schemes, seeds.lrs, seeds.args) == (demo.schemes, demo.lrs, demo.args)
    assert set(demo.seeds) <= set(seeds.seeds)
    old = sweep.SweepSpec.load("configs/sweeps/lm-tiny.yaml")
    assert old.args == [] and len(sweep.grid(old)) == 3  # tiny.yaml's own 400 steps
