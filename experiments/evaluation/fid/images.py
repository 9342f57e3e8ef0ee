"""Image sets for the FID command line: a folder of png/jpg files or an .npz of uint8 NHWC images.

The .npz layout is the ADM / DiT evaluation suite's sample batch (key ``arr_0``, uint8 (N, H, W, 3));
key ``images`` is accepted too. The array is streamed from the zip member in batches, so 50k samples at
512x512 never sit in memory at once.
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
    """A folder or .npz of images, read lazily in uint8 (B, 3, S, S) batches.

    Images not already S x S are resized with the TF1-compatible bilinear that the InceptionV3
    extractor itself uses, then rounded to uint8; images at S x S pass through untouched.

    Args:
        path: a folder (searched recursively) or an .npz file.
        image_size: side S every image is brought to.

    Raises:
        FileNotFoundError: the path does not exist.
        ValueError: an empty folder, or an .npz without a usable uint8 image array.
    """

    def __init__(self, path: str | Path, image_size: int = 299) -> None:
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
        """Yield uint8 (B, 3, S, S) batches in file order."""
        if self.path.is_dir():
            for start in range(0, self.num_images, batch_size):
                arrays = [np.array(Image.open(f).convert("RGB")) for f in self.files[start : start + batch_size]]
                yield torch.cat([self._to_batch(a[None]) for a in arrays])  # sizes may differ per file
        else:
            for chunk in self._npz_chunks(batch_size):
                yield self._to_batch(chunk)

    def _to_batch(self, nhwc: np.ndarray) -> Tensor:
        """uint8 (B, H, W, 3) -> uint8 (B, 3, S, S)."""
        x = torch.from_numpy(np.ascontiguousarray(nhwc)).permute(0, 3, 1, 2)  # (B, 3, H, W)
        if x.shape[-2:] == (self.image_size, self.image_size):
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
