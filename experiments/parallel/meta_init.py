"""A network built on the meta device gets its values after it is sharded: each rank only its own slices.

The task builds its network's large tensors on the meta device (``model.init_args.meta_init``;
:func:`models.init_values.meta_parameters`), takes the network's init plan while the network still has its
one-process layout (:func:`plan_of`), parallelizes it (tensor / expert parallelism, FSDP2) and then calls
:func:`materialize`: every parameter still on the meta device is allocated as this rank's shard, and for each
one the full tensor is drawn from its own seeded generator (:func:`models.init_values.initial_value`, float32 on
the CPU), put in the sharded layout (a packed projection's ``(parts, rows, in)`` view or its grouped-query
permutation: :mod:`experiments.parallel.packed`), cut to this rank's slice with the DTensor's placements
(``compute_local_shape_and_global_offset``'s arithmetic at this process's coordinate: no collective) and
copied in. The values are bit for bit the
one-process network's at the same seed, at any world size and layout; the host holds this rank's shards plus one
full parameter at a time (two for a grouped-query qkv, whose layout is a permuted copy).

Tensors that were never on the meta device (norm scales, a scheme's constants, every buffer) keep their values:
the allocation is ``to_empty`` for the meta tensors only, applied from the root module (FSDP2 then re-registers
its sharded storage, as after ``to_empty``).
"""

from __future__ import annotations

from itertools import chain

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset

from experiments.parallel.packed import PackedLinear, to_groups
from models.init_values import Plan, initial_value


def local_of(t: Tensor) -> Tensor:
    """The tensor this rank holds: a DTensor's local shard, or the tensor itself."""
    return t._local_tensor if isinstance(t, DTensor) else t


def _tensors(module: nn.Module) -> dict[str, Tensor]:
    return dict(chain(module.named_parameters(), module.named_buffers()))


def on_meta(module: nn.Module) -> list[str]:
    """Names of the parameters and buffers of ``module`` whose storage (this rank's shard) is on the meta device."""
    return [name for name, t in _tensors(module).items() if local_of(t).is_meta]


def _allocated(t: Tensor, device: torch.device | str) -> Tensor:
    """``to_empty`` for the meta tensors only (the others keep their values, moved to ``device``); a DTensor keeps
    its own mesh and placements (not DTensor's sharding decision for ``empty_like``, which it caches by mesh)."""
    local = local_of(t)
    if not local.is_meta:
        return t.to(device)
    empty = torch.empty_like(local, device=device)
    if not isinstance(t, DTensor):
        return empty
    return DTensor.from_local(empty, t.device_mesh, t.placements, run_check=False, shape=t.shape, stride=t.stride())


def plain_name(name: str) -> str:
    """``name`` as the one-process network calls it: without the ``_orig_mod`` of a module ``torch.compile``
    wrapped."""
    return ".".join(part for part in name.split(".") if part != "_orig_mod")


def plan_of(net: nn.Module) -> Plan:
    """The init plan of a suite network (``LanguageModel``, ``ViTClassifier``, ``DiT``), taken before
    :func:`experiments.parallel.parallelize` packs its projections (the plan names the one-process layout)."""
    plan = getattr(net, "init_plan", None)
    if plan is None:
        raise TypeError(f"{type(net).__name__} has no init_plan: it cannot be built on the meta device")
    return plan()


def sharded_layout(module: nn.Module, name: str, full: Tensor, shape: torch.Size) -> Tensor:
    """``full`` (the one-process layout) in the layout of parameter ``name`` of the parallelized ``module``, whose
    global shape is ``shape``: a :class:`PackedLinear`'s ``(parts, rows, in)`` view, or its grouped-query
    ``(kv_heads, g + 2, Dh, ...)`` permutation (:func:`experiments.parallel.packed.to_groups`)."""
    if tuple(full.shape) == tuple(shape):
        return full
    owner = module.get_submodule(name.rpartition(".")[0])
    if not isinstance(owner, PackedLinear):
        raise ValueError(f"parameter {name} is {tuple(shape)} after parallelize, {tuple(full.shape)} in the init plan")
    if owner.grouped:
        return to_groups(full, shape[0], shape[1] - 2)
    return full.view(shape)


def coordinate(mesh: DeviceMesh) -> list[int]:
    """This process's position on ``mesh``, from its global rank: the mesh's index of ``dist.get_rank()``."""
    where = (mesh.mesh == dist.get_rank()).nonzero()
    if len(where) != 1:
        raise ValueError(f"rank {dist.get_rank()} is not on the mesh {mesh.mesh.tolist()} a parameter is sharded over")
    return where[0].tolist()


def local_slice(full: Tensor, param: Tensor) -> Tensor:
    """This rank's slice of ``full`` (the parameter's global value) as ``param`` holds it: a DTensor's shard cut by
    its placements on its mesh (DTensor's ``compute_local_shape_and_global_offset`` arithmetic at this process's
    coordinate: no collective), else all of it."""
    if not isinstance(param, DTensor):
        return full
    mesh = param.device_mesh
    shape, offset = _compute_local_shape_and_global_offset(full.shape, mesh.shape, coordinate(mesh), param.placements)
    for dim, (start, size) in enumerate(zip(offset, shape, strict=True)):
        full = full.narrow(dim, start, size)
    return full


@torch.no_grad()
def materialize(module: nn.Module, plan: Plan, seed: int, device: torch.device | str = "cpu") -> list[str]:
    """Allocates every meta tensor of ``module`` on ``device`` as this rank's shard and gives it its init value.

    Args:
        module: a network built with :func:`models.init_values.meta_parameters`, possibly parallelized.
        plan: its init plan from :func:`plan_of`, taken before it was parallelized.
        seed: its ``init_seed``.
        device: where this rank's tensors live (the strategy's root device).

    Returns:
        The names of the tensors given values (empty when nothing was on the meta device).

    Raises:
        ValueError: a meta tensor the plan does not cover (it would start as uninitialized memory), before any
            allocation.
    """
    names = on_meta(module)
    if not names:
        return []
    planned = {name: plain_name(name) for name in names}
    missing = [name for name in names if planned[name] not in plan]
    if missing:
        raise ValueError(
            f"{missing[0]} of {type(module).__name__} is on the meta device and its init plan has no entry for it "
            f"({len(missing)} such tensors); valid: build only parameters the plan covers on the meta device"
        )
    module._apply(lambda t: _allocated(t, device))  # on the root: FSDP2 re-registers its sharded storage
    tensors = _tensors(module)
    for name in names:
        param = tensors[name]
        full = initial_value(plan[planned[name]], seed, planned[name])
        full = sharded_layout(module, name, full, param.shape)
        local_of(param).copy_(local_slice(full, param))
        del full
    return names
