"""train/loss under gradient accumulation: the logged value at an optimizer step is the mean of its micro-batches."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from lightning.pytorch.loggers import Logger
from torch.utils.data import DataLoader, TensorDataset

from experiments.monitoring.step_mean import StepMean
from experiments.monitoring.summary import RunSummary

MICRO, STEPS = 3, 4


def test_the_running_mean_restarts_at_each_step() -> None:
    mean = StepMean()
    got = [float(mean(torch.tensor(v), step)) for step, v in [(0, 1.0), (0, 2.0), (0, 6.0), (1, 5.0), (1, 7.0)]]
    assert got == [1.0, 1.5, 3.0, 5.0, 6.0] and mean.count == 2
    assert not mean(torch.tensor(2.0, requires_grad=True), 2).requires_grad  # no graph kept across micro-batches


class _Logged(Logger):
    """Keeps what Lightning hands the logger: {step: train/loss}."""

    def __init__(self) -> None:
        super().__init__()
        self.values: dict[int, float] = {}

    @property
    def name(self) -> str:
        return "memory"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        if "train/loss" in metrics:
            self.values[int(step)] = float(metrics["train/loss"])


class _Regression(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.step_mean = StepMean()
        self.micro_losses: list[float] = []

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.micro_losses.append(float(loss.detach()))
        self.log("train/loss", self.step_mean(loss, self.global_step), sync_dist=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_the_logged_loss_of_an_accumulated_step_is_the_mean_of_its_micro_batches(tmp_path) -> None:
    """3 micro-batches per step, 4 steps: the logger gets one value per step, the mean of the step's 3 micro-batch
    losses (logging the loss itself hands it the 3rd micro-batch's)."""
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(MICRO * STEPS * 2, 4), torch.randn(MICRO * STEPS * 2, 1))
    module, logger, summary = _Regression(), _Logged(), RunSummary(log_every_n_steps=1)
    trainer = L.Trainer(
        max_steps=STEPS, accumulate_grad_batches=MICRO, logger=logger, log_every_n_steps=1, accelerator="cpu",
        callbacks=[summary],
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
    )  # fmt: skip
    trainer.fit(module, DataLoader(data, batch_size=2))
    micro = torch.tensor(module.micro_losses).view(STEPS, MICRO)
    # Lightning logs the step's values after its optimizer step, at the new global_step - 1 (0-based steps)
    assert sorted(logger.values) == list(range(STEPS))
    torch.testing.assert_close(torch.tensor([logger.values[s] for s in range(STEPS)]), micro.mean(1))
    assert not torch.allclose(micro.mean(1), micro[:, -1])  # the test tells the mean from the last micro-batch
    # summary.json's curve: one point per optimizer step (after its last micro-batch), the same step means
    assert [step for step, _ in summary.train_curve] == list(range(1, STEPS + 1))
    torch.testing.assert_close(torch.tensor([loss for _, loss in summary.train_curve]), micro.mean(1))
