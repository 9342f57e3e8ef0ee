"""The run's TensorBoard logger: Lightning's, with the ``epoch`` scalar only where epochs are the budget.

Lightning adds ``epoch`` to every ``log`` call. TensorBoard's TIME SERIES tab sorts its groups by tag
prefix and expands the first two, so that scalar becomes the first card a user sees, above the losses. In
a run budgeted in steps (``max_steps``, no ``max_epochs``) it says only how often the loader ran out (the
demo's 120 steps never finish epoch 0): there it is dropped. In a run budgeted in epochs it is kept as
``train/epoch``, grouped with the training curves instead of sorted above them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_only

EPOCH_TAG = "train/epoch"  # where an epoch-budgeted run's epoch goes (Lightning logs it as "epoch")


def epochs_are_the_budget(trainer_config: Any) -> bool:
    """Whether a fit with this ``trainer`` config (a dict or the CLI's namespace) stops after a number of
    epochs (Lightning's defaults: ``max_epochs`` unset means 1000 unless ``max_steps`` or ``max_time`` is set)."""
    max_epochs, max_steps = trainer_config.get("max_epochs"), trainer_config.get("max_steps")
    if max_epochs is not None:
        return max_epochs != -1
    return max_steps in (None, -1) and trainer_config.get("max_time") is None


class SuiteTensorBoardLogger(TensorBoardLogger):
    """``TensorBoardLogger`` that drops Lightning's ``epoch`` scalar, or logs it as ``train/epoch``.

    Args:
        *args: as ``TensorBoardLogger``.
        log_epoch: keep the epoch (as :data:`EPOCH_TAG`); False for a run budgeted in steps.
        **kwargs: as ``TensorBoardLogger``.
    """

    def __init__(self, *args, log_epoch: bool = True, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.log_epoch = log_epoch

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        metrics = dict(metrics)
        epoch = metrics.pop("epoch", None)
        if epoch is not None and self.log_epoch:
            metrics[EPOCH_TAG] = epoch
        if metrics:
            super().log_metrics(metrics, step)
