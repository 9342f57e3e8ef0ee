"""scripts/alpha_sweep.py: a run is the zoo's run of its cell (the same command), its table reads the right diagnostics
of a run (the last block by number, not by name; the MLP-site norms, the odd sublayers), says stalled by the
comparison's rule, and refuses a bad alpha before training."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from torch.utils.tensorboard import SummaryWriter

from experiments.reliability.errors import UsageExit
from experiments.sweeps.spec import Run, SweepSpec

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("alpha_sweep", ROOT / "scripts" / "alpha_sweep.py")
alpha_sweep = importlib.util.module_from_spec(spec)
spec.loader.exec_module(alpha_sweep)


def fake_run(run_dir: Path, val: float, streams=("x",), norms=("norm",), finals=("norm_f",)) -> Path:
    """A run of 12 blocks: block b's stream RMS is 10 b + step / 25 (a second stream's 1000 more); sublayer k's i-th
    norm saturates k / 100 + step / 1000 + i / 10; the i-th final norm 0.5 + i / 10."""
    run_dir.mkdir(parents=True)
    summary = {"status": "finished", "steps": 120, "final_train_loss": 2.5, "final_val": {"val/loss": val},
               "baseline_loss": 3.0, "train_curve": [[10, 3.1], [120, 2.5]], "val_curve": []}  # fmt: skip
    (run_dir / "summary.json").write_text(json.dumps(summary))
    writer = SummaryWriter(str(run_dir))
    for step in (0, 25, 50, 100):
        for b in range(12):
            for i, name in enumerate(streams):
                writer.add_scalar(f"diag/rms/{name}/block_{b}", 10 * b + step / 25 + 1000 * i, step)
        for k in range(24):
            for i, name in enumerate(norms):
                writer.add_scalar(f"diag/saturation/{name}/sublayer_{k}", k / 100 + step / 1000 + i / 10, step)
        for i, name in enumerate(finals):
            writer.add_scalar(f"diag/saturation/{name}", 0.5 + i / 10, step)
    writer.close()
    return run_dir


def test_row_reads_the_last_block_and_the_mlp_sites(tmp_path: Path):
    line, _ = alpha_sweep.row("a8", "8", fake_run(tmp_path / "a8", val=2.4))
    cells = [c.strip() for c in line.strip("|").split("|")]
    # last block is block_11 (lexically block_9): 110 + 1 -> 110 + 4; MLP sites 1, 3, ..., 23: mean 0.12 + step/1000
    assert cells == ["a8", "8", "2.500", "2.400", "finished", "111 -> 114", "0.145 -> 0.220", "0.500 -> 0.500"]


def test_row_of_a_two_stream_run_reads_its_pre_norm_like_stream(tmp_path: Path):
    norms, finals = ("norm_x", "norm_y", "norm_in"), ("norm_a", "norm_b", "norm_o")  # SiameseNorm's
    run = fake_run(tmp_path / "s", 2.4, ("pre", "post"), norms, finals)
    cells = [c.strip() for c in alpha_sweep.row("siamese-a8", "8", run)[0].strip("|").split("|")]
    assert cells[5:] == ["111 -> 114", "0.245 -> 0.320", "0.600 -> 0.600"]  # post's stream: 1111 -> 1114


def test_a_run_above_the_stall_line_is_called_stalled(tmp_path: Path):
    line, _ = alpha_sweep.row("port", "recipe", fake_run(tmp_path / "port", val=2.71))  # > 0.9 x 3.0
    assert "| stalled |" in line


# In-process (main(argv), its UsageExit line): the script's own exit status 2 and one stderr line are checked once,
# through the script, in test_nan_lr_through_the_script_is_one_line_and_exit_2.
@pytest.mark.parametrize("alphas", ["0,4", "port,x", "-2"])
def test_a_bad_alpha_is_one_line_and_exit_2_before_any_run(alphas: str, tmp_path: Path, monkeypatch):
    line = refused(["--layer", "derf", f"--alphas={alphas}", "--out", str(tmp_path / "out")], monkeypatch)
    assert "--alphas" in line, line
    assert not (tmp_path / "out").exists()


def test_an_existing_table_is_not_replaced_without_overwrite(tmp_path: Path, monkeypatch):
    (tmp_path / "alpha.md").write_text("an earlier table\n")
    line = refused(["--layer", "dyt", "--out", str(tmp_path)], monkeypatch)  # refused before the first run
    assert "--overwrite" in line, line
    assert (tmp_path / "alpha.md").read_text() == "an earlier table\n"


def test_a_run_is_the_zoos_run_of_its_cell(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The same configs, rate, seeds (the data order too) and zoo args as the sweep gives the cell: only the names
    differ, so the script's base and tuned-alpha runs reproduce the zoo's. An alpha's options come before the zoo's."""
    calls = []
    monkeypatch.setattr(alpha_sweep, "ROOT", tmp_path)  # no finished run there: both are trained
    monkeypatch.setattr(alpha_sweep.subprocess, "run", lambda command, **kw: calls.append((command, kw["env"])))
    alpha_sweep.train("base", "configs/norm/pre-port-trunk.yaml", [], "alpha-lr0.05-s2", 0.05, 2, 1)
    alpha_sweep.train("dyt-a8", "configs/norm/pre-dyt-llama.yaml", alpha_sweep.alpha_args(8), "x", 0.05, 2, 1)
    zoo = SweepSpec.load(str(ROOT / "configs" / "sweeps" / "zoo.yaml"))
    names = ("--experiment=", "--run_name=", "--runs_root=", "--hparams_columns=", "--trainer.enable_progress_bar=")

    def same_run(argv: list[str]) -> list[str]:
        return [str(Path(a)) if a.endswith(".yaml") else a for a in argv if not a.startswith(names)]

    (base, env), (alpha, _) = calls
    assert same_run(base) == same_run(Run("pre-port-trunk", 0.05, None, 2).argv(zoo))
    assert "--data.init_args.seed=2" in base and env["OMP_NUM_THREADS"] == "1"
    assert "--run_name=base" in base and "--experiment=alpha-lr0.05-s2" in base
    tuned = same_run(Run("pre-dyt-llama", 0.05, None, 2).argv(zoo))
    k = tuned.index(zoo.args[0])
    assert same_run(alpha) == tuned[:k] + alpha_sweep.alpha_args(8) + tuned[k:]


def test_a_layer_without_a_recipe_under_the_scheme_is_one_line_and_exit_2(tmp_path: Path, monkeypatch):
    line = refused(["--layer", "derf", "--scheme", "siamese", "--out", str(tmp_path / "out")], monkeypatch)
    assert "siamese-derf-gpt2.yaml" in line, line
    assert not (tmp_path / "out").exists()


def refused(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> str:
    """``main(argv)``'s one-line refusal, asserting that no run was started."""
    monkeypatch.setattr(alpha_sweep.subprocess, "run", lambda *a, **k: pytest.fail(f"a run started: {a}"))
    with pytest.raises(UsageExit) as caught:
        alpha_sweep.main(argv)
    assert caught.value.code.startswith("error: ") and "\n" not in caught.value.code, caught.value.code
    return caught.value.code


@pytest.mark.parametrize(
    ("option", "says"),
    [("--alphas=port,nan", "--alphas='nan' is not a finite number"), ("--alphas=inf", "--alphas='inf' is not a fin"),
     ("--alphas=1e400", "--alphas='1e400' is not a finite"), ("--alphas=,", "names no alpha"),
     ("--lr=nan", "--lr='nan' is not a finite number (command line); valid: finite numbers > 0"),
     ("--lr=-0.01", "--lr='-0.01' must be > 0"), ("--lr=0", "--lr='0' must be > 0"),
     ("--seed=-1", "--seed='-1' must be >= 0 and <= 4294967295"), ("--seed=1.5", "--seed='1.5' is not a whole")],
)  # fmt: skip
def test_a_bad_number_is_refused_before_any_run(option: str, says: str, tmp_path: Path, monkeypatch):
    assert says in refused(["--layer", "dyt", option, "--out", str(tmp_path / "out")], monkeypatch)
    assert not (tmp_path / "out").exists()


def test_a_missing_config_of_a_run_is_named_before_any_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The zoo cell's overlay of the base run is gone (a checkout without it): refused, naming the run and the file,
    before the first run starts (it used to fail in that run's fit, a CalledProcessError traceback)."""
    shutil.copytree(ROOT / "configs", tmp_path / "configs")
    (tmp_path / "configs/norm/pre-port-trunk.yaml").unlink()
    monkeypatch.setattr(alpha_sweep, "ROOT", tmp_path)
    monkeypatch.setattr(alpha_sweep, "ZOO", tmp_path / "configs/sweeps/zoo.yaml")
    alpha_sweep.zoo.cache_clear()
    try:
        line = refused(["--layer", "dyt", "--alphas=port,8", "--out", str(tmp_path / "out")], monkeypatch)
    finally:
        alpha_sweep.zoo.cache_clear()
    assert "run base: its config configs/norm/pre-port-trunk.yaml does not exist" in line, line
    assert "configs/sweeps/zoo.yaml" in line and not (tmp_path / "out").exists()


def test_nan_lr_through_the_script_is_one_line_and_exit_2(tmp_path: Path):
    command = [sys.executable, str(ROOT / "scripts" / "alpha_sweep.py"), "--layer", "dyt", "--lr=nan",
               "--out", str(tmp_path / "out")]  # fmt: skip
    out = subprocess.run(command, capture_output=True, text=True)
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith("error: --lr='nan' is not a finite number (command line)"), out.stderr
    assert not (tmp_path / "out").exists() and "training" not in out.stdout


def test_a_failed_run_is_one_line_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    def fails(command, **kw):
        raise subprocess.CalledProcessError(1, command)

    monkeypatch.setattr(alpha_sweep, "ROOT", tmp_path)  # no finished run there
    monkeypatch.setattr(alpha_sweep.subprocess, "run", fails)
    with pytest.raises(alpha_sweep.RunFailed, match=r"^run dyt-a8 failed: fit exited with 1 \(its output is above\)"):
        alpha_sweep.train("dyt-a8", "configs/norm/pre-dyt-llama.yaml", [], "x", 0.05, 2, 1)
