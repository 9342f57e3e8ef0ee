"""Feed-forward sublayers: GELU MLP (ViT/DiT) and SwiGLU (LM)."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn


class Mlp(nn.Module):
    """``fc2(act(fc1(x)))``; ``approximate="tanh"`` gives DiT's GELU."""

    def __init__(self, dim: int, hidden: int, bias: bool = True, approximate: str = "none") -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden, bias=bias)
        self.act = nn.GELU(approximate=approximate)
        self.fc2 = nn.Linear(hidden, dim, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.act(self.fc1(x)))


class SwiGLU(nn.Module):
    """``fc2(silu(gate) * up)`` with gate and up from one fused projection ``fc1``."""

    def __init__(self, dim: int, hidden: int, bias: bool = False) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, 2 * hidden, bias=bias)  # [gate; up]
        self.fc2 = nn.Linear(hidden, dim, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.fc1(x).chunk(2, dim=-1)
        return self.fc2(F.silu(gate) * up)
