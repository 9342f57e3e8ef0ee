"""A global batch: batch_size 4 stepping every batch = micro-batches of 1 accumulated 4 times (losses, gradients)."""

from __future__ import annotations

import re
from pathlib import Path
from pydoc_data.topics import topics
from types import SimpleNamespace

import lightning as L
import pytest
import torch

from datamodules.batching import set_accumulation
from datamodules.text.datamodule import TextDataModule
from experiments.tasks.lm import LanguageModeling
from experiments.tasks.optim import OptimConfig
from models import TrunkConfig
from tests.experiments.test_bad_input import error_line
from tests.experiments.tiny import tiny_lm

ROOT = Path(__file__).resolve().parents[2]

STEPS = 3


class _Record(L.Callback):
    """Each optimizer step's loss (the accumulated mean) and the gradients it steps with."""

    def __init__(self) -> None:
        self.losses: list[float] = []
        self.grads: list[dict[str, torch.Tensor]] = []
        self._sum = 0.0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        self._sum += float(outputs["loss"])  # Lightning returns the micro-batch loss already divided by it
        if (batch_idx + 1) % trainer.accumulate_grad_batches == 0:
            self.losses.append(self._sum)
            self._sum = 0.0

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        self.grads.append({n: p.grad.detach().clone() for n, p in pl_module.named_parameters() if p.grad is not None})


def _fit(corpus: Path, tmp: Path, **data: int) -> tuple[_Record, L.Trainer]:
    L.seed_everything(0)
    dm = TextDataModule(source=str(corpus), data_dir=str(tmp / "d"), seq_len=16, eval_samples=2, **data)
    model = LanguageModeling(
        trunk=TrunkConfig(dim=32, depth=2, num_heads=2, mlp="swiglu", norm_layer="rmsnorm"),
        optim=OptimConfig(lr=1e-2, warmup_steps=0, schedule="constant"),
        vocab_size=256,
        seq_len=16,
    )
    record = _Record()
    trainer = L.Trainer(
        max_steps=STEPS, accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, limit_val_batches=0, num_sanity_val_steps=0, callbacks=[record],
        default_root_dir=tmp, deterministic=True,
    )  # fmt: skip
    trainer.fit(model, datamodule=dm)
    return record, trainer


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "topics.txt"
    path.write_text("\n\n".join(topics[k] for k in sorted(topics))[:20_000])
    return path


def test_four_micro_batches_of_one_equal_one_batch_of_four(corpus: Path, tmp_path: Path) -> None:
    whole, whole_trainer = _fit(corpus, tmp_path, batch_size=4)
    micro, micro_trainer = _fit(corpus, tmp_path, batch_size=1, global_batch_size=4)
    assert whole_trainer.accumulate_grad_batches == 1 and micro_trainer.accumulate_grad_batches == 4
    assert whole_trainer.global_step == micro_trainer.global_step == STEPS
    assert len(whole.losses) == len(micro.losses) == STEPS and len(micro.grads) == STEPS
    torch.testing.assert_close(torch.tensor(micro.losses), torch.tensor(whole.losses), rtol=1e-5, atol=1e-6)
    for step in range(STEPS):
        assert whole.grads[step].keys() == micro.grads[step].keys()
        for name, grad in whole.grads[step].items():
            torch.testing.assert_close(micro.grads[step][name], grad, rtol=1e-4, atol=1e-6, msg=f"{step} {name}")


def _trainer(replicas: int, accumulate: int = 1) -> SimpleNamespace:
    shard = {"num_replicas": replicas, "rank": 0} if replicas > 1 else None
    return SimpleNamespace(distributed_sampler_kwargs=shard, accumulate_grad_batches=accumulate)


def test_the_accumulation_follows_the_replicas_and_a_split_that_is_not_whole_is_refused() -> None:
    for replicas, expected in ((1, 64), (8, 8), (64, 1)):
        trainer = _trainer(replicas)
        assert set_accumulation(2048, 32, trainer) == expected == trainer.accumulate_grad_batches
    split = "global_batch_size=2048 does not split into micro-batches of batch_size=32 on 3 data-parallel replicas"
    with pytest.raises(ValueError, match=re.escape(f"{split}; use a multiple of 96")):
        set_accumulation(2048, 32, _trainer(3))
    with pytest.raises(ValueError, match=re.escape("trainer.accumulate_grad_batches=2 conflicts with global_batch")):
        set_accumulation(2048, 32, _trainer(8, accumulate=2))
    assert set_accumulation(None, 32, _trainer(8, accumulate=2)) == 2  # no global batch: the trainer's own


def test_a_global_batch_the_micro_batch_does_not_divide_is_refused_at_construction(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=re.escape("global_batch_size=100 is not a multiple of the per-device")):
        TextDataModule(source="embedded", data_dir=str(tmp_path), batch_size=32, global_batch_size=100)


def test_the_command_line_refuses_a_global_batch_that_does_not_split_in_one_line(corpus: Path, tmp_path: Path, capsys):
    base = ["fit", "-c", str(ROOT / "configs/lm/tiny.yaml"), f"--runs_root={tmp_path / 'runs'}",
            f"--data.init_args.source={corpus}", f"--data.init_args.data_dir={tmp_path / 'd'}",
            *tiny_lm(depth=1, seq_len=16, batch_size=4, eval_samples=4), "--trainer.max_steps=1"]  # fmt: skip
    line = error_line([*base, "--data.init_args.global_batch_size=10"], capsys)
    assert "global_batch_size=10 is not a multiple of the per-device micro-batch batch_size=4" in line
    line = error_line([*base, "--data.init_args.global_batch_size=8", "--trainer.accumulate_grad_batches=3"], capsys)
    assert "trainer.accumulate_grad_batches=3 conflicts with global_batch_size=8, which needs 2" in line


def _image_trainer(processes: int, replicas: int, accumulate: int = 1) -> SimpleNamespace:
    shard = {"num_replicas": replicas, "rank": 0} if processes > 1 else None
    return SimpleNamespace(world_size=processes, distributed_sampler_kwargs=shard, accumulate_grad_batches=accumulate)


def test_the_image_global_batch_is_split_over_data_parallel_replicas_not_processes() -> None:
    """4 processes as 2 tensor-parallel x 2 data-parallel: the two ranks of a replica read the same batch, so each
    reads 1024 / 2 = 512 images (global / world size would be 256: a global batch of 512)."""
    from datamodules.images.folder import ImageFolderDataModule

    dm = ImageFolderDataModule("unused", auto_augment=None, global_batch_size=1024)
    cases = ((1, 1, 1, 1024), (8, 8, 1, 128), (4, 2, 1, 512), (8, 2, 4, 128))
    for processes, replicas, accumulate, per_device in cases:
        dm.trainer = _image_trainer(processes, replicas, accumulate)
        assert dm.per_device_batch_size() == per_device, (processes, replicas, accumulate)
    dm.trainer = _image_trainer(6, 3)
    split = "global_batch_size=1024 does not split evenly over 3 data-parallel replicas x 1 accumulation steps"
    with pytest.raises(ValueError, match=re.escape(f"{split}; use a multiple of 3")):
        dm.per_device_batch_size()
