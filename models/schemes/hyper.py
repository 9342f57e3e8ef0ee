"""Hyper-Connections (Zhu et al., ICLR 2025), dynamic (DHC), expansion n = 2.

The residual state is ``H`` with n copies of the width-D stream per token, ``(B, N, n, D)``.
Per sublayer k::

    Hn  = N(H)
    A_m = A_m0 + s_a * tanh(Hn W_m)      (n)      width connection: how streams mix into F's input
    A_r = A_r0 + s_a * tanh(Hn W_r)      (n x n)  depth connection: how streams carry over
    B   = B0   + s_b * tanh(Hn W_b)      (n)      how F's output is written to each stream
    o   = F(N(A_m^T H))
    H   = B^T o + A_r^T H

Init: ``A_m0 = e_(k mod n)``, ``A_r0 = I``, ``B0 = 1``, ``W_* = 0``, ``s_a = s_b = 0.01``; so at init
sublayer k reads stream k mod n and adds its output to every stream.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn

from models.schemes.base import NormScheme, Scheme, Site, register
from models.schemes.readouts import HyperReadout

EXPANSION = 2


class _Pending(NamedTuple):
    """What ``prepare`` computed that ``update`` needs: the streams and this token's A_r and B."""

    streams: Tensor  # (B, N, n, D)
    depth_conn: Tensor  # A_r, (B, N, n, n)
    write_conn: Tensor  # B, (B, N, n)


@register(NormScheme.HYPER)
class HyperConnections(Scheme):
    """Dynamic Hyper-Connections with n = 2 (equations in the module docstring)."""

    readout = HyperReadout

    def __init__(self, site: Site) -> None:
        super().__init__(site)
        n, d = EXPANSION, site.dim
        self.norm_h = site.norm()  # N(H)
        self.norm_in = site.branch_norm()  # N(h_in)
        self.register_buffer("read_0", torch.eye(n)[site.index % n])  # e_(k mod n)
        self.register_buffer("depth_0", torch.eye(n))
        self.register_buffer("write_0", torch.ones(n))
        self.w_read = nn.Parameter(torch.zeros(d))  # W_m
        self.w_depth = nn.Parameter(torch.zeros(d, n))  # W_r
        self.w_write = nn.Parameter(torch.zeros(d))  # W_b
        self.s_a = nn.Parameter(torch.tensor(0.01))
        self.s_b = nn.Parameter(torch.tensor(0.01))
        self.recompute_wins = True  # N(H) and A_m^T H are kept by the connection matmuls and N(h_in)

    @staticmethod
    def init_state(h: Tensor) -> Tensor:
        return torch.stack([h] * EXPANSION, dim=-2)  # (B, N, D) -> (B, N, n, D)

    def prepare(self, streams: Tensor) -> tuple[Tensor, _Pending]:
        hn = self.norm_h(streams)
        read = self.read_0 + self.s_a * torch.tanh(hn @ self.w_read)  # A_m: (B, N, n)
        depth = self.depth_0 + self.s_a * torch.tanh(hn @ self.w_depth)  # A_r: (B, N, n, n)
        write = self.write_0 + self.s_b * torch.tanh(hn @ self.w_write)  # B: (B, N, n)
        h_in = torch.einsum("...i,...id->...d", read, streams)  # A_m^T H: (B, N, D)
        return self.norm_in(h_in), _Pending(streams, depth, write)

    def update(self, pending: _Pending, out: Tensor) -> Tensor:
        carried = torch.einsum("...ij,...id->...jd", pending.depth_conn, pending.streams)  # A_r^T H
        return pending.write_conn.unsqueeze(-1) * out.unsqueeze(-2) + carried  # B^T o + A_r^T H
