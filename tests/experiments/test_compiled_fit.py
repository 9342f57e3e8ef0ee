"""Compiled training through the command line on one device (the path of every strategy without a mesh: the task's
``configure_model`` compiles each trunk Block): the same losses as eager, and something really compiled."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.experiments.test_lm import data_dir, run  # noqa: F401 - data_dir: the session fixture


def _curve(runs: Path, scheme: str) -> list[float]:
    summary = json.loads((runs / "lm" / "tiny" / scheme / "summary.json").read_text())
    return [loss for _, loss in summary["train_curve"]]


@pytest.mark.slow
def test_a_compiled_fit_gives_the_eager_losses(tmp_path: Path, data_dir: Path):  # noqa: F811
    steps = ["--trainer.max_steps=3", "--trainer.limit_val_batches=1", "--trainer.val_check_interval=3",
             "--model.init_args.trunk.activation_checkpointing=true", "--summary.log_every_n_steps=1"]  # fmt: skip
    run("fit", tmp_path / "eager", data_dir, *steps, scheme="siamese")
    torch._dynamo.reset()
    before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    compiled = ["--model.init_args.parallel.compile=true", "--model.init_args.parallel.compile_backend=aot_eager"]
    run("fit", tmp_path / "compiled", data_dir, *steps, *compiled, scheme="siamese")
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > before  # not a silent fall back to eager
    eager, comp = _curve(tmp_path / "eager", "siamese"), _curve(tmp_path / "compiled", "siamese")
    assert len(eager) == len(comp) == 3
    torch.testing.assert_close(comp, eager, rtol=1e-5, atol=0)
