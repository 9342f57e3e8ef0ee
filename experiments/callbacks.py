"""Callbacks every run gets: a summary file the sweep reads, and loss divergence / spike detection."""

from __future__ import annotations

import json
import math
import os
import time
from collections import deque
from pathlib import Path
from statistics import median

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.exceptions import SIGTERMException


def atomic_write_json(path: Path, payload: dict) -> None:
    """Writes JSON through a temp file and ``os.replace`` so a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2, default=float))
    os.replace(tmp, path)


class RunSummary(Callback):
    """Writes ``summary.json`` into the run directory: scheme, curves, final metrics, status.

    The sweep builds its comparison table and plots from these files only.

    Args:
        log_every_n_steps: how often the training loss enters the curve.
    """

    def __init__(self, log_every_n_steps: int = 10) -> None:
        self.log_every_n_steps = log_every_n_steps
        self.train_curve: list[tuple[int, float]] = []
        self.val_curve: list[tuple[int, dict[str, float]]] = []
        self.start = time.perf_counter()
        self.earlier_wall_time_s = 0.0  # spent before the checkpoint this run resumed from
        self.baseline_loss: float | None = None
        self.status = "running"

    def _path(self, trainer: L.Trainer) -> Path | None:
        return Path(trainer.log_dir) / "summary.json" if trainer.log_dir else None

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.start = time.perf_counter()
        # What a context-free predictor scores on this data (LM: unigram entropy), when the data knows it.
        self.baseline_loss = getattr(trainer.datamodule, "baseline_loss", None)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        step = trainer.global_step
        if step % self.log_every_n_steps == 0 and "train/loss" in trainer.callback_metrics:
            loss = trainer.callback_metrics["train/loss"].detach().float()
            if trainer.world_size > 1:  # each rank logged its own shard's loss: the curve holds their mean
                loss = trainer.strategy.reduce(loss, reduce_op="mean")
            self.train_curve.append((step, float(loss)))

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
        self.val_curve.append((trainer.global_step, metrics))
        self.write(trainer, pl_module)

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        detector = next((c for c in trainer.callbacks if isinstance(c, DivergenceDetector)), None)
        self.status = "diverged" if detector is not None and detector.diverged_at is not None else "finished"
        self.write(trainer, pl_module)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self.status = "interrupted" if isinstance(exception, KeyboardInterrupt | SIGTERMException) else "crashed"
        self.write(trainer, pl_module, error=f"{type(exception).__name__}: {exception}")

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
        payload = json.loads(path.read_text()) if path.exists() else {}
        payload["test"] = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("test/")}
        atomic_write_json(path, payload)

    def write(self, trainer: L.Trainer, pl_module: L.LightningModule, error: str | None = None) -> None:
        path = self._path(trainer)
        if path is None or trainer.global_rank != 0:
            return
        detector = next((c for c in trainer.callbacks if isinstance(c, DivergenceDetector)), None)
        final_val = self.val_curve[-1][1] if self.val_curve else {}
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
            },
        )


class DivergenceDetector(Callback):
    """Stops a run whose training loss is non-finite or explodes; counts loss spikes.

    A step's loss is a *spike* when it exceeds ``spike_factor`` times the running median of the
    last ``window`` losses, and *divergence* when it is non-finite or exceeds ``diverge_factor``
    times that median (or ``max_loss``). A diverged run stops cleanly: Lightning's checkpoint
    callbacks keep the last good checkpoint and the summary records the step.

    Args:
        window: running-median window in steps.
        spike_factor: spike threshold over the running median.
        diverge_factor: divergence threshold over the running median.
        max_loss: absolute divergence threshold (e.g. well above ln(vocab) for an LM).
        min_steps: steps before the median-based tests start.
    """

    def __init__(
        self,
        window: int = 50,
        spike_factor: float = 1.5,
        diverge_factor: float = 4.0,
        max_loss: float = float("inf"),
        min_steps: int = 20,
    ) -> None:
        self.window, self.spike_factor, self.diverge_factor = window, spike_factor, diverge_factor
        self.max_loss, self.min_steps = max_loss, min_steps
        self.history: deque[float] = deque(maxlen=window)
        self.spikes = 0
        self.diverged_at: int | None = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        if loss is None:
            return
        value = float(loss.detach()) if isinstance(loss, torch.Tensor) else float(loss)
        ref = median(self.history) if len(self.history) >= self.min_steps else None
        if not math.isfinite(value) or value > self.max_loss or (ref is not None and value > self.diverge_factor * ref):
            self.diverged_at = trainer.global_step
            pl_module.log("train/diverged", 1.0)
            trainer.should_stop = True
            return
        if ref is not None and value > self.spike_factor * ref:
            self.spikes += 1
        pl_module.log("train/spikes", float(self.spikes))
        self.history.append(value)

    def state_dict(self) -> dict:
        return {"history": list(self.history), "spikes": self.spikes, "diverged_at": self.diverged_at}

    def load_state_dict(self, state_dict: dict) -> None:
        self.history = deque(state_dict["history"], maxlen=self.window)
        self.spikes, self.diverged_at = state_dict["spikes"], state_dict["diverged_at"]
