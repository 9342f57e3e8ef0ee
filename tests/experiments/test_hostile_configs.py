"""Issue #36, configs: what the command line gives wins over what a config or the data links in."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments.cli import SuiteCLI

ROOT = Path(__file__).resolve().parents[2]
TINY_DIT = ["-c", str(ROOT / "configs/dit/tiny.yaml"), "-c", str(ROOT / "configs/dit/synthetic-latents.yaml"),
            "--model.init_args.trunk.dim=32", "--model.init_args.trunk.depth=1", "--model.init_args.trunk.num_heads=2",
            "--trainer.enable_progress_bar=false"]  # fmt: skip


@pytest.mark.parametrize("given", [None, "vae-dir"])
def test_vae_path_on_the_command_line_wins_over_the_datas(given, tmp_path):
    """Synthetic latents link vae_path=None into the DiT; a --model.init_args.vae_path the user gives (to decode
    predict's samples) must reach the model instead of being overridden by the data's."""
    extra = [f"--model.init_args.vae_path={tmp_path / given}"] if given else []
    cli = SuiteCLI(args=[*TINY_DIT, f"--runs_root={tmp_path / 'runs'}", *extra], run=False)
    assert cli.model.hparams.vae_path == (str(tmp_path / given) if given else None)
