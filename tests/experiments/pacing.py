"""Test-only callbacks that make a signal land in the middle of a run: slow every step down, or hold at one step."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import lightning as L


class Pace(L.Callback):
    """Sleeps ``seconds`` after every training step."""

    def __init__(self, seconds: float = 0.05) -> None:
        self.seconds = seconds

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        time.sleep(self.seconds)


class HoldForSignal(L.Callback):
    """The first run to finish step ``at_step`` writes ``ready`` and waits there until its trainer has received
    SIGTERM (at most ``timeout_s``): the signal lands mid-run without pacing every step. A run that finds
    ``ready`` already written (the resumed run, the sweep's next run) never waits.

    Validation and checkpointing of a step run after this hook: hold one step after a checkpoint step so
    that checkpoint is on disk while the run waits.
    """

    def __init__(self, ready: str, at_step: int = 1, timeout_s: float = 300.0) -> None:
        self.ready, self.at_step, self.timeout_s = Path(ready), at_step, timeout_s

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if trainer.global_step != self.at_step or self.ready.exists():
            return
        self.ready.write_text(str(os.getpid()))
        deadline = time.monotonic() + self.timeout_s
        while not trainer.received_sigterm and time.monotonic() < deadline:
            time.sleep(0.01)  # the handler runs between these sleeps and sets the flag


class SignalAtStep(L.Callback):
    """Sends SIGTERM to this process when step ``at_step`` ends: every rank of a multi-process run gets its own
    signal at the same step, as a cluster's preemption signals every task of a job."""

    def __init__(self, at_step: int = 1) -> None:
        self.at_step = at_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if trainer.global_step == self.at_step:
            os.kill(os.getpid(), signal.SIGTERM)
