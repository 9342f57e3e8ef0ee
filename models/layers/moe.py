"""Token-choice top-k mixture of experts (OLMoE-style), dropless, experts computed batched."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def load_balancing_loss(probs: Tensor, expert_idx: Tensor, num_experts: int) -> Tensor:
    """Switch-Transformer auxiliary loss ``E * sum_e f_e * P_e``; equals 1 for a uniform router.

    Args:
        probs: router softmax, ``(T, E)``.
        expert_idx: chosen experts, ``(T, k)``.
        num_experts: E.
    """
    counts = torch.bincount(expert_idx.flatten(), minlength=num_experts).to(probs.dtype)
    fraction = counts / expert_idx.numel()  # f_e: share of the T*k assignments
    return num_experts * (fraction * probs.mean(dim=0)).sum()


class MoE(nn.Module):
    """SwiGLU experts behind a softmax top-k router.

    Tokens are sorted by expert and packed into an ``(E, C, D)`` buffer (C = the busiest expert's
    load, so nothing is dropped), every expert runs in one batched matmul, and outputs are
    scattered back weighted by their router probability.

    Args:
        dim: model width D.
        hidden: each expert's SwiGLU hidden size.
        num_experts: E.
        top_k: experts per token.
        normalize_topk: renormalize the k chosen probabilities to sum to 1 (OLMoE: no).
    """

    def __init__(self, dim: int, hidden: int, num_experts: int, top_k: int, normalize_topk: bool = False):
        super().__init__()
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"moe top_k {top_k} must be in [1, num_experts={num_experts}]")
        self.num_experts, self.top_k, self.normalize_topk = num_experts, top_k, normalize_topk
        self.router = nn.Linear(dim, num_experts, bias=False)
        self.w_in = nn.Parameter(torch.empty(num_experts, dim, 2 * hidden))  # per expert [gate; up]
        self.w_out = nn.Parameter(torch.empty(num_experts, hidden, dim))
        nn.init.normal_(self.w_in, std=1 / math.sqrt(dim))
        nn.init.normal_(self.w_out, std=1 / math.sqrt(hidden))

    def route(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Router probabilities ``(T, E)``, chosen experts ``(T, k)`` and their weights ``(T, k)``."""
        probs = F.softmax(self.router(x).float(), dim=-1)
        weight, idx = probs.topk(self.top_k, dim=-1)
        if self.normalize_topk:
            weight = weight / weight.sum(dim=-1, keepdim=True)
        return probs, idx, weight.to(x.dtype)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Returns the output (same shape as ``x``) and the load-balancing loss."""
        shape = x.shape
        x = x.reshape(-1, shape[-1])  # (T, D)
        probs, idx, weight = self.route(x)
        flat_expert = idx.flatten()  # (T*k,) assignment a -> expert
        order = torch.argsort(flat_expert, stable=True)
        sorted_expert = flat_expert[order]
        counts = torch.bincount(flat_expert, minlength=self.num_experts)
        starts = torch.cumsum(counts, 0) - counts
        slot = torch.arange(order.numel(), device=x.device) - starts[sorted_expert]  # position in expert
        token = order // self.top_k  # which token each sorted assignment came from
        buf = x.new_zeros(self.num_experts, int(counts.max()), shape[-1])  # (E, C, D)
        buf[sorted_expert, slot] = x[token]
        gate, up = torch.bmm(buf, self.w_in).chunk(2, dim=-1)  # (E, C, H) each
        y = torch.bmm(F.silu(gate) * up, self.w_out)  # (E, C, D)
        y = y[sorted_expert, slot] * weight.flatten()[order].unsqueeze(-1)  # (T*k, D)
        out = torch.zeros_like(x).index_add_(0, token, y)
        return out.reshape(shape), load_balancing_loss(probs, idx, self.num_experts)
