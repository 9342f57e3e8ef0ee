"""The default reference of the DiT ``test``: real images of the data the latent cache was encoded from.

The embedded set's held-out test split, or the cache's ImageFolder, at the VAE's resolution. Their
features are computed once per (source, size, backend, count) and kept, with their statistics, in
``<latent cache>/fid_stats/`` (the statistics layout of :mod:`experiments.evaluation.fid.stats`), so
later runs score against the same file without another pass. A reference given as a path gets its
features cached in the same directory (:mod:`experiments.evaluation.reference_cache`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from experiments.evaluation.fid.metric import FeatureExtractor
from experiments.evaluation.fid.reference import Reference, open_reference
from experiments.evaluation.fid.stats import save_real_stats


def _source_of(datamodule) -> tuple[str, int]:
    """(source, image side) of the images behind a latent DataModule."""
    source = str(getattr(datamodule, "source_name", "embedded"))
    image_size = int(getattr(datamodule, "source_image_size", 0))
    if not image_size:
        raise ValueError("the latent cache does not record the image size it was encoded at")
    return source, image_size


def fid_stats_dir(datamodule) -> Path:
    """``<latent cache>/fid_stats``: where a DiT ``test`` keeps reference statistics and features it computed
    (the latent cache is a directory the user named; ``data/fid_stats`` for a DataModule without one)."""
    return Path(getattr(datamodule, "cache_dir", None) or "data") / "fid_stats"


def reference_stats_path(datamodule, backend: str, num_images: int, feature: int = 2048) -> Path:
    """``<latent cache>/fid_stats/<source>-<size>px-<backend>[-f<feature>]-<n>.npz``: computed once per dataset
    and InceptionV3 tap (the published 2048-d tap carries no ``-f`` part)."""
    source, size = _source_of(datamodule)
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", source).strip("_")
    tap = "" if feature == 2048 else f"-f{feature}"
    return fid_stats_dir(datamodule) / f"{slug}-{size}px-{backend}{tap}-{num_images}.npz"


def reference_batches(datamodule, num_images: int, batch_size: int) -> Iterator[torch.Tensor]:
    """Yields up to ``num_images`` real images as uint8 ``(B, 3, H, W)`` at the VAE's resolution."""
    source, size = _source_of(datamodule)
    if Path(source).is_dir():
        from torchvision import transforms as T
        from torchvision.datasets import ImageFolder

        tf = T.Compose([T.Resize(size), T.CenterCrop(size), T.PILToTensor()])
        data = ImageFolder(source, transform=tf)
        for i in range(0, min(num_images, len(data)), batch_size):
            idx = range(i, min(i + batch_size, num_images, len(data)))
            yield torch.stack([data[j][0] for j in idx])
        return
    from datamodules.images.embedded import load_embedded_images, resize_uint8

    arrays = load_embedded_images("test")  # held-out real images of the embedded set
    images = torch.from_numpy(arrays.images[:num_images]).unsqueeze(1).expand(-1, 3, -1, -1)
    images = resize_uint8(images.contiguous(), size)
    for i in range(0, len(images), batch_size):
        yield images[i : i + batch_size]


def heldout_reference(
    datamodule,
    extractor: FeatureExtractor,
    num_images: int,
    batch_size: int,
    device: torch.device | str = "cpu",
    progress: bool = True,
    report: Callable[[int, int | None], None] | None = None,
) -> Reference:
    """The held-out reference as a statistics file with features, computed on the first call and reused after
    (``report``: called with (images done, total) while they are computed)."""
    from experiments.evaluation.generation import extract_features

    path = reference_stats_path(datamodule, extractor.backend, num_images, int(extractor.module.num_features))
    if not path.is_file():
        features = extract_features(
            reference_batches(datamodule, num_images, batch_size),
            extractor.module,
            batch_size=batch_size,
            total=num_images,
            desc="reference features",
            device=device,
            progress=progress,
            report=report,
        )
        save_real_stats(path, features.stats(), extractor.backend, features.stacked().numpy())
    return open_reference(path)
