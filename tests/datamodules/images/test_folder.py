"""ImageFolderDataModule on a tiny generated tree: batches, the broken-file counter, layout errors."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from datamodules.images.folder import ImageFolderDataModule

FAST = {"image_size": 16, "batch_size": 2, "num_workers": 0, "pin_memory": False}


def _png(path: Path, seed: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(seed).integers(0, 256, size=(20, 24, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """train: cat x4, dog x3 + one corrupt dog (8 files, 4 full batches of 2); val: cat x1, dog x2."""
    root = tmp_path / "imagenet"
    for i in range(4):
        _png(root / "train" / "cat" / f"{i}.png", i)
    for i in range(3):
        _png(root / "train" / "dog" / f"{i}.png", 10 + i)
    (root / "train" / "dog" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not really a png")
    _png(root / "val" / "cat" / "0.png", 20)
    _png(root / "val" / "dog" / "0.png", 21)
    _png(root / "val" / "dog" / "1.png", 22)
    return root


def test_batches_classes_and_the_broken_file_count(tree: Path) -> None:
    dm = ImageFolderDataModule(str(tree), **FAST)
    assert dm.class_names == ["cat", "dog"] and dm.num_classes == 2
    dm.setup("fit")
    assert len(dm.train_dataset) == 8
    with pytest.warns(UserWarning, match=r"skipped unreadable image .*broken\.png.*1 skipped so far"):
        batches = list(dm.train_dataloader())
    assert len(batches) == 4
    for x, y in batches:
        assert x.shape == (2, 3, 16, 16) and x.dtype == torch.float32 and y.dtype == torch.int64
    assert dm.num_broken_images == 1  # each index is read once per epoch
    with pytest.warns(UserWarning, match=r"1 unreadable images were skipped"):
        dm.teardown("fit")


def test_broken_file_yields_the_next_readable_sample(tree: Path) -> None:
    dm = ImageFolderDataModule(str(tree), **FAST)
    dm.setup("fit")
    folder = dm.train_dataset.dataset
    broken = next(i for i, (path, _) in enumerate(folder.samples) if path.endswith("broken.png"))
    with pytest.warns(UserWarning, match="broken.png"):
        image, label = dm.train_dataset[broken]
    assert image.shape == (3, 16, 16) and label == folder.samples[(broken + 1) % len(folder)][1]
    assert dm.train_dataset.num_broken == 1


def test_broken_count_is_shared_with_worker_processes(tree: Path) -> None:
    dm = ImageFolderDataModule(str(tree), **{**FAST, "num_workers": 1, "batch_size": 1})
    dm.setup("validate")
    (tree / "val" / "cat" / "0.png").write_bytes(b"garbage")  # break one after scanning
    labels = torch.cat([y for _, y in dm.val_dataloader()])
    assert labels.tolist() == [1, 1, 1]  # the broken cat was replaced by the next sample, a dog
    assert dm.num_broken_images == 1  # counted in the worker, visible here


def test_eval_transform_and_test_split_is_val(tree: Path) -> None:
    dm = ImageFolderDataModule(str(tree), **FAST)
    dm.setup("test")
    assert dm.train_dataset is None
    x, y = next(iter(dm.test_dataloader()))
    xv, yv = next(iter(dm.val_dataloader()))
    assert torch.equal(x, xv) and torch.equal(y, yv)  # deterministic eval transform, same split
    assert x.shape == (2, 3, 16, 16)


def test_val_uses_train_labels_when_a_class_is_missing(tree: Path) -> None:
    shutil.rmtree(tree / "val" / "cat")
    dm = ImageFolderDataModule(str(tree), **FAST)
    dm.setup("validate")
    assert [y for _, y in dm.val_dataset.dataset.samples] == [1, 1]  # dog stays 1, as in train


def test_layout_errors_name_the_path(tree: Path, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=re.escape(f"{str(tmp_path / 'gone')!r} does not exist")):
        ImageFolderDataModule(str(tmp_path / "gone"), **FAST).setup()
    shutil.rmtree(tree / "val")
    with pytest.raises(FileNotFoundError, match=re.escape(f"{str(tree / 'val')!r} is missing")):
        ImageFolderDataModule(str(tree), **FAST).setup()


def test_split_without_images_or_classes_is_refused(tree: Path) -> None:
    for path in (tree / "val").rglob("*.png"):
        path.unlink()
    with pytest.raises(ValueError, match=r"val' holds no images \(.*\.png.*\) in its class directories"):
        ImageFolderDataModule(str(tree), **FAST).setup()
    (tree / "val" / "zebra").mkdir()
    with pytest.raises(ValueError, match="class directories absent from train/: zebra"):
        ImageFolderDataModule(str(tree), **FAST).setup()
    shutil.rmtree(tree / "train")
    (tree / "train").mkdir()
    with pytest.raises(ValueError, match=r"train' holds no class directories"):
        _ = ImageFolderDataModule(str(tree), **FAST).num_classes


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"image_size": 0}, "image_size=0 must be a positive integer"),
        ({"batch_size": 0}, "batch_size=0 must be a positive integer"),
        ({"num_workers": -1}, "num_workers=-1 must be >= 0"),
        ({"re_prob": 1.5}, "re_prob=1.5 must lie in [0, 1]"),
        ({"color_jitter": -0.1}, "color_jitter=-0.1 must be >= 0"),
        ({"interpolation": "cubic"}, "interpolation='cubic' is not supported; valid: bilinear, bicubic"),
        ({"eval_crop_pct": 0.0}, "eval_crop_pct=0.0 must lie in (0, 1]"),
        ({"global_batch_size": 0}, "global_batch_size=0 must be a positive integer (or null)"),
        ({"batch_size": 2, "global_batch_size": 64}, "batch_size=2 and global_batch_size=64 are both set; set one"),
        ({"auto_augment": "randaugment-m9"}, "auto_augment='randaugment-m9' is not a timm augmentation policy"),
    ],
)
def test_bad_arguments_name_the_value(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        ImageFolderDataModule("unused", **kwargs)


def test_augmentation_can_be_switched_off(tree: Path) -> None:
    dm = ImageFolderDataModule(str(tree), **{**FAST, "auto_augment": None, "re_prob": 0.0})
    dm.setup("fit")
    x, _ = next(iter(dm.train_dataloader()))
    assert x.shape == (2, 3, 16, 16)


@pytest.mark.parametrize(("processes", "accumulate", "per_device"), [(1, 1, 1024), (8, 1, 128), (4, 2, 128)])
def test_global_batch_is_split_over_processes_and_accumulation(processes: int, accumulate: int, per_device: int):
    dm = ImageFolderDataModule("unused", **{**FAST, "batch_size": None, "global_batch_size": 1024})
    shard = {"num_replicas": processes, "rank": 0} if processes > 1 else None
    dm.trainer = SimpleNamespace(
        world_size=processes, distributed_sampler_kwargs=shard, accumulate_grad_batches=accumulate
    )
    assert dm.per_device_batch_size() == per_device


def test_global_batch_that_does_not_split_names_the_valid_multiple(tree: Path):
    dm = ImageFolderDataModule(str(tree), **{**FAST, "batch_size": None, "global_batch_size": 1000})
    shard = {"num_replicas": 3, "rank": 0}
    dm.trainer = SimpleNamespace(world_size=3, distributed_sampler_kwargs=shard, accumulate_grad_batches=1)
    with pytest.raises(ValueError, match=re.escape("does not split evenly over 3 data-parallel replicas")):
        dm.setup("fit")


def test_global_batch_reaches_the_loader(tree: Path):
    dm = ImageFolderDataModule(str(tree), **{**FAST, "batch_size": None, "global_batch_size": 4})
    dm.setup("fit")  # no trainer: one process
    x, _ = next(iter(dm.train_dataloader()))
    assert x.shape[0] == 4


def test_ranks_that_found_other_images_are_refused_at_setup(tree: Path, monkeypatch) -> None:
    """This rank (1 of 2, all_gather faked) scans a folder where one image was replaced (another file size) since
    rank 0 scanned it: one line naming both; the folder as rank 0 saw it is taken."""
    import datamodules.fingerprint as fp

    records = {}

    def gather(out, mine):  # rank 0 answers with the first fingerprint it was asked about
        records.setdefault("rank0", {**mine, "rank": 0, "host": "node-a"})
        out[:] = [records["rank0"], mine]

    monkeypatch.setattr(fp, "_world", lambda: 2)
    monkeypatch.setattr(fp.dist, "get_rank", lambda: 1)
    monkeypatch.setattr(fp.dist, "all_gather_object", gather)
    ImageFolderDataModule(str(tree), **FAST).setup("fit")  # rank 0's view: the same on both
    ImageFolderDataModule(str(tree), **FAST).setup("fit")
    Image.fromarray(np.zeros((30, 30, 3), dtype=np.uint8)).save(tree / "val" / "dog" / "1.png")  # same name
    with pytest.raises(ValueError, match=r"^the ranks read different data: rank 0 on node-a read image folder "):
        ImageFolderDataModule(str(tree), **FAST).setup("fit")
