"""Embedded images: IDX reading, Fashion-MNIST and its digits fallback, EmbeddedImageDataModule."""

from __future__ import annotations

import gzip
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

import datamodules.images.embedded as images
from datamodules.images.embedded import (
    DIGITS_NAME,
    FASHION_MNIST_CLASSES,
    EmbeddedImageDataModule,
    load_embedded_images,
    read_idx_gz,
    resize_uint8,
)

HAS_FASHION = images.FASHION_MNIST_DIR.is_dir()
needs_fashion = pytest.mark.skipif(not HAS_FASHION, reason="Debian dataset-fashion-mnist is not installed")


@pytest.fixture
def no_fashion(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Points the Fashion-MNIST directory somewhere empty, forcing the digits fallback."""
    monkeypatch.setattr(images, "FASHION_MNIST_DIR", tmp_path / "absent")


def _idx(header: bytes, payload: bytes, path: Path, zipped: bool = True) -> Path:
    (gzip.open if zipped else open)(path, "wb").write(header + payload)
    return path


@pytest.mark.parametrize("zipped", [True, False])
def test_read_idx_by_hand(tmp_path: Path, zipped: bool) -> None:
    pixels = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    header = bytes([0, 0, 0x08, 3]) + np.array([2, 3, 4], dtype=">u4").tobytes()
    got = read_idx_gz(_idx(header, pixels.tobytes(), tmp_path / "x.gz" if zipped else tmp_path / "x", zipped))
    np.testing.assert_array_equal(got, pixels)
    ints = np.array([7, -1, 70000], dtype=">i4")
    header = bytes([0, 0, 0x0C, 1]) + np.array([3], dtype=">u4").tobytes()
    assert read_idx_gz(_idx(header, ints.tobytes(), tmp_path / "i.gz")).tolist() == [7, -1, 70000]


def test_bad_idx_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"nope\.gz' does not exist"):
        read_idx_gz(tmp_path / "nope.gz")
    with pytest.raises(ValueError, match=r"bad\.gz' is not an IDX file \(bad magic 504b0304\)"):
        read_idx_gz(_idx(b"PK\x03\x04", b"", tmp_path / "bad.gz"))
    header = bytes([0, 0, 0x08, 1]) + np.array([10], dtype=">u4").tobytes()
    with pytest.raises(ValueError, match=r"short\.gz': header shape \(10,\) does not match 3 payload bytes"):
        read_idx_gz(_idx(header, b"abc", tmp_path / "short.gz"))


@needs_fashion
def test_fashion_mnist_loads_with_the_official_shapes() -> None:
    train, test = load_embedded_images("train"), load_embedded_images("test")
    assert train.images.shape == (60000, 28, 28) and train.images.dtype == np.uint8
    assert test.images.shape == (10000, 28, 28) and test.labels.shape == (10000,)
    assert train.name == "fashion-mnist" and train.class_names == FASHION_MNIST_CLASSES
    assert len(train.class_names) == 10
    assert np.bincount(train.labels).tolist() == [6000] * 10  # balanced, as published
    assert train.images.max() == 255


def test_digits_fallback_when_fashion_is_absent(no_fashion: None) -> None:
    train, test = load_embedded_images("train"), load_embedded_images("test")
    assert train.name == test.name == DIGITS_NAME
    assert train.images.shape == (1437, 8, 8) and test.images.shape == (360, 8, 8)  # 80/20 of 1797
    assert train.images.dtype == np.uint8 and train.images.max() == 255  # 16 -> 255
    assert sorted(set(train.labels.tolist())) == list(range(10)) and len(train.class_names) == 10
    again = load_embedded_images("train")
    np.testing.assert_array_equal(again.images, train.images)
    with pytest.raises(ValueError, match="split='val' is not an embedded image split"):
        load_embedded_images("val")  # type: ignore[arg-type]


def test_resize_keeps_constants_and_skips_same_size() -> None:
    flat = torch.full((2, 1, 8, 8), 200, dtype=torch.uint8)
    assert torch.equal(resize_uint8(flat, 20), torch.full((2, 1, 20, 20), 200, dtype=torch.uint8))
    assert resize_uint8(flat, 8) is flat


def test_datamodule_on_digits_batches_and_normalization(no_fashion: None) -> None:
    dm = EmbeddedImageDataModule(image_size=16, batch_size=8, val_size=100, normalize="half")
    assert (dm.num_classes, dm.dataset_name, dm.in_chans, dm.image_size) == (10, DIGITS_NAME, 3, 16)
    dm.setup("fit")
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (8, 3, 16, 16) and x.dtype == torch.float32 and y.dtype == torch.int64
    raw, label = dm.val_dataset[0]
    assert raw.dtype == torch.uint8 and raw.shape == (3, 16, 16) and torch.equal(raw[0], raw[2])
    xv, yv = next(iter(dm.val_dataloader()))
    torch.testing.assert_close(xv[0], raw.float() / 127.5 - 1.0)  # "half": [0, 255] -> [-1, 1]
    assert int(yv[0]) == int(label)


def test_imagenet_normalization_uses_timm_constants(no_fashion: None) -> None:
    dm = EmbeddedImageDataModule(image_size=8, batch_size=4, val_size=50, normalize="imagenet")
    dm.setup()
    x, _ = next(iter(dm.test_dataloader()))
    raw = dm.test_dataset[0][0].float() / 255.0
    mean, std = torch.tensor(IMAGENET_DEFAULT_MEAN), torch.tensor(IMAGENET_DEFAULT_STD)
    torch.testing.assert_close(x[0], (raw - mean[:, None, None]) / std[:, None, None])


def test_val_is_carved_deterministically_and_disjointly(no_fashion: None) -> None:
    a = EmbeddedImageDataModule(val_size=200, limit_train=500, seed=5)
    b = EmbeddedImageDataModule(val_size=200, limit_train=500, seed=5)
    a.setup()
    b.setup()
    np.testing.assert_array_equal(a.val_index, b.val_index)
    assert torch.equal(a.train_dataset.images, b.train_dataset.images)
    assert len(a.val_index) == 200 and len(a.train_index) == len(a.train_dataset) == 500
    assert not set(a.val_index.tolist()) & set(a.train_index.tolist())
    c = EmbeddedImageDataModule(val_size=200, seed=6)
    c.setup()
    assert not np.array_equal(c.val_index, a.val_index) and len(c.train_dataset) == 1437 - 200
    assert len(c.test_dataset) == 360  # the official test split, untouched


def test_val_size_is_capped_on_the_small_fallback(no_fashion: None) -> None:
    dm = EmbeddedImageDataModule()
    with pytest.warns(UserWarning, match="val_size=5000 capped at 287"):
        dm.setup()
    assert len(dm.val_dataset) == 287


def test_augmentation_changes_train_images_only(no_fashion: None) -> None:
    dm = EmbeddedImageDataModule(image_size=16, val_size=50, normalize="half")
    dm.setup()
    image = dm.train_dataset[3][0]
    torch.manual_seed(0)
    augmented = torch.stack([dm.train_transform(image) for _ in range(20)])
    plain = dm.eval_transform(image)
    assert augmented.shape == (20, 3, 16, 16)
    assert any(not torch.equal(a, plain) for a in augmented)
    off = EmbeddedImageDataModule(image_size=16, val_size=50, normalize="half", augment=False)
    assert torch.equal(off.train_transform(image), plain)


@needs_fashion
def test_fashion_datamodule_splits() -> None:
    dm = EmbeddedImageDataModule(batch_size=16)
    dm.setup()
    assert (len(dm.train_dataset), len(dm.val_dataset), len(dm.test_dataset)) == (55000, 5000, 10000)
    assert dm.train_dataset.images.shape == (55000, 1, 32, 32)  # resized once, stored as uint8
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (16, 3, 32, 32) and y.max() < 10 and dm.class_names == list(FASHION_MNIST_CLASSES)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"image_size": 0}, "image_size=0 must be a positive integer"),
        ({"batch_size": -1}, "batch_size=-1 must be a positive integer"),
        ({"val_size": 0}, "val_size=0 must be a positive integer"),
        ({"num_workers": -3}, "num_workers=-3 must be >= 0"),
        ({"normalize": "zscore"}, "normalize='zscore' is not a normalization; valid: imagenet, half"),
        ({"limit_train": 0}, "limit_train=0 must be a positive integer or None"),
    ],
)
def test_bad_arguments_name_the_value(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        EmbeddedImageDataModule(**kwargs)
