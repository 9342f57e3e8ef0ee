"""The one place a DataModule turns a dataset into a ``DataLoader``.

Every task reads its data the same way: training batches in the order of a resumable sampler
(:mod:`datamodules.samplers`), sharded over ranks, with a fixed batch shape; evaluation batches in dataset
order. What differs between DataModules (the dataset, the sampler, the worker count) is an argument here.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from datamodules.samplers import shard_over_ranks


def make_loader(
    dataset: Dataset,
    batch_size: int,
    *,
    train_sampler: Sampler[int] | None = None,
    trainer: Any | None = None,
    num_workers: int = 0,
    pin_memory: bool = True,
) -> DataLoader:
    """A training loader when ``train_sampler`` is given, else an evaluation loader (dataset order).

    Training drops the ragged last batch (fixed shapes, friendly to ``torch.compile``; DeiT does the same)
    unless the dataset holds less than one batch, so a tiny set still trains.

    Args:
        dataset: The split to read.
        batch_size: Items per batch.
        train_sampler: The resumable training order; sharded over ranks (``shard_over_ranks``).
        trainer: The Lightning trainer, for the ranks (None outside a trainer).
        num_workers: Worker processes; they persist between epochs (and keep their memory maps).
        pin_memory: Page-locked host memory for faster host-to-device copies (only with CUDA).
    """
    train = train_sampler is not None
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=shard_over_ranks(train_sampler, trainer) if train else None,
        shuffle=False,
        drop_last=train and len(dataset) >= batch_size,
        num_workers=num_workers,
        pin_memory=pin_memory and torch.cuda.is_available(),
        persistent_workers=num_workers > 0,
    )
