"""SYNTHETIC latents for smoke runs of the DiT task: no VAE, no cache, nothing to prepare.

    python -m experiments fit -c configs/dit/tiny.yaml -c configs/dit/synthetic-latents.yaml --trainer.fast_dev_run=1

Each class ``k`` has a fixed random mean pattern ``m_k`` (C, h, w); an item is ``m_k + 0.5 * noise``, drawn
from a generator seeded by (seed, row), so the data is the same on every machine and in every worker.
It exercises the training, validation and sampling code paths on a fresh clone; it is not a dataset:
there are no images behind it, so there is no VAE to decode samples and no FID (``test`` needs
``--model.init_args.fid_samples=0``). Real runs use :class:`datamodules.latents.LatentDataModule`.
"""

from __future__ import annotations

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset

from datamodules.loaders import make_loader
from datamodules.samplers import RandomPermutationSampler


class SyntheticLatentDataset(Dataset[tuple[torch.Tensor, ...]]):
    """(latent (C, h, w) float32, label int64[, row int64]) for rows ``start .. start + count - 1``."""

    def __init__(self, means: torch.Tensor, start: int, count: int, seed: int, with_row: bool = False) -> None:
        self.means, self.start, self.count, self.seed, self.with_row = means, start, count, seed, with_row

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> tuple[torch.Tensor, ...]:
        row = self.start + i
        label = row % len(self.means)
        gen = torch.Generator().manual_seed(self.seed * 2**32 + row)
        latent = self.means[label] + 0.5 * torch.randn(self.means.shape[1:], generator=gen)
        label_t = torch.tensor(label, dtype=torch.int64)
        return (latent, label_t, torch.tensor(row, dtype=torch.int64)) if self.with_row else (latent, label_t)


class SyntheticLatentDataModule(L.LightningDataModule):
    """Class-conditional synthetic latents with the attributes the DiT task links from a latent cache.

    Args:
        num_classes: classes (labels ``row mod num_classes``).
        latent_size: latent side h = w.
        latent_channels: latent channels C.
        train_count: training items.
        val_count: validation items (also test and predict).
        batch_size: items per batch.
        seed: seed of the class means and the items.
    """

    vae_path = None  # no images behind these latents: samples cannot be decoded
    source_name = "synthetic"
    source_image_size = 0

    def __init__(
        self,
        num_classes: int = 10,
        latent_size: int = 8,
        latent_channels: int = 4,
        train_count: int = 512,
        val_count: int = 64,
        batch_size: int = 32,
        seed: int = 0,
    ) -> None:
        super().__init__()
        for name, value in [("num_classes", num_classes), ("latent_size", latent_size),
                            ("latent_channels", latent_channels), ("train_count", train_count),
                            ("val_count", val_count), ("batch_size", batch_size)]:  # fmt: skip
            if value < 1:
                raise ValueError(f"data.init_args.{name}={value}; valid: >= 1")
        self.save_hyperparameters()
        self.num_classes, self.latent_size, self.latent_channels = num_classes, latent_size, latent_channels
        self.batch_size, self.seed = batch_size, seed
        gen = torch.Generator().manual_seed(seed)
        self.means = torch.randn(num_classes, latent_channels, latent_size, latent_size, generator=gen)
        self.train_sampler = RandomPermutationSampler(train_count, seed)  # exact mid-epoch resume, as the cache

    def _dataset(self, train: bool, with_row: bool = False) -> SyntheticLatentDataset:
        hp = self.hparams
        start, count = (0, hp.train_count) if train else (hp.train_count, hp.val_count)
        return SyntheticLatentDataset(self.means, start, count, self.seed, with_row)

    def train_dataloader(self) -> DataLoader:
        return make_loader(self._dataset(True), self.batch_size, train_sampler=self.train_sampler, trainer=self.trainer)

    def val_dataloader(self) -> DataLoader:
        return make_loader(self._dataset(False), self.batch_size)

    def test_dataloader(self) -> DataLoader:
        return self.val_dataloader()

    def predict_dataloader(self) -> DataLoader:
        return make_loader(self._dataset(False, with_row=True), self.batch_size)
