"""Hand-written float64 reference of mHC (manifold-constrained Hyper-Connections), from the equations of
``lucidrains/hyper-connections`` ``hyper_connections/mHCv2.py`` (docs/schemes.md, "mHC").

Streams, weights and the Sinkhorn matrix are Python lists of per-token tensors, indexed by stream, so every
sum over streams is written out; nothing here calls the scheme's ``prepare``/``update``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

SINKHORN_ITERS = 20  # mHCv2.py: sinkhorn_iters = 20


def sigmoid(z: Tensor) -> Tensor:
    return 1 / (1 + torch.exp(-z))


def sinkhorn(logits: list[list[Tensor]], iters: int = SINKHORN_ITERS) -> list[list[Tensor]]:
    """``M = exp(Z)``; then ``iters`` times: divide each column by its sum, then each row by its sum.

    ``logits[i][j]`` is entry (i, j) for every token; the reference's column-max shift cancels in the first
    column normalization, so it is left out here.
    """
    n = len(logits)
    m = [[torch.exp(logits[i][j]) for j in range(n)] for i in range(n)]
    for _ in range(iters):
        col = [sum(m[i][j] for i in range(n)) for j in range(n)]
        m = [[m[i][j] / col[j] for j in range(n)] for i in range(n)]
        row = [sum(m[i][j] for j in range(n)) for i in range(n)]
        m = [[m[i][j] / row[i] for j in range(n)] for i in range(n)]
    return m


def init_h_res(n: int) -> tuple[float, float]:
    """Diagonal and off-diagonal of ``Sinkhorn(I)``: ``exp(I)`` has equal row and column sums ``e + n - 1``."""
    return math.e / (math.e + n - 1), 1 / (math.e + n - 1)


def ref_mhc(r, h: Tensor) -> Tensor:
    """The mHC trunk: ``r`` is test_schemes' ``Ref`` (norms with explicit weights, the sublayers, adaLN)."""
    n = r.cfg.mhc_streams
    x = [h] * n  # n copies of the embedding
    for b, _, kind, site in r.sites():
        xn = [r.N(site.norm_h, xi) for xi in x]  # each stream normalized on its own
        h_pre = [sigmoid(site.read_0[i] + site.s_pre * (xn[i] @ site.w_read)) for i in range(n)]
        logits = [[site.depth_0[i, j] + site.s_res * (xn[i] @ site.w_depth[:, j]) for j in range(n)] for i in range(n)]
        h_res = sinkhorn(logits)
        h_post = [2 * sigmoid(site.write_0[j] + site.s_post * (xn[j] @ site.w_write)) for j in range(n)]
        h_in = sum(h_pre[i][..., None] * x[i] for i in range(n))  # H_pre^T x
        o = r.F(b, kind, r.own(site.norm_in, h_in))  # o = F(N(h_in))
        x = [h_post[j][..., None] * o + sum(h_res[i][j][..., None] * x[i] for i in range(n)) for j in range(n)]
    return r.own(r.trunk.readout.norm_f, sum(x))  # N_f(sum of streams)
