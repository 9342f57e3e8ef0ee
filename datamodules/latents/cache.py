"""The latent cache of the DiT task: VAE latents encoded once, read back by `LatentDataModule` (datamodule.py).

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
``python -m datamodules.latents.encode --vae DIR --out DIR`` (see :mod:`datamodules.latents.encode`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from fileio import InputError, atomic_file, atomic_write_json, read_json

__all__ = ["LatentCacheMeta", "LatentShardWriter", "LatentShards", "read_latent_meta"]

META_FILE = "meta.json"
FORMAT_VERSION = 1
SHARD_KEYS = ("latents", "latents_flip", "labels")
SHARD_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*\.npy")
ENCODE_HINT = (
    "python -m datamodules.latents.encode --vae runs/vae/tiny/vae --out {cache_dir} (or `make dit`); "
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
        """Writes ``meta.json`` atomically (a reader never sees half of it)."""
        atomic_write_json(Path(cache_dir) / META_FILE, asdict(self))


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
        meta = LatentCacheMeta(**read_json(path, "latent cache meta", dict))
    except (InputError, TypeError) as err:  # not JSON, an array, too deep; or keys of another format
        raise ValueError(f"{str(path)!r} is not a latent cache meta.json: {str(err).splitlines()[0]}") from None
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
    """``np.save``, atomically."""
    with atomic_file(path) as f:
        np.save(f, array, allow_pickle=False)


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
