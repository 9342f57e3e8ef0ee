"""Hand-written reference formulas the model tests compare against.

Everything here is written from the equations (docs/schemes.md, the cited papers), on plain
tensors with every weight passed explicitly. Nothing here calls a scheme's ``prepare``/``update`` or
a layer's ``forward``; the tests pull the weights out of the modules and hand them to these.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def norm(
    x: Tensor,
    kind: str,
    eps: float,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    alpha: Tensor | None = None,
    shift: Tensor | None = None,
) -> Tensor:
    """LayerNorm ``(x - mean) / sqrt(var + eps)``, RMSNorm ``x / sqrt(mean(x^2) + eps)``, DyT ``tanh(alpha x)``
    (Zhu et al. 2025: no epsilon, ``alpha`` one scalar) or Derf ``erf(alpha x + s)`` (Chen et al. 2025: ``alpha``
    and ``s`` one scalar each), then ``* w + b``."""
    if kind == "dyt":
        assert alpha is not None and alpha.numel() == 1, "DyT needs its scalar alpha"
        y = torch.tanh(alpha * x)
    elif kind == "derf":
        assert alpha is not None and alpha.numel() == 1 and shift is not None and shift.numel() == 1
        y = torch.special.erf(alpha * x + shift)
    elif kind == "layernorm":
        mean = x.mean(dim=-1, keepdim=True)
        var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)  # biased variance, as LayerNorm
        y = (x - mean) / torch.sqrt(var + eps)
    elif kind == "rmsnorm":
        y = x / torch.sqrt((x**2).mean(dim=-1, keepdim=True) + eps)
    else:
        raise ValueError(kind)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y


def silu(z: Tensor) -> Tensor:
    return z / (1 + torch.exp(-z))


def gelu(z: Tensor, approximate: str = "none") -> Tensor:
    if approximate == "tanh":
        return 0.5 * z * (1 + torch.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z**3)))
    return 0.5 * z * (1 + torch.erf(z / math.sqrt(2)))


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    y = torch.einsum("...i,oi->...o", x, weight)
    return y if bias is None else y + bias


def modulate(x: Tensor, shift: Tensor, scale: Tensor) -> Tensor:
    """DiT: ``x * (1 + scale) + shift``."""
    return x * (1 + scale) + shift


def rope_complex(x: Tensor, base: float = 10000.0) -> Tensor:
    """Rotary embedding through complex numbers, rotate-half layout.

    Channel i and channel i + Dh/2 form the complex number ``x_i + j x_{i+Dh/2}``, which is multiplied
    by ``exp(j * pos * base^(-2i/Dh))``; real parts go back to the first half, imaginary to the second.

    Args:
        x: ``(..., N, Dh)``, positions along dim -2.
    """
    n, dh = x.shape[-2], x.shape[-1]
    half = dh // 2
    theta = torch.tensor([base ** (-2 * i / dh) for i in range(half)], dtype=torch.float64)
    pos = torch.arange(n, dtype=torch.float64)
    rot = torch.polar(torch.ones(n, half, dtype=torch.float64), pos[:, None] * theta[None])  # (N, Dh/2)
    z = torch.complex(x[..., :half].double(), x[..., half:].double()) * rot
    return torch.cat([z.real, z.imag], dim=-1).to(x.dtype)


def attention(
    x: Tensor,
    num_heads: int,
    w_qkv: Tensor,
    b_qkv: Tensor | None,
    w_proj: Tensor,
    b_proj: Tensor | None,
    q_norm=None,
    k_norm=None,
    v_norm=None,
    causal: bool = False,
    rope_base: float | None = None,
    q_full_norm=None,
    k_full_norm=None,
) -> Tensor:
    """Naive multi-head ``softmax(Q K^T / sqrt(Dh)) V`` with a loop over heads.

    ``q_norm``/``k_norm``/``v_norm`` are callables applied per head (or None); ``q_full_norm``/``k_full_norm``
    are applied to all heads' q / k at once, a ``(B, N, D)`` vector each (OLMo 2's ``Olmo2Attention``); the fused
    projection holds ``[W_q; W_k; W_v]`` and each of those holds head 0's rows first.
    """
    bsz, n, d = x.shape
    dh = d // num_heads
    qkv = linear(x, w_qkv, b_qkv)
    q_all, k_all, v_all = qkv[..., :d], qkv[..., d : 2 * d], qkv[..., 2 * d :]
    q_all = q_full_norm(q_all) if q_full_norm else q_all
    k_all = k_full_norm(k_all) if k_full_norm else k_all
    heads = []
    for h in range(num_heads):
        cols = slice(h * dh, (h + 1) * dh)
        q, k, v = q_all[..., cols], k_all[..., cols], v_all[..., cols]  # (B, N, Dh)
        q = q_norm(q) if q_norm else q
        k = k_norm(k) if k_norm else k
        v = v_norm(v) if v_norm else v
        if rope_base is not None:
            q, k = rope_complex(q, rope_base), rope_complex(k, rope_base)
        scores = q @ k.transpose(-1, -2) / math.sqrt(dh)  # (B, N, N)
        if causal:
            mask = torch.ones(n, n, dtype=torch.bool).triu(1)
            scores = scores.masked_fill(mask, float("-inf"))
        weights = torch.exp(scores - scores.amax(-1, keepdim=True))
        weights = weights / weights.sum(-1, keepdim=True)
        heads.append(weights @ v)
    return linear(torch.cat(heads, dim=-1), w_proj, b_proj)


def get_1d_sincos_pos_embed_from_grid(embed_dim, pos):
    """DiT / MAE ``models.py``, in numpy."""
    import numpy as np

    omega = np.arange(embed_dim // 2, dtype=np.float64)
    omega /= embed_dim / 2.0
    omega = 1.0 / 10000**omega
    out = np.einsum("m,d->md", pos.reshape(-1), omega)
    return np.concatenate([np.sin(out), np.cos(out)], axis=1)


def get_2d_sincos_pos_embed(embed_dim, grid_size):
    """DiT's ``get_2d_sincos_pos_embed`` (no cls token), in numpy: ``(grid_size**2, embed_dim)``."""
    import numpy as np

    grid_h = np.arange(grid_size, dtype=np.float32)
    grid_w = np.arange(grid_size, dtype=np.float32)
    grid = np.meshgrid(grid_w, grid_h)  # here w goes first
    grid = np.stack(grid, axis=0).reshape([2, 1, grid_size, grid_size])
    emb_h = get_1d_sincos_pos_embed_from_grid(embed_dim // 2, grid[0])
    emb_w = get_1d_sincos_pos_embed_from_grid(embed_dim // 2, grid[1])
    return np.concatenate([emb_h, emb_w], axis=1)
