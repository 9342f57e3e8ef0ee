"""Loss divergence and spike detection: a run that blows up stops cleanly and says at which step."""

# Annotations are evaluated (no ``from __future__ import annotations``): jsonargparse checks the
# ``Annotated`` bounds while parsing only then.

import math
from collections import deque
from statistics import median
from typing import Annotated

import torch
from annotated_types import Ge, Gt
from lightning.pytorch.callbacks import Callback


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
        window: Annotated[int, Ge(1)] = 50,
        spike_factor: Annotated[float, Gt(1)] = 1.5,
        diverge_factor: Annotated[float, Gt(1)] = 4.0,
        max_loss: Annotated[float, Gt(0)] = float("inf"),
        min_steps: Annotated[int, Ge(0)] = 20,
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
