"""Which checkpoint a finished sweep run is tested from (the local launcher and the submitit job alike): the one
with the highest recorded step, whatever the file times say (a run directory copied without its times)."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from experiments.sweeps.launchers import newest_checkpoint


def test_the_highest_recorded_step_is_tested_not_the_newest_file(tmp_path: Path):
    ckpts = tmp_path / "run" / "checkpoints"
    ckpts.mkdir(parents=True)
    for name, step, mtime in [("last.ckpt", 40, 1_000), ("step=20.ckpt", 20, 2_000), ("step=10.ckpt", 10, 3_000)]:
        torch.save({"global_step": step, "state_dict": {}}, ckpts / name)
        os.utime(ckpts / name, (mtime, mtime))  # the earliest steps look newest, as after `cp -r` without -p
    assert newest_checkpoint(tmp_path / "run") == ckpts / "last.ckpt"
    (ckpts / "last.ckpt").write_bytes(b"cut short")  # unreadable: the next highest step, not the newest file
    assert newest_checkpoint(tmp_path / "run") == ckpts / "step=20.ckpt"
    assert newest_checkpoint(tmp_path / "none") is None


def test_downstream_evaluation_names_a_step_that_is_not_a_number(tmp_path: Path):
    """The downstream scorer reads the step it reports from the checkpoint, checked as resume checks it."""
    import pytest

    from experiments.evaluation.downstream.checkpoint import load_lm
    from experiments.reliability.errors import CheckpointError
    from experiments.reliability.safe_load import load_checkpoint
    from tests.experiments.sharing.conftest import TEXT_DATA, lm_module, save_run

    ckpt = Path(save_run(tmp_path, "pre", lm_module("pre", 0), "experiments.tasks.LanguageModeling", TEXT_DATA))
    payload = load_checkpoint(ckpt)
    assert load_lm(ckpt).step == payload["global_step"]
    torch.save({**payload, "global_step": "7"}, ckpt)  # once silently reported as step 0
    with pytest.raises(CheckpointError, match=r"its global_step is '7', not a step count"):
        load_lm(ckpt)
