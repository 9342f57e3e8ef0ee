"""``LatentDataModule``: the DiT task's batches, read from a latent cache (:mod:`datamodules.latents.cache`)."""

from __future__ import annotations

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from datamodules.batching import check_global_batch, set_accumulation
from datamodules.fingerprint import check_same_files
from datamodules.latents.cache import META_FILE, LatentShards, read_latent_meta
from datamodules.loaders import make_loader
from datamodules.samplers import RandomPermutationSampler

__all__ = ["LatentDataModule", "LatentDataset"]


class LatentDataset(Dataset[tuple[torch.Tensor, ...]]):
    """(latent float32 (C, h, w), label int64) for the given rows of a cache, and the row if ``with_row``.

    Args:
        shards: The cache.
        index: Rows (source images) this split holds.
        random_flip: Return the mirrored image's latent with probability 1/2 (needs a flip cache).
        with_row: Also return the row (int64): generation seeds each sample by it, so samples stay
            distinct and reproducible however the rows are split over ranks and batches.
    """

    def __init__(self, shards: LatentShards, index: np.ndarray, random_flip: bool, with_row: bool = False) -> None:
        self.shards, self.index, self.with_row = shards, index, with_row
        self.random_flip = random_flip and shards.meta.flip

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        row = int(self.index[i])
        flipped = self.random_flip and bool(torch.rand(()) < 0.5)  # torch RNG: seeded per DataLoader worker
        latent = torch.from_numpy(self.shards.latent(row, flipped))
        label = torch.tensor(self.shards.labels[row], dtype=torch.int64)
        return (latent, label, torch.tensor(row, dtype=torch.int64)) if self.with_row else (latent, label)


class LatentDataModule(L.LightningDataModule):
    """Pre-encoded VAE latents for the DiT task.

    Validation is ``round(val_fraction * count)`` source images (at least one when the fraction is
    positive) drawn by a permutation seeded with ``seed``; train is the rest; test and predict reuse
    validation. Train items come from either orientation at random (when the cache has flips);
    validation items are never flipped.

    Args:
        cache_dir: Directory written by ``python -m datamodules.latents.encode``.
        batch_size: Latents per batch on each device (the micro-batch).
        global_batch_size: Latents per optimizer step over all devices (DiT's 256), reached by accumulating
            global / (batch_size x data-parallel replicas) micro-batches, which must be whole
            (:mod:`datamodules.batching`); None steps after every micro-batch.
        num_workers: DataLoader worker processes.
        val_fraction: Fraction of the source images held out for validation.
        seed: Seed of the train/val split and of the training order (resumable mid-epoch).
        random_flip: Use the flipped latents as train-time augmentation.
    """

    def __init__(
        self,
        cache_dir: str,
        batch_size: int = 64,
        global_batch_size: int | None = None,
        num_workers: int = 0,
        val_fraction: float = 0.02,
        seed: int = 1234,
        random_flip: bool = True,
    ) -> None:
        super().__init__()
        if batch_size <= 0 or num_workers < 0:
            raise ValueError(f"need batch_size > 0 and num_workers >= 0, got {batch_size=}, {num_workers=}")
        check_global_batch(global_batch_size, batch_size)
        if not 0.0 <= val_fraction < 1.0:
            raise ValueError(f"val_fraction={val_fraction} must lie in [0, 1)")
        self.save_hyperparameters()
        self.cache_dir = cache_dir
        self.batch_size, self.num_workers = batch_size, num_workers
        self.global_batch_size = global_batch_size
        self.val_fraction, self.seed, self.random_flip = val_fraction, seed, random_flip
        self.meta = read_latent_meta(cache_dir)  # now, so a missing cache fails before any training
        self.shards: LatentShards | None = None
        self.train_index: np.ndarray | None = None
        self.val_index: np.ndarray | None = None
        self.train_sampler: RandomPermutationSampler | None = None

    @property
    def num_classes(self) -> int:
        return self.meta.num_classes

    @property
    def latent_size(self) -> int:
        """Latent side h (the DiT input size)."""
        return self.meta.latent_shape[1]

    @property
    def latent_channels(self) -> int:
        return self.meta.latent_shape[0]

    @property
    def class_names(self) -> list[str]:
        return list(self.meta.class_names)

    @property
    def scaling_factor(self) -> float:
        return self.meta.scaling_factor

    @property
    def vae_path(self) -> str:
        return self.meta.vae_path

    @property
    def source_name(self) -> str:
        """Embedded dataset name, or the absolute ImageFolder root the latents were encoded from."""
        return self.meta.source_name

    @property
    def source_image_size(self) -> int:
        """Side of the images that were encoded (the VAE's input and the decoded samples' size)."""
        return self.meta.image_size

    def split_indices(self) -> tuple[np.ndarray, np.ndarray]:
        """(train rows, val rows), sorted, disjoint, a pure function of ``count``, ``val_fraction`` and ``seed``."""
        count = self.meta.count
        val_count = 0 if self.val_fraction == 0 else max(1, round(self.val_fraction * count))
        if val_count >= count:
            raise ValueError(f"val_fraction={self.val_fraction} leaves no training latents out of {count}")
        order = np.random.default_rng(self.seed).permutation(count)
        return np.sort(order[val_count:]), np.sort(order[:val_count])

    def setup(self, stage: str | None = None) -> None:
        """Opens the cache and splits it; under several ranks, checks first that every rank reads the same cache
        (:mod:`datamodules.fingerprint`). For fit, sets the trainer's accumulation for ``global_batch_size``."""
        if stage in (None, "fit"):
            set_accumulation(self.global_batch_size, self.batch_size, self.trainer)
        files = [s[key] for s in self.meta.shards for key in ("latents", "latents_flip", "labels") if s.get(key)]
        check_same_files(self.cache_dir, [META_FILE, *files], f"latent cache {self.cache_dir}")
        if self.shards is None:
            self.shards = LatentShards(self.cache_dir, self.meta)
            self.train_index, self.val_index = self.split_indices()
            self.train_sampler = RandomPermutationSampler(len(self.train_index), self.seed)

    def _loader(self, index: np.ndarray | None, train: bool, with_row: bool = False) -> DataLoader:
        if self.shards is None or index is None:
            raise RuntimeError("call setup() before asking for a dataloader")
        dataset = LatentDataset(self.shards, index, random_flip=train and self.random_flip, with_row=with_row)
        sampler = self.train_sampler if train else None
        return make_loader(dataset, self.batch_size, train_sampler=sampler, trainer=self.trainer,
                           num_workers=self.num_workers)  # fmt: skip

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_index, train=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_index, train=False)

    def test_dataloader(self) -> DataLoader:
        """The validation split (the cache holds one source split; FID reference images come from elsewhere)."""
        return self._loader(self.val_index, train=False)

    def predict_dataloader(self) -> DataLoader:
        """Validation (latent, label, row) batches: the generation task uses their labels and rows."""
        return self._loader(self.val_index, train=False, with_row=True)
