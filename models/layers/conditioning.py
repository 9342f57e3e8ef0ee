"""adaLN-Zero conditioning (DiT): per-block shift/scale/gate produced from the conditioning vector."""

from __future__ import annotations

from torch import Tensor, nn


def modulate(x: Tensor, shift: Tensor, scale: Tensor) -> Tensor:
    """``x * (1 + scale) + shift`` with per-sample ``(B, 1, D)`` shift and scale."""
    return x * (1 + scale) + shift


class AdaLNZero(nn.Module):
    """``SiLU -> Linear(D, chunks * D)``, zero-initialized so every gate starts at 0.

    Returns ``chunks`` tensors of shape ``(B, 1, D)``.
    """

    def __init__(self, dim: int, chunks: int) -> None:
        super().__init__()
        self.chunks = chunks
        self.net = nn.Sequential(nn.SiLU(), nn.Linear(dim, chunks * dim))
        nn.init.zeros_(self.net[1].weight)
        nn.init.zeros_(self.net[1].bias)

    def forward(self, cond: Tensor) -> tuple[Tensor, ...]:
        return self.net(cond).unsqueeze(1).chunk(self.chunks, dim=-1)
