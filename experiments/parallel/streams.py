"""Training randomness per data-parallel rank, reproducibly: what DiT's and DeiT's training scripts do.

LightningCLI seeds every process with the one ``seed_everything``, so every rank would draw the same diffusion
timesteps and noise, label drops, drop-path masks, dropout and Mixup / CutMix / RandAugment / random-erasing
draws: 8 ranks x 32 samples would see 32 distinct draws. The references offset the seed by the rank (DiT's
``train.py``: ``global_seed * world_size + rank``; DeiT's ``main.py``: ``seed + rank``). Here:

    init            every rank builds the network from the one seed, before this runs: identical weights
    training        data-parallel rank r of R reseeds torch, numpy and Python with ``seed * R + r`` when the fit
                    starts (before the first loader iterator, so its workers' seeds differ too)
    tensor parallel the ranks of one data-parallel replica share its batch, so they share its stream (they
                    must: they hold shards of one forward)
    one replica     R = 1 leaves the seed as it is: a one-process run draws what it always drew, and "two
                    tensor-parallel ranks = one process" holds as before
    checkpoints     every save gathers every rank's RNG states (``rank_streams`` in the checkpoint); a resume on
                    the same world size gives each rank back its own, so the resumed run draws what the
                    uninterrupted one would have; on another world size each rank starts a fresh stream from
                    ``(seed * R + r, step)`` and says so

The "2 processes = 1 process" proofs stay exact where the training draws nothing (the LM) or where the ranks are
one replica (tensor parallelism); two data-parallel ranks are held to another two-rank run (FSDP2 against DDP:
the same streams) and to their own rerun.
"""

from __future__ import annotations

import os
import random
from typing import Any

import lightning as L
import numpy as np
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_warn

from experiments.parallel.shard import DP
from experiments.reliability.checkpointing import rng_states, set_rng_states

KEY = "rank_streams"


def data_parallel_rank(trainer: L.Trainer) -> tuple[int, int]:
    """``(rank, size)`` of this process among the data-parallel replicas (a device mesh's ``data_parallel``
    dimension under ``ModelParallelStrategy``, else every process its own replica)."""
    mesh = getattr(trainer.strategy, "device_mesh", None)
    if mesh is not None and DP in (mesh.mesh_dim_names or ()):
        return mesh[DP].get_local_rank(), mesh[DP].size()
    return trainer.global_rank, trainer.world_size


def rank_seed(seed: int, rank: int, replicas: int, step: int = 0) -> int:
    """The seed of replica ``rank`` of ``replicas``: DiT's ``seed * world_size + rank`` (``seed`` itself for one
    replica); ``step`` > 0 starts a fresh stream there (a resume on another world size)."""
    base = seed * replicas + rank
    return base if step == 0 else int(np.random.SeedSequence([base, step]).generate_state(1)[0])


def reseed(seed: int) -> None:
    """torch's, numpy's and Python's global generators from ``seed`` (what ``seed_everything`` seeds)."""
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    random.seed(seed)


def _seed() -> int:
    """The run's ``seed_everything`` (LightningCLI records it in the run's config.yaml; Lightning keeps it in the
    process environment for its worker processes)."""
    return int(os.environ.get("PL_GLOBAL_SEED", "0"))


class RankStreams(Callback):
    """Offsets each data-parallel rank's training randomness from the run's seed, and saves / restores every
    rank's generator states with the checkpoint (module docstring). Added by every task."""

    def __init__(self) -> None:
        self._restore: dict[str, Any] | None = None

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        rank, replicas = data_parallel_rank(trainer)
        if replicas > 1:
            reseed(rank_seed(_seed(), rank, replicas))

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        mine = rng_states()
        if dist.is_available() and dist.is_initialized() and trainer.world_size > 1:
            every: list[Any] = [None] * trainer.world_size
            dist.all_gather_object(every, mine)  # every rank saves through here (the strategy picks the writer)
        else:
            every = [mine]
        checkpoint[KEY] = {"world_size": trainer.world_size, "states": every}

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        saved = checkpoint.get(KEY)
        if not isinstance(saved, dict):
            return
        if saved.get("world_size") == trainer.world_size and len(saved.get("states", ())) == trainer.world_size:
            self._restore = saved["states"][trainer.global_rank]
            return
        rank, replicas = data_parallel_rank(trainer)
        if replicas > 1:
            rank_zero_warn(
                f"resumed on {trainer.world_size} processes from a checkpoint of {saved.get('world_size')}: each "
                "rank's training randomness starts a fresh stream here (the data order continues exactly)"
            )
        self._restore = {"reseed": rank_seed(_seed(), rank, replicas, step=max(1, int(checkpoint["global_step"])))}

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # after ExactResume's (a trainer callback, called before the module's): this rank's own states win
        if self._restore is None:
            return
        if "reseed" in self._restore:
            reseed(self._restore["reseed"])
        else:
            set_rng_states(self._restore)
        self._restore = None
