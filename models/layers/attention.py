"""Multi-head self-attention on fused ``scaled_dot_product_attention``, with QK(V)-norm and RoPE."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.norms import build_norm


def rope_tables(seq_len: int, head_dim: int, base: float = 10000.0, device=None) -> tuple[Tensor, Tensor]:
    """Rotary cos/sin tables, ``(N, Dh)`` each, in the rotate-half layout used by Llama/GPT-NeoX."""
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv_freq)  # (N, Dh/2)
    angles = torch.cat([angles, angles], dim=-1)  # (N, Dh)
    return angles.cos(), angles.sin()


def apply_rope(x: Tensor, rope: tuple[Tensor, Tensor]) -> Tensor:
    """Rotates ``x`` of shape ``(B, H, N, Dh)`` by position: ``x * cos + rotate_half(x) * sin``."""
    cos, sin = (t[: x.shape[-2]].to(x.dtype) for t in rope)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class Attention(nn.Module):
    """Self-attention with a fused QKV projection.

    Args:
        dim: model width D.
        num_heads: H; must divide D.
        bias: biases on the QKV and output projections.
        qk_norm: normalize Q and K per head after projection.
        qkv_norm: normalize Q, K and V per head after projection (HybridNorm).
        norm_layer: "layernorm" or "rmsnorm" for those per-head norms.
        norm_eps: their epsilon.
        attn_drop: dropout on attention weights (training only).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        bias: bool = True,
        qk_norm: bool = False,
        qkv_norm: bool = False,
        norm_layer: str = "layernorm",
        norm_eps: float = 1e-6,
        attn_drop: float = 0.0,
    ) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"dim {dim} is not divisible by num_heads {num_heads}")
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.attn_drop = attn_drop
        self.qkv = nn.Linear(dim, 3 * dim, bias=bias)
        per_head = qk_norm or qkv_norm
        self.q_norm = build_norm(norm_layer, self.head_dim, norm_eps) if per_head else nn.Identity()
        self.k_norm = build_norm(norm_layer, self.head_dim, norm_eps) if per_head else nn.Identity()
        self.v_norm = build_norm(norm_layer, self.head_dim, norm_eps) if qkv_norm else nn.Identity()
        self.proj = nn.Linear(dim, dim, bias=bias)

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor] | None = None, is_causal: bool = False) -> Tensor:
        B, N, D = x.shape
        qkv = self.qkv(x).view(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)  # (B, H, N, Dh) each
        q, k, v = self.q_norm(q), self.k_norm(k), self.v_norm(v)
        if rope is not None:
            q, k = apply_rope(q, rope), apply_rope(k, rope)
        dropout = self.attn_drop if self.training else 0.0
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=is_causal)
        return self.proj(out.transpose(1, 2).reshape(B, N, D))  # (B, H, N, Dh) -> (B, N, D)
