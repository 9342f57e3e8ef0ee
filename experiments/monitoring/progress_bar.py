"""The progress bar every run shows: Lightning's own (rich if installed, else tqdm), minus what says nothing.

Dropped: ``v_num``, Lightning's version number, since the run's name is already its directory's name.
"""

from __future__ import annotations

from lightning.pytorch.callbacks import ProgressBar, RichProgressBar, TQDMProgressBar


class _NoVersionBar:
    """Lightning's progress bar without ``v_num`` (the run name, already in the run directory's path)."""

    def get_metrics(self, trainer, pl_module):
        items = super().get_metrics(trainer, pl_module)
        items.pop("v_num", None)
        return items


class SuiteRichProgressBar(_NoVersionBar, RichProgressBar):
    """Lightning's rich progress bar without ``v_num``."""


class SuiteTQDMProgressBar(_NoVersionBar, TQDMProgressBar):
    """Lightning's tqdm progress bar without ``v_num``."""


def progress_bar() -> ProgressBar:
    from lightning.pytorch.callbacks.progress.rich_progress import _RICH_AVAILABLE

    return SuiteRichProgressBar() if _RICH_AVAILABLE else SuiteTQDMProgressBar()


def has_progress_bar(trainer_config) -> bool:
    callbacks = trainer_config.get("callbacks") or []
    return any(isinstance(c, ProgressBar) for c in (callbacks if isinstance(callbacks, list) else [callbacks]))
