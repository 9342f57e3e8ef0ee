"""Training samplers a run can resume in the middle of an epoch.

Each epoch's draw is a pure function of (seed, epoch): Lightning calls ``set_epoch`` before every
epoch (and forwards it through its distributed wrapper), so a run is reproducible and every epoch
sees a fresh order. A checkpoint stores ``{"seed", "epoch", "offset"}`` (see
:class:`experiments.reliability.checkpointing.ExactResume`); the resumed pass over that epoch starts at its
``offset``-th item. The pass is rotated rather than shortened, so ``len`` and the distributed sharding
(rank r takes items r, r + W, ... of the pass) stay as they were, and Lightning ends the resumed epoch
after the batches that remained.

    RandomPermutationSampler   each epoch a permutation of the dataset (images, latents)
    RepeatedAugmentationSampler  DeiT's repeated augmentation: each drawn image 3 times, on different ranks
    RandomWindowSampler        (datamodules.text.windows) starts drawn with replacement (token windows)
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from lightning.fabric.utilities.distributed import DistributedSamplerWrapper
from torch.utils.data import Sampler

__all__ = [
    "RandomPermutationSampler",
    "RepeatedAugmentationSampler",
    "ResumableSampler",
    "epoch_seed",
    "shard_over_ranks",
]


def epoch_seed(seed: int, epoch: int) -> int:
    """A well-mixed 63-bit generator seed for (seed, epoch); neighbouring epochs are unrelated."""
    return int(np.random.SeedSequence([seed, epoch]).generate_state(2, dtype=np.uint64)[0] >> np.uint64(1))


class ResumableSampler(Sampler[int]):
    """A seeded per-epoch draw of ``num_samples`` indices with a resumable position; subclasses pick the draw.

    Args:
        num_samples: Indices per epoch.
        seed: Base seed.
    """

    def __init__(self, num_samples: int, seed: int = 0) -> None:
        if num_samples <= 0:
            raise ValueError(f"num_samples={num_samples} must be positive")
        self.num_samples = num_samples
        self.seed = seed
        self.epoch = 0
        self._resume_offset = 0  # items of `epoch` consumed before a checkpoint, skipped once

    def draw(self, generator: torch.Generator) -> list[int]:
        """The epoch's ``num_samples`` indices, drawn from ``generator`` only."""
        raise NotImplementedError

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self._resume_offset = 0  # a resume position belongs to the epoch it was saved in
        self.epoch = epoch

    def __len__(self) -> int:
        return self.num_samples

    def __iter__(self) -> Iterator[int]:
        items = self.draw(torch.Generator().manual_seed(epoch_seed(self.seed, self.epoch)))
        if self._resume_offset:
            k, self._resume_offset = self._resume_offset % self.num_samples, 0
            items = items[k:] + items[:k]
        return iter(items)

    def state_dict(self) -> dict[str, int]:
        pending = {"offset": self._resume_offset} if self._resume_offset else {}
        return {"seed": self.seed, "epoch": self.epoch, **pending}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.seed = int(state["seed"])
        self.epoch = int(state["epoch"])
        self._resume_offset = int(state.get("offset", 0))


class RandomPermutationSampler(ResumableSampler):
    """Every index of a dataset once per epoch, in a fresh seeded order (``shuffle=True``, resumable)."""

    def draw(self, generator: torch.Generator) -> list[int]:
        return torch.randperm(self.num_samples, generator=generator).tolist()


class RepeatedAugmentationSampler(ResumableSampler):
    """DeiT's repeated augmentation (facebookresearch/deit, samplers.py ``RASampler``; timm's ``RepeatAugSampler``).

    Each epoch permutes the dataset, repeats every index ``repeats`` times in a row, and keeps the first
    ``replicas * floor(floor(N / 256) * 256 / replicas)`` items: as DeiT, an epoch is about N samples (N rounded down
    to a multiple of 256, then to a multiple of the ranks), so it shows about N / repeats distinct images, each
    ``repeats`` times. Rank r takes items r, r + W, ... (:func:`shard_over_ranks`), so the copies of an image land on
    neighbouring ranks, each transformed by its own rank's random stream (DeiT's point: different augmentations of
    one image in one optimizer step). The draw is seeded by (seed, epoch) and resumable like every sampler here.

    Args:
        dataset_size: Images in the training split (N).
        repeats: Copies of each drawn image (DeiT: 3).
        replicas: Data-parallel ranks the epoch is split over (W); the epoch length depends on it, as DeiT's.
        seed: Base seed.
    """

    def __init__(self, dataset_size: int, repeats: int = 3, replicas: int = 1, seed: int = 0) -> None:
        if repeats < 1 or replicas < 1:
            raise ValueError(f"repeats={repeats} and replicas={replicas} must be positive")
        self.dataset_size, self.repeats, self.replicas = dataset_size, repeats, replicas
        per_rank = dataset_size // 256 * 256 // replicas  # DeiT's num_selected_samples
        if per_rank == 0:
            raise ValueError(
                f"repeated augmentation needs at least 256 training images per {replicas} rank(s) (DeiT's epoch "
                f"is floor(N / 256) * 256 samples); the split holds {dataset_size}"
            )
        super().__init__(per_rank * replicas, seed)

    def draw(self, generator: torch.Generator) -> list[int]:
        order = torch.randperm(self.dataset_size, generator=generator)
        return torch.repeat_interleave(order, self.repeats)[: self.num_samples].tolist()


def shard_over_ranks(sampler: Sampler[int], trainer: Any | None) -> Sampler[int]:
    """Under multi-process training, rank r takes items r, r + W, ... of each pass, in order.

    So W ranks with batch B see what one process sees with batch W x B, and a mid-epoch resume lands
    on the same items. Lightning's own wrapper would shuffle once more and break both.
    """
    shard = trainer.distributed_sampler_kwargs if trainer is not None else None
    # Under every parallel strategy, even with one replica (tensor parallelism: a group of ranks reads one
    # batch; ModelParallelStrategy on one process): unwrapped, Lightning would wrap it and shuffle once more.
    if shard:
        return DistributedSamplerWrapper(sampler, shuffle=False, **shard)
    return sampler
