"""A fit's last word: one validation over the whole validation split, recorded in ``summary.json``.

In-loop validations are kept short (``trainer.limit_val_batches``; the LM reads ``eval_samples`` evenly spaced
windows): they draw the curve. The number a comparison ranks runs by should carry as little of the evaluation's
own noise as the split allows, so when a fit ends its budget the command line runs one more validation, on the
same trainer and the final weights, over every batch of the split:

    fit ends (its step / epoch budget, or an early stop)      -> trainer.validate(limit_val_batches=1.0), on every
                                                               rank (DDP / FSDP2 / TP: the collectives match)
    a DataModule whose validation set is a sample of its split -> read whole inside its ``whole_val_split()``
                                                               (the LM: every window tiling the split)
    summary.json                                               -> ``whole_split_val``: the ``val/*`` metrics;
                                                               ``whole_split_val_protocol``: step, batches per rank,
                                                               samples, tokens (LM), ranks

It is skipped when the fit diverged (:class:`~experiments.monitoring.divergence.DivergenceDetector`), under
``fast_dev_run``, when validation is switched off (``limit_val_batches: 0``) or the run has no validation
data, and with ``--final_validation.enabled=false``. The loggers are left out of it: TensorBoard's ``val/``
curves stay the in-loop validations (a second point at the last step, measured on other data, would read as a
jump). Under several data-parallel ranks Lightning's evaluation sampler pads the split to a multiple of the ranks
(at most ranks - 1 repeated samples).
"""

from __future__ import annotations

import contextlib
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.model_helpers import is_overridden

from experiments.monitoring.divergence import DivergenceDetector

__all__ = ["FinalValidation"]


class FinalValidation(Callback):
    """Configures the whole-split validation the command line runs after ``fit`` (:meth:`run`).

    Args:
        enabled: Run it (a run whose split is large and whose number nobody compares may skip it).
    """

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.result: dict[str, Any] | None = None

    def skip_reason(self, trainer: L.Trainer, model: L.LightningModule, datamodule: Any) -> str | None:
        """Why the final validation does not run, or None when it does."""
        if not self.enabled:
            return "final_validation.enabled is false"
        if trainer.fast_dev_run:
            return "fast_dev_run"
        if not trainer.limit_val_batches:
            return "validation is off (limit_val_batches: 0)"
        detector = next((c for c in trainer.callbacks if isinstance(c, DivergenceDetector)), None)
        if detector is not None and detector.diverged_at is not None:
            return f"the run diverged at step {detector.diverged_at}"
        source = datamodule if datamodule is not None else model
        if not (is_overridden("validation_step", model) and is_overridden("val_dataloader", source)):
            return "no validation data"
        return None

    def run(self, trainer: L.Trainer, model: L.LightningModule, datamodule: Any) -> dict[str, Any] | None:
        """Validates ``model`` on the whole validation split with ``trainer`` (after its fit; every rank calls it)
        and hands the result to the run's summary (:class:`~experiments.monitoring.summary.RunSummary`).

        Returns:
            ``{"metrics": {...}, "protocol": {...}}``, or None when skipped (:meth:`skip_reason`).
        """
        reason = self.skip_reason(trainer, model, datamodule)
        if reason is not None:
            rank_zero_info(f"final validation on the whole split skipped: {reason}")
            return None
        whole = getattr(datamodule, "whole_val_split", None)
        limit, loggers = trainer.limit_val_batches, trainer.loggers
        trainer.limit_val_batches, trainer.loggers = 1.0, []
        try:
            with whole() if callable(whole) else contextlib.nullcontext():
                results = trainer.validate(model, datamodule=datamodule, verbose=False)
                protocol = self._protocol(trainer, datamodule)
        finally:
            trainer.limit_val_batches, trainer.loggers = limit, loggers
        metrics = {k: float(v) for result in results for k, v in result.items() if k.startswith("val/")}
        self.result = {"metrics": metrics, "protocol": protocol}
        summary = next((c for c in trainer.callbacks if hasattr(c, "record_whole_split_val")), None)
        if summary is not None:
            summary.record_whole_split_val(trainer, model, metrics, protocol)
        shown = ", ".join(f"{k} {v:.6g}" for k, v in sorted(metrics.items()))
        size = f"{protocol['samples']:,} samples" + (f", {protocol['tokens']:,} tokens" if "tokens" in protocol else "")
        rank_zero_info(f"final validation on the whole split ({size}, step {protocol['step']}): {shown}")
        return self.result

    @staticmethod
    def _protocol(trainer: L.Trainer, datamodule: Any) -> dict[str, Any]:
        """What the final validation read: the step, its batches and samples (tokens for token windows)."""
        loaders = trainer.val_dataloaders
        loaders = loaders if isinstance(loaders, list | tuple) else [loaders] if loaders is not None else []
        samples = sum(len(loader.dataset) for loader in loaders if hasattr(loader, "dataset"))
        protocol: dict[str, Any] = {
            "scope": "whole validation split",
            "step": trainer.global_step,
            "batches_per_rank": int(sum(trainer.num_val_batches)),
            "samples": samples,
            "ranks": trainer.world_size,
        }
        seq_len = getattr(datamodule, "seq_len", None)
        if isinstance(seq_len, int):
            protocol["tokens"] = samples * seq_len  # predicted tokens: seq_len targets per window
        return protocol
