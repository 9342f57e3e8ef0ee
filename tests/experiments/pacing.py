"""A test-only callback that slows training down, so a signal reliably lands in the middle of a run."""

from __future__ import annotations

import time

import lightning as L


class Pace(L.Callback):
    """Sleeps ``seconds`` after every training step."""

    def __init__(self, seconds: float = 0.05) -> None:
        self.seconds = seconds

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        time.sleep(self.seconds)
