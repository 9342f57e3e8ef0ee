"""A test-only callback that records, per rank and step, which random stream the step draws from, without drawing
from it: the sha256 of torch's and numpy's global generator states when the step starts."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import lightning as L
import numpy as np
import torch


def state_digest() -> str:
    """A short digest of torch's and numpy's global generator states (reading them draws nothing)."""
    keys = np.random.get_state()[1]
    return hashlib.sha256(torch.get_rng_state().numpy().tobytes() + keys.tobytes()).hexdigest()[:16]


class RecordDraws(L.Callback):
    """Appends ``[step, digest]`` for every training step to ``<run dir>/draws-rank<r>.json``."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        log_dir = trainer.log_dir or trainer.default_root_dir
        path = Path(log_dir) / f"draws-rank{trainer.global_rank}.json"
        draws = json.loads(path.read_text()) if path.is_file() else []
        draws.append([trainer.global_step, state_digest()])
        path.write_text(json.dumps(draws))


def draws(run: Path, rank: int) -> dict[int, str]:
    """``{step: digest}`` of the run below ``run`` on ``rank`` (a resumed step's last record wins)."""
    (path,) = run.rglob(f"draws-rank{rank}.json")
    return {step: digest for step, digest in json.loads(path.read_text())}
