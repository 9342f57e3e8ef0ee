"""An FSDP2 size that cannot cut a parameter is one line naming it, its shape, the size and what would be valid,
raised by ``parallelize`` before any collective (it was FSDP2's NotImplementedError traceback from inside
``configure_model``). Held against FSDP2 itself: a 2-rank world in this process (torch's fake process group, no
collective runs) where plain ``fully_shard`` raises on the same network and accepts the even one."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Shard
from torch.testing._internal.distributed.fake_pg import FakeStore

from experiments.parallel.config import ParallelConfig
from experiments.parallel.packed import pack_trunk
from experiments.parallel.shard import DP, TP, check_sharding, packed_weights, parallelize
from models import LanguageModel, TrunkConfig


def lm(dim: int, heads: int, device: str = "cpu") -> LanguageModel:
    with torch.device(device):
        trunk = TrunkConfig(dim=dim, depth=1, num_heads=heads, mlp_hidden=64, mlp="swiglu")
        return LanguageModel(trunk, vocab_size=64, max_seq_len=16)


@pytest.fixture
def two_ranks():
    """A (data_parallel 2, tensor_parallel 1) mesh in this one process."""
    assert not dist.is_initialized()
    dist.init_process_group("fake", rank=0, world_size=2, store=FakeStore())
    try:
        yield init_device_mesh("cpu", (2, 1), mesh_dim_names=(DP, TP))
    finally:
        dist.destroy_process_group()


def test_fsdp2_itself_refuses_the_odd_width_and_takes_the_even_one(two_ranks):
    """The reference: FSDP2 cuts a packed projection on its input axis and only evenly."""
    odd, even = lm(33, 3), lm(32, 2)
    for net in (odd, even):
        pack_trunk(net.trunk)
    place = set(packed_weights(odd))

    def placement(p):
        return Shard(p.ndim - 1) if id(p) in place else None

    with pytest.raises(NotImplementedError, match=r"uneven sharding on dim 2: torch.Size\(\[3, 33, 33\]\)"):
        fully_shard(odd.trunk.blocks[0], mesh=two_ranks[DP], shard_placement_fn=placement)
    place = set(packed_weights(even))
    fully_shard(even.trunk.blocks[0], mesh=two_ranks[DP], shard_placement_fn=placement)  # no error


def test_parallelize_names_the_parameter_its_shape_the_size_and_what_is_valid(two_ranks):
    with pytest.raises(ValueError) as refused:
        parallelize(lm(33, 3), two_ranks, ParallelConfig())
    assert str(refused.value) == (
        "parameter trunk.blocks.0.attn.qkv.weight of shape (3, 33, 33) cannot be split over data_parallel_size 2: "
        "FSDP2 cuts its dim 2 (33) into equal shares; valid: a data_parallel_size that divides 33 (1, 3, 11, 33), "
        "or a trunk dim that 2 divides"
    )
    parallelize(lm(32, 2), two_ranks, ParallelConfig())  # what FSDP2 takes is taken


def test_check_sharding_runs_on_a_meta_network_before_anything_is_launched():
    """No process group, no memory: a pre-launch check can build the network on meta and ask."""
    net = lm(48, 3, device="meta")
    pack_trunk(net.trunk)
    check_sharding(net, 1)
    check_sharding(net, 16)  # 48 = 16 x 3
    with pytest.raises(ValueError, match=r"^parameter trunk\.blocks\.0\.attn\.qkv\.weight of shape \(3, 48, 48\) .* "
                       r"data_parallel_size 5: .*divides 48 \(1, 2, 3, 4, 6, 8, 12, 16, 24, 48\)"):  # fmt: skip
        check_sharding(net, 5)
