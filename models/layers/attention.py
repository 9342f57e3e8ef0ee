"""Multi-head self-attention on fused ``scaled_dot_product_attention``, with QK(V)-norm and RoPE."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.norms import DyTInit, build_norm


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
    """Self-attention with a fused QKV projection, multi-head or grouped-query.

    The fused projection ``qkv`` holds ``[W_q; W_k; W_v]``: ``W_q`` of ``D = H * Dh`` rows, ``W_k`` and ``W_v`` of
    ``kv_dim = H_kv * Dh`` rows each, each with head 0's rows first. With ``H_kv < H`` (grouped-query attention,
    Llama 3 / OLMo 2 32B; transformers' ``repeat_kv``) query head h reads key/value head ``h // (H / H_kv)``.

    Args:
        dim: model width D.
        num_heads: H; must divide D.
        bias: biases on the QKV and output projections.
        qk_norm: normalize Q and K after projection.
        qkv_norm: normalize Q, K and V per head after projection (HybridNorm); takes precedence over ``qk_norm``.
        norm_layer: "layernorm", "rmsnorm" or "dyt" for those norms.
        norm_eps: their epsilon.
        attn_drop: dropout on attention weights (training only).
        qk_norm_scope: "per_head" (width D/H, on each head) or "full" (OLMo 2's ``Olmo2Attention``: width D on
            all heads' q, width ``kv_dim`` on all key heads' k, as one vector each before the head split).
        dyt: how those norms start when they are DyT (None: DyT's defaults).
        num_kv_heads: H_kv, key/value heads; must divide H. None means H (multi-head attention).
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
        qk_norm_scope: str = "per_head",
        dyt: DyTInit | None = None,
        num_kv_heads: int | None = None,
    ) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"dim {dim} is not divisible by num_heads {num_heads}")
        kv_heads = num_kv_heads or num_heads
        if num_heads % kv_heads:
            raise ValueError(f"num_kv_heads {kv_heads} does not divide num_heads {num_heads}")
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, kv_heads, dim // num_heads
        self.group = num_heads // kv_heads  # query heads per key/value head
        self.kv_dim = kv_heads * self.head_dim
        self.attn_drop = attn_drop
        self.qkv = nn.Linear(dim, dim + 2 * self.kv_dim, bias=bias)
        self.full_qk_norm = qk_norm and qk_norm_scope == "full" and not qkv_norm
        q_width, k_width = (dim, self.kv_dim) if self.full_qk_norm else (self.head_dim, self.head_dim)

        def norm(width: int, wanted: bool) -> nn.Module:
            return build_norm(norm_layer, width, norm_eps, dyt=dyt or DyTInit()) if wanted else nn.Identity()

        self.q_norm = norm(q_width, qk_norm or qkv_norm)
        self.k_norm = norm(k_width, qk_norm or qkv_norm)
        self.v_norm = norm(self.head_dim, qkv_norm)
        self.proj = nn.Linear(dim, dim, bias=bias)

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor] | None = None, is_causal: bool = False) -> Tensor:
        qkv = self.qkv(x)  # (B, N, D + 2 kv_dim)
        # Shapes from qkv, not x: under tensor parallelism (experiments.parallel) x is this rank's share of the
        # sequence and qkv holds the whole sequence for this rank's heads only ([q_r; k_r; v_r], same proportions).
        B, N, width = qkv.shape
        kv = width // (self.group + 2)  # this rank's k (and v) width
        q, k, v = qkv.split([self.group * kv, kv, kv], dim=-1)  # (B, N, D), (B, N, kv_dim) x 2
        if self.full_qk_norm:  # one vector of all heads' q (k), normalized before the head split
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = (t.view(B, N, -1, self.head_dim).transpose(1, 2) for t in (q, k, v))  # (B, H or H_kv, N, Dh)
        if not self.full_qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        v = self.v_norm(v)
        if rope is not None:
            q, k = apply_rope(q, rope), apply_rope(k, rope)
        dropout = self.attn_drop if self.training else 0.0
        # enable_gqa: query head h attends with key/value head h // group (repeat_interleave, without the copy)
        gqa = {"enable_gqa": True} if self.group > 1 else {}
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=is_causal, **gqa)
        return self.proj(out.transpose(1, 2).reshape(B, N, -1))  # (B, H, N, Dh) -> (B, N, D)
