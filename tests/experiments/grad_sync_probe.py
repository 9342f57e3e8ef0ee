"""A callback for the multi-process tests: after each micro-batch's backward, whether FSDP2 has reduce-scattered the
gradients yet (a sharded parameter holds a ``.grad``), written to ``<out>/rank<R>.json`` when the fit ends."""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L
from torch.distributed.tensor import DTensor


class GradSyncProbe(L.Callback):
    """Records, per micro-batch, whether any FSDP2-sharded parameter of the network has its sharded gradient."""

    def __init__(self, out: str) -> None:
        self.out = Path(out)
        self.synced: list[bool] = []

    def on_after_backward(self, trainer, pl_module) -> None:
        sharded = [p for p in pl_module.parameters() if isinstance(p, DTensor)]
        self.synced.append(bool(sharded) and any(p.grad is not None for p in sharded))

    def on_fit_end(self, trainer, pl_module) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        record = {"synced": self.synced, "accumulate": trainer.accumulate_grad_batches, "step": trainer.global_step}
        (self.out / f"rank{trainer.global_rank}.json").write_text(json.dumps(record))
