"""A stop signal ends a multi-process run in bounded time: the ranks stop together when they can, every rank exits
at a deadline when they cannot.

    SIGTERM (or a first Ctrl-C, through checkpointing's routing) during fit on W > 1 ranks
      -> the handler only notes it: no collective inside a signal handler (Lightning's own handler broadcasts
         there, which meets whatever collective another rank is in at that moment: the job hung)
      -> at the end of every training step (and validation batch) the ranks vote (one all-reduce of one number):
         when any rank noted a signal, every rank raises Lightning's stop flag at that same point, so all of them
         stop after it, save interrupted.ckpt together (checkpointing.InterruptCheckpoint) and exit 143 / 130
    one process, or validate / test / predict: the handler raises Lightning's flag at once, as Lightning does
    on W > 1 ranks, always: a watchdog thread, woken by the signal even while the main thread waits inside a
      collective, gives the run ``grace_s`` seconds to end; past them the rank prints one ``error:`` line, marks
      the run interrupted (callbacks with ``on_stop_abandoned``: summary.json), kills the ranks it started and
      exits 143 / 130 at once, with no new checkpoint: the newest regular one is the resume point

The watchdog hears the signal through :func:`signal.set_wakeup_fd`, which the interpreter writes from its C-level
handler, so it does not need the main thread to reach Python code. Signals Lightning forwards to the ranks it
started itself (``trainer.strategy.launcher``) are forwarded from the watchdog thread at once for the same reason.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
import time
from typing import Annotated, Any

import lightning as L
import torch
from annotated_types import Gt
from lightning.pytorch.callbacks import Callback

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Watchdog:
    """One per process: a daemon thread that wakes on SIGTERM / SIGINT (through the wakeup fd) and ends the process
    ``grace_s`` seconds later if the run that was signalled is still running then.

    The wakeup fd stays with the process once set (it can only be changed from the main thread, and a run ends
    wherever it ends); :meth:`watch` re-installs it if something else took it since.
    """

    _instance: Watchdog | None = None

    def __init__(self) -> None:
        self._reader, self._writer = socket.socketpair()
        self._writer.setblocking(False)
        self._lock = threading.Lock()
        self._stop: BoundedStop | None = None  # the run being watched
        self._thread = threading.Thread(target=self._loop, name="bounded-stop-watchdog", daemon=True)
        self._thread.start()

    @classmethod
    def watch(cls, stop: BoundedStop) -> bool:
        """Watches ``stop``'s run from now on; False when it cannot (not the main thread)."""
        if threading.current_thread() is not threading.main_thread():
            return False
        if cls._instance is None:
            cls._instance = cls()
        self = cls._instance
        signal.set_wakeup_fd(self._writer.fileno(), warn_on_full_buffer=False)  # (one fd per process: the run's)
        with self._lock:
            self._stop = stop
        return True

    @classmethod
    def unwatch(cls, stop: BoundedStop) -> None:
        if cls._instance is not None:
            with cls._instance._lock:
                if cls._instance._stop is stop:
                    cls._instance._stop = None

    def _loop(self) -> None:
        while True:
            data = self._reader.recv(64)
            for signum in data:
                if signum in STOP_SIGNALS:
                    with self._lock:
                        stop = self._stop
                    if stop is not None:
                        stop._heard(signal.Signals(signum))


class BoundedStop(Callback):
    """Makes the ranks of a run agree on a stop signal and bounds how long the stop may take.

    Args:
        grace_s: seconds from a SIGTERM / Ctrl-C to the end of the process when the ranks cannot stop together
            (a rank waits in a collective another rank never joins, or is gone). It must cover finishing a step
            and saving ``interrupted.ckpt``, and stay below the time a scheduler allows after its signal (a sweep's
            ``signal_delay_s``, 120 s by default; SLURM's KillWait after ``scancel``), or the scheduler's SIGKILL
            comes first.
    """

    def __init__(self, grace_s: Annotated[float, Gt(0)] = 90.0) -> None:
        self.grace_s = grace_s
        self._trainer: L.Trainer | None = None
        self._pending: signal.Signals | None = None  # a signal this rank noted, not yet voted on
        self._heard_at: float | None = None  # when the watchdog heard the run's first signal (monotonic)
        self._watched = False
        self._run = 0  # counts the runs (fit, test ...) this callback watched: a deadline belongs to one

    # -- installing -----------------------------------------------------------------------------------------

    def _install(self, trainer: L.Trainer) -> None:
        # After Lightning registered its handlers (its teardown puts the original ones back on every exit path)
        if threading.current_thread() is not threading.main_thread():
            return
        if self._trainer is trainer and signal.getsignal(signal.SIGTERM) == self._on_sigterm:
            return  # (validation inside fit: already in place)
        self._trainer, self._pending, self._heard_at, self._run = trainer, None, None, self._run + 1
        signal.signal(signal.SIGTERM, self._on_sigterm)
        self._watched = Watchdog.watch(self)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._install(trainer)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._install(trainer)  # (inside fit it is already in place)

    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._install(trainer)

    def on_predict_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._install(trainer)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        Watchdog.unwatch(self)
        self._trainer = None

    # -- the signal -----------------------------------------------------------------------------------------

    def _voting(self, trainer: L.Trainer) -> bool:
        return trainer.world_size > 1 and trainer.state.fn is not None and trainer.state.fn.value == "fit"

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        trainer = self._trainer
        if trainer is None:
            return
        self.note(trainer, signal.Signals(signum))
        if not self._watched:  # no watchdog thread forwarded it: what Lightning's handler does
            self._forward(trainer, signum)
        previous = trainer._signal_connector._original_handlers.get(signal.SIGTERM)
        if callable(previous):  # a handler from before the run (Lightning calls it too)
            previous(signum, frame)

    def note(self, trainer: L.Trainer, signum: signal.Signals) -> None:
        """A stop signal arrived on this rank: noted for the next vote (fit on several ranks), else Lightning's
        stop flag at once. (The suite's Ctrl-C routing calls this too.)"""
        if self._voting(trainer):
            self._pending = self._pending or signum
        else:
            trainer._signal_connector.received_sigterm = True

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        self._vote(trainer)

    def on_validation_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        self._vote(trainer)  # a long validation inside fit stops after the same batch on every rank, too

    def _vote(self, trainer: L.Trainer) -> None:
        """Every rank raises Lightning's stop flag at this same batch when any rank noted a signal."""
        if self._trainer is not trainer or not self._voting(trainer):
            return
        flag = torch.tensor([1.0 if self._pending is not None else 0.0], device=trainer.strategy.root_device)
        if float(trainer.strategy.reduce(flag, reduce_op="max")) > 0:
            trainer._signal_connector.received_sigterm = True

    # -- the watchdog's side (its own thread) ----------------------------------------------------------------

    def _heard(self, signum: signal.Signals) -> None:
        trainer = self._trainer
        if trainer is None or self._heard_at is not None:
            return
        self._heard_at = time.monotonic()
        self._forward(trainer, signum)
        if trainer.world_size <= 1:  # one process waits on no other: its stop takes as long as its step and save
            return
        threading.Thread(target=self._deadline, args=(trainer, signum, self._run), daemon=True).start()

    def _deadline(self, trainer: L.Trainer, signum: signal.Signals, run: int) -> None:
        time.sleep(self.grace_s)
        if self._run != run or self._trainer is not trainer or trainer.state.stage is None:
            return  # the run ended in time (saved or not), or another one began
        name = "SIGINT" if signum == signal.SIGINT else "SIGTERM"
        where = f" on rank {trainer.global_rank} of {trainer.world_size}" if trainer.world_size > 1 else ""
        message = (
            f"interrupted by {name} at step {trainer.global_step}{where}: the run did not stop within "
            f"{self.grace_s:g} s (a rank waits in a collective another rank never joins, or is gone); "
            "no checkpoint saved, exiting (resume: the same command with --ckpt_path last)"
        )
        for callback in trainer.callbacks:
            hook = getattr(callback, "on_stop_abandoned", None)
            if callable(hook):
                with contextlib.suppress(Exception):  # the exit must happen whatever a record does
                    hook(trainer, message)
        print(f"error: {message}", file=sys.stderr, flush=True)
        self._forward(trainer, signal.SIGKILL)
        os._exit(128 + int(signum))

    @staticmethod
    def _forward(trainer: L.Trainer, signum: int) -> None:
        """Passes ``signum`` on to the ranks this process started (Lightning's launcher), as Lightning does."""
        launcher = trainer.strategy.launcher
        for proc in getattr(launcher, "procs", None) or []:
            try:
                if proc.poll() is None:
                    proc.send_signal(signum)
            except OSError:
                pass


def bounded_stop(trainer: L.Trainer) -> BoundedStop | None:
    """The run's :class:`BoundedStop` callback, if it has one."""
    return next((c for c in trainer.callbacks if isinstance(c, BoundedStop)), None)


def note_stop(trainer: L.Trainer, signum: signal.Signals) -> None:
    """Asks ``trainer`` to stop at the next safe point for ``signum`` (a handler of the suite's own, e.g. Ctrl-C's):
    through the ranks' vote when the run has a :class:`BoundedStop`, else Lightning's flag at once."""
    stop = bounded_stop(trainer)
    if stop is not None and stop._trainer is trainer:
        stop.note(trainer, signum)
    else:
        trainer._signal_connector.received_sigterm = True
