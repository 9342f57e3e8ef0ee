"""What every task LightningModule shares: the trunk config, the optimizer, hparams with a metric."""

from __future__ import annotations

import lightning as L
import torch
from lightning.pytorch.loggers import TensorBoardLogger

from experiments.tasks.optim import OptimConfig, build_optimizer
from models import TrunkConfig


class TaskModule(L.LightningModule):
    """Base of the task modules. Subclasses build ``self.net`` and implement ``model_step``.

    Attributes:
        task: short task name ("lm", "vit", "dit", "vae"), used in run directories.
        key_metric: the metric shown as the hparams column in TensorBoard (e.g. "val/ppl").
    """

    task: str = "task"
    key_metric: str = "val/loss"

    def __init__(self, trunk: TrunkConfig, optim: OptimConfig) -> None:
        super().__init__()
        self.trunk_cfg, self.optim_cfg = trunk, optim

    @property
    def scheme(self) -> str:
        return self.trunk_cfg.norm_scheme

    def configure_optimizers(self) -> dict:
        total = int(self.trainer.estimated_stepping_batches)
        epochs = self.trainer.max_epochs if self.trainer.max_epochs and self.trainer.max_epochs > 0 else 1
        return build_optimizer(self.net, self.optim_cfg, total, total / epochs)

    def setup(self, stage: str) -> None:
        # An EMA copy (timm ModelEmaV3, a submodule so it is checkpointed) is updated by hand, never by autograd:
        # frozen before the strategy wraps the module, or DDP waits for gradients that never come.
        ema = getattr(self, "ema", None)
        if isinstance(ema, torch.nn.Module):
            ema.requires_grad_(False)

    def on_fit_start(self) -> None:
        # Register the key metric with the hparams plugin so runs compare in TensorBoard's HPARAMS tab.
        for logger in self.loggers:
            if isinstance(logger, TensorBoardLogger):
                logger.log_hyperparams(self.hparams, {self.key_metric: float("nan")})

    def training_step(self, batch, batch_idx: int):
        return self.model_step(batch, "train")

    def validation_step(self, batch, batch_idx: int):
        return self.model_step(batch, "val")

    def test_step(self, batch, batch_idx: int):
        return self.model_step(batch, "test")

    def model_step(self, batch, split: str):
        raise NotImplementedError
