"""Readouts: how each scheme turns its final residual state into the trunk's output.

In conditioned (adaLN) mode the readout's outermost norm is the DiT final layer's input norm, so
it becomes non-affine (``site.branch_norm``), and readouts without one gain it (``site.cond_norm``),
by the same rule as for branch inputs (README, "The norm schemes").
"""

from __future__ import annotations

import torch
from torch import Tensor

from models.schemes.base import DualStream, HybridDual, Readout, Site, TwoStream


class FinalNorm(Readout):
    """``N_f(x)``: Pre-Norm-style final norm."""

    def __init__(self, site: Site) -> None:
        super().__init__(site)
        self.norm_f = site.branch_norm()

    def forward(self, state: Tensor) -> Tensor:
        return self.norm_f(state)


class PassThrough(Readout):
    """``x``: Post-Norm-style schemes already end on a norm."""

    def __init__(self, site: Site) -> None:
        super().__init__(site)
        self.norm_f = site.cond_norm()

    def forward(self, state: Tensor) -> Tensor:
        return self.norm_f(state)


class ResiDualReadout(Readout):
    """``x + N_d(d)``: the Post-LN stream plus the normalized sum of all branch outputs."""

    def __init__(self, site: Site) -> None:
        super().__init__(site)
        self.norm_d = site.norm()
        self.norm_f = site.cond_norm()

    def forward(self, state: DualStream) -> Tensor:
        return self.norm_f(state.post + self.norm_d(state.delta))

    def streams(self, state: DualStream) -> dict[str, Tensor]:
        return {"post": self.norm_f(state.post), "delta": self.norm_f(self.norm_d(state.delta))}


class HybridDualReadout(Readout):
    """``N_x(x) + N_d(d)``: ResiDual's readout for a main stream that does not end on a norm (HybridNorm's)."""

    def __init__(self, site: Site) -> None:
        super().__init__(site)
        self.norm_x = site.norm()
        self.norm_d = site.norm()
        self.norm_f = site.cond_norm()
        self.recompute_wins = site.conditioned  # adaLN's N_f keeps N_x(x) + N_d(d)

    def forward(self, state: HybridDual) -> Tensor:
        return self.norm_f(self.norm_x(state.hybrid) + self.norm_d(state.delta))

    def streams(self, state: HybridDual) -> dict[str, Tensor]:
        return {"hybrid": self.norm_f(self.norm_x(state.hybrid)), "delta": self.norm_f(self.norm_d(state.delta))}


class SiameseFusion(Readout):
    """``N_o(N_a(x) + N_b(y))``: each stream normalized, summed, normalized again."""

    def __init__(self, site: Site) -> None:
        super().__init__(site)
        self.norm_a = site.norm()
        self.norm_b = site.norm()
        self.norm_o = site.branch_norm()
        self.recompute_wins = True  # N_o's input N_a(x) + N_b(y) need not be kept

    def forward(self, state: TwoStream) -> Tensor:
        return self.norm_o(self.norm_a(state.post) + self.norm_b(state.pre))

    def streams(self, state: TwoStream) -> dict[str, Tensor]:
        return {"post": self.norm_o(self.norm_a(state.post)), "pre": self.norm_o(self.norm_b(state.pre))}


class HyperReadout(Readout):
    """``N_f(sum_i H_i)``: Hyper-Connections sum their n streams before the final norm."""

    def __init__(self, site: Site) -> None:
        super().__init__(site)
        self.norm_f = site.branch_norm()

    def forward(self, state: Tensor) -> Tensor:
        return self.norm_f(state.sum(dim=-2))  # (B, N, n, D) -> (B, N, D)

    def streams(self, state: Tensor) -> dict[str, Tensor]:
        return {f"h{i}": self.norm_f(h) for i, h in enumerate(torch.unbind(state, dim=-2))}


__all__ = ["FinalNorm", "PassThrough", "ResiDualReadout", "HybridDualReadout", "SiameseFusion", "HyperReadout"]
