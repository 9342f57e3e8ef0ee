"""Multi-process: 2-process DDP on CPU (gloo) follows the 1-process trajectory; the large LM configs name FSDP2.

Tolerance: DDP averages per-rank gradients (all-reduce) where one process averages over the whole batch,
so the sums round differently; over the first 5 steps the relative loss difference measured ~1e-7.
The test allows rtol=1e-5: far below what a wrong data order or a missing gradient sync gives (>1e-3).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from experiments.__main__ import main
from experiments.cli import SuiteCLI
from tests.experiments.tiny import tiny_lm

ROOT = Path(__file__).resolve().parents[2]
STEPS = 5
RTOL = 1e-5


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
    """Parses and instantiates model, data and strategy, but no Trainer (the paper configs name 8 GPUs)."""

    def instantiate_trainer(self, **kwargs):
        return None


SHRINK = [
    "--model.init_args.trunk.dim=32", "--model.init_args.trunk.depth=3", "--model.init_args.trunk.num_heads=2",
    "--model.init_args.trunk.mlp_hidden=64", "--data.init_args.source=embedded", "--data.init_args.tokenizer=byte",
    "--data.init_args.seq_len=16",
]  # fmt: skip


@pytest.mark.parametrize("config", ["configs/lm/olmo-1b.yaml", "configs/lm/moe-15a2b.yaml"])
def test_the_large_lm_configs_shard_with_fsdp2(tmp_path: Path, config: str):
    cli = ParseOnlyCLI(args=["-c", str(ROOT / config), f"--runs_root={tmp_path}", *SHRINK], run=False)
    strategy = cli.config_init["trainer"]["strategy"]
    assert type(strategy).__name__ == "ModelParallelStrategy" and strategy._save_distributed_checkpoint
    assert (strategy._data_parallel_size, strategy._tensor_parallel_size) == (8, 1)  # = devices: 8
    assert cli.config_init["trainer"]["precision"] == "32-true"  # bf16 from FSDP2's policy, not autocast
    parallel = cli.model.parallel_cfg
    assert parallel.param_torch_dtype("cuda") == torch.bfloat16 and parallel.param_torch_dtype("cpu") == torch.float32
    assert cli.model.net.trunk.cfg.activation_checkpointing
    assert parallel.expert_parallel == ("moe" in config)  # 64 experts over the 8 GPUs


def test_the_fsdp2_tp_overlay_asks_for_a_node_of_tensor_parallelism(tmp_path: Path):
    args = ["-c", str(ROOT / "configs/lm/olmo-1b.yaml"), "-c", str(ROOT / "configs/trainer/fsdp2-tp.yaml")]
    cli = ParseOnlyCLI(args=[*args, f"--runs_root={tmp_path}", *SHRINK], run=False)
    strategy = cli.config_init["trainer"]["strategy"]
    assert (strategy._data_parallel_size, strategy._tensor_parallel_size) == ("auto", "auto")
