"""Token-choice top-k mixture of experts (OLMoE-style), dropless, experts computed batched.

Besides its output, each MoE layer returns what its router did (:class:`Routing`): the load-balancing loss
and how many of the ``T * k`` token -> expert assignments each expert received. Both come out of the
forward as tensors (no Python loop over tokens, nothing stored on the module), so activation
checkpointing, ``torch.compile`` and DDP see a pure function. :func:`expert_usage` turns the counts into
the usage statistics a comparison reports. The router has no capacity: every token reaches its ``k``
experts, so no token is ever dropped.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class Routing(NamedTuple):
    """What the router did in one forward.

    Attributes:
        loss: the load-balancing loss (a scalar; the trunk sums it over its MoE layers).
        load: assignments per expert as float32 counts, ``(E,)`` for one layer, ``(L, E)`` stacked by the
            trunk over its L MoE layers. They sum to ``T * k`` per layer (T tokens, k experts each).
    """

    loss: Tensor
    load: Tensor


class ExpertUsage(NamedTuple):
    """Usage statistics of the experts, one value per layer (the shape of ``load`` without its last axis).

    With ``f_e = load_e / sum(load)`` the share of assignments expert e received:

    Attributes:
        entropy: ``-sum_e f_e ln f_e / ln E``: 1 = every expert equally used, 0 = one expert takes all.
        load_max: ``E * max_e f_e``, the busiest expert over the uniform share (1 = balanced; at most E / k).
        load_min: ``E * min_e f_e``, the idlest expert over the uniform share (0 = an expert got no token).
        load_ratio: ``max_e load_e / max(min_e load_e, 1)``: busiest over idlest expert's count; an idle
            expert counts as one assignment, so the ratio stays finite (``load_min`` = 0 says it was idle).
    """

    entropy: Tensor
    load_max: Tensor
    load_min: Tensor
    load_ratio: Tensor


def expert_load(expert_idx: Tensor, num_experts: int) -> Tensor:
    """Assignments per expert, ``(E,)`` float32 counts, from the chosen experts ``(T, k)``."""
    return torch.bincount(expert_idx.flatten(), minlength=num_experts).float()


def switch_loss(probs: Tensor, load: Tensor) -> Tensor:
    """Switch-Transformer auxiliary loss ``E * sum_e f_e * P_e`` from the router softmax ``(T, E)`` and the
    assignment counts ``(E,)`` (``f_e`` = count share, ``P_e`` = mean router probability); 1 for a uniform router."""
    fraction = (load / load.sum()).to(probs.dtype)  # f_e: share of the T*k assignments
    return load.numel() * (fraction * probs.mean(dim=0)).sum()


def load_balancing_loss(probs: Tensor, expert_idx: Tensor, num_experts: int) -> Tensor:
    """Switch-Transformer auxiliary loss ``E * sum_e f_e * P_e``; equals 1 for a uniform router.

    Args:
        probs: router softmax, ``(T, E)``.
        expert_idx: chosen experts, ``(T, k)``.
        num_experts: E.
    """
    return switch_loss(probs, expert_load(expert_idx, num_experts))


@torch.no_grad()
def expert_usage(load: Tensor) -> ExpertUsage:
    """:class:`ExpertUsage` of assignment counts ``(..., E)`` (one layer's, or the trunk's ``(L, E)``)."""
    load = load.detach().float()
    num_experts = load.shape[-1]
    share = load / load.sum(dim=-1, keepdim=True).clamp_min(1)  # (..., E)
    plogp = torch.where(share > 0, share * share.clamp_min(1e-30).log(), torch.zeros_like(share))  # 0 ln 0 = 0
    entropy = -plogp.sum(dim=-1) / math.log(num_experts) if num_experts > 1 else torch.ones_like(share[..., 0])
    high, low = load.max(dim=-1).values, load.min(dim=-1).values
    return ExpertUsage(
        entropy, num_experts * share.max(dim=-1).values, num_experts * share.min(dim=-1).values, high / low.clamp_min(1)
    )


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

    def forward(self, x: Tensor) -> tuple[Tensor, Routing]:
        """Returns the output (same shape as ``x``) and the routing (load-balancing loss, assignments per expert)."""
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
        load = counts.float()  # (E,): the counts the packing used, as the routing record
        return out.reshape(shape), Routing(switch_loss(probs, load), load)
