"""An expert-parallel degree that cannot run is one line from ``fit`` before anything is launched or written."""

from __future__ import annotations

from tests.experiments.test_hostile_configs import error_line
from tests.experiments.test_hostile_resume import fit_args
from tests.experiments.test_hostile_round4 import SIZES, STRATEGY


def test_an_expert_parallel_size_that_does_not_divide_data_parallel_is_refused_by_fit(tmp_path, corpus, capsys):
    runs = tmp_path / "runs"
    options = ["--trainer.devices=4", f"{SIZES}data_parallel_size=4", f"{SIZES}tensor_parallel_size=1",
               "--model.init_args.trunk.moe_experts=6", "--model.init_args.trunk.moe_top_k=2",
               "--model.init_args.parallel.expert_parallel_size=3"]  # fmt: skip
    line = error_line(fit_args(runs, corpus, "--trainer.max_steps=1", "--trainer.accelerator=cpu", STRATEGY, *options),
                      capsys)  # fmt: skip
    assert line.startswith("error: model.init_args.parallel.expert_parallel_size=3 (command line) does not divide "
                           "data_parallel_size 4"), line  # fmt: skip
    assert not runs.exists()
