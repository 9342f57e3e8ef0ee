"""OLMoE's router losses against hand-computed values: the router z-loss of one layer, and the trunk's per-layer
means against Megablocks' batched formula written out from its source on the routers' own logits."""

from __future__ import annotations

import math

import torch

from models import TrunkConfig
from models.layers import MoE, router_z_loss
from models.trunk import Trunk

EXPERTS, TOP_K, DEPTH, DIM = 4, 2, 3, 16


def test_router_z_loss_by_hand():
    # rows: logsumexp(0, 0) = ln 2, logsumexp(ln 3, 0) = ln 4 = 2 ln 2 -> mean of (ln 2)^2 and 4 (ln 2)^2
    logits = torch.tensor([[0.0, 0.0], [math.log(3.0), 0.0]])
    assert router_z_loss(logits).item() == torch.tensor(2.5 * math.log(2.0) ** 2).item()
    big = torch.tensor([[1000.0, 1000.0]])  # stable: ln(2 e^1000) = 1000 + ln 2, no overflow
    torch.testing.assert_close(router_z_loss(big), torch.tensor((1000 + math.log(2.0)) ** 2), rtol=1e-6, atol=0)
    assert router_z_loss(torch.zeros(0, 4)).item() == 0.0


def megablocks_losses(logits: list[torch.Tensor], top_k: int, lb_weight: float, z_weight: float):
    """databricks/megablocks ``batched_load_balancing_loss`` (moe.py 32-89 at 78eea65) and OLMoE's z-loss
    (Muennighoff/megablocks branch olmoe, moe.py 103), written out on every layer's router logits ``(T, E)``."""
    num_layers, (tokens, num_experts) = len(logits), logits[0].shape
    scores = [z.double().softmax(dim=-1) for z in logits]
    tokens_per_expert = [
        torch.bincount(s.topk(top_k, dim=-1).indices.flatten(), minlength=num_experts).double() for s in scores
    ]
    expert_scores = torch.cat(scores, dim=1).mean(dim=0)
    scale = num_experts * lb_weight / (num_layers * tokens * top_k)
    lb = scale * torch.dot(torch.cat(tokens_per_expert), expert_scores)
    lse = torch.log(torch.exp(torch.cat([z.double() for z in logits])).sum(dim=-1))
    z = z_weight * (lse**2).sum() / (num_layers * tokens)  # OLMoE's fork also divides by top_k: see the config
    return lb, z


def test_trunk_means_equal_megablocks_batched_losses():
    torch.manual_seed(0)
    cfg = TrunkConfig(dim=DIM, depth=DEPTH, num_heads=2, mlp="swiglu", norm_layer="rmsnorm", moe_experts=EXPERTS,
                      moe_top_k=TOP_K, moe_hidden=8, init_std=0.5)  # fmt: skip
    trunk = Trunk(cfg)
    seen: list[torch.Tensor] = []
    for layer in (m for m in trunk.modules() if isinstance(m, MoE)):
        layer.router.register_forward_hook(lambda mod, args, out: seen.append(out.detach()))
    _, routing = trunk(torch.randn(2, 6, DIM), return_aux=True)
    assert len(seen) == DEPTH and routing.layers == DEPTH
    lb, z = megablocks_losses(seen, TOP_K, lb_weight=0.01, z_weight=1e-3)
    torch.testing.assert_close(0.01 * routing.mean_loss.double(), lb, rtol=1e-5, atol=0)
    torch.testing.assert_close(1e-3 * routing.mean_z.double(), z, rtol=1e-5, atol=0)
    assert routing.mean_loss.item() < 0.99 * routing.loss.item() / 2  # a mean, not the sum over the 3 layers
    assert routing.mean_z.item() > 1.0  # init_std 0.5: large router logits, a z-loss well above 0


def test_dense_trunk_routing_means_are_zero():
    trunk = Trunk(TrunkConfig(dim=DIM, depth=2, num_heads=2))
    _, routing = trunk(torch.randn(1, 4, DIM), return_aux=True)
    assert routing.layers == 0 and routing.mean_loss.item() == 0.0 and routing.mean_z.item() == 0.0
