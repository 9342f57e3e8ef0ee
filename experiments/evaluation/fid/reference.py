"""What a generation metric is measured against, recognised from the file itself.

    a folder of .png/.jpg            images        -> features -> FID stats, KID, precision / recall
    .npz with arr_0 (or images)      image batch   -> the same (uint8 N, H, W, 3: ADM / DiT samples)
    .npz with arr_0 + mu + sigma     ADM reference -> FID from the STORED mu / sigma (ADM computed them over
                                                      the whole ImageNet train set); arr_0 (10k images) only
                                                      for KID and precision / recall, as ADM's evaluator does
    .npz with mu + sigma             statistics    -> FID only (pytorch-fid / torch-fidelity files; this
                                                      suite's own, which may also hold the pool features)

Scoring ADM's ``VIRTUAL_imagenet256_labeled.npz`` against its 10k ``arr_0`` images instead of the stored
statistics gives a different (higher) FID than the DiT paper's; this module never does that. Every
``.npz`` is opened with ``allow_pickle=False``.
"""

from __future__ import annotations

import hashlib
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from experiments.evaluation.fid.images import IMAGE_SUFFIXES, ImageSet
from experiments.evaluation.fid.stats import load_stats_npz

LAYOUTS = (
    "image folder",
    "image .npz (arr_0 or images)",
    "ADM reference batch (arr_0 + mu, sigma)",
    "statistics (mu, sigma)",
)


@dataclass
class Reference:
    """An opened reference.

    Attributes:
        path: the file or folder.
        layout: one of ``LAYOUTS``.
        stats: stored (mu, sigma) for FID, or None (computed from ``images``).
        images: images for features (KID, precision / recall; FID when ``stats`` is None), or None.
        features: stored pool features (this suite's statistics files), or None.
        backend: the feature backend a statistics file of this suite records, or None.
        sha256: of the file, or of a folder's (relative name, bytes) pairs.
    """

    path: Path
    layout: str
    stats: object | None
    images: ImageSet | None
    features: np.ndarray | None
    backend: str | None
    sha256: str

    @property
    def image_count(self) -> int | str:
        """Images behind the FID statistics: a count, or "stored statistics" when they are unknown."""
        if self.stats is None:
            return len(self.images) if self.images is not None else 0
        n = self.stats.num_samples
        return "stored statistics" if n is None else int(n)

    def describe(self) -> str:
        count = self.image_count
        what = f"{count} images" if isinstance(count, int) else count
        return f"{self.path} ({self.layout}; FID from {what}; sha256 {self.sha256[:12]})"


def sha256_of(path: Path) -> str:
    """sha256 of a file, or of a folder's images (relative name and bytes, in name order)."""
    digest = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)
    for file in files:
        if path.is_dir():
            digest.update(str(file.relative_to(path)).encode())
        with open(file, "rb") as f:
            for chunk in iter(lambda f=f: f.read(1 << 24), b""):
                digest.update(chunk)
    return digest.hexdigest()


def npz_keys(path: Path) -> list[str]:
    """Array names in an .npz, read from the zip directory (no array is loaded)."""
    try:
        with zipfile.ZipFile(path) as zf:
            return sorted(n[: -len(".npy")] for n in zf.namelist() if n.endswith(".npy"))
    except zipfile.BadZipFile:
        raise ValueError(f"{path}: not a valid .npz file; valid: {', '.join(LAYOUTS)}") from None


def open_reference(path: str | Path, image_size: int | None = None) -> Reference:
    """Recognises the layout of ``path`` from what it holds and opens it (nothing large is loaded).

    Args:
        path: folder, image ``.npz``, ADM reference batch or statistics ``.npz``.
        image_size: None keeps images at their own size (the extractor resizes to 299 in float, as
            torch-fidelity and ADM do); a side S resizes first (see :class:`ImageSet`).

    Raises:
        FileNotFoundError: nothing at ``path``.
        ValueError: one line; an unrecognised ``.npz`` names the keys it found and the layouts accepted.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"FID reference not found: {path}; valid: {', '.join(LAYOUTS)}")
    if path.is_dir():
        return Reference(path, LAYOUTS[0], None, ImageSet(path, image_size), None, None, sha256_of(path))
    if path.suffix != ".npz":
        raise ValueError(f"FID reference {path}: not a folder or an .npz; valid: {', '.join(LAYOUTS)}")
    keys = set(npz_keys(path))
    image_key = next((k for k in ("arr_0", "images") if k in keys), None)
    has_stats = {"mu", "sigma"} <= keys
    if has_stats and image_key == "arr_0":
        stored = load_stats_npz(path)
        return Reference(path, LAYOUTS[2], stored.stats, ImageSet(path, image_size), None, None, sha256_of(path))
    if has_stats and image_key is None:
        stored = load_stats_npz(path)
        return Reference(path, LAYOUTS[3], stored.stats, None, stored.features, stored.backend, sha256_of(path))
    if image_key is not None and not has_stats:
        return Reference(path, LAYOUTS[1], None, ImageSet(path, image_size), None, None, sha256_of(path))
    raise ValueError(
        f"FID reference {path}: unrecognised .npz layout (keys: {', '.join(sorted(keys)) or 'none'}); "
        f"valid: {', '.join(LAYOUTS)}"
    )
