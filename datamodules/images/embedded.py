"""Embedded image data: Fashion-MNIST from the Debian package, scikit-learn digits as fallback.

    /usr/share/datasets/fashion-mnist present ?  --yes-->  Fashion-MNIST, 60k/10k 28x28, 10 classes
                                                 --no--->  sklearn load_digits, 8x8 scaled to 0-255,
                                                           a fixed 80/20 train/test split

`EmbeddedImageDataModule` turns either into 3-channel images at `image_size`: the whole array
is resized once as uint8 (cheap to index), and per-sample work is only the light train
augmentation (pad-and-crop, horizontal flip) plus normalization, all torchvision v2 on tensors.
`ImageFolderDataModule` (ImageNet layout, DeiT transforms) lives beside it in folder.py.
"""

# Annotations are evaluated (no ``from __future__ import annotations``): jsonargparse checks the
# ``Annotated`` bounds while parsing only then.

import gzip
from pathlib import Path
from typing import Annotated, Literal, NamedTuple

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from annotated_types import Ge
from lightning.pytorch.utilities import rank_zero_warn
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from torch.utils.data import DataLoader
from torchvision.transforms import v2

from datamodules.loaders import make_loader
from datamodules.samplers import RandomPermutationSampler

__all__ = [
    "EmbeddedImageDataModule",
    "FASHION_MNIST_DIR",
    "ImageArrays",
    "UInt8ImageDataset",
    "embedded_image_info",
    "load_embedded_images",
    "read_idx_gz",
    "resize_uint8",
]

FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
FASHION_MNIST_NAME = "fashion-mnist"
FASHION_MNIST_CLASSES = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
)  # fmt: skip
FASHION_MNIST_FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
DIGITS_NAME = "sklearn-digits"
DIGITS_CLASSES = tuple(str(d) for d in range(10))
DIGITS_TRAIN_FRACTION = 0.8
DIGITS_SPLIT_SEED = 0

# IDX header byte 3 -> element type (big-endian on disk); http://yann.lecun.com/exdb/mnist/
_IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


class ImageArrays(NamedTuple):
    """One split of an embedded image set."""

    images: np.ndarray  # (N, H, W) uint8
    labels: np.ndarray  # (N,) int64
    class_names: tuple[str, ...]
    name: str


def read_idx_gz(path: str | Path) -> np.ndarray:
    """Reads an IDX file (gzipped if the name ends in .gz) into an array of its shape and type.

    Raises:
        FileNotFoundError: The file does not exist.
        ValueError: The header or the payload size is not valid IDX.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"IDX file {str(path)!r} does not exist")
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in _IDX_DTYPES:
        raise ValueError(f"{str(path)!r} is not an IDX file (bad magic {data[:4].hex()})")
    ndim = data[3]
    shape = tuple(int(d) for d in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    dtype = np.dtype(_IDX_DTYPES[data[2]])
    offset = 4 + 4 * ndim
    if len(data) - offset != int(np.prod(shape)) * dtype.itemsize:
        raise ValueError(f"{str(path)!r}: header shape {shape} does not match {len(data) - offset} payload bytes")
    return np.frombuffer(data, dtype=dtype, offset=offset).reshape(shape).astype(dtype.newbyteorder("="))


def embedded_image_info() -> tuple[str, tuple[str, ...]]:
    """(dataset name, class names) that `load_embedded_images` will return, without reading data."""
    if FASHION_MNIST_DIR.is_dir():
        return FASHION_MNIST_NAME, FASHION_MNIST_CLASSES
    return DIGITS_NAME, DIGITS_CLASSES


def _load_digits(split: str) -> ImageArrays:
    from sklearn.datasets import load_digits  # shipped inside scikit-learn, no download

    digits = load_digits()
    images = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)  # 0..16 -> 0..255
    order = np.random.default_rng(DIGITS_SPLIT_SEED).permutation(len(images))
    n_train = int(len(images) * DIGITS_TRAIN_FRACTION)
    index = np.sort(order[:n_train] if split == "train" else order[n_train:])
    return ImageArrays(images[index], digits.target[index].astype(np.int64), DIGITS_CLASSES, DIGITS_NAME)


def load_embedded_images(split: Literal["train", "test"]) -> ImageArrays:
    """Loads one split of the embedded image set.

    Returns:
        (images (N, H, W) uint8, labels (N,) int64, class_names, name): Fashion-MNIST as
        "fashion-mnist" when its Debian directory exists, else sklearn digits as "sklearn-digits".
    """
    if split not in FASHION_MNIST_FILES:
        raise ValueError(f"split={split!r} is not an embedded image split; valid: train, test")
    if not FASHION_MNIST_DIR.is_dir():
        return _load_digits(split)
    image_file, label_file = FASHION_MNIST_FILES[split]
    images = read_idx_gz(FASHION_MNIST_DIR / image_file).astype(np.uint8)
    labels = read_idx_gz(FASHION_MNIST_DIR / label_file).astype(np.int64)
    if images.ndim != 3 or len(images) != len(labels):
        raise ValueError(
            f"{str(FASHION_MNIST_DIR)!r}: {split} images {images.shape} do not match labels {labels.shape}"
        )
    return ImageArrays(images, labels, FASHION_MNIST_CLASSES, FASHION_MNIST_NAME)


def resize_uint8(images: torch.Tensor, size: int, chunk: int = 8192) -> torch.Tensor:
    """Resizes uint8 (N, C, H, W) images to (N, C, size, size), antialiased bilinear, in chunks."""
    if images.shape[-2:] == (size, size):
        return images
    out = torch.empty((*images.shape[:2], size, size), dtype=torch.uint8)
    for i in range(0, len(images), chunk):
        x = images[i : i + chunk].float()
        y = F.interpolate(x, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
        out[i : i + chunk] = y.round().clamp(0, 255).to(torch.uint8)
    return out


class UInt8ImageDataset(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """(image, label) pairs from uint8 tensors; grayscale is repeated to 3 channels.

    Without a transform an item is the raw uint8 (3, size, size) image, e.g. for a latent encoder.

    Args:
        images: (N, 1 or 3, H, W) uint8.
        labels: (N,) int64.
        size: Output side; images not already this size are resized per item.
        transform: Applied to the uint8 (3, size, size) image.
    """

    def __init__(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        size: int,
        transform: torch.nn.Module | None = None,
    ) -> None:
        if images.dtype != torch.uint8 or images.ndim != 4 or images.shape[1] not in (1, 3):
            raise ValueError(f"images must be uint8 (N, 1|3, H, W), got {images.dtype} {tuple(images.shape)}")
        if len(images) != len(labels):
            raise ValueError(f"{len(images)} images but {len(labels)} labels")
        self.images = images
        self.labels = labels
        self.size = size
        self.transform = transform

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        image = resize_uint8(self.images[index : index + 1], self.size)[0]  # no-op when pre-resized
        image = image.expand(3, -1, -1)  # (3, size, size); a view for grayscale
        if self.transform is not None:
            image = self.transform(image)
        return image, self.labels[index]


#################################################################################
#                          Embedded image DataModule                             #
#################################################################################

NORMALIZATIONS: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "imagenet": (IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD),  # ViT / DeiT inputs
    "half": ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),  # x / 127.5 - 1 in [-1, 1], for the VAE and DiT
}
MAX_PRERESIZE_BYTES = 1 << 30  # beyond this the array stays native-size and items resize one by one


class EmbeddedImageDataModule(L.LightningDataModule):
    """Fashion-MNIST (or sklearn digits) as 3-channel images for ViT, VAE and DiT runs.

    Splits: val is `val_size` images drawn from the official train split by a permutation
    seeded with `seed`; train is the rest (optionally the first `limit_train` of them in that
    permuted order); test is the official test split.

    Args:
        image_size: Output side in pixels (28x28 or 8x8 sources are resized once, bilinear).
        batch_size: Images per batch.
        num_workers: DataLoader worker processes.
        val_size: Images held out of train for validation (at most a fifth of the train split).
        augment: Pad-and-crop (padding image_size // 8) plus horizontal flip on train images.
        seed: Seed of the train/val carve and of the training order (resumable mid-epoch).
        normalize: "imagenet" (timm mean/std) or "half" (maps [0, 255] to [-1, 1]).
        limit_train: Keep only this many training images (quick runs), None for all.
    """

    in_chans = 3

    def __init__(
        self,
        image_size: Annotated[int, Ge(1)] = 32,
        batch_size: Annotated[int, Ge(1)] = 128,
        num_workers: Annotated[int, Ge(0)] = 0,
        val_size: Annotated[int, Ge(1)] = 5000,
        augment: bool = True,
        seed: int = 1234,
        normalize: Literal["imagenet", "half"] = "imagenet",
        limit_train: Annotated[int, Ge(1)] | None = None,
    ) -> None:
        super().__init__()
        for name, value in (("image_size", image_size), ("batch_size", batch_size), ("val_size", val_size)):
            if value <= 0:
                raise ValueError(f"{name}={value} must be a positive integer")
        if num_workers < 0:
            raise ValueError(f"num_workers={num_workers} must be >= 0")
        if normalize not in NORMALIZATIONS:
            raise ValueError(f"normalize={normalize!r} is not a normalization; valid: {', '.join(NORMALIZATIONS)}")
        if limit_train is not None and limit_train <= 0:
            raise ValueError(f"limit_train={limit_train} must be a positive integer or None")
        self.save_hyperparameters()
        self.image_size = image_size
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.val_size = val_size
        self.augment = augment
        self.seed = seed
        self.normalize = normalize
        self.limit_train = limit_train
        self.train_transform, self.eval_transform = self._build_transforms()
        name, classes = embedded_image_info()
        self.dataset_name: str = name
        self.class_names: list[str] = list(classes)
        self.train_dataset: UInt8ImageDataset | None = None
        self.train_sampler: RandomPermutationSampler | None = None
        self.val_dataset: UInt8ImageDataset | None = None
        self.test_dataset: UInt8ImageDataset | None = None
        self.train_index: np.ndarray | None = None
        self.val_index: np.ndarray | None = None

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def mean_std(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """Per-channel (mean, std) of the normalization, to undo it for image logging."""
        return NORMALIZATIONS[self.normalize]

    def _build_transforms(self) -> tuple[v2.Transform, v2.Transform]:
        """(train, eval) transforms, uint8 (3, S, S) -> normalized float (3, S, S)."""
        mean, std = self.mean_std
        eval_transform = v2.Compose([v2.ToDtype(torch.float32, scale=True), v2.Normalize(list(mean), list(std))])
        if not self.augment:
            return eval_transform, eval_transform
        pad = max(1, self.image_size // 8)  # 4 px at 32 px, the CIFAR recipe
        crop = [v2.RandomCrop(self.image_size, padding=pad), v2.RandomHorizontalFlip()]
        return v2.Compose([*crop, eval_transform]), eval_transform

    def _to_tensor(self, images: np.ndarray) -> torch.Tensor:
        """(N, H, W) uint8 array -> (N, 1, S, S) uint8 tensor, resized once when it fits in memory."""
        x = torch.from_numpy(np.ascontiguousarray(images)).unsqueeze(1)  # (N, 1, H, W)
        if len(x) * self.image_size**2 <= MAX_PRERESIZE_BYTES:
            x = resize_uint8(x, self.image_size)
        return x

    def setup(self, stage: str | None = None) -> None:
        """Loads both official splits once and carves validation out of train."""
        if self.train_dataset is not None:
            return
        train, test = load_embedded_images("train"), load_embedded_images("test")
        self.dataset_name, self.class_names = train.name, list(train.class_names)
        val_size = min(self.val_size, len(train.images) // 5)
        if val_size < self.val_size:
            rank_zero_warn(
                f"val_size={self.val_size} capped at {val_size}: {train.name} has {len(train.images)} train images"
            )
        order = np.random.default_rng(self.seed).permutation(len(train.images))
        val_index = np.sort(order[:val_size])
        train_index = np.sort(order[val_size:][: self.limit_train])  # slice with None keeps all
        self.train_index, self.val_index = train_index, val_index  # into the official train split
        labels = torch.from_numpy(train.labels)
        images = self._to_tensor(train.images)
        self.train_dataset = UInt8ImageDataset(images[train_index], labels[train_index], self.image_size)
        self.val_dataset = UInt8ImageDataset(images[val_index], labels[val_index], self.image_size)
        test_images = self._to_tensor(test.images)
        self.test_dataset = UInt8ImageDataset(test_images, torch.from_numpy(test.labels), self.image_size)
        self.train_sampler = RandomPermutationSampler(len(self.train_dataset), self.seed)

    def _loader(self, dataset: UInt8ImageDataset | None, transform: v2.Transform, train: bool) -> DataLoader:
        if dataset is None:
            raise RuntimeError("call setup() before asking for a dataloader")
        view = UInt8ImageDataset(dataset.images, dataset.labels, self.image_size, transform)
        sampler = self.train_sampler if train else None
        return make_loader(view, self.batch_size, train_sampler=sampler, trainer=self.trainer,
                           num_workers=self.num_workers)  # fmt: skip

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_dataset, self.train_transform, train=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_dataset, self.eval_transform, train=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.test_dataset, self.eval_transform, train=False)

    def predict_dataloader(self) -> DataLoader:
        return self.test_dataloader()
