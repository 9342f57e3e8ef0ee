"""The latent cache of the DiT task: VAE latents encoded once, read back by `LatentDataModule`.

    <cache_dir>/
      meta.json                  written last: its presence marks a complete cache
      latents_<tag>_00000.npy    (n, C, h, w) float16|float32, already (z - shift) * scaling_factor
      latents_flip_<tag>_00000.npy   same rows, encoded from the horizontally flipped images (if flip)
      labels_<tag>_00000.npy     (n,) int64, shared by both sets
      ...                        one triple per `shard_size` source images (or fewer), in source order
      encoding.json              only while encoding: the shards finished so far (a rerun resumes)

``<tag>`` identifies the settings a cache was made with, so a cache re-encoded with other settings
(``--overwrite``) writes new files next to the old ones and switches over by replacing ``meta.json``.
Shard names in ``meta.json`` must be plain file names inside the cache directory: a cache never makes
its reader open a file elsewhere.

Flips are a SECOND SET OF SHARDS aligned row by row with the first (row i of ``latents_flip`` is
image i mirrored), not extra rows: the train/val split is drawn over source images, so an image
and its mirror never straddle it, and training picks one of the two at random per item, which is
the DiT recipe's ``RandomHorizontalFlip`` moved before the encoder. Build a cache with
``python -m datamodules.encode_latents --vae DIR --out DIR`` (see encode_latents.py).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from datamodules.samplers import RandomPermutationSampler, shard_over_ranks

__all__ = [
    "LatentCacheMeta",
    "LatentDataModule",
    "LatentDataset",
    "LatentShardWriter",
    "LatentShards",
    "read_latent_meta",
]

META_FILE = "meta.json"
FORMAT_VERSION = 1
SHARD_KEYS = ("latents", "latents_flip", "labels")
SHARD_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*\.npy")
ENCODE_HINT = (
    "python -m datamodules.encode_latents --vae runs/vae/tiny/vae --out {cache_dir} (or `make dit`); "
    "a smoke run needs none: -c configs/dit/synthetic-latents.yaml"
)


@dataclass
class LatentCacheMeta:
    """What ``meta.json`` records about a latent cache.

    Attributes:
        num_classes: Number of classes (labels are 0..num_classes-1).
        class_names: Name of each label.
        latent_shape: (C, h, w) of one latent.
        scaling_factor: The VAE's scaling factor, already applied to the stored latents.
        shift_factor: The VAE's shift (None for SD VAEs), subtracted before scaling.
        vae_path: Absolute path of the VAE directory; decode with ``z / scaling_factor + shift``.
        vae_sha256: Hash of the VAE weights file, so a retrained VAE at the same path is noticed.
        source: "embedded" or "image-folder".
        source_name: The embedded dataset's name ("fashion-mnist", "sklearn-digits"), or the absolute
            ImageFolder root (FID reference images are read from it).
        image_size: Side of the images that were encoded.
        count: Number of source images (rows per set).
        flip: Whether the ``latents_flip_*`` set exists.
        sample: Latents are posterior samples (True) or posterior means (False).
        dtype: Storage dtype of the latents.
        shard_size: Source images per shard.
        shards: Per shard: {"latents", "latents_flip" (or None), "labels", "count"}.
        format_version: Layout version of the cache.
        seed: Seed of the posterior samples (None for posterior means).
    """

    num_classes: int
    class_names: list[str]
    latent_shape: list[int]
    scaling_factor: float
    shift_factor: float | None
    vae_path: str
    vae_sha256: str
    source: str
    source_name: str
    image_size: int
    count: int
    flip: bool
    sample: bool
    dtype: str
    shard_size: int
    shards: list[dict] = field(default_factory=list)
    format_version: int = FORMAT_VERSION
    seed: int | None = None

    def write(self, cache_dir: str | Path) -> None:
        """Writes ``meta.json`` through a temp file and ``os.replace`` (a reader never sees half of it)."""
        path = Path(cache_dir) / META_FILE
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        os.replace(tmp, path)


def read_latent_meta(cache_dir: str | Path) -> LatentCacheMeta:
    """Reads ``meta.json`` of a latent cache.

    Raises:
        FileNotFoundError: One line with the encode command when the cache or its meta.json is missing.
        ValueError: The meta.json is not a latent cache of this format.
    """
    path = Path(cache_dir) / META_FILE
    if not path.is_file():
        what = "does not exist" if not Path(cache_dir).exists() else "has no meta.json (encoding never finished?)"
        raise FileNotFoundError(
            f"latent cache {str(cache_dir)!r} {what}; build it with: {ENCODE_HINT.format(cache_dir=cache_dir)}"
        )
    try:
        payload = json.loads(path.read_text())
        meta = LatentCacheMeta(**payload)
    except (json.JSONDecodeError, TypeError) as err:
        raise ValueError(f"{str(path)!r} is not a latent cache meta.json: {err}") from None
    if meta.format_version != FORMAT_VERSION:
        raise ValueError(f"{str(path)!r} has cache format {meta.format_version}, this code reads {FORMAT_VERSION}")
    check_shard_names(cache_dir, meta.shards, meta.flip, path)
    return meta


def check_shard_names(cache_dir: str | Path, shards: list, flip: bool, source: str | Path) -> None:
    """Every shard entry names plain ``.npy`` files that resolve to inside ``cache_dir``.

    Raises:
        ValueError: one line naming the entry and ``source`` (the meta.json it came from).
    """
    root = Path(cache_dir).resolve()
    if not isinstance(shards, list):
        raise ValueError(f"shards: {shards!r} ({source}); valid: a list of shard entries")
    for k, shard in enumerate(shards):
        if not isinstance(shard, dict) or not isinstance(shard.get("count"), int) or shard["count"] < 0:
            raise ValueError(f"shards[{k}]: {shard!r} ({source}); valid: {{latents, latents_flip, labels, count >= 0}}")
        for key in SHARD_KEYS:
            if key == "latents_flip" and not flip:
                continue  # never opened
            name = shard.get(key)
            inside = isinstance(name, str) and SHARD_NAME.fullmatch(name) and (root / name).resolve().parent == root
            if not inside:
                raise ValueError(
                    f"shards[{k}].{key}: {name!r} ({source}); valid: a plain .npy file name inside {str(root)!r}"
                )


def write_array(path: Path, array: np.ndarray) -> None:
    """``np.save`` through a temp file and ``os.replace``."""
    tmp = path.with_name(path.stem + ".tmp.npy")
    np.save(tmp, array, allow_pickle=False)
    os.replace(tmp, path)


class LatentShardWriter:
    """Cuts a stream of encoded batches into shards of ``shard_size`` rows and writes each atomically.

    Args:
        cache_dir: Directory the shards go to.
        shard_size: Rows (source images) per shard.
        dtype: Storage dtype of the latents.
        tag: Goes into every file name (``latents_<tag>_00000.npy``); "" gives ``latents_00000.npy``.
        shards: Shards already written (a resumed encoding appends to them).
        on_flush: Called with the shard list after each shard is on disk (progress for resuming).
    """

    def __init__(
        self,
        cache_dir: str | Path,
        shard_size: int,
        dtype: str = "float16",
        tag: str = "",
        shards: list[dict] | None = None,
        on_flush: Callable[[list[dict]], None] | None = None,
    ) -> None:
        self.cache_dir, self.shard_size, self.dtype = Path(cache_dir), shard_size, np.dtype(dtype)
        self.tag, self.on_flush = f"{tag}_" if tag else "", on_flush
        self.shards: list[dict] = list(shards or [])
        self._parts: dict[str, list[np.ndarray]] = {"latents": [], "latents_flip": [], "labels": []}
        self._pending = 0

    def add(self, latents: np.ndarray, flipped: np.ndarray | None, labels: np.ndarray) -> None:
        """Appends rows; ``flipped`` must be given for every batch or for none."""
        lo = 0
        while lo < len(labels):  # a batch may straddle a shard boundary
            hi = lo + min(len(labels) - lo, self.shard_size - self._pending)
            self._parts["latents"].append(latents[lo:hi].astype(self.dtype))
            if flipped is not None:
                self._parts["latents_flip"].append(flipped[lo:hi].astype(self.dtype))
            self._parts["labels"].append(labels[lo:hi].astype(np.int64))
            self._pending += hi - lo
            lo = hi
            if self._pending == self.shard_size:
                self._flush()

    def _flush(self) -> None:
        k = len(self.shards)
        shard: dict = {"latents": None, "latents_flip": None, "labels": None, "count": self._pending}
        for key, parts in self._parts.items():
            if parts:
                shard[key] = f"{key}_{self.tag}{k:05d}.npy"
                write_array(self.cache_dir / shard[key], np.concatenate(parts))
                parts.clear()
        self.shards.append(shard)
        self._pending = 0
        if self.on_flush is not None:
            self.on_flush(self.shards)

    def close(self) -> list[dict]:
        """Writes the last partial shard; returns the shard list for ``meta.json``."""
        if self._pending:
            self._flush()
        return self.shards


class LatentShards:
    """Row access over the shards of a cache; the arrays are memory-mapped lazily (per worker process).

    Args:
        cache_dir: The cache directory.
        meta: Its meta (read from ``cache_dir`` when None).
    """

    def __init__(self, cache_dir: str | Path, meta: LatentCacheMeta | None = None) -> None:
        self.cache_dir = Path(cache_dir)
        self.meta = meta or read_latent_meta(cache_dir)
        counts = [int(s["count"]) for s in self.meta.shards]
        if sum(counts) != self.meta.count:
            raise ValueError(f"{str(self.cache_dir)!r}: shard counts {counts} do not add up to {self.meta.count}")
        self.offsets = np.cumsum([0, *counts])  # shard k holds rows offsets[k]:offsets[k + 1]
        labels = [np.load(self.cache_dir / s["labels"], allow_pickle=False) for s in self.meta.shards]
        self.labels = np.concatenate(labels).astype(np.int64)
        self._latents: list[np.ndarray] | None = None
        self._flipped: list[np.ndarray] | None = None

    def __len__(self) -> int:
        return self.meta.count

    def __getstate__(self) -> dict:
        # Reopen the mmaps in each worker rather than pickling them (which would copy the data).
        return {**self.__dict__, "_latents": None, "_flipped": None}

    def _open(self) -> None:
        def load(name: str) -> np.ndarray:
            array = np.load(self.cache_dir / name, mmap_mode="r", allow_pickle=False)
            if array.ndim != 4 or list(array.shape[1:]) != list(self.meta.latent_shape):
                raise ValueError(f"{name}: shape {array.shape} does not match latent shape {self.meta.latent_shape}")
            return array

        self._latents = [load(s["latents"]) for s in self.meta.shards]
        self._flipped = [load(s["latents_flip"]) for s in self.meta.shards] if self.meta.flip else None

    def latent(self, index: int, flipped: bool = False) -> np.ndarray:
        """Row ``index`` as a float32 (C, h, w) array, from the flipped set if ``flipped``."""
        if self._latents is None:
            self._open()
        if flipped and self._flipped is None:
            raise ValueError(f"{str(self.cache_dir)!r} was encoded with --no-flip: there are no flipped latents")
        shard = int(np.searchsorted(self.offsets, index, side="right")) - 1
        arrays = self._flipped if flipped else self._latents
        return np.array(arrays[shard][index - self.offsets[shard]], dtype=np.float32)  # a copy, off the mmap


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
        cache_dir: Directory written by ``python -m datamodules.encode_latents``.
        batch_size: Latents per batch.
        num_workers: DataLoader worker processes.
        val_fraction: Fraction of the source images held out for validation.
        seed: Seed of the train/val split and of the training order (resumable mid-epoch).
        random_flip: Use the flipped latents as train-time augmentation.
    """

    def __init__(
        self,
        cache_dir: str,
        batch_size: int = 64,
        num_workers: int = 0,
        val_fraction: float = 0.02,
        seed: int = 1234,
        random_flip: bool = True,
    ) -> None:
        super().__init__()
        if batch_size <= 0 or num_workers < 0:
            raise ValueError(f"need batch_size > 0 and num_workers >= 0, got {batch_size=}, {num_workers=}")
        if not 0.0 <= val_fraction < 1.0:
            raise ValueError(f"val_fraction={val_fraction} must lie in [0, 1)")
        self.save_hyperparameters()
        self.cache_dir = cache_dir
        self.batch_size, self.num_workers = batch_size, num_workers
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
        if self.shards is None:
            self.shards = LatentShards(self.cache_dir, self.meta)
            self.train_index, self.val_index = self.split_indices()
            self.train_sampler = RandomPermutationSampler(len(self.train_index), self.seed)

    def _loader(self, index: np.ndarray | None, train: bool, with_row: bool = False) -> DataLoader:
        if self.shards is None or index is None:
            raise RuntimeError("call setup() before asking for a dataloader")
        dataset = LatentDataset(self.shards, index, random_flip=train and self.random_flip, with_row=with_row)
        return DataLoader(
            dataset,
            batch_size=self.batch_size,
            sampler=shard_over_ranks(self.train_sampler, self.trainer) if train else None,
            drop_last=train and len(dataset) >= self.batch_size,
            num_workers=self.num_workers,
            pin_memory=torch.cuda.is_available(),
            persistent_workers=self.num_workers > 0,
        )

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
