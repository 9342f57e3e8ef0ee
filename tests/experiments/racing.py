"""Test-only callbacks for races between commands: count the fits that start, and hold runs at a step until the
test lets them go (a barrier across processes made of files, no sleeps to guess)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import lightning as L

from experiments.reliability.layout import trainer_run_dir


class RecordFit(L.Callback):
    """Appends ``<pid> <run directory>`` to ``record`` when a fit starts: a run trained twice shows twice."""

    def __init__(self, record: str) -> None:
        self.record = Path(record)

    def on_fit_start(self, trainer, pl_module) -> None:
        with self.record.open("a") as f:
            f.write(f"{os.getpid()} {trainer_run_dir(trainer)}\n")


class HoldUntil(L.Callback):
    """At the end of step ``at_step`` writes ``<ready_dir>/<pid>`` and waits until ``release`` exists (at most
    ``timeout_s``): the test sees every run it expects held at once, does its checks, then lets them go."""

    def __init__(self, ready_dir: str, release: str, at_step: int = 1, timeout_s: float = 300.0) -> None:
        self.ready_dir, self.release = Path(ready_dir), Path(release)
        self.at_step, self.timeout_s = at_step, timeout_s

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if trainer.global_step != self.at_step:
            return
        self.ready_dir.mkdir(parents=True, exist_ok=True)
        (self.ready_dir / str(os.getpid())).write_text(str(trainer_run_dir(trainer)))
        deadline = time.monotonic() + self.timeout_s
        while not self.release.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
