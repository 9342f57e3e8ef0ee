"""The resumable training order of the image and latent DataModules (RandomPermutationSampler), and how it is held
and sharded over ranks (a compact array, handed out lazily)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from lightning.fabric.utilities.distributed import DistributedSamplerWrapper

from datamodules.images.embedded import EmbeddedImageDataModule
from datamodules.samplers import RandomPermutationSampler, epoch_seed, shard_over_ranks


def _epoch(sampler: RandomPermutationSampler, epoch: int) -> list[int]:
    sampler.set_epoch(epoch)
    return list(sampler)


def test_each_epoch_is_a_seeded_permutation_of_every_index() -> None:
    sampler = RandomPermutationSampler(50, seed=7)
    first = _epoch(sampler, 0)
    assert sorted(first) == list(range(50)) and len(sampler) == 50
    expected = torch.randperm(50, generator=torch.Generator().manual_seed(epoch_seed(7, 0))).tolist()
    assert first == expected
    assert _epoch(sampler, 1) != first and _epoch(RandomPermutationSampler(50, seed=7), 0) == first


def test_a_resumed_epoch_continues_at_the_saved_offset_then_the_next_epoch_is_whole() -> None:
    original = RandomPermutationSampler(20, seed=3)
    order = _epoch(original, 2)
    resumed = RandomPermutationSampler(20, seed=0)
    resumed.load_state_dict({**original.state_dict(), "offset": 12})  # 12 items of epoch 2 were trained on
    resumed.set_epoch(2)  # Lightning does this before iterating the resumed epoch
    assert list(resumed)[:8] == order[12:]  # the 8 unseen items come first
    assert _epoch(resumed, 3) == _epoch(RandomPermutationSampler(20, seed=3), 3)


def test_ranks_take_interleaved_items_of_one_pass() -> None:
    sampler = RandomPermutationSampler(12, seed=1)

    def trainer(rank: int) -> SimpleNamespace:
        return SimpleNamespace(distributed_sampler_kwargs={"num_replicas": 3, "rank": rank})

    order = list(sampler)
    assert [list(shard_over_ranks(sampler, trainer(r))) for r in range(3)] == [order[r::3] for r in range(3)]
    assert isinstance(shard_over_ranks(sampler, trainer(0)), DistributedSamplerWrapper)
    assert shard_over_ranks(sampler, None) is sampler


def test_num_samples_must_be_positive() -> None:
    with pytest.raises(ValueError, match="num_samples=0 must be positive"):
        RandomPermutationSampler(0)


def test_embedded_images_train_loader_uses_the_resumable_sampler() -> None:
    dm = EmbeddedImageDataModule(image_size=8, batch_size=4, val_size=8, limit_train=16, seed=5)
    dm.setup("fit")
    loader = dm.train_dataloader()
    assert loader.sampler is dm.train_sampler and len(dm.train_sampler) == 16
    dm.train_sampler.set_epoch(0)
    labels = torch.cat([y for _, y in loader])
    expected = dm.train_dataset.labels[torch.tensor(list(dm.train_sampler))]
    assert torch.equal(labels, expected)


def _old_shard(n: int, seed: int, epoch: int, offset: int, rank: int, world: int) -> list[int]:
    """The reference: the epoch's permutation as a Python list, rotated by the resume offset, then PyTorch's
    DistributedSampler positions (rank, rank + W, ..., padded past the end from the start)."""
    order = torch.randperm(n, generator=torch.Generator().manual_seed(epoch_seed(seed, epoch))).tolist()
    rotated = order[offset % n :] + order[: offset % n]
    padded = list(range(n)) * (1 + world)
    total = -(-n // world) * world
    return [rotated[p] for p in padded[:total][rank:total:world]]


@pytest.mark.parametrize(("n", "world", "offset"), [(12, 3, 0), (13, 4, 5), (3, 5, 2), (140_001, 2, 77_777)])
def test_lazy_shards_equal_the_list_reference_with_padding_and_resume(n: int, world: int, offset: int) -> None:
    for rank in range(world):
        sampler = RandomPermutationSampler(n, seed=9)
        sampler.load_state_dict({"seed": 9, "epoch": 4, "offset": offset})
        sampler.set_epoch(4)
        trainer = SimpleNamespace(distributed_sampler_kwargs={"num_replicas": world, "rank": rank})
        shard = shard_over_ranks(sampler, trainer)
        got = list(shard)
        assert got == _old_shard(n, 9, 4, offset, rank, world) and len(got) == len(shard)
        assert all(type(i) is int for i in got[:5])
        assert sampler.state_dict() == {"seed": 9, "epoch": 4}  # the offset was used once


def test_an_epoch_is_held_as_a_compact_array_not_a_list() -> None:
    """1 M items: the draw is 4 bytes an item (int32) and a rank's first items come without listing the epoch
    (as Python ints it took about 40 bytes an item, twice over under Lightning's wrapper)."""
    import tracemalloc

    n = 1_000_000
    sampler = RandomPermutationSampler(n, seed=2)
    drawn = sampler.draw(torch.Generator().manual_seed(0))
    assert drawn.dtype == np.int32 and drawn.nbytes == 4 * n
    trainer = SimpleNamespace(distributed_sampler_kwargs={"num_replicas": 2, "rank": 1})
    tracemalloc.start()
    try:
        first = next(iter(shard_over_ranks(sampler, trainer)))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert first == _old_shard(n, 2, 0, 0, 1, 2)[0]
    assert peak < 8 * n, f"{peak / n:.1f} bytes an item"
