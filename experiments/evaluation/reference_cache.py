"""A reference's InceptionV3 features, computed once and reused by every run that scores against it.

KID and precision / recall need the reference's pool features, not only its statistics; a 3-seed x 2-scheme
DiT comparison would otherwise push the same 10k-50k reference images through InceptionV3 six times. The
first run writes them (with their ``mu`` / ``sigma``) in the statistics layout of
:mod:`experiments.evaluation.fid.stats`; later runs read that file::

    <cache dir>/reference-<sha256 of the reference, 16>-<backend>-<weights sha256, 12>-f<feature>-<size>-n<N>.npz

Everything that changes the features is in the name: the reference's content (its sha256, so an edited file
or folder is computed anew), the feature network (backend and the weights file's own sha256), the tap, the
image size protocol (``native`` or a resize) and the image count. Written atomically
(:func:`fileio.atomic_file`), read with ``allow_pickle=False``. A reference that has nothing to compute (a
statistics file, or one of this suite's with features) is returned as it is.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Callable
from pathlib import Path

import torch

from experiments.evaluation.fid.metric import FeatureExtractor
from experiments.evaluation.fid.reference import Reference
from experiments.evaluation.fid.stats import load_stats_npz, save_real_stats
from experiments.evaluation.generation import extract_features

_WEIGHTS_DIGESTS: dict[tuple[str, int, int], str] = {}  # (path, size, mtime) -> sha256: hashed once per process


def weights_digest(extractor: FeatureExtractor) -> str:
    """sha256 of the extractor's weights file (``proxy`` for the fixed random network, which has none)."""
    if extractor.weights_path is None:
        return "proxy"
    path = Path(extractor.weights_path)
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _WEIGHTS_DIGESTS:
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 24), b""):
                digest.update(block)
        _WEIGHTS_DIGESTS[key] = digest.hexdigest()
    return _WEIGHTS_DIGESTS[key]


def cached_features_path(cache_dir: str | Path, reference: Reference, extractor: FeatureExtractor) -> Path:
    """Where the features of ``reference`` under ``extractor`` are kept (module docstring)."""
    images = reference.images
    count = len(images) if images is not None else 0
    size = "native" if images is None or images.image_size is None else f"s{images.image_size}"
    backend = re.sub(r"[^A-Za-z0-9_.-]+", "_", extractor.backend)
    feature = int(extractor.module.num_features)
    name = f"reference-{reference.sha256[:16]}-{backend}-{weights_digest(extractor)[:12]}-f{feature}-{size}-n{count}"
    return Path(cache_dir) / f"{name}.npz"


def with_cached_features(
    reference: Reference,
    extractor: FeatureExtractor,
    cache_dir: str | Path,
    *,
    batch_size: int = 50,
    device: torch.device | str = "cpu",
    progress: bool = True,
    report: Callable[[int, int | None], None] | None = None,
) -> Reference:
    """``reference`` with its features (and, for images, its statistics) from the cache, computed on a miss.

    An ADM reference batch keeps its stored ``mu`` / ``sigma`` for FID (computed by ADM over the whole
    training set); only its ``arr_0`` features come from the cache. ``report`` is called with (images done,
    total) while they are computed.
    """
    if reference.images is None or reference.features is not None:
        return reference  # statistics only, or this suite's statistics file with features: nothing to compute
    path = cached_features_path(cache_dir, reference, extractor)
    if not path.is_file():
        computed = extract_features(
            reference.images.batches(batch_size),
            extractor.module,
            batch_size=batch_size,
            total=len(reference.images),
            desc="reference features (cached after this run)",
            device=device,
            progress=progress,
            report=report,
        )
        save_real_stats(path, computed.stats(), extractor.backend, computed.stacked().numpy())
    stored = load_stats_npz(path)
    if stored.features is None or len(stored.features) != len(reference.images):
        raise ValueError(
            f"{path}: holds {0 if stored.features is None else len(stored.features)} reference features, not "
            f"{len(reference.images)}; valid: delete it and it is computed again"
        )
    stats = reference.stats if reference.stats is not None else stored.stats
    return dataclasses.replace(reference, stats=stats, features=stored.features, backend=extractor.backend)
