"""Loss divergence and spike detection: a run that blows up stops cleanly and says at which step.

On several ranks the decision is taken on values every rank shares, so every rank stops at the same step (a rank
that stopped alone would leave the others waiting in their next collective for ever):

    every_n_steps batches: the ranks' losses of those batches, kept on the device until then
        --all-gather (world x N x 3 numbers, one collective, the one host read)--> every rank's losses
        each batch in order:
            diverged  when any rank's loss is non-finite, or the largest one exceeds max_loss or
                      diverge_factor x the running median
            spikes and the running median follow the mean over the ranks (the global batch's loss)

``every_n_steps`` (default 1: every training batch, the stop at the batch that diverged) sets how often the host
waits for the losses; between checks nothing is read, so a GPU keeps its queue of work. With N > 1 a divergence is
recorded at its own step (``diverged_at``) and every rank stops at the next check, at most N - 1 batches later, the
same batch on every rank; the end of training checks what is left.
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
        every_n_steps: training batches between two checks (each check one host read and, on several ranks, one
            all-gather); the losses in between wait on the device.
    """

    def __init__(
        self,
        window: Annotated[int, Ge(1)] = 50,
        spike_factor: Annotated[float, Gt(1)] = 1.5,
        diverge_factor: Annotated[float, Gt(1)] = 4.0,
        max_loss: Annotated[float, Gt(0)] = float("inf"),
        min_steps: Annotated[int, Ge(0)] = 20,
        every_n_steps: Annotated[int, Ge(1)] = 1,
    ) -> None:
        self.window, self.spike_factor, self.diverge_factor = window, spike_factor, diverge_factor
        self.max_loss, self.min_steps, self.every_n_steps = max_loss, min_steps, every_n_steps
        self.history: deque[float] = deque(maxlen=window)
        self.spikes = 0
        self.diverged_at: int | None = None
        self._pending: list[tuple[int, torch.Tensor | float | None]] = []  # (step, loss) not yet checked

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        value = loss.detach() if isinstance(loss, torch.Tensor) else None if loss is None else float(loss)
        self._pending.append((trainer.global_step, value))
        if len(self._pending) >= self.every_n_steps:  # every rank sees the same batches: they check together
            self._check(trainer, pl_module)

    def on_train_end(self, trainer, pl_module) -> None:
        if self._pending and self.diverged_at is None:  # what the last checks did not see (every rank ends here)
            self._check(trainer, pl_module, stop=False)

    def _check(self, trainer, pl_module, stop: bool = True) -> None:
        pending, self._pending = self._pending, []
        for step, shared in zip((s for s, _ in pending), across_ranks(trainer, [v for _, v in pending]), strict=True):
            if shared is None:  # no rank has a loss this step
                continue
            mean, worst = shared
            ref = median(self.history) if len(self.history) >= self.min_steps else None
            too_large = worst > self.max_loss or (ref is not None and worst > self.diverge_factor * ref)
            if not math.isfinite(worst) or too_large:
                self.diverged_at = step
                if stop:
                    pl_module.log("train/diverged", 1.0)
                    trainer.should_stop = True
                return
            if ref is not None and mean > self.spike_factor * ref:
                self.spikes += 1
            self.history.append(mean)
        if stop:
            pl_module.log("train/spikes", float(self.spikes))

    def state_dict(self) -> dict:
        pending = [(step, None if v is None else float(v)) for step, v in self._pending]  # read at a save only
        return {"history": list(self.history), "spikes": self.spikes, "diverged_at": self.diverged_at,
                "pending": pending}  # fmt: skip

    def load_state_dict(self, state_dict: dict) -> None:
        self.history = deque(state_dict["history"], maxlen=self.window)
        self.spikes, self.diverged_at = state_dict["spikes"], state_dict["diverged_at"]
        self._pending = [(step, value) for step, value in state_dict.get("pending", [])]


def across_ranks(trainer, values: list[torch.Tensor | float | None]) -> list[tuple[float, float] | None]:
    """Per step, the (mean, largest) of the ranks' losses ``values`` (this rank's, one per step), the same on every
    rank: ``nan`` as the largest when any rank's loss is not finite; None when no rank has one. One host read of
    every step's numbers together, and on several ranks one all-gather of 3 numbers per step and rank."""
    if not values:
        return []
    device = trainer.strategy.root_device if getattr(trainer, "strategy", None) is not None else torch.device("cpu")
    rows = []
    for value in values:  # on the device: [loss if finite else 0, has a finite loss, has a non-finite loss]
        if value is None:
            rows.append(torch.zeros(3, device=device))
            continue
        loss = torch.as_tensor(value, dtype=torch.float32, device=device).reshape(())
        finite = torch.isfinite(loss)
        rows.append(torch.stack([torch.where(finite, loss, 0.0), finite.float(), (~finite).float()]))
    local = torch.stack(rows)  # (steps, 3)
    if getattr(trainer, "world_size", 1) > 1:
        local = trainer.strategy.all_gather(local)  # (world, steps, 3)
    table = local.reshape(-1, len(values), 3).transpose(0, 1).tolist()  # the host read: [step][rank][3]
    out: list[tuple[float, float] | None] = []
    for ranks in table:
        losses = [loss for loss, ok, _ in ranks if ok]
        if any(bad for _, _, bad in ranks):
            out.append(((sum(losses) / len(losses) if losses else math.nan), math.nan))
        else:
            out.append((sum(losses) / len(losses), max(losses)) if losses else None)
    return out
