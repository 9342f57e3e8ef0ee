"""Reference ("real") statistics for FID, computed once per dataset and cached as .npz.

torchmetrics accumulates, per side, the feature sum, the sum of outer products and the count. A
Gaussian summary (mu, sigma, n) holds the same information::

    mu    = sum / n
    sigma = (cov_sum - n mu mu^T) / (n - 1)
    =>  sum = n mu,   cov_sum = (n - 1) sigma + n mu mu^T

so cached stats are written back into a metric's real accumulators exactly (float64) and FID from the
cache equals FID computed fresh. The file name carries everything that must match for reuse::

    <dataset>-<backend>-f<feature>-n<num_images>.npz      keys: mu, sigma, num_samples, backend, feature
"""

from __future__ import annotations

import os
import tempfile
import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor
from torchmetrics.image.fid import FrechetInceptionDistance


class RealStats(NamedTuple):
    """Gaussian summary of the reference features.

    Attributes:
        mu: feature mean, (D,) float64.
        sigma: unbiased feature covariance, (D, D) float64.
        num_samples: number of images summarized.
    """

    mu: np.ndarray
    sigma: np.ndarray
    num_samples: int


def real_stats_path(cache_dir: str | Path, dataset: str, backend: str, feature: int, num_images: int) -> Path:
    """Cache file for one (dataset, backend, feature dim, image count)."""
    return Path(cache_dir) / f"{dataset}-{backend}-f{feature}-n{num_images}.npz"


def read_real_stats(metric: FrechetInceptionDistance) -> RealStats:
    """Turn a metric's real accumulators into (mu, sigma, n), summed over ranks under DDP."""
    with metric.sync_context():  # no-op outside torch.distributed
        n = int(metric.real_features_num_samples)
        total = metric.real_features_sum.detach().double().cpu()  # (D,)
        cov_sum = metric.real_features_cov_sum.detach().double().cpu()  # (D, D)
    if n < 2:
        raise ValueError(f"need at least 2 real images for FID statistics, got {n}")
    mu = total / n
    sigma = (cov_sum - n * torch.outer(mu, mu)) / (n - 1)
    return RealStats(mu.numpy(), sigma.numpy(), n)


def write_real_stats(metric: FrechetInceptionDistance, stats: RealStats) -> None:
    """Set a metric's real accumulators from (mu, sigma, n); exact inverse of ``read_real_stats``.

    Under DDP torchmetrics sums the accumulators over ranks before ``compute``, so only rank 0 holds
    the statistics and the other ranks hold zeros: the sum is then exactly the reference set.
    """
    dim = metric.real_features_sum.shape[0]
    if stats.mu.shape != (dim,) or stats.sigma.shape != (dim, dim):
        raise ValueError(f"cached FID stats have dimension {stats.mu.shape[0]}, the metric has {dim}")
    device = metric.real_features_sum.device
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    keep = 0 if distributed and torch.distributed.get_rank() != 0 else 1
    n = stats.num_samples
    mu = torch.as_tensor(stats.mu, dtype=torch.float64)
    sigma = torch.as_tensor(stats.sigma, dtype=torch.float64)
    metric.real_features_sum = (keep * n * mu).to(device)
    metric.real_features_cov_sum = (keep * ((n - 1) * sigma + n * torch.outer(mu, mu))).to(device)
    metric.real_features_num_samples = torch.tensor(keep * n, dtype=torch.long, device=device)


def compute_real_stats(images_iter: Iterable[Tensor], metric: FrechetInceptionDistance) -> RealStats:
    """Feed reference images through the metric as ``real`` and summarize them.

    The metric's real accumulators are cleared first and hold exactly these images afterwards.

    Args:
        images_iter: batches of uint8 images (N, 3, H, W).
        metric: the FID metric whose extractor defines the features.

    Returns:
        (mu, sigma, num_samples).
    """
    device = metric.real_features_sum.device
    metric.real_features_sum = torch.zeros_like(metric.real_features_sum)
    metric.real_features_cov_sum = torch.zeros_like(metric.real_features_cov_sum)
    metric.real_features_num_samples = torch.tensor(0, dtype=torch.long, device=device)
    for batch in images_iter:
        metric.update(batch.to(device), real=True)
    return read_real_stats(metric)


def save_real_stats(path: str | Path, stats: RealStats, backend: str) -> Path:
    """Write stats to ``path`` atomically (temp file + ``os.replace``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp.npz", dir=path.parent)
    os.close(fd)
    try:
        np.savez(
            tmp,
            mu=stats.mu,
            sigma=stats.sigma,
            num_samples=stats.num_samples,
            backend=backend,
            feature=stats.mu.shape[0],
        )
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def is_real_stats_file(path: str | Path) -> bool:
    """True for an .npz written by ``save_real_stats`` (stats only, no image array)."""
    path = Path(path)
    if path.suffix != ".npz" or not path.is_file() or not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as zf:
        names = set(zf.namelist())
    return {"mu.npy", "sigma.npy", "backend.npy"} <= names and not {"arr_0.npy", "images.npy"} & names


def load_real_stats(path: str | Path, backend: str | None = None) -> RealStats:
    """Read stats written by ``save_real_stats``.

    Args:
        path: the .npz file.
        backend: when given, the file must have been made with this backend.

    Raises:
        FileNotFoundError: the file does not exist (the message says how to make it).
        ValueError: the file was made with another backend.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"FID reference statistics not found: {path}; make them with "
            f"`python -m experiments fid REAL_IMAGES REAL_IMAGES --save-real-stats {path}` "
            "or experiments.evaluation.fid.real_stats_for(path, metric, backend, images=...)"
        )
    with np.load(path, allow_pickle=False) as data:
        stored = str(data["backend"])
        if backend is not None and stored != backend:
            raise ValueError(f"FID stats {path} were made with backend {stored!r}, not {backend!r}")
        return RealStats(data["mu"], data["sigma"], int(data["num_samples"]))


def real_stats_for(
    path: str | Path,
    metric: FrechetInceptionDistance,
    backend: str,
    images: Iterable[Tensor] | None = None,
) -> RealStats:
    """Put a dataset's reference statistics into ``metric``, computing and caching them only once.

    Args:
        path: cache file, normally from ``real_stats_path``.
        metric: FID metric (build it with ``reset_real_features=False`` so the stats survive resets).
        backend: the metric's backend; a cache made with another backend is refused.
        images: reference batches, used only when ``path`` does not exist yet; None makes the cache
            required.

    Returns:
        The statistics now held by the metric's real accumulators.
    """
    if Path(path).is_file() or images is None:
        stats = load_real_stats(path, backend)
        write_real_stats(metric, stats)
        return stats
    stats = compute_real_stats(images, metric)
    save_real_stats(path, stats, backend)
    write_real_stats(metric, stats)  # same accumulator layout as a cache hit, whichever each rank took
    return stats
