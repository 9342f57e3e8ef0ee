"""A refused command leaves nothing behind: the run directory it made goes again.

When ``fit`` (or an evaluation) made the run directory and is then refused (a user error, exit status 2) before its
first training step and first checkpoint, the directory is removed, so the corrected command is not told that the
directory "already holds a run".
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from lightning.pytorch.utilities import rank_zero_only

from experiments.reliability.errors import describe
from experiments.reliability.layout import held_artifacts

__all__ = ["discard_if_refused"]


def discard_if_refused(run_dir: Path | None, made: bool, trainer: Any | None, err: BaseException) -> bool:
    """Removes ``run_dir`` when this command ``made`` it and ``err`` is a refusal (exit status 2) that came before
    any training step (``trainer.global_step``) and any checkpoint; only on rank zero.

    Returns:
        Whether the directory was removed.
    """
    if run_dir is None or not made or rank_zero_only.rank != 0:
        return False
    described = describe(err)
    if described is None or described[0] != 2:
        return False
    if (trainer is not None and trainer.global_step > 0) or held_artifacts(run_dir).count("checkpoints/"):
        return False
    shutil.rmtree(run_dir, ignore_errors=True)
    return True
