"""The training loss of an optimizer step: the mean over its micro-batches, not the last micro-batch's.

With gradient accumulation (``global_batch_size``, :mod:`datamodules.batching`) one optimizer step sums the
gradients of k micro-batches, and its loss is the mean of their k losses (the loss of the global batch).
Lightning sends a step's logged values to the logger once, after the micro-batch the optimizer steps after, with
the value logged last: a task that logs each micro-batch's loss reports the k-th micro-batch alone (k times the
variance, and a curve that depends on the accumulation). A task logs the running mean instead::

    self.log("train/loss", self.step_mean(loss, self.global_step), sync_dist=True)

Micro-batches belong to the same step while ``global_step`` stays the same (it advances after each optimizer
step), so the running mean restarts at each step's first micro-batch and equals the step's mean at its last,
when Lightning logs it. Without accumulation every step has one micro-batch and the value is the loss itself.
Under several data-parallel ranks, ``sync_dist`` averages the ranks' means: equal micro-batches make it the
global batch's mean.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["StepMean"]


class StepMean:
    """Running mean of a per-micro-batch value over the micro-batches of the current optimizer step."""

    def __init__(self) -> None:
        self._step: int | None = None
        self._sum: Tensor | None = None
        self._count = 0

    def __call__(self, value: Tensor, step: int) -> Tensor:
        """Adds ``value`` (detached) for optimizer step ``step``; returns the mean of the step's values so far.

        Args:
            value: This micro-batch's value (a scalar tensor).
            step: The trainer's ``global_step`` (optimizer steps taken before this micro-batch).
        """
        value = value.detach()
        if step != self._step or self._sum is None or self._sum.device != value.device:
            self._step, self._sum, self._count = step, torch.zeros_like(value, dtype=torch.float32), 0
        self._sum = self._sum + value.float()
        self._count += 1
        return (self._sum / self._count).to(value.dtype)

    @property
    def count(self) -> int:
        """Micro-batches in the current step so far."""
        return self._count
