"""Test-only callbacks that make the ranks of a multi-process run disagree: a non-finite loss on one rank, one rank
held (or stuck for good) while the others wait in their next collective, and a record of what each rank saw.

Used by tests/experiments/test_parallel.py's shared launch (tests/experiments/parallel_worker.py jobs).
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import lightning as L
import torch


class PoisonLoss(L.Callback):
    """On rank ``rank`` only, the loss of step ``at_step`` reads as NaN to the callbacks after this one (a bf16
    overflow in that rank's micro-batch); the other ranks' losses are untouched."""

    def __init__(self, rank: int = 1, at_step: int = 2) -> None:
        self.rank, self.at_step = rank, at_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if trainer.global_rank == self.rank and trainer.global_step == self.at_step and isinstance(outputs, dict):
            outputs["loss"] = torch.full_like(outputs["loss"], float("nan"))


class RankRecord(L.Callback):
    """Writes ``<out>/rank<R>.json`` when the fit ends (or stops on an exception): this rank's pid, its own loss at
    every step and the step it ended at."""

    def __init__(self, out: str) -> None:
        self.out = Path(out)
        self.losses: list[float] = []
        self.started = time.time()

    def on_fit_start(self, trainer, pl_module) -> None:
        self.started = time.time()
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / f"pid{trainer.global_rank}").write_text(str(os.getpid()))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        self.losses.append(float(loss.detach()))

    def _write(self, trainer) -> None:
        record = {"losses": self.losses, "step": trainer.global_step, "started": self.started, "ended": time.time()}
        (self.out / f"rank{trainer.global_rank}.json").write_text(json.dumps(record))

    def on_fit_end(self, trainer, pl_module) -> None:
        self._write(trainer)

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        self._write(trainer)


class SignalWhileHeld(L.Callback):
    """Rank ``rank`` stops at the end of step ``at_step`` (or of the first validation batch after it) while the
    other ranks go on into their next collective and wait there; after ``hold_s`` it sends SIGTERM to every rank
    (pids from :class:`RankRecord`'s ``out``) as a scheduler does (or to itself only), and writes
    ``<out>/signalled`` (the time). Then it holds ``stuck_s`` more seconds: a short hold is a slow rank that comes
    back, a long one a rank stuck for good (a hung file system, a dead device)."""

    def __init__(
        self,
        out: str,
        rank: int = 1,
        at_step: int = 2,
        hold_s: float = 1.5,
        stuck_s: float = 1.0,
        in_validation: bool = False,
        signal_all: bool = True,
    ) -> None:
        self.out, self.rank, self.at_step, self.hold_s, self.stuck_s = Path(out), rank, at_step, hold_s, stuck_s
        self.in_validation = in_validation  # held at the first validation batch after step at_step instead
        self.signal_all = signal_all  # False: only this rank is signalled (a `kill` of one process)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if not self.in_validation:
            self._hold(trainer)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int, *args) -> None:
        if self.in_validation and batch_idx == 0 and not trainer.sanity_checking:
            self._hold(trainer)

    def _hold(self, trainer) -> None:
        if trainer.global_rank != self.rank or trainer.global_step != self.at_step:
            return
        time.sleep(self.hold_s)  # the others reach their next collective meanwhile
        (self.out / "signalled").write_text(str(time.time()))
        others = [r for r in range(trainer.world_size) if r != self.rank and self.signal_all]
        for rank in [*others, self.rank]:  # this rank last, a moment later: the waiting ranks' deadlines come first
            os.kill(int((self.out / f"pid{rank}").read_text()), signal.SIGTERM)
            time.sleep(0.5)
        deadline = time.monotonic() + self.stuck_s
        while time.monotonic() < deadline:  # a Python loop: this rank's own signal handler runs in it
            time.sleep(0.05)
