"""FSDP2 over the data-parallel mesh dimension, after tensor parallelism over the other (torchtitan's order).

    parallelize(net, mesh, config)
      0. fused projections held as their parts (experiments.parallel.packed), at every mesh size
      1. tensor_parallel > 1: experiments.parallel.tensor (per Block, in place); or, for an MoE trunk with
         parallel.expert_parallel(_size), its experts split over groups of data-parallel ranks and FSDP2-sharded
         over the groups (experiments.parallel.expert)
      2. parallel.compile: each trunk Block compiled (experiments.parallel.compile)
      3. fully_shard(block) for every trunk Block, then fully_shard(net) for what is left (embeddings, heads,
         readout): one all-gather per Block in forward and in backward, one reduce-scatter per Block
      4. the names of the sequence-parallel parameters kept on the net, for sync_grads

Activation checkpointing stays the trunk's own switch (``trunk.activation_checkpointing``): it recomputes each
Block inside ``forward_state``, which composes with fully_shard (the Block's parameters are gathered again for
the recomputation); with ``parallel.compile`` the recomputation moves inside each compiled Block (step 2). The
network is built and initialized on every rank before this (the same seed gives the same init everywhere), so the
sharded init is the one-process init, cut into shards; or, with ``meta_init``, built on the meta device and filled
per rank after this, each rank drawing the full tensors and keeping its own slices (experiments.parallel.meta_init):
the same bits.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, Shard

from experiments.parallel.compile import compile_blocks
from experiments.parallel.config import DTYPES, ParallelConfig
from experiments.parallel.expert import (
    EP,
    EP_SHARD,
    apply_expert_parallel,
    expert_mesh,
    expert_modules,
    scale_expert_grads,
)
from experiments.parallel.packed import PackedLinear, pack_trunk
from experiments.parallel.tensor import apply_tensor_parallel, check_tensor_parallel, sequence_parallel_params
from models.trunk import Trunk

DP, TP = "data_parallel", "tensor_parallel"  # Lightning's ModelParallelStrategy names its mesh dimensions so
SP_PARAMS = "_sequence_parallel_params"  # attribute on the net: names of the parameters synced over TP
EP_RANKS = "_expert_parallel_ranks"  # attribute on the net: ranks of a group its experts are split over (0: none)
REPLICATED = "_replicated_params"  # attribute on the net: parameters FSDP2 leaves whole (0-dim ones)


def is_parallelized(net: nn.Module) -> bool:
    """Whether :func:`parallelize` already ran on ``net`` (``configure_model`` runs at every stage)."""
    return hasattr(net, SP_PARAMS)


def trunk_of(net: nn.Module) -> Trunk:
    trunk = getattr(net, "trunk", None)
    if not isinstance(trunk, Trunk):
        raise TypeError(f"{type(net).__name__} has no trunk to parallelize")
    return trunk


def packed_weights(net: nn.Module) -> dict[int, str]:
    """``id(weight) -> name`` of every :class:`PackedLinear` weight of ``net``: FSDP2 cuts these on their input axis
    (the last), the others on dim 0."""
    names = {id(p): n for n, p in net.named_parameters()}
    return {id(m.weight): names.get(id(m.weight), "?") for m in net.modules() if isinstance(m, PackedLinear)}


def check_sharding(net: nn.Module, data_parallel: int) -> None:
    """Raises one line when FSDP2 over ``data_parallel`` ranks cannot cut a parameter of ``net`` (after
    :func:`~experiments.parallel.packed.pack_trunk`): a packed projection is cut on its input axis, which FSDP2
    cuts only evenly (``NotImplementedError: FSDP does not support uneven sharding on dim ...`` otherwise; dim 0
    it pads). Works on a network built on the meta device, so it can run before anything is launched.

    Raises:
        ValueError: ``parameter trunk.blocks.0.attn.qkv.weight of shape (3, 33, 33) cannot be split over
            data_parallel_size 2: FSDP2 cuts its dim 2 (33) into equal shares; valid: a data_parallel_size that
            divides 33 (1, 3, 11, 33), or a trunk dim that 2 divides``.
    """
    if data_parallel <= 1:
        return
    packed = packed_weights(net)
    cut = [(n, p) for n, p in net.named_parameters() if id(p) in packed and p.ndim and p.shape[-1] % data_parallel]
    if not cut:
        return
    name, param = cut[0]
    width = math.gcd(*(p.shape[-1] for p in net.parameters() if id(p) in packed))
    divisors = [d for d in range(1, width + 1) if width % d == 0]
    shown = ", ".join(map(str, divisors[:12])) + (", ..." if len(divisors) > 12 else "")
    raise ValueError(
        f"parameter {name} of shape {tuple(param.shape)} cannot be split over data_parallel_size {data_parallel}: "
        f"FSDP2 cuts its dim {param.ndim - 1} ({param.shape[-1]}) into equal shares; valid: a data_parallel_size "
        f"that divides {width} ({shown}), or a trunk dim that {data_parallel} divides"
    )


def parallelize(net: nn.Module, mesh: DeviceMesh, config: ParallelConfig, seq_len: int | None = None) -> nn.Module:
    """Applies tensor parallelism (if the mesh has a tensor-parallel size above 1) and FSDP2 to ``net``, in place.

    Args:
        net: a suite network with a ``trunk`` (LanguageModel, ViTClassifier, DiT), initialized the same on every rank.
        mesh: a 2-D mesh named ("data_parallel", "tensor_parallel"), as ``ModelParallelStrategy`` builds it.
        config: mixed precision and resharding.
        seq_len: the trunk's sequence length when known before the first batch (checked against the TP size).

    Raises:
        ValueError: a trunk this plan cannot shard over the tensor-parallel size, or a parameter FSDP2 cannot
            cut over the data-parallel size (one line saying why and what would be valid), before any collective.
    """
    trunk = trunk_of(net)
    tp = mesh[TP].size()
    sp_names: list[str] = []
    pack_trunk(trunk)  # at every mesh size: one checkpoint layout whatever the tensor-parallel size
    check_sharding(net, mesh[DP].size())
    if tp > 1:
        check_tensor_parallel(trunk, tp, seq_len)
        apply_tensor_parallel(trunk, mesh[TP])
        names = {id(p): n for n, p in net.named_parameters()}
        sp_names = [names[id(p)] for p in sequence_parallel_params(trunk)]
    dp_mesh = mesh[DP]
    device_type = mesh.device_type
    policy = MixedPrecisionPolicy(
        param_dtype=config.param_torch_dtype(device_type), reduce_dtype=DTYPES[config.reduce_dtype]
    )
    degree = config.expert_degree(dp_mesh.size())
    if degree:  # split over groups of `degree` ranks, each expert's share FSDP2-sharded over the groups (torchtitan)
        ep_mesh = expert_mesh(dp_mesh, degree)
        apply_expert_parallel(trunk, ep_mesh[EP])
        for module in expert_modules(trunk):
            fully_shard(module, mesh=ep_mesh[EP_SHARD], mp_policy=policy,
                        reshard_after_forward=config.reshard_after_forward)  # fmt: skip
    compile_blocks(trunk, config)  # after the model-parallel styles, before FSDP2 (torchtitan's order)
    # fully_shard cannot cut a 0-dim parameter (Hyper-Connections' gains): it stays whole on every rank, outside
    # FSDP2, and sync_grads averages its gradient over data_parallel as FSDP2 does for the others
    scalars = {p for p in net.parameters() if p.ndim == 0}
    left_out = scalars
    # A packed projection's weight is (parts, rows, in): cut on dim 0 (2 or 3 parts) every rank would hold a padded
    # third or half of it; cut on its input axis (the last: a grouped-query qkv is (kv_heads, parts, Dh, in)), each
    # holds 1 / data_parallel (rows may be tensor-parallel)
    packed = packed_weights(net)
    shard = {
        "mesh": dp_mesh, "mp_policy": policy, "reshard_after_forward": config.reshard_after_forward,
        "shard_placement_fn": lambda p: Shard(p.ndim - 1) if id(p) in packed else None,
    }  # fmt: skip
    for block in trunk.blocks:
        fully_shard(block, ignored_params={p for p in block.parameters() if p in left_out} or None, **shard)
    fully_shard(net, ignored_params=left_out or None, **shard)
    names = {id(p): n for n, p in net.named_parameters()}
    setattr(net, SP_PARAMS, tuple(sp_names))
    setattr(net, REPLICATED, tuple(names[id(p)] for p in scalars))
    setattr(net, EP_RANKS, degree)
    return net


@torch.no_grad()
def sync_grads(net: nn.Module, mesh: DeviceMesh) -> None:
    """What FSDP2's reduction leaves to do before the optimizer step: the gradients each rank computed from its
    own share of the sequence (or its own heads) summed over the tensor-parallel group, and the experts'
    summed gradients averaged over the expert-parallel ranks. A no-op for plain FSDP2."""
    if ranks := getattr(net, EP_RANKS, 0):
        scale_expert_grads(trunk_of(net), ranks)
    if mesh[TP].size() > 1:
        _all_reduce(_grads(net, getattr(net, SP_PARAMS, ())), mesh[TP].get_group())
    if mesh[DP].size() > 1 and (whole := _grads(net, getattr(net, REPLICATED, ()))):
        _all_reduce(whole, mesh[DP].get_group(), divide=mesh[DP].size())


def _grads(net: nn.Module, names: tuple[str, ...]) -> list[torch.Tensor]:
    """The local gradient tensors of the named parameters (a DTensor's: this rank's FSDP shard)."""
    grads = [net.get_parameter(name).grad for name in names]
    return [g._local_tensor if isinstance(g, DTensor) else g for g in grads if g is not None]


def _all_reduce(grads: list[torch.Tensor], group, divide: int = 1) -> None:
    """Sums ``grads`` over ``group`` in one collective (then divides), in place."""
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=group)
    if divide > 1:
        flat = flat / divide
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()
