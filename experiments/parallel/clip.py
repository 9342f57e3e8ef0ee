"""Gradient-norm clipping over parameters that live on different meshes.

With tensor parallelism the sharded projections are DTensors on the 2-D (data, tensor) mesh while everything
else is sharded over the data-parallel mesh alone; ``torch.nn.utils.clip_grad_norm_`` stacks all per-parameter
norms into one tensor, which DTensor refuses across meshes. Here each group of one mesh and placement gets its
norms summed on its own, made whole (``full_tensor``), and the groups are added: the same global norm.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor, nn
from torch.distributed.tensor import DTensor


def grad_norm(params: Iterable[nn.Parameter]) -> Tensor:
    """The L2 norm of all gradients together, a float32 scalar on the gradients' device, the same on every rank.

    Nothing is read on the host: the sums stay on the device (a GPU run's step is not held up waiting for them).
    """
    groups: dict[tuple, list[Tensor]] = {}
    for p in params:
        if p.grad is None:
            continue
        g = p.grad
        key = (id(g.device_mesh), tuple(g.placements)) if isinstance(g, DTensor) else ("local",)
        groups.setdefault(key, []).append(g)
    total: Tensor | None = None
    for grads in groups.values():
        norms = torch._foreach_norm(grads, 2.0)
        squares = torch.stack([n.float() for n in norms]).square().sum()
        part = squares.full_tensor() if isinstance(squares, DTensor) else squares
        total = part if total is None else total + part.to(total.device)
    return torch.zeros((), dtype=torch.float32) if total is None else total.sqrt()


@torch.no_grad()
def clip_grad_norm(params: Iterable[nn.Parameter], max_norm: float, eps: float = 1e-6) -> Tensor:
    """Scales every gradient by ``min(1, max_norm / (norm + eps))``, as ``clip_grad_norm_`` does; returns the norm.

    The factor stays a device tensor and every gradient is multiplied by it (by 1 when the norm is below
    ``max_norm``, which changes no bit), as torch's ``clip_grad_norm_`` does: no host sync.
    """
    params = [p for p in params if p.grad is not None]
    norm = grad_norm(params)
    coef = torch.clamp(max_norm / (norm + eps), max=1.0)
    for p in params:
        local = p.grad._local_tensor if isinstance(p.grad, DTensor) else p.grad  # the factor is the same on every rank
        local.mul_(coef.to(local.device))
    return norm
