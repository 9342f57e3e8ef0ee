"""Compiled training says when it cannot compile: MoE Blocks whose experts are split over ranks (expert
parallelism) run eagerly under activation checkpointing (the expert exchange is a graph break inside the compiled
checkpoint), and the fit warns once; without checkpointing, or with the experts not split, it says nothing.

Built on one process as rank 0 of 2 (torch's fake backend); compiling is lazy, so nothing is traced here."""

from __future__ import annotations

import warnings

import pytest
import torch

from experiments.parallel.config import ParallelConfig
from experiments.tasks import LanguageModeling
from experiments.tasks.optim import OptimConfig
from models import TrunkConfig
from tests.experiments.test_meta_init import configured, fake_rank

MOE = dict(dim=32, depth=2, num_heads=4, mlp_hidden=64, mlp="swiglu", moe_experts=4, moe_hidden=16)


def built(expert_parallel: bool, checkpointing: bool) -> list[str]:
    torch.manual_seed(0)
    task = LanguageModeling(TrunkConfig(**MOE, activation_checkpointing=checkpointing), OptimConfig(), vocab_size=48,
                            seq_len=16, parallel=ParallelConfig(expert_parallel=expert_parallel, compile=True,
                                                                compile_backend="aot_eager"))  # fmt: skip
    with fake_rank(0, 2, 1) as mesh, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        configured(task, mesh)
    return [str(w.message) for w in caught if "run eagerly" in str(w.message)]


@pytest.mark.parametrize(("expert_parallel", "checkpointing", "warned"),
                         [(True, True, 1), (True, False, 0), (False, True, 0)])  # fmt: skip
def test_split_experts_under_checkpointing_say_their_blocks_run_eagerly(expert_parallel, checkpointing, warned):
    messages = built(expert_parallel, checkpointing)
    assert len(messages) == warned, messages
    if warned:
        assert "expert parallelism and activation checkpointing" in messages[0]
