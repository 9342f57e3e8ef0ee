"""Multi-process: 2-process DDP on CPU (gloo) follows the 1-process trajectory; the FSDP recipe wraps per Block.

Tolerance: DDP averages per-rank gradients (all-reduce) where one process averages over the whole batch,
so the sums round differently; over the first 5 steps the relative loss difference measured ~1e-7.
The test allows rtol=1e-5: far below what a wrong data order or a missing gradient sync gives (>1e-3).
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from experiments.__main__ import main
from experiments.cli import SuiteCLI
from models.trunk import Block
from tests.experiments.tiny import tiny_lm

ROOT = Path(__file__).resolve().parents[2]
STEPS = 5
RTOL = 1e-5

# The FSDP recipe for the large LM configs (README): one FSDP unit per trunk Block, activation
# checkpointing per Block by FSDP (the trunk's own switch off, or blocks are checkpointed twice), bf16.
FSDP_YAML = """
trainer:
  strategy:
    class_path: lightning.pytorch.strategies.FSDPStrategy
    init_args:
      auto_wrap_policy: [models.trunk.Block]
      activation_checkpointing_policy: [models.trunk.Block]
      sharding_strategy: FULL_SHARD
      state_dict_type: sharded
  precision: bf16-mixed
model:
  init_args:
    trunk:
      activation_checkpointing: false
"""


def lm_args(runs: Path, corpus: tuple[Path, Path], batch_size: int, *extra: str) -> list[str]:
    text, shards = corpus
    return [
        "fit", "-c", str(ROOT / "configs/lm/tiny.yaml"),
        f"--runs_root={runs}", f"--data.init_args.source={text}", f"--data.init_args.data_dir={shards}",
        "--trainer.accelerator=cpu", *tiny_lm(batch_size=batch_size, eval_samples=None),
        "--trainer.limit_val_batches=0", "--trainer.num_sanity_val_steps=0", f"--trainer.max_steps={STEPS}",
        "--model.init_args.optim.warmup_steps=2", "--summary.log_every_n_steps=1",
        *extra,
    ]  # fmt: skip


def train_curve(runs: Path) -> list[tuple[int, float]]:
    return json.loads((runs / "lm" / "tiny" / "pre" / "summary.json").read_text())["train_curve"]


@pytest.mark.slow
@pytest.mark.xdist_group("processes")  # several busy processes: never beside another such test
def test_two_process_ddp_follows_the_single_process_run(tmp_path: Path, corpus):
    main(lm_args(tmp_path / "one", corpus, 8))  # one process, batch 8 (prepares the shards too)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    ddp = lm_args(tmp_path / "two", corpus, 4, "--trainer.devices=2", "--trainer.strategy=ddp")  # 2 x 4
    proc = subprocess.run(
        [sys.executable, "-m", "experiments", *ddp], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    one, two = train_curve(tmp_path / "one"), train_curve(tmp_path / "two")
    assert [s for s, _ in two] == list(range(1, STEPS + 1)) == [s for s, _ in one]
    # Rank r takes windows r, r+2, ... of the epoch's draw: together the ranks see the one-process batch.
    torch.testing.assert_close(torch.tensor([v for _, v in two]), torch.tensor([v for _, v in one]), rtol=RTOL, atol=0)


class ParseOnlyCLI(SuiteCLI):
    """Parses and instantiates model, data and strategy, but no Trainer (Lightning refuses FSDP without a GPU)."""

    def instantiate_trainer(self, **kwargs):
        return None


def test_fsdp_recipe_parses_and_wraps_every_block(tmp_path: Path):
    overlay = tmp_path / "fsdp.yaml"
    overlay.write_text(FSDP_YAML)
    shrink = [
        "--model.init_args.trunk.dim=32", "--model.init_args.trunk.depth=3", "--model.init_args.trunk.num_heads=2",
        "--model.init_args.trunk.mlp_hidden=64", "--model.init_args.trunk.moe_experts=4",
        "--model.init_args.trunk.moe_top_k=2", "--model.init_args.trunk.moe_hidden=16",
        "--data.init_args.source=embedded", "--data.init_args.tokenizer=byte", "--data.init_args.seq_len=16",
    ]  # fmt: skip
    cli = ParseOnlyCLI(
        args=["-c", str(ROOT / "configs/lm/moe-15a2b.yaml"), "-c", str(overlay), f"--runs_root={tmp_path}", *shrink],
        run=False,
    )
    strategy = cli.config_init["trainer"]["strategy"]
    assert type(strategy).__name__ == "FSDPStrategy" and strategy._state_dict_type == "sharded"
    assert cli.config_init["trainer"]["precision"] == "bf16-mixed"
    assert not cli.model.net.trunk.cfg.activation_checkpointing
    # What Lightning's FSDPStrategy._setup_model does on a GPU, here on CPU with a one-process gloo group.
    from lightning.fabric.strategies.fsdp import _setup_activation_checkpointing
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    reference = copy.deepcopy(cli.model.net)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        cpu = torch.device("cpu")  # Lightning passes the GPU index here
        wrapped = FSDP(cli.model.net, sharding_strategy=strategy.sharding_strategy, device_id=cpu, **strategy.kwargs)
        _setup_activation_checkpointing(wrapped, strategy._activation_checkpointing_kwargs)
        units = [m for m in wrapped.modules() if isinstance(m, FSDP)]
        assert len(units) == 3 + 1  # every Block, plus the root (embeddings, readout, head)
        assert sum(isinstance(m, Block) for u in units for m in [u.module]) == 3
        assert sum(isinstance(m, CheckpointWrapper) for m in wrapped.modules()) == 3
        idx = torch.randint(0, 256, (2, 16))
        logits = wrapped(idx)
        logits.float().square().mean().backward()
        torch.testing.assert_close(logits, reference(idx))
        assert all(p.grad is not None for p in wrapped.parameters())
    finally:
        dist.destroy_process_group()
