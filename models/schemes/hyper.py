"""Hyper-Connections (Zhu et al., ICLR 2025), dynamic (DHC), expansion n = 2, and the family's shared machinery.

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

:class:`StreamConnections` is what every member of the family shares (mHC in :mod:`models.schemes.mhc` too):
the n-stream state, the three connection products ``read`` / ``carry`` / ``write`` and the readout
``N_f(sum_i H_i)``. A member only says how its per-token weights are made.

Dtypes: the connection weights and the stream mixing run in float32 whatever the autocast or the parameter
dtype (FSDP2's bfloat16 all-gathers leave the ``*_0`` buffers float32; a float64 trunk stays float64), and what
they produce goes back to the streams' dtype, as mHC does (:func:`write_and_carry`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn

from models.schemes.base import NormScheme, Scheme, Site, register
from models.schemes.readouts import HyperReadout

EXPANSION = 2


class Pending(NamedTuple):
    """What ``prepare`` computed that ``update`` needs: the streams, this token's carry-over and write weights."""

    streams: Tensor  # (B, N, n, D)
    depth_conn: Tensor  # A_r (mHC: H_res), (B, N, n, n)
    write_conn: Tensor  # B (mHC: H_post), (B, N, n)


def autocast_off(t: Tensor) -> torch.autocast:
    """A region where autocast leaves dtypes alone, so what is computed in float32 stays float32."""
    return torch.autocast(t.device.type, enabled=False)


def at_least_float32(t: Tensor) -> Tensor:
    """``t`` in float32 (the reference's ``.float()``), or left in float64."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


def read(weights: Tensor, streams: Tensor) -> Tensor:
    """``A_m^T H = sum_i A_m[i] H_i``: the branch input, ``(B, N, n) x (B, N, n, D) -> (B, N, D)``."""
    return torch.einsum("...i,...id->...d", weights, streams)


def carry(matrix: Tensor, streams: Tensor) -> Tensor:
    """``A_r^T H``: stream j receives ``sum_i A_r[i, j] H_i``, ``(B, N, n, n) x (B, N, n, D) -> (B, N, n, D)``."""
    return torch.einsum("...ij,...id->...jd", matrix, streams)


def write(weights: Tensor, out: Tensor) -> Tensor:
    """``B^T o``: stream j receives ``B[j] o``, ``(B, N, n) x (B, N, D) -> (B, N, n, D)``."""
    return weights.unsqueeze(-1) * out.unsqueeze(-2)


def write_and_carry(pending: Pending, out: Tensor) -> Tensor:
    """``B^T o + A_r^T H`` in the weights' float32, cast back to the streams' dtype."""
    x, f = pending.streams, pending.write_conn.dtype
    with autocast_off(out):
        written = write(pending.write_conn, out.to(f))  # B^T o: (B, N, n, D)
        carried = carry(pending.depth_conn, x.to(f))  # A_r^T H: (B, N, n, D)
    return written.to(x.dtype) + carried.to(x.dtype)


class StreamConnections(Scheme):
    """A Hyper-Connections-family site: n residual streams, read into one branch input and written back.

    The state is n copies of the embedding, ``(B, N, n, D)``; the readout sums the streams and normalizes
    (``N_f(sum_i H_i)``). Subclasses build their weights in ``prepare`` and combine ``read``, ``carry`` and
    ``write`` in ``update``.
    """

    readout = HyperReadout

    def __init__(self, site: Site, streams: int) -> None:
        super().__init__(site)
        self.streams = streams
        self.recompute_wins = True  # N(H) and A_m^T H are kept by the connection matmuls and N(h_in)

    def init_state(self, h: Tensor) -> Tensor:
        return torch.stack([h] * self.streams, dim=-2)  # (B, N, D) -> (B, N, n, D)


@register(NormScheme.HYPER)
class HyperConnections(StreamConnections):
    """Dynamic Hyper-Connections with n = 2 (equations in the module docstring)."""

    def __init__(self, site: Site) -> None:
        super().__init__(site, EXPANSION)
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

    def prepare(self, streams: Tensor) -> tuple[Tensor, Pending]:
        hn = at_least_float32(self.norm_h(streams))  # N(H): (B, N, n, D)
        f = hn.dtype  # the weights below in float32 (the buffers' dtype), whatever the parameters' dtype
        with autocast_off(streams):
            s_a, s_b = self.s_a.to(f), self.s_b.to(f)
            read_w = self.read_0.to(f) + s_a * torch.tanh(hn @ self.w_read.to(f))  # A_m: (B, N, n)
            depth = self.depth_0.to(f) + s_a * torch.tanh(hn @ self.w_depth.to(f))  # A_r: (B, N, n, n)
            write_w = self.write_0.to(f) + s_b * torch.tanh(hn @ self.w_write.to(f))  # B: (B, N, n)
            h_in = read(read_w, streams.to(f)).to(streams.dtype)  # A_m^T H: (B, N, D)
        return self.norm_in(h_in), Pending(streams, depth, write_w)  # N(A_m^T H)

    def update(self, pending: Pending, out: Tensor) -> Tensor:
        return write_and_carry(pending, out)  # B^T o + A_r^T H
