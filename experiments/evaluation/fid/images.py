"""Image sets for the FID command line: a folder of png/jpg files or an .npz of uint8 NHWC images.

The .npz layout is the ADM / DiT evaluation suite's sample batch (key ``arr_0``, uint8 (N, H, W, 3));
key ``images`` is accepted too. The array is streamed from the zip member in batches, so 50k samples at
512x512 never sit in memory at once.

Images reach the InceptionV3 extractor at their own size, as uint8: the network resizes them to 299 in
float (TF1-compatible bilinear) itself, which is what torch-fidelity and ADM's evaluator do, so the same
images give their numbers. A folder of mixed sizes is fed in runs of equal size (same result, smaller
batches). Only an explicit ``image_size`` resizes first, and rounds to uint8: a different protocol, for
users who want every image brought to one size before scoring.
"""

from __future__ import annotations

import math
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import numpy as np
import torch
from PIL import Image
from torch import Tensor
from torch_fidelity.interpolate_compat_tensorflow import interpolate_bilinear_2d_like_tensorflow1x

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
NPZ_KEYS = ("arr_0", "images")


class ImageSet:
    """A folder or .npz of images, read lazily in uint8 (B, 3, H, W) batches.

    Args:
        path: a folder (searched recursively) or an .npz file.
        image_size: None (default) keeps every image at its own size, so the extractor resizes in float as
            torch-fidelity does; a side S resizes to S x S first (TF1-compatible bilinear, rounded to uint8).

    Raises:
        FileNotFoundError: the path does not exist.
        ValueError: an empty folder, or an .npz without a usable uint8 image array.
    """

    def __init__(self, path: str | Path, image_size: int | None = None) -> None:
        self.path = Path(path)
        self.image_size = image_size
        if not self.path.exists():
            raise FileNotFoundError(f"no such image folder or .npz: {self.path}")
        if self.path.is_dir():
            self.files = sorted(p for p in self.path.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)
            if not self.files:
                raise ValueError(f"no .png/.jpg images under {self.path}")
            self.num_images = len(self.files)
        elif self.path.suffix == ".npz":
            self.member, shape = self._npz_header()
            self.num_images = shape[0]
        else:
            raise ValueError(f"expected a folder or an .npz file, got {self.path}")

    def __len__(self) -> int:
        return self.num_images

    def batches(self, batch_size: int) -> Iterator[Tensor]:
        """Yield uint8 (B, 3, H, W) batches in file order (B <= batch_size; a folder's batch ends where the
        image size changes)."""
        if self.path.is_dir():
            for start in range(0, self.num_images, batch_size):
                arrays = [self._decode(f) for f in self.files[start : start + batch_size]]
                run: list[np.ndarray] = []
                for array in arrays:
                    if run and array.shape != run[0].shape:
                        yield self._to_batch(np.stack(run))
                        run = []
                    run.append(array)
                yield self._to_batch(np.stack(run))
        else:
            for chunk in self._npz_chunks(batch_size):
                yield self._to_batch(chunk)

    @staticmethod
    def _decode(file: Path) -> np.ndarray:
        """One image as uint8 (H, W, 3); a file that is not a readable image is named in one line."""
        try:
            with Image.open(file) as image:
                return np.array(image.convert("RGB"))
        except (OSError, ValueError, Image.DecompressionBombError) as err:
            raise ValueError(f"{file} is not a readable image ({str(err).splitlines()[0][:100]})") from None

    def _to_batch(self, nhwc: np.ndarray) -> Tensor:
        """uint8 (B, H, W, 3) -> uint8 (B, 3, H, W), or (B, 3, S, S) when an image_size was asked for."""
        x = torch.from_numpy(np.ascontiguousarray(nhwc)).permute(0, 3, 1, 2)  # (B, 3, H, W)
        if self.image_size is None or x.shape[-2:] == (self.image_size, self.image_size):
            return x.contiguous()
        size = (self.image_size, self.image_size)
        x = interpolate_bilinear_2d_like_tensorflow1x(x.float(), size=size, align_corners=False)
        return x.round().clamp(0, 255).to(torch.uint8)

    def _npz_header(self) -> tuple[str, tuple[int, ...]]:
        """Find the image array in the .npz and check it is uint8 (N, H, W, 3) in C order."""
        try:
            with zipfile.ZipFile(self.path) as zf:
                names = zf.namelist()
                key = next((k for k in NPZ_KEYS if f"{k}.npy" in names), None)
                if key is None:
                    raise ValueError(f"{self.path} has none of the keys {NPZ_KEYS} (found {names[:5]})")
                with zf.open(f"{key}.npy") as f:
                    shape, fortran, dtype = _read_npy_header(f)
        except zipfile.BadZipFile as err:
            raise ValueError(f"not a valid .npz file: {self.path}") from err
        if dtype != np.uint8 or len(shape) != 4 or shape[-1] != 3 or fortran:
            raise ValueError(f"{self.path}[{key}] must be uint8 (N, H, W, 3) in C order, got {dtype} {shape}")
        return f"{key}.npy", shape

    def _npz_chunks(self, batch_size: int) -> Iterator[np.ndarray]:
        """Stream the array from the zip member, ``batch_size`` images at a time."""
        with zipfile.ZipFile(self.path) as zf, zf.open(self.member) as f:
            shape, _, _ = _read_npy_header(f)
            per_image = math.prod(shape[1:])
            for start in range(0, shape[0], batch_size):
                count = min(batch_size, shape[0] - start)
                buf = f.read(count * per_image)
                if len(buf) != count * per_image:
                    raise ValueError(f"{self.path} is truncated at image {start}")
                yield np.frombuffer(bytearray(buf), dtype=np.uint8).reshape(count, *shape[1:])  # writable copy


def _read_npy_header(f: IO[bytes]) -> tuple[tuple[int, ...], bool, np.dtype]:
    """Read a .npy header from an open stream, leaving it at the first data byte."""
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
        return np.lib.format.read_array_header_1_0(f)
    return np.lib.format.read_array_header_2_0(f)
