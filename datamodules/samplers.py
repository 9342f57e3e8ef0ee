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
    PermutedWindowSampler      (datamodules.text.windows) every non-overlapping window once per epoch

Memory: an epoch's draw is held as one numpy array of the smallest integer type that holds it (int32 below
2^31 items), and items are handed out lazily, a chunk of :data:`CHUNK` at a time, rotation and rank sharding
included (:class:`ShardedSampler`). The 48.8 M windows of a 100B-token split at sequence length 2,048 take
195 MB per rank this way; as Python lists (the draw, its rotation, and Lightning's ``DistributedSampler``
index list over it) they took about 4 GB per rank.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from lightning.fabric.utilities.distributed import DistributedSamplerWrapper
from torch.utils.data import Sampler

__all__ = [
    "CHUNK",
    "RandomPermutationSampler",
    "RepeatedAugmentationSampler",
    "ResumableSampler",
    "ShardedSampler",
    "compact",
    "epoch_seed",
    "shard_over_ranks",
]

CHUNK = 1 << 16  # items turned into Python ints at a time


def epoch_seed(seed: int, epoch: int) -> int:
    """A well-mixed 63-bit generator seed for (seed, epoch); neighbouring epochs are unrelated."""
    return int(np.random.SeedSequence([seed, epoch]).generate_state(2, dtype=np.uint64)[0] >> np.uint64(1))


def compact(values: torch.Tensor | np.ndarray) -> np.ndarray:
    """``values`` as a numpy array of int32 when they fit (half of int64's memory), else int64; values unchanged."""
    array = values.numpy() if isinstance(values, torch.Tensor) else np.asarray(values)
    small = array.size == 0 or (int(array.min()) >= 0 and int(array.max()) < 2**31)
    return array.astype(np.int32 if small else np.int64, copy=False)


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

    def draw(self, generator: torch.Generator) -> np.ndarray:
        """The epoch's ``num_samples`` draws (a compact integer array, see :func:`compact`) from ``generator`` only."""
        raise NotImplementedError

    def items(self, drawn: np.ndarray) -> np.ndarray:
        """The indices handed out for a slice of the draw (the identity; a window sampler maps windows to starts)."""
        return drawn

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self._resume_offset = 0  # a resume position belongs to the epoch it was saved in
        self.epoch = epoch

    def __len__(self) -> int:
        return self.num_samples

    def __iter__(self) -> Iterator[int]:
        return self.iter_shard(0, 1, self.num_samples)

    def iter_shard(self, rank: int, replicas: int, count: int) -> Iterator[int]:
        """Items ``rank, rank + replicas, ...`` (``count`` of them, wrapping around past the end as PyTorch's
        ``DistributedSampler`` pads) of this epoch's pass, which starts at the resume offset (used once)."""
        drawn = self.draw(torch.Generator().manual_seed(epoch_seed(self.seed, self.epoch)))
        start, self._resume_offset = self._resume_offset % self.num_samples, 0
        return self._lazy(drawn, start, rank, replicas, count)

    def _lazy(self, drawn: np.ndarray, start: int, rank: int, replicas: int, count: int) -> Iterator[int]:
        n = self.num_samples
        for first in range(0, count, CHUNK):
            j = np.arange(first, min(first + CHUNK, count), dtype=np.int64)
            positions = (start + (rank + j * replicas) % n) % n
            yield from self.items(drawn[positions]).tolist()

    def state_dict(self) -> dict[str, int]:
        pending = {"offset": self._resume_offset} if self._resume_offset else {}
        return {"seed": self.seed, "epoch": self.epoch, **pending}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.seed = int(state["seed"])
        self.epoch = int(state["epoch"])
        self._resume_offset = int(state.get("offset", 0))


class RandomPermutationSampler(ResumableSampler):
    """Every index of a dataset once per epoch, in a fresh seeded order (``shuffle=True``, resumable)."""

    def draw(self, generator: torch.Generator) -> np.ndarray:
        return compact(torch.randperm(self.num_samples, generator=generator, dtype=_index_dtype(self.num_samples)))


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

    def draw(self, generator: torch.Generator) -> np.ndarray:
        order = torch.randperm(self.dataset_size, generator=generator, dtype=_index_dtype(self.dataset_size))
        return compact(torch.repeat_interleave(order, self.repeats)[: self.num_samples])


def _index_dtype(n: int) -> torch.dtype:
    """int32 for a permutation of fewer than 2^31 items (torch draws the same permutation in either type)."""
    return torch.int32 if n < 2**31 else torch.int64


class ShardedSampler(DistributedSamplerWrapper):
    """Rank r of W takes items r, r + W, ... of each pass (padded as PyTorch's ``DistributedSampler`` pads),
    computed a chunk at a time: Lightning's wrapper would hold the whole pass as a Python list, and its
    ``DistributedSampler`` another list of every position, on every rank.

    It stays a ``DistributedSamplerWrapper`` (``.dataset._sampler`` is the wrapped sampler, ``set_epoch`` is
    forwarded), so Lightning leaves it in place and :mod:`experiments.reliability.checkpointing` finds the
    sampler and its world size as before. A sampler that is not a :class:`ResumableSampler` is sharded by
    Lightning's own code.
    """

    def __iter__(self) -> Iterator[int]:
        sampler = self.dataset._sampler
        if not isinstance(sampler, ResumableSampler) or self.shuffle or self.drop_last:
            return super().__iter__()
        return sampler.iter_shard(self.rank, self.num_replicas, self.num_samples)


def shard_over_ranks(sampler: Sampler[int], trainer: Any | None) -> Sampler[int]:
    """Under multi-process training, rank r takes items r, r + W, ... of each pass, in order.

    So W ranks with batch B see what one process sees with batch W x B, and a mid-epoch resume lands
    on the same items. Lightning's own wrapper would shuffle once more and break both.
    """
    shard = trainer.distributed_sampler_kwargs if trainer is not None else None
    # Under every parallel strategy, even with one replica (tensor parallelism: a group of ranks reads one
    # batch; ModelParallelStrategy on one process): unwrapped, Lightning would wrap it and shuffle once more.
    if shard:
        return ShardedSampler(sampler, shuffle=False, **shard)
    return sampler
