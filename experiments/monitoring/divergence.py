"""Loss divergence and spike detection: a run that blows up stops cleanly and says at which step.

On several ranks the decision is taken on values every rank shares, so every rank stops at the same step (a rank
that stopped alone would leave the others waiting in their next collective for ever):

    each step: this rank's loss --all-gather (world x 3 numbers, one collective)--> every rank's loss
        diverged  when any rank's loss is non-finite, or the largest one exceeds max_loss or
                  diverge_factor x the running median
        spikes and the running median follow the mean over the ranks (the global batch's loss)
"""

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
        value = None if loss is None else float(loss.detach()) if isinstance(loss, torch.Tensor) else float(loss)
        shared = across_ranks(trainer, value)
        if shared is None:  # no rank has a loss this step
            return
        mean, worst = shared
        ref = median(self.history) if len(self.history) >= self.min_steps else None
        if not math.isfinite(worst) or worst > self.max_loss or (ref is not None and worst > self.diverge_factor * ref):
            self.diverged_at = trainer.global_step
            pl_module.log("train/diverged", 1.0)
            trainer.should_stop = True
            return
        if ref is not None and mean > self.spike_factor * ref:
            self.spikes += 1
        pl_module.log("train/spikes", float(self.spikes))
        self.history.append(mean)

    def state_dict(self) -> dict:
        return {"history": list(self.history), "spikes": self.spikes, "diverged_at": self.diverged_at}

    def load_state_dict(self, state_dict: dict) -> None:
        self.history = deque(state_dict["history"], maxlen=self.window)
        self.spikes, self.diverged_at = state_dict["spikes"], state_dict["diverged_at"]


def across_ranks(trainer, value: float | None) -> tuple[float, float] | None:
    """(mean, largest) of the ranks' step losses, the same on every rank: ``nan`` as the largest when any rank's
    loss is not finite; None when no rank has one. One all-gather of three numbers per rank (a host sync), none
    on one process."""
    if getattr(trainer, "world_size", 1) <= 1:
        return None if value is None else (value, value)
    finite = value is not None and math.isfinite(value)
    local = [value if finite else 0.0, float(finite), float(value is not None and not finite)]
    rows = trainer.strategy.all_gather(torch.tensor(local, device=trainer.strategy.root_device))
    rows = rows.reshape(-1, 3).tolist()
    losses = [loss for loss, ok, _ in rows if ok]
    if any(bad for _, _, bad in rows):
        return (sum(losses) / len(losses) if losses else math.nan), math.nan
    return (sum(losses) / len(losses), max(losses)) if losses else None
