"""Trunk building blocks: attention, feed-forwards, MoE, adaLN-Zero conditioning."""

from models.layers.attention import Attention, apply_rope, rope_tables
from models.layers.conditioning import AdaLNZero, modulate
from models.layers.mlp import Mlp, SwiGLU
from models.layers.moe import ExpertUsage, MoE, Routing, expert_usage, load_balancing_loss, router_z_loss

__all__ = [
    "AdaLNZero",
    "Attention",
    "ExpertUsage",
    "Mlp",
    "MoE",
    "Routing",
    "SwiGLU",
    "apply_rope",
    "expert_usage",
    "load_balancing_loss",
    "modulate",
    "rope_tables",
    "router_z_loss",
]
