"""scripts/alpha_sweep.py: its table reads the right diagnostics of a run (the last block by number, not by name; the
MLP-site norms, the odd sublayers), says stalled by the comparison's rule, and refuses a bad alpha before training."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from torch.utils.tensorboard import SummaryWriter

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("alpha_sweep", ROOT / "scripts" / "alpha_sweep.py")
alpha_sweep = importlib.util.module_from_spec(spec)
spec.loader.exec_module(alpha_sweep)


def fake_run(run_dir: Path, val: float) -> Path:
    """A run of 12 blocks: block b's stream RMS is 10 b + step / 20; sublayer k saturates k / 100 + step / 1000."""
    run_dir.mkdir(parents=True)
    summary = {"status": "finished", "steps": 120, "final_train_loss": 2.5, "final_val": {"val/loss": val},
               "baseline_loss": 3.0, "train_curve": [[10, 3.1], [120, 2.5]], "val_curve": []}  # fmt: skip
    (run_dir / "summary.json").write_text(json.dumps(summary))
    writer = SummaryWriter(str(run_dir))
    for step in (0, 20, 40, 100):
        for b in range(12):
            writer.add_scalar(f"diag/rms/x/block_{b}", 10 * b + step / 20, step)
        for k in range(24):
            writer.add_scalar(f"diag/saturation/norm/sublayer_{k}", k / 100 + step / 1000, step)
        writer.add_scalar("diag/saturation/norm_f", 0.5, step)
    writer.close()
    return run_dir


def test_row_reads_the_last_block_and_the_mlp_sites(tmp_path: Path):
    line, _ = alpha_sweep.row("a8", "8", fake_run(tmp_path / "a8", val=2.4))
    cells = [c.strip() for c in line.strip("|").split("|")]
    # last block is block_11 (lexically block_9): 110 + 1 -> 110 + 5; MLP sites 1, 3, ..., 23: mean 0.12 + step/1000
    assert cells == ["a8", "8", "2.500", "2.400", "finished", "111 -> 115", "0.140 -> 0.220", "0.500 -> 0.500"]


def test_a_run_above_the_stall_line_is_called_stalled(tmp_path: Path):
    line, _ = alpha_sweep.row("port", "recipe", fake_run(tmp_path / "port", val=2.71))  # > 0.9 x 3.0
    assert "| stalled |" in line


@pytest.mark.parametrize("alphas", ["0,4", "port,x", "-2"])
def test_a_bad_alpha_is_one_line_and_exit_2_before_any_run(alphas: str, tmp_path: Path):
    command = [sys.executable, str(ROOT / "scripts" / "alpha_sweep.py"), "--layer", "derf", f"--alphas={alphas}",
               "--out", str(tmp_path / "out")]  # fmt: skip
    out = subprocess.run(command, capture_output=True, text=True)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "--alphas" in out.stderr, out.stderr
    assert not (tmp_path / "out").exists()


def test_an_existing_table_is_not_replaced_without_overwrite(tmp_path: Path):
    (tmp_path / "alpha.md").write_text("an earlier table\n")
    command = [sys.executable, str(ROOT / "scripts" / "alpha_sweep.py"), "--layer", "dyt", "--out", str(tmp_path)]
    out = subprocess.run(command, capture_output=True, text=True)
    assert out.returncode == 2 and "--overwrite" in out.stderr and out.stderr.count("\n") == 1, out.stderr
    assert (tmp_path / "alpha.md").read_text() == "an earlier table\n"
    assert "training" not in out.stdout  # refused before the first run
