"""Reference statistics files: the plain ``mu`` / ``sigma`` layout everyone exchanges, plus what this suite adds.

    mu        (D,)    float64   feature mean                       pytorch-fid, torch-fidelity, ADM
    sigma     (D, D)  float64   unbiased feature covariance        pytorch-fid, torch-fidelity, ADM
    num_samples, backend, feature   (optional) image count, feature backend, feature width: this suite
    features  (N, D)  float32   (optional) the pool features, so KID and precision / recall work too

So a file written here is read by pytorch-fid / torch-fidelity users (they read ``mu`` and ``sigma``),
and theirs are read here (FID only). Files are read with ``allow_pickle=False``. A cache file's name
carries what must match for reuse::

    <dataset>-<backend>-f<feature>-n<num_images>.npz
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

from fileio import atomic_file

PROXY_BACKEND = "proxy"


class RealStats(NamedTuple):
    """Gaussian summary of reference features.

    Attributes:
        mu: feature mean, (D,) float64.
        sigma: unbiased feature covariance, (D, D) float64.
        num_samples: number of images summarized; None when the file does not say (ADM, pytorch-fid).
    """

    mu: np.ndarray
    sigma: np.ndarray
    num_samples: int | None


@dataclass
class StoredStats:
    """A statistics file as read: the stats, and this suite's optional extras."""

    stats: RealStats
    features: np.ndarray | None
    backend: str | None


def real_stats_path(cache_dir: str | Path, dataset: str, backend: str, feature: int, num_images: int) -> Path:
    """Cache file for one (dataset, backend, feature dim, image count)."""
    return Path(cache_dir) / f"{dataset}-{backend}-f{feature}-n{num_images}.npz"


def same_feature_space(a: str | None, b: str | None) -> bool:
    """Stats of the proxy network and of InceptionV3 are not comparable; InceptionV3 from any source is."""
    return a is None or b is None or (a == PROXY_BACKEND) == (b == PROXY_BACKEND)


def save_real_stats(
    path: str | Path, stats: RealStats, backend: str, features: np.ndarray | None = None, replace: bool = True
) -> Path:
    """Writes a statistics file atomically (:func:`fileio.atomic_file`); ``replace=False``: only if ``path`` is
    still absent when the file is complete (two commands saving one new file: the first wins, whole)."""
    path = Path(path)
    extra = {} if features is None else {"features": np.asarray(features, np.float32)}
    with atomic_file(path, replace=replace) as f:
        np.savez(
            f,
            mu=stats.mu,
            sigma=stats.sigma,
            num_samples=-1 if stats.num_samples is None else stats.num_samples,
            backend=backend,
            feature=stats.mu.shape[0],
            **extra,
        )
    return path


SYMMETRY_TOLERANCE = 1e-6  # of the largest |entry|: what float32 storage and np.cov's rounding leave
EIGENVALUE_TOLERANCE = 1e-4  # of the largest |eigenvalue|: a rank-deficient covariance rounds slightly below 0


def check_covariance(sigma: np.ndarray, path: str | Path) -> None:
    """Refuses a ``sigma`` that no set of features has: not symmetric, or not positive semi-definite.

    FID's ``Tr(S_r + S_g - 2 (S_r S_g)^(1/2))`` gives a number for any square matrix (``-I`` included), so a
    broken statistics file would otherwise score silently.

    Raises:
        ValueError: one line naming the file, the largest asymmetry or the most negative eigenvalue.
    """
    scale = float(np.abs(sigma).max())
    asymmetry = float(np.abs(sigma - sigma.T).max())
    if asymmetry > SYMMETRY_TOLERANCE * max(scale, 1e-300):
        raise ValueError(
            f"{path}: sigma is not symmetric (|sigma - sigma^T| up to {asymmetry:.3g}); valid: a covariance matrix"
        )
    eigenvalues = np.linalg.eigvalsh((sigma + sigma.T) / 2)  # ascending
    lowest, largest = float(eigenvalues[0]), float(np.abs(eigenvalues).max())
    if lowest < -EIGENVALUE_TOLERANCE * largest:
        raise ValueError(
            f"{path}: sigma has the negative eigenvalue {lowest:.4g} (largest |eigenvalue| {largest:.4g}); "
            "valid: a positive semi-definite covariance"
        )


def load_stats_npz(path: str | Path) -> StoredStats:
    """Reads ``mu``, ``sigma`` and this suite's optional keys from an .npz (``allow_pickle=False``).

    Raises:
        ValueError: one line naming the file and the key that is wrong.
    """
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as data:
            mu, sigma = np.asarray(data["mu"], np.float64), np.asarray(data["sigma"], np.float64)
            n = int(data["num_samples"]) if "num_samples" in data else -1
            backend = str(data["backend"]) if "backend" in data else None
            features = np.asarray(data["features"], np.float32) if "features" in data else None
    except (OSError, KeyError, ValueError, TypeError) as err:  # OSError: not an .npz; ValueError: object arrays
        raise ValueError(
            f"{path}: not a statistics file ({err}); valid: an .npz with mu (D,) and sigma (D, D)"
        ) from None
    dim = mu.shape[0] if mu.ndim == 1 else -1
    if dim < 1 or sigma.shape != (dim, dim):
        raise ValueError(f"{path}: mu {mu.shape} and sigma {sigma.shape} do not fit; valid: mu (D,), sigma (D, D)")
    if not (np.isfinite(mu).all() and np.isfinite(sigma).all()):
        raise ValueError(f"{path}: mu or sigma holds non-finite values; valid: finite statistics")
    check_covariance(sigma, path)
    if features is not None and (features.ndim != 2 or features.shape[1] != dim):
        raise ValueError(f"{path}: features {features.shape} do not match mu ({dim},); valid: (N, {dim})")
    if features is not None and not np.isfinite(features).all():
        raise ValueError(f"{path}: features hold non-finite values; valid: finite features")
    return StoredStats(RealStats(mu, sigma, None if n < 0 else n), features, backend)


def load_real_stats(path: str | Path, backend: str | None = None) -> RealStats:
    """Reads the (mu, sigma, n) of a statistics file.

    Args:
        path: the .npz file.
        backend: when given, the file's recorded backend (if any) must share its feature space.

    Raises:
        FileNotFoundError: the file does not exist (the message says how to make it).
        ValueError: the file is not a statistics file, or was made with the proxy network (or vice versa).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"FID reference statistics not found: {path}; make them with "
            f"`python -m experiments fid REAL_IMAGES REAL_IMAGES --save-real-stats {path}`"
        )
    stored = load_stats_npz(path)
    if not same_feature_space(stored.backend, backend):
        raise ValueError(f"FID stats {path} were made with backend {stored.backend!r}, not comparable with {backend!r}")
    return stored.stats
