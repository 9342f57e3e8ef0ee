"""What a run records about itself: ``summary.json`` (scheme, curves, final metrics, status) for sweeps to
compare, ``progress.json`` (step / total, latest loss, steps/s, ETA; rewritten every few seconds) for a sweep
to show while the run trains, and the marker file that says the directory is a suite run.

    <run_dir>/summary.json     at each validation, at the end, after the final whole-split validation
                               (``whole_split_val``, :mod:`experiments.monitoring.final_validation`), on a stop
                               or crash, after test
    <run_dir>/progress.json    every ``progress_every_s`` seconds while training or testing (a long test's named
                               phases, a DiT's sampling and feature passes, at each phase's start), and at the end
    <run_dir>/.suite-run.json  when the fit starts: only directories holding it are ever deleted by a sweep
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.exceptions import SIGTERMException

from experiments.monitoring.divergence import DivergenceDetector
from experiments.monitoring.records import (  # noqa: F401 - re-exported: where run files were always found
    PROGRESS_FILE,
    RUN_MARKER,
    SUMMARY_FILE,
    mark_run_dir,
)
from experiments.monitoring.throughput import Throughput
from experiments.reliability.layout import trainer_run_dir
from fileio import atomic_write_json


class RunSummary(Callback):
    """Writes ``summary.json`` into the run directory: scheme, curves, final metrics, status.

    The sweep builds its comparison table and plots from these files only.

    Args:
        log_every_n_steps: how often the training loss enters the curve.
        progress_every_s: how often ``progress.json`` is rewritten while the run trains or tests.
    """

    def __init__(self, log_every_n_steps: int = 10, progress_every_s: float = 5.0) -> None:
        if log_every_n_steps < 1 or progress_every_s <= 0:
            raise ValueError(
                f"summary.log_every_n_steps={log_every_n_steps} must be >= 1 and "
                f"summary.progress_every_s={progress_every_s} > 0"
            )
        self.log_every_n_steps = log_every_n_steps
        self.progress = ProgressFile(progress_every_s)
        self.train_curve: list[tuple[int, float]] = []
        self.val_curve: list[tuple[int, dict[str, float]]] = []
        self.start = time.perf_counter()
        self.earlier_wall_time_s = 0.0  # spent before the checkpoint this run resumed from
        self.baseline_loss: float | None = None
        self.status = "running"
        self.whole_split_val: dict[str, Any] | None = None  # {"metrics", "protocol"} of the final validation
        self._last_step: int | None = None  # global_step at the previous train batch end

    def _path(self, trainer: L.Trainer) -> Path | None:
        run_dir = trainer_run_dir(trainer)
        return Path(run_dir) / SUMMARY_FILE if run_dir else None

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.start = time.perf_counter()
        # What a context-free predictor scores on this data (LM: unigram entropy), when the data knows it.
        self.baseline_loss = getattr(trainer.datamodule, "baseline_loss", None)
        log_dir = trainer_run_dir(trainer)
        if log_dir and trainer.global_rank == 0:
            mark_run_dir(Path(log_dir))
            self.progress.start(Path(log_dir) / PROGRESS_FILE, "fit", trainer.global_step)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.progress.total = _total_steps(trainer)  # once: Lightning's estimate walks the loaders
        self.progress.restart_clock(trainer.global_step)  # a resumed fit's step is known only now
        self._last_step = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        step = trainer.global_step
        # Only after a micro-batch the optimizer stepped after: with gradient accumulation the others share the
        # step number, and the step's loss (the mean over its micro-batches) is complete only at its last.
        stepped, self._last_step = step != self._last_step, step
        if stepped and step % self.log_every_n_steps == 0 and "train/loss" in trainer.callback_metrics:
            loss = trainer.callback_metrics["train/loss"].detach().float()  # the mean over ranks (sync_dist)
            self.train_curve.append((step, float(loss)))
        if trainer.global_rank == 0 and self.progress.due():
            loss = trainer.callback_metrics.get("train/loss")
            self.progress.write(step, self.progress.total, float(loss) if loss is not None else None)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != "fit":  # a standalone validate keeps the fit's record
            return
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
        self.val_curve.append((trainer.global_step, metrics))
        self.write(trainer, pl_module)

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        detector = next((c for c in trainer.callbacks if isinstance(c, DivergenceDetector)), None)
        self.status = "diverged" if detector is not None and detector.diverged_at is not None else "finished"
        self.write(trainer, pl_module)
        if trainer.global_rank == 0:
            self.progress.write(trainer.global_step, self.progress.total, self._last_loss(), status=self.status)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self.status = "interrupted" if isinstance(exception, KeyboardInterrupt | SIGTERMException) else "crashed"
        self.write(trainer, pl_module, error=f"{type(exception).__name__}: {exception}")
        if trainer.global_rank == 0 and self.progress.path is not None:
            self.progress.write(trainer.global_step, self.progress.total, self._last_loss(), status=self.status)

    def on_stop_abandoned(self, trainer: L.Trainer, message: str) -> None:
        """Called by :class:`experiments.reliability.signals.BoundedStop` (from its watchdog thread) just before a
        signalled run whose ranks could not stop together exits: the record says interrupted, not running."""
        self.status = "interrupted"
        self.write(trainer, trainer.lightning_module, error=message)
        if trainer.global_rank == 0 and self.progress.path is not None:
            self.progress.write(trainer.global_step, self.progress.total, self._last_loss(), status=self.status)

    def record_whole_split_val(
        self, trainer: L.Trainer, pl_module: L.LightningModule, metrics: dict[str, float], protocol: dict[str, Any]
    ) -> None:
        """Records the final validation over the whole split (``whole_split_val``, with what it read under
        ``whole_split_val_protocol``); ``final_val`` stays the last in-loop validation, as ``val_curve`` ends."""
        self.whole_split_val = {"metrics": dict(metrics), "protocol": dict(protocol)}
        self.write(trainer, pl_module)

    def _last_loss(self) -> float | None:
        return self.train_curve[-1][1] if self.train_curve else None

    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        log_dir = trainer_run_dir(trainer)
        if log_dir and trainer.global_rank == 0:
            self.progress.start(Path(log_dir) / PROGRESS_FILE, "test", 0)
            self.progress.write(0, None, None)  # at once: a sweep shows the run testing, not its finished fit

    def phase_reporter(self, trainer: L.Trainer, phase: str) -> Callable[[int, int | None], None] | None:
        """A ``(done, total)`` callback for one long part of a test (a DiT's ``"sampling"``, its ``"sample
        features"`` ...) that rewrites ``progress.json`` with the phase's own count, rate and ETA; None off rank 0."""
        if trainer.global_rank != 0 or self.progress.path is None:
            return None
        return lambda done, total: self.progress.phase_progress(phase, done, total)

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int, dataloader_idx: int = 0) -> None:
        if trainer.global_rank == 0 and self.progress.due():
            total = trainer.num_test_batches[dataloader_idx] if trainer.num_test_batches else None
            self.progress.write(batch_idx + 1, total if total != float("inf") else None, None)

    def wall_time_s(self) -> float:
        return self.earlier_wall_time_s + time.perf_counter() - self.start

    def state_dict(self) -> dict:  # a resumed run keeps its curves and its clock
        return {"train_curve": self.train_curve, "val_curve": self.val_curve, "wall_time_s": self.wall_time_s()}

    def load_state_dict(self, state_dict: dict) -> None:
        self.train_curve, self.val_curve = list(state_dict["train_curve"]), list(state_dict["val_curve"])
        self.earlier_wall_time_s = state_dict.get("wall_time_s", 0.0)

    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        path = self._path(trainer)
        if path is None:
            return
        if trainer.global_rank != 0:
            return
        self.progress.write(self.progress.step, self.progress.total, None, status="tested")
        payload = json.loads(path.read_text()) if path.exists() else {}
        payload["test"] = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("test/")}
        # How the test metrics were measured (sample counts, samplers, references, task lists ...), when the
        # task records it: a comparison must not rank numbers measured under different protocols.
        protocol = getattr(pl_module, "test_protocol", None)
        if isinstance(protocol, dict) and protocol:
            payload["test_protocol"] = protocol
        atomic_write_json(path, payload)

    def write(self, trainer: L.Trainer, pl_module: L.LightningModule, error: str | None = None) -> None:
        path = self._path(trainer)
        if path is None or trainer.global_rank != 0:
            return
        detector = next((c for c in trainer.callbacks if isinstance(c, DivergenceDetector)), None)
        final_val = self.val_curve[-1][1] if self.val_curve else {}
        # How an MoE routes (experts, top-k, capacity and what it drops), when the task has one
        routing = getattr(pl_module, "routing_record", None)
        speed = next((c for c in trainer.callbacks if isinstance(c, Throughput)), None)
        perf = speed.record(pl_module, trainer.world_size) if speed is not None and speed.last else None
        atomic_write_json(
            path,
            {
                "task": getattr(pl_module, "task", "?"),
                "scheme": getattr(pl_module, "scheme", "?"),
                "lr": pl_module.optim_cfg.lr if hasattr(pl_module, "optim_cfg") else None,
                "params": sum(p.numel() for p in pl_module.parameters()),
                "status": self.status,
                "error": error,
                "steps": trainer.global_step,
                "wall_time_s": self.wall_time_s(),
                "final_train_loss": self.train_curve[-1][1] if self.train_curve else None,
                "final_val": final_val,
                "baseline_loss": self.baseline_loss,
                "diverged_at": detector.diverged_at if detector else None,
                "spikes": detector.spikes if detector else 0,
                "train_curve": self.train_curve,
                "val_curve": self.val_curve,
                **self._whole_split_fields(),
                **({"moe": routing} if isinstance(routing, dict) else {}),
                **({"perf": perf} if perf else {}),
            },
        )

    def _whole_split_fields(self) -> dict[str, Any]:
        if self.whole_split_val is None:
            return {}
        return {
            "whole_split_val": self.whole_split_val["metrics"],
            "whole_split_val_protocol": self.whole_split_val["protocol"],
        }


def _total_steps(trainer: L.Trainer) -> int | None:
    """The step the fit ends at: ``max_steps``, else Lightning's estimate from epochs (None if unbounded)."""
    if trainer.max_steps and trainer.max_steps > 0:
        return int(trainer.max_steps)
    try:
        total = trainer.estimated_stepping_batches
    except Exception:  # noqa: BLE001 - no loader yet, or an infinite one: the total is unknown
        return None
    return int(total) if total != float("inf") else None


class ProgressFile:
    """``progress.json``: a few numbers about where the run stands, rewritten atomically every few seconds.

    Read by the sweep (``experiments.sweeps.progress``) to print a line per run with its ETA; cheap enough to
    write from rank zero of any run (one ``float()`` of the loss per interval, no collective).

    Args:
        every_s: seconds between writes.
    """

    def __init__(self, every_s: float) -> None:
        self.every_s = every_s
        self.path: Path | None = None
        self.stage, self.step, self.total = "fit", 0, None
        self.phase: str | None = None  # a named part of the stage, counted in its own units (images, samples)
        self._last_write = 0.0
        self._rate: float | None = None
        self._mark: tuple[float, int] | None = None  # (time, step) the rate is measured from

    def start(self, path: Path, stage: str, step: int) -> None:
        self.path, self.stage, self.step, self.total, self.phase = path, stage, step, None, None
        self._rate, self._mark = None, (time.monotonic(), step)
        self._last_write = time.monotonic()  # the first write comes one interval in, with a measured rate

    def restart_clock(self, step: int) -> None:
        """Measures the rate from ``step`` on (the step a resumed fit continues from)."""
        self.step, self._rate, self._mark = step, None, (time.monotonic(), step)

    def phase_progress(self, phase: str, done: int, total: int | None) -> None:
        """Progress inside a named phase: written at once when the phase starts, then every interval."""
        if phase != self.phase:
            self.phase = phase
            self.restart_clock(done)
            self.write(done, total, None)
        elif self.due() or (total is not None and done >= total):
            self.write(done, total, None)

    def due(self) -> bool:
        return self.path is not None and time.monotonic() - self._last_write >= self.every_s

    def write(self, step: int, total: int | None, loss: float | None, status: str = "running") -> None:
        if self.path is None:
            return
        now = time.monotonic()
        if self._mark is not None and now > self._mark[0] and step > self._mark[1]:
            rate = (step - self._mark[1]) / (now - self._mark[0])
            self._rate = rate if self._rate is None else 0.5 * self._rate + 0.5 * rate  # smooth out slow steps
            self._mark = (now, step)
        self.step, self.total, self._last_write = step, total, now
        eta = (total - step) / self._rate if self._rate and total is not None and status == "running" else None
        payload = {
            "stage": self.stage, "phase": self.phase, "status": status, "step": step, "total": total, "loss": loss,
            "steps_per_s": self._rate, "eta_s": eta, "updated": time.time(), "pid": os.getpid(),
            "host": socket.gethostname(),
        }  # fmt: skip
        with contextlib.suppress(OSError):  # progress is a courtesy: a full disk must not stop the run here
            atomic_write_json(self.path, payload, indent=None)
