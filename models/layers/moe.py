"""Token-choice top-k mixture of experts (OLMoE-style), dropless, experts computed batched.

Besides its output, each MoE layer returns what its router did (:class:`Routing`): the load-balancing loss,
the router z-loss and how many of the ``T * k`` token -> expert assignments each expert received. Both come out of the
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
from torch._subclasses.fake_tensor import is_fake
from torch.distributed.tensor import DTensor


class Routing(NamedTuple):
    """What the router did in one forward.

    Attributes:
        loss: the load-balancing loss (a scalar, :func:`switch_loss`; the trunk sums it over its MoE layers).
        load: assignments per expert as float32 counts, ``(E,)`` for one layer, ``(L, E)`` stacked by the
            trunk over its L MoE layers. They sum to ``T * k`` per layer (T tokens, k experts each).
        z: the router z-loss, :func:`router_z_loss` (a scalar; the trunk sums it over its MoE layers).

    A loss weighted as OLMoE / Megablocks weight it is the per-layer mean: :attr:`mean_loss`, :attr:`mean_z`.
    """

    loss: Tensor
    load: Tensor
    z: Tensor

    @property
    def layers(self) -> int:
        """How many MoE layers the record covers (1 for one layer's record, 0 for a dense trunk's)."""
        return self.load.shape[0] if self.load.ndim == 2 else 1

    @property
    def mean_loss(self) -> Tensor:
        """The load-balancing loss averaged over the MoE layers (0 for a dense trunk): Megablocks'
        ``batched_load_balancing_loss`` without its weight, ``E / (L T k) sum_(l, e) count_le P_le``
        (databricks/megablocks ``megablocks/layers/moe.py`` lines 83-89 at 78eea65; OLMoE's fork, the same)."""
        return self.loss / max(self.layers, 1)

    @property
    def mean_z(self) -> Tensor:
        """The router z-loss averaged over the MoE layers (0 for a dense trunk)."""
        return self.z / max(self.layers, 1)


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


def router_z_loss(logits: Tensor) -> Tensor:
    """ST-MoE's router z-loss ``mean_t (logsumexp_e logits_te)^2`` of one layer's router logits ``(T, E)``.

    As OLMoE computes it: ``torch.log(torch.exp(expert_logits).sum(dim=-1)) ** 2`` over every token of every layer
    (Muennighoff/megablocks branch ``olmoe`` 4a25bc7, ``megablocks/layers/moe.py`` line 103), here with a stable
    logsumexp, in float32, per layer; upstream Megablocks' ``batched_router_zloss`` (``megablocks/layers/router.py``
    lines 25-42 at 78eea65) is the same per-layer mean. An empty batch gives 0.
    """
    if logits.shape[0] == 0:
        return logits.new_zeros((), dtype=torch.float32)
    return torch.logsumexp(logits.float(), dim=-1).square().mean()


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


def matmul_dtype(x: Tensor) -> torch.dtype:
    """The dtype the experts' matmuls run in: autocast's lower precision where autocast is on for ``x``'s device
    (autocast lists no ``_grouped_mm``, and CUDA's kernel takes only bfloat16 / float16: the cast a Linear gets
    from autocast, done here), else ``x``'s own."""
    device = x.device.type
    if torch.amp.is_autocast_available(device) and torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return x.dtype


def grouped_matmul(x: Tensor, w: Tensor, counts: Tensor) -> Tensor:
    """``x[rows of expert e] @ w[e]`` for every expert e, the rows sorted by expert: ``(T, D) x (E, D, F) -> (T, F)``.

    One grouped kernel (``torch._grouped_mm``, offsets from the counts: no host sync) where torch has one for the
    tensors (its rows must be 16-byte aligned; bfloat16 everywhere, float32 on CPU only: CUDA's kernel refuses it);
    else every expert's rows padded to a common capacity and one batched matmul. Eagerly (and on meta / fake
    tensors, whose read the memory estimate answers) the capacity is the busiest expert's count, read on the host.
    Under ``torch.compile`` it is the number of rows T, a static upper bound: no host sync and no data-dependent
    size, so the function traces into one graph, also inside a compiled activation-checkpointing region (which
    cannot hold a graph break). Its cost: the padded input ``(E, T, D)`` and output ``(E, T, F)`` hold E times the
    rows of ``x`` (eagerly ``E * max count``, about T rows for a balanced load), and the batched matmul does E times
    the FLOPs. Only float32 under compile pays it (bfloat16, autocast's dtype on a GPU, takes the grouped kernel).
    Each row's value is the same either way (the padding is zero rows). Under autocast both run in autocast's dtype
    (:func:`matmul_dtype`).
    """
    x = x.to(matmul_dtype(x))
    aligned = all(size * x.element_size() % 16 == 0 for size in (w.shape[-2], w.shape[-1])) and x.shape[0] > 0
    # float32 has a CPU kernel but no CUDA, meta or fake one (torch.compile, the memory estimate): bfloat16 has all.
    # is_compiling() first: dynamo does not trace is_fake (a graph break, and a compiled checkpoint falls back to eager)
    compiling = torch.compiler.is_compiling()
    traced = compiling or x.device.type == "meta" or is_fake(x)
    cpu32 = x.dtype == torch.float32 and x.device.type == "cpu" and not traced
    if aligned and (x.dtype == torch.bfloat16 or cpu32):
        offsets = torch.cumsum(counts, 0, dtype=torch.int32)
        return torch._grouped_mm(x, w.to(x.dtype), offs=offsets)
    starts = torch.cumsum(counts, 0) - counts
    expert = torch.repeat_interleave(torch.arange(counts.numel(), device=x.device), counts, output_size=x.shape[0])
    slot = torch.arange(x.shape[0], device=x.device) - starts[expert]  # position within its expert's rows
    capacity = x.shape[0] if compiling else int(counts.max()) if x.shape[0] else 0
    buf = x.new_zeros(counts.numel(), capacity, x.shape[-1])  # (E, C, D)
    buf[expert, slot] = x
    return torch.bmm(buf, w.to(x.dtype))[expert, slot]


class GroupedExperts(nn.Module):
    """E SwiGLU experts with stacked weights, over tokens sorted by expert.

    ``forward(x, counts)``: ``x`` ``(A, D)`` holds the A token copies routed here, the rows of expert 0 first, then
    expert 1's ...; ``counts`` ``(E,)`` how many rows each expert has. This is the boundary expert parallelism cuts
    at (experiments.parallel): the experts' rows can come from other ranks, and the weights split on their first
    axis.
    """

    def __init__(self, dim: int, hidden: int, num_experts: int) -> None:
        super().__init__()
        self.num_experts = num_experts
        self.w_in = nn.Parameter(torch.empty(num_experts, dim, 2 * hidden))  # per expert [gate; up]
        self.w_out = nn.Parameter(torch.empty(num_experts, hidden, dim))
        nn.init.normal_(self.w_in, std=1 / math.sqrt(dim))
        nn.init.normal_(self.w_out, std=1 / math.sqrt(hidden))

    def forward(self, x: Tensor, counts: Tensor) -> Tensor:
        # Under expert parallelism the weights are DTensors cut on the expert axis: this rank's experts are its part.
        w_in, w_out = (w.to_local() if isinstance(w, DTensor) else w for w in (self.w_in, self.w_out))
        gate, up = grouped_matmul(x, w_in, counts).chunk(2, dim=-1)  # (A, H) each
        return grouped_matmul(F.silu(gate) * up, w_out, counts)  # (A, D)


class MoE(nn.Module):
    """SwiGLU experts behind a softmax top-k router.

    The router picks k experts per token; the T * k token copies are sorted by expert (a stable sort, so each
    expert sees its tokens in order), the experts run as :class:`GroupedExperts` on ``(sorted copies, counts)``,
    and each output is scattered back to its token weighted by its router probability.

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
        self.experts = GroupedExperts(dim, hidden, num_experts)
        self.register_load_state_dict_pre_hook(_experts_moved)

    @property
    def w_in(self) -> nn.Parameter:
        """The experts' stacked ``[gate; up]`` weights ``(E, D, 2H)``."""
        return self.experts.w_in

    @property
    def w_out(self) -> nn.Parameter:
        """The experts' stacked output weights ``(E, H, D)``."""
        return self.experts.w_out

    def route(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Router probabilities ``(T, E)``, chosen experts ``(T, k)`` and their weights ``(T, k)``."""
        probs, idx, weight = self.route_logits(self.router(x).float())
        return probs, idx, weight.to(x.dtype)

    def route_logits(self, logits: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """:meth:`route` from the router's float32 logits ``(T, E)`` (the weights stay float32)."""
        probs = F.softmax(logits, dim=-1)
        weight, idx = probs.topk(self.top_k, dim=-1)
        if self.normalize_topk:
            weight = weight / weight.sum(dim=-1, keepdim=True)
        return probs, idx, weight

    def forward(self, x: Tensor) -> tuple[Tensor, Routing]:
        """Returns the output (same shape as ``x``) and the routing (load-balancing loss, assignments per expert,
        router z-loss)."""
        shape = x.shape
        x = x.reshape(-1, shape[-1])  # (T, D)
        logits = self.router(x).float()  # (T, E)
        probs, idx, weight = self.route_logits(logits)
        weight = weight.to(x.dtype)
        flat_expert = idx.flatten()  # (T*k,) assignment a -> expert
        order = torch.argsort(flat_expert, stable=True)
        # (E,) copies per expert; a scatter, not bincount: its size is E whatever the data (no host sync)
        counts = flat_expert.new_zeros(self.num_experts).index_add_(0, flat_expert, torch.ones_like(flat_expert))
        token = order // self.top_k  # which token each sorted assignment came from
        y = self.experts(x[token], counts) * weight.flatten()[order].unsqueeze(-1)  # (T*k, D)
        out = torch.zeros_like(x).index_add_(0, token, y)
        load = counts.float()  # (E,): the counts the grouping used, as the routing record
        return out.reshape(shape), Routing(switch_loss(probs, load), load, router_z_loss(logits))


def _experts_moved(module, state_dict, prefix, *args) -> None:
    """Checkpoints from before the experts were a submodule kept ``w_in`` / ``w_out`` on the MoE itself."""
    for name in ("w_in", "w_out"):
        if prefix + name in state_dict:
            state_dict[prefix + "experts." + name] = state_dict.pop(prefix + name)
