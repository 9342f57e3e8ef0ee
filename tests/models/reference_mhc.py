"""Hand-written float64 references of mHC (manifold-constrained Hyper-Connections): ``mhc_variant: mhcv2`` from the
equations of ``lucidrains/hyper-connections`` ``hyper_connections/mHCv2.py`` (docs/schemes.md, "mHC"), and
``mhc_variant: paper`` from DeepSeek-V4's ``hc_pre`` / ``hc_post`` / ``hc_split_sinkhorn`` (as its public ports
restate them) with Megatron-LM's init (``megatron/core/transformer/hyper_connection.py``).

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


#################################################################################
#   The paper form (mhc_variant: paper): DeepSeek-V4's hc_pre / hc_post and     #
#   hc_split_sinkhorn, Megatron-LM's init                                       #
#################################################################################

HC_EPS = 1e-6  # DeepSeek-V4: hc_eps
HC_NORM_EPS = 1e-6  # DeepSeek-V4: norm_eps of the rescale before the projection


def sinkhorn_eps(logits: list[list[Tensor]], iters: int = SINKHORN_ITERS, eps: float = HC_EPS) -> list[list[Tensor]]:
    """DeepSeek-V4's ``hc_split_sinkhorn`` on ``logits[i][j]``: a softmax over j (row i) plus eps, then the
    columns divided by (their sum + eps), then ``iters - 1`` rounds of rows, then columns, likewise."""
    n = len(logits)
    m = []
    for i in range(n):
        e = [torch.exp(logits[i][j]) for j in range(n)]  # no max shift: the logits here are small
        total = sum(e)
        m.append([e[j] / total + eps for j in range(n)])

    def columns(m):
        col = [sum(m[i][j] for i in range(n)) + eps for j in range(n)]
        return [[m[i][j] / col[j] for j in range(n)] for i in range(n)]

    def rows(m):
        row = [sum(m[i][j] for j in range(n)) + eps for i in range(n)]
        return [[m[i][j] / row[i] for j in range(n)] for i in range(n)]

    m = columns(m)
    for _ in range(iters - 1):
        m = columns(rows(m))
    return m


def paper_weights(site, x: list[Tensor]) -> tuple[list[Tensor], list[Tensor], list[list[Tensor]]]:
    """H_pre, H_post, H_res of one site for streams ``x`` (a list of n ``(B, N, D)`` tensors).

    ``v = [x_0, ..., x_(n-1)]`` concatenated; ``m_r = (Phi_r . v) / sqrt(mean(v^2) + 1e-6)`` for each of the
    ``n^2 + 2n`` rows r of Phi; rows 0..n-1 are pre, n..2n-1 post, then res row-major (entry (i, j) at
    ``2n + i n + j``); ``z_r = a_group m_r + b_r``.
    """
    n = len(x)
    v = torch.cat(x, dim=-1)  # (B, N, nD), stream 0's channels first
    inv_rms = 1 / torch.sqrt((v**2).mean(-1) + HC_NORM_EPS)
    phi, b, a = site.hc_fn, site.hc_base, site.hc_scale

    def z(r: int, group: int) -> Tensor:
        return a[group] * ((v @ phi[r]) * inv_rms) + b[r]

    h_pre = [sigmoid(z(i, 0)) + HC_EPS for i in range(n)]
    h_post = [2 * sigmoid(z(n + j, 1)) for j in range(n)]
    h_res = sinkhorn_eps([[z(2 * n + i * n + j, 2) for j in range(n)] for i in range(n)])
    return h_pre, h_post, h_res


def ref_mhc_paper(r, h: Tensor) -> Tensor:
    """The paper-form mHC trunk: DeepSeek-V4's ``hc_pre`` (read), the branch's norm, F, ``hc_post``
    (``out_j = post_j o + sum_i comb[i][j] x_i``), and the suite's readout ``N_f(sum_i x_i)``."""
    n = r.cfg.mhc_streams
    x = [h] * n
    for b, _, kind, site in r.sites():
        h_pre, h_post, h_res = paper_weights(site, x)
        h_in = sum(h_pre[i][..., None] * x[i] for i in range(n))
        o = r.F(b, kind, r.own(site.norm_in, h_in))
        x = [h_post[j][..., None] * o + sum(h_res[i][j][..., None] * x[i] for i in range(n)) for j in range(n)]
    return r.own(r.trunk.readout.norm_f, sum(x))


def ref_mhc_any(r, h: Tensor) -> Tensor:
    """The reference of the trunk's ``mhc_variant``."""
    return ref_mhc_paper(r, h) if r.cfg.mhc_variant == "paper" else ref_mhc(r, h)
