"""The progress bar every run shows: Lightning's own (rich if installed, else tqdm), minus what says nothing.

Dropped: ``v_num``, Lightning's version number, since the run's name is already its directory's name.
Changed: the rich bar's label in a run budgeted in steps (``max_steps``, no ``max_epochs``). Lightning labels
it ``Epoch 0/-2`` there (its ``max_epochs`` is -1); this bar says ``Epoch 0, step 60/120``: the global step
against the budget, while the bar itself counts the batches of the current epoch, as Lightning's does.
"""

from __future__ import annotations

from lightning.pytorch.callbacks import ProgressBar, RichProgressBar, TQDMProgressBar


class _NoVersionBar:
    """Lightning's progress bar without ``v_num`` (the run name, already in the run directory's path)."""

    def get_metrics(self, trainer, pl_module):
        items = super().get_metrics(trainer, pl_module)
        items.pop("v_num", None)
        return items


def step_budget(trainer) -> int | None:
    """The fit's step budget when steps, not epochs, bound it (Lightning sets ``max_epochs`` to -1 then)."""
    max_steps = trainer.max_steps
    return max_steps if trainer.max_epochs == -1 and max_steps is not None and max_steps > 0 else None


class SuiteRichProgressBar(_NoVersionBar, RichProgressBar):
    """Lightning's rich progress bar without ``v_num``, labelled with the step budget in step-based runs."""

    def _get_train_description(self, current_epoch: int) -> str:  # Lightning's hook for the label
        if self.trainer.max_epochs != -1:  # epochs bound the run: Lightning's "Epoch 3/99" is right
            return super()._get_train_description(current_epoch)
        budget = step_budget(self.trainer)
        label = f"Epoch {current_epoch}" + (f", step {self.trainer.global_step}/{budget}" if budget else "")
        return f"{label:{len(self.validation_description)}}"  # as Lightning pads it: no flicker after validation

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if self.progress is not None and self.train_progress_bar_id is not None and step_budget(trainer):
            # the step moved: relabel before Lightning's update redraws the bar
            label = self._get_train_description(trainer.current_epoch)
            self.progress.update(self.train_progress_bar_id, description=label)
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)


class SuiteTQDMProgressBar(_NoVersionBar, TQDMProgressBar):
    """Lightning's tqdm progress bar without ``v_num`` (its label, ``Epoch N``, has no total to get wrong)."""


def progress_bar() -> ProgressBar:
    from lightning.pytorch.callbacks.progress.rich_progress import _RICH_AVAILABLE

    return SuiteRichProgressBar() if _RICH_AVAILABLE else SuiteTQDMProgressBar()


def has_progress_bar(trainer_config) -> bool:
    callbacks = trainer_config.get("callbacks") or []
    return any(isinstance(c, ProgressBar) for c in (callbacks if isinstance(callbacks, list) else [callbacks]))
