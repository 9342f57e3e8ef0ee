"""``summary.json``: what a run records about itself (scheme, curves, final metrics, status) for sweeps to compare."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.exceptions import SIGTERMException

from experiments.monitoring.divergence import DivergenceDetector


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
        if trainer.sanity_checking or trainer.state.fn != "fit":  # a standalone validate keeps the fit's record
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
        if trainer.global_rank != 0:
            return
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
