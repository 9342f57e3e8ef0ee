"""Fused projections kept as their parts, so every mesh can cut them without mixing one part into another.

The trunk fuses projections: attention's ``qkv`` is ``[W_q; W_k; W_v]`` ``(3D, D)`` and SwiGLU's ``fc1`` is
``[W_gate; W_up]`` ``(2H, D)``. Cut into t contiguous row blocks for tensor parallelism, rank 0 would get all of
q and part of k. :class:`PackedLinear` holds the same weight as ``(parts, rows, in)`` (a view: same numbers,
same forward bits), which tensor parallelism shards on its rows axis: each rank gets its slice of every part
(``[q_r; k_r; v_r]``), and the distributed checkpoint stores plain contiguous chunks that load at any mesh.

Under ``ModelParallelStrategy`` the swap is made at every mesh size (tensor-parallel 1 included), so each sharded
checkpoint of a run has one layout; :func:`unpack_state_dict` turns it back into the plain ``nn.Linear`` layout
when a sharded checkpoint is consolidated into one file.
"""

from __future__ import annotations

import re

import torch.nn.functional as F
from torch import Tensor, nn
from torch.distributed.tensor import DTensor

from models.layers import SwiGLU
from models.trunk import Trunk

PACKED = {"attn.qkv": 3, "mlp.fc1": 2}  # a Block's fused projections and their part counts (SwiGLU's fc1 only)
PACKED_KEY = re.compile(r"(^|\.)trunk\.blocks\.\d+\.(attn\.qkv|mlp\.fc1)\.(?P<leaf>weight|bias)$")


def local(t: Tensor | None) -> Tensor | None:
    """This rank's part of a tensor-parallel parameter (autograd flows back to it), or the tensor itself."""
    return t.to_local() if isinstance(t, DTensor) else t


class PackedLinear(nn.Module):
    """``y = x W^T + b`` with ``W = [W_0; ...; W_{k-1}]`` stored as ``(k, out / k, in)`` and ``b`` as ``(k, out / k)``.

    Sharded on its rows axis (dim 1), the local forward computes ``[x W_0,r^T, ..., x W_{k-1},r^T]``: this rank's
    slice of every part, in the order the fused layer's callers split it.
    """

    def __init__(self, linear: nn.Linear, parts: int) -> None:
        super().__init__()
        if linear.out_features % parts:
            raise ValueError(f"{linear.out_features} output features do not split into {parts} parts")
        self.parts, self.in_features = parts, linear.in_features
        self.weight = nn.Parameter(linear.weight.detach().view(parts, -1, linear.in_features))
        bias = linear.bias
        self.bias = nn.Parameter(bias.detach().view(parts, -1)) if bias is not None else None

    def forward(self, x: Tensor) -> Tensor:
        w, b = local(self.weight), local(self.bias)
        return F.linear(x, w.reshape(-1, self.in_features), None if b is None else b.reshape(-1))


def pack_trunk(trunk: Trunk) -> None:
    """Replaces each Block's fused projections by :class:`PackedLinear` views of the same weights (in place)."""
    for block in trunk.blocks:
        block.attn.qkv = PackedLinear(block.attn.qkv, PACKED["attn.qkv"])
        if isinstance(block.mlp, SwiGLU):
            block.mlp.fc1 = PackedLinear(block.mlp.fc1, PACKED["mlp.fc1"])


def unpack_state_dict(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """The plain ``nn.Linear`` layout of a packed state dict: ``(k, rows, in) -> (k * rows, in)``, biases
    ``(k, rows) -> (k * rows,)``; every other entry as it is. Idempotent (plain entries are left alone)."""
    out = {}
    for key, value in state.items():
        match = PACKED_KEY.search(key)
        if match and isinstance(value, Tensor) and value.ndim == (3 if match["leaf"] == "weight" else 2):
            value = value.flatten(0, 1)
        out[key] = value
    return out
