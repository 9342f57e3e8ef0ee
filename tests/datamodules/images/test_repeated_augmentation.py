"""DeiT's repeated augmentation: each drawn image 3 times per epoch, on different ranks, differently augmented, in
an epoch as long as DeiT's RASampler makes it."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from datamodules.images.folder import ImageFolderDataModule
from datamodules.samplers import RepeatedAugmentationSampler, epoch_seed, shard_over_ranks


def _deit_rasampler(order: torch.Tensor, num_replicas: int, rank: int, num_repeats: int = 3) -> list[int]:
    """facebookresearch/deit samplers.py RASampler.__iter__, line for line, on a given permutation."""
    n = len(order)
    num_samples = int(math.ceil(n * num_repeats / num_replicas))
    total_size = num_samples * num_replicas
    num_selected_samples = int(math.floor(n // 256 * 256 / num_replicas))
    indices = torch.repeat_interleave(order, repeats=num_repeats, dim=0).tolist()
    padding_size = total_size - len(indices)
    if padding_size > 0:
        indices += indices[:padding_size]
    indices = indices[rank:total_size:num_replicas]
    return indices[:num_selected_samples]


def _shares(size: int, world: int, seed: int, epoch: int) -> list[list[int]]:
    shares = []
    for rank in range(world):
        sampler = RepeatedAugmentationSampler(size, 3, world, seed)
        sampler.set_epoch(epoch)
        trainer = SimpleNamespace(distributed_sampler_kwargs={"num_replicas": world, "rank": rank})
        shares.append(list(shard_over_ranks(sampler, trainer)))
    return shares


@pytest.mark.parametrize(("size", "world"), [(600, 4), (1000, 3), (300, 1), (777, 8)])
def test_each_rank_reads_what_deits_sampler_gives_it(size: int, world: int) -> None:
    shares = _shares(size, world, seed=5, epoch=2)
    order = torch.randperm(size, generator=torch.Generator().manual_seed(epoch_seed(5, 2)))
    assert shares == [_deit_rasampler(order, world, rank) for rank in range(world)]
    assert {len(s) for s in shares} == {size // 256 * 256 // world}  # DeiT's num_selected_samples per rank


def test_every_drawn_image_appears_three_times_per_epoch_on_different_ranks() -> None:
    shares = _shares(1000, 4, seed=1, epoch=0)
    assert sum(map(len, shares)) == 768  # floor(1000 / 256) * 256, split evenly over 4 ranks
    counts = Counter(i for share in shares for i in share)
    assert sorted(Counter(counts.values()).items()) == [(3, 256)]  # 768 = 256 images x 3 copies
    ranks: dict[int, list[int]] = {}
    for rank, share in enumerate(shares):
        for i in share:
            ranks.setdefault(i, []).append(rank)
    assert all(len(set(r)) == 3 for r in ranks.values())  # the copies of an image are on 3 different ranks
    other = _shares(1000, 4, seed=1, epoch=1)
    assert other != shares and Counter(i for s in other for i in s).keys() != counts.keys()  # a fresh draw


def test_too_few_images_for_deits_epoch_are_refused() -> None:
    assert len(RepeatedAugmentationSampler(300, 3, replicas=2)) == 256  # 128 per rank
    with pytest.raises(ValueError, match="at least 256 training images per 2 rank.*the split holds 200"):
        RepeatedAugmentationSampler(200, 3, replicas=2)


def _tree(root: Path, count: int) -> Path:
    for i in range(count):
        path = root / "train" / f"c{i % 2}" / f"{i}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.random.default_rng(i).integers(0, 256, (12, 12, 3), dtype=np.uint8)).save(path)
    for c in (0, 1):
        (root / "val" / f"c{c}").mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.zeros((12, 12, 3), dtype=np.uint8)).save(root / "val" / f"c{c}" / "0.png")
    return root


def test_the_folder_module_repeats_each_image_with_a_different_augmentation(tmp_path: Path) -> None:
    root = _tree(tmp_path / "imagenet", 300)
    fast = {"image_size": 16, "batch_size": 32, "num_workers": 0, "pin_memory": False, "seed": 3, "auto_augment": None}
    dm = ImageFolderDataModule(str(root), repeated_augmentation=3, **fast)
    dm.setup("fit")
    assert isinstance(dm.train_sampler, RepeatedAugmentationSampler) and len(dm.train_sampler) == 256
    torch.manual_seed(0)
    loader = dm.train_dataloader()
    images = torch.cat([x for x, _ in loader])
    order = list(dm.train_sampler)
    assert images.shape[0] == len(order) == 256
    assert order[0] == order[1] == order[2] and len(set(order[:6])) == 2
    for start in range(0, 255, 3):  # copies of one image, one after the other: augmented differently
        copies = images[start : start + 3]
        assert not torch.equal(copies[0], copies[1]) and not torch.equal(copies[1], copies[2])
    plain = ImageFolderDataModule(str(root), **fast)
    plain.setup("fit")
    assert len(plain.train_sampler) == 300 and sorted(plain.train_sampler) == list(range(300))
