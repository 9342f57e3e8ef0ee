"""A fit that stops before its first validation: one true line instead of Lightning's "did you log it?" hint.

A run budgeted in epochs but stopped by ``--trainer.max_steps`` inside its first epoch ends the epoch
before it ever validates. ``ModelCheckpoint(monitor="val/acc1")`` then saves at that epoch end, finds no
``val/acc1`` and warns that it "could not find the monitored key ... Did you call log('val/acc1')?". The
task does log it, at every validation; none ran. Lightning raises that same message as an error once a
validation has run, so the warning only ever appears before the first one; this callback replaces it
with what happened exactly where that is the cause:

    the fit stops (max_steps reached or a stop requested), validation is configured, none has run in this
    fit, and a checkpoint monitors a metric nobody logged yet
        -> Lightning's warning is held back for the rest of the fit (only that one message) and, if it came,
           one line: "the fit stopped at step 3 before validating: no checkpoint is ranked by val/acc1
           (last.ckpt holds the final weights)"

Everywhere else (no validation configured at all: the monitor can never be found) the warning stays.
"""

from __future__ import annotations

import re
import warnings

import lightning as L
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.model_helpers import is_overridden

# The start of Lightning's message (lightning.pytorch.callbacks.model_checkpoint, _save_topk_checkpoint).
HINT = "`ModelCheckpoint(monitor={monitor!r})` could not find the monitored key"


class FirstValidationNote(Callback):
    """Says in one line that a fit stopped before its first validation, instead of Lightning's logging hint."""

    def __init__(self) -> None:
        self._validated = False
        self._held: warnings.catch_warnings | None = None
        self._caught: list[warnings.WarningMessage] = []
        self._monitors: list[str] = []

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._validated = False

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._validated = True

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Runs before every ModelCheckpoint's on_train_epoch_end (Lightning calls checkpoints last).
        if self._held is not None or self._validated or trainer.fast_dev_run or not _stopping(trainer):
            return
        if not _validates(trainer, pl_module):  # no validation configured: Lightning's warning is right
            return
        self._monitors = [
            cb.monitor
            for cb in trainer.checkpoint_callbacks
            if isinstance(cb, ModelCheckpoint) and cb.monitor and cb.monitor not in trainer.callback_metrics
        ]
        if self._monitors:
            self._held = warnings.catch_warnings(record=True)
            self._caught = self._held.__enter__()

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._release(trainer)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._release(trainer)

    def _release(self, trainer: L.Trainer) -> None:
        """Ends the hold: shows every other warning it caught as usual, and the line instead of the hint."""
        if self._held is None:
            return
        self._held.__exit__(None, None, None)
        self._held = None
        hints = {monitor: re.escape(HINT.format(monitor=monitor)) for monitor in self._monitors}
        for caught in self._caught:
            monitor = next((m for m, rx in hints.items() if re.match(rx, str(caught.message))), None)
            if monitor is None:
                warnings.showwarning(caught.message, caught.category, caught.filename, caught.lineno)
                continue
            saved = " (last.ckpt holds the final weights)" if _saves_last(trainer) else ""
            rank_zero_info(
                f"the fit stopped at step {trainer.global_step} before validating: "
                f"no checkpoint is ranked by {monitor}{saved}"
            )
        self._caught = []


def _stopping(trainer: L.Trainer) -> bool:
    """Whether this epoch end is the fit's last (step budget spent or a stop requested)."""
    max_steps = trainer.max_steps
    return trainer.should_stop or (max_steps is not None and 0 < max_steps <= trainer.global_step)


def _validates(trainer: L.Trainer, pl_module: L.LightningModule) -> bool:
    """Whether the fit has a validation loop (its batch count once loaded, else a loader and a step exist)."""
    if not trainer.limit_val_batches:
        return False
    if trainer.num_val_batches:  # loaded (by the sanity check, or a validation)
        return sum(trainer.num_val_batches) > 0
    source = trainer.datamodule if trainer.datamodule is not None else pl_module
    return is_overridden("validation_step", pl_module) and is_overridden("val_dataloader", source)


def _saves_last(trainer: L.Trainer) -> bool:
    return any(isinstance(cb, ModelCheckpoint) and cb.save_last for cb in trainer.checkpoint_callbacks)
