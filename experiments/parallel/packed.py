"""Fused projections kept as their parts, so every mesh can cut them without mixing one part into another.

The trunk fuses projections: attention's ``qkv`` is ``[W_q; W_k; W_v]`` ``(3D, D)`` and SwiGLU's ``fc1`` is
``[W_gate; W_up]`` ``(2H, D)``. Cut into t contiguous row blocks for tensor parallelism, rank 0 would get all of
q and part of k. :class:`PackedLinear` holds the same weight as ``(parts, rows, in)`` (a view: same numbers,
same forward bits), which tensor parallelism shards on its rows axis: each rank gets its slice of every part
(``[q_r; k_r; v_r]``), and the distributed checkpoint stores plain contiguous chunks that load at any mesh.

Grouped-query attention (``num_kv_heads`` H_kv < H) has parts of unequal widths: ``W_q`` of ``g * kv_dim`` rows
(g = H / H_kv query heads per key/value head), ``W_k`` and ``W_v`` of ``kv_dim``. Its qkv is held per key/value
head instead, ``(H_kv, g + 2, Dh, in)``: group j is ``[q heads j g .. j g + g - 1; k head j; v head j]``, which
tensor parallelism shards on the groups axis, so each rank gets whole groups: its query heads and the key/value
heads they read. That layout is a permutation of the fused rows (a copy, made once); the local forward puts the
rows back in the fused order ``[q_r; k_r; v_r]`` before the matmul, so the attention splits its output as ever.

Under ``ModelParallelStrategy`` the swap is made at every mesh size (tensor-parallel 1 included), so each sharded
checkpoint of a run has one layout; :func:`unpack_state_dict` turns it back into the plain ``nn.Linear`` layout
when a sharded checkpoint is consolidated into one file.
"""

from __future__ import annotations

import re

import torch
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


def to_groups(t: Tensor, kv_heads: int, group: int) -> Tensor:
    """Fused GQA rows ``[q (g kv_dim); k (kv_dim); v (kv_dim)]`` (and any trailing axes) -> ``(H_kv, g + 2, Dh, ...)``:
    per key/value head j, its g query heads, its k and its v."""
    rows, rest = t.shape[0], t.shape[1:]
    kv_dim = rows // (group + 2)
    q = t[: group * kv_dim].reshape(kv_heads, group, -1, *rest)  # query head j g + i in [j, i]
    k, v = (t[group * kv_dim + n * kv_dim :][:kv_dim].reshape(kv_heads, 1, -1, *rest) for n in (0, 1))
    return torch.cat([q, k, v], dim=1)


def from_groups(t: Tensor) -> Tensor:
    """The inverse of :func:`to_groups`: ``(H_kv, g + 2, Dh, ...)`` -> the fused rows ``[q; k; v]``."""
    group = t.shape[1] - 2
    return torch.cat([t[:, :group].flatten(0, 2), t[:, group:].transpose(0, 1).flatten(0, 2)])


class PackedLinear(nn.Module):
    """``y = x W^T + b`` with ``W = [W_0; ...; W_{k-1}]`` stored as ``(k, out / k, in)`` and ``b`` as ``(k, out / k)``;
    or, given ``kv_heads`` (grouped-query attention's qkv, k = g + 2 parts), as ``(kv_heads, k, Dh, in)`` and
    ``(kv_heads, k, Dh)`` (:func:`to_groups`).

    Sharded on ``shard_dim`` (rows: 1; key/value groups: 0), the local forward computes
    ``[x W_0,r^T, ..., x W_{k-1},r^T]``: this rank's slice of every part, in the order the fused layer's callers
    split it.
    """

    def __init__(self, linear: nn.Linear, parts: int, kv_heads: int = 0) -> None:
        super().__init__()
        if linear.out_features % (parts * max(kv_heads, 1)):
            raise ValueError(f"{linear.out_features} output features do not split into {parts} parts")
        self.parts, self.in_features, self.grouped = parts, linear.in_features, kv_heads > 0
        self.shard_dim = 0 if self.grouped else 1
        bias = linear.bias
        if self.grouped:  # a permutation of the rows: a copy
            weight = to_groups(linear.weight.detach(), kv_heads, parts - 2)
            bias = to_groups(bias.detach(), kv_heads, parts - 2) if bias is not None else None
        else:  # a view: the same storage
            weight = linear.weight.detach().view(parts, -1, linear.in_features)
            bias = bias.detach().view(parts, -1) if bias is not None else None
        self.weight = nn.Parameter(weight)
        self.bias = nn.Parameter(bias) if bias is not None else None

    def forward(self, x: Tensor) -> Tensor:
        w, b = local(self.weight), local(self.bias)
        if self.grouped:
            w, b = from_groups(w), None if b is None else from_groups(b)
        return F.linear(x, w.reshape(-1, self.in_features), None if b is None else b.reshape(-1))


def pack_trunk(trunk: Trunk) -> None:
    """Replaces each Block's fused projections by :class:`PackedLinear` views of the same weights (in place)."""
    for block in trunk.blocks:
        attn = block.attn
        if attn.group > 1:  # grouped-query attention: per key/value head (g query parts, k, v)
            attn.qkv = PackedLinear(attn.qkv, attn.group + 2, kv_heads=attn.num_kv_heads)
        else:
            attn.qkv = PackedLinear(attn.qkv, PACKED["attn.qkv"])
        if isinstance(block.mlp, SwiGLU):
            block.mlp.fc1 = PackedLinear(block.mlp.fc1, PACKED["mlp.fc1"])


def unpack_state_dict(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """The plain ``nn.Linear`` layout of a packed state dict: ``(k, rows, in) -> (k * rows, in)``, biases
    ``(k, rows) -> (k * rows,)``, grouped-query qkv ``(H_kv, g + 2, Dh, in) -> (D + 2 kv_dim, in)`` (biases
    ``(H_kv, g + 2, Dh)``); every other entry as it is. Idempotent (plain entries are left alone)."""
    out = {}
    for key, value in state.items():
        match = PACKED_KEY.search(key)
        if match and isinstance(value, Tensor):
            plain = 2 if match["leaf"] == "weight" else 1
            if value.ndim == plain + 1:
                value = value.flatten(0, 1)
            elif value.ndim == plain + 2 and match[2] == "attn.qkv":
                value = from_groups(value)
        out[key] = value
    return out
