"""Embedders that stems put in front of the trunk: 2-D sin-cos positions, timesteps, class labels."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


def sincos_1d(dim: int, pos: Tensor) -> Tensor:
    """``[sin(pos * w), cos(pos * w)]`` with ``w_i = 10000^(-2i/dim)``: ``(M,) -> (M, dim)``."""
    omega = 1.0 / 10000 ** (torch.arange(dim // 2, dtype=torch.float64) / (dim / 2))
    angles = torch.outer(pos.double().flatten(), omega)  # (M, dim/2)
    return torch.cat([angles.sin(), angles.cos()], dim=1)


def sincos_2d(dim: int, grid_size: int) -> Tensor:
    """Fixed 2-D sin-cos position embedding of DiT/MAE: ``(grid_size**2, dim)``, rows in raster order.

    Half the channels encode the column (w) coordinate, half the row (h) coordinate.
    """
    coords = torch.arange(grid_size, dtype=torch.float64)
    w, h = torch.meshgrid(coords, coords, indexing="xy")  # w varies along a row
    return torch.cat([sincos_1d(dim // 2, w), sincos_1d(dim // 2, h)], dim=1).float()


def timestep_frequencies(t: Tensor, dim: int = 256, max_period: float = 10000.0, freq_shift: int = 0) -> Tensor:
    """Sinusoidal timestep features ``[cos(t w), sin(t w)]``, ``w_i = max_period^(-i/(dim/2 - freq_shift))``.

    ``freq_shift=0`` is the official DiT; ``freq_shift=1`` is diffusers' ``Timesteps(downscale_freq_shift=1)``.
    """
    half = dim // 2
    freqs = torch.exp(
        -math.log(max_period) * torch.arange(half, dtype=torch.float32, device=t.device) / (half - freq_shift)
    )
    args = t.float()[:, None] * freqs[None]  # (B, half)
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


class TimestepEmbedder(nn.Module):
    """Scalar diffusion timesteps -> ``(B, D)`` via sinusoidal features and a 2-layer MLP."""

    def __init__(self, dim: int, freq_dim: int = 256, freq_shift: int = 0) -> None:
        super().__init__()
        self.freq_dim, self.freq_shift = freq_dim, freq_shift
        self.mlp = nn.Sequential(nn.Linear(freq_dim, dim), nn.SiLU(), nn.Linear(dim, dim))

    def forward(self, t: Tensor) -> Tensor:
        freqs = timestep_frequencies(t, self.freq_dim, freq_shift=self.freq_shift)
        return self.mlp(freqs.to(self.mlp[0].weight.dtype))


class LabelEmbedder(nn.Module):
    """Class labels -> ``(B, D)``; with ``dropout > 0`` an extra "null" row (index ``num_classes``)
    replaces dropped labels, which is what classifier-free guidance samples against."""

    def __init__(self, num_classes: int, dim: int, dropout: float) -> None:
        super().__init__()
        self.num_classes, self.dropout = num_classes, dropout
        self.table = nn.Embedding(num_classes + int(dropout > 0), dim)

    def forward(self, labels: Tensor, force_drop: Tensor | None = None) -> Tensor:
        if (self.training and self.dropout > 0) or force_drop is not None:
            drop = (
                force_drop.bool()
                if force_drop is not None
                else torch.rand_like(labels, dtype=torch.float) < self.dropout
            )
            labels = torch.where(drop, torch.full_like(labels, self.num_classes), labels)
        return self.table(labels)
