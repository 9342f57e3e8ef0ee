"""Manifold-constrained Hyper-Connections (mHC; Xie et al., DeepSeek, arXiv 2512.24880).

Hyper-Connections with n streams (``mhc_streams``, default 4) whose residual mixer is projected onto the
doubly stochastic matrices, so the carried-over streams stay a convex mixture of the old ones at every depth,
and whose read and write weights are kept positive. State: ``x`` with n streams per token, ``(B, N, n, D)``,
n copies of the embedding. Per sublayer k::

    xn_i   = N(x_i)                                           each stream normalized on its own, before mixing
    H_pre  = sigmoid(b_pre + s_pre * xn W_pre)                (n)      read weights, in (0, 1)
    H_res  = Sinkhorn(B_res + s_res * xn W_res)               (n x n)  carry-over, doubly stochastic
    H_post = 2 * sigmoid(b_post + s_post * xn W_post)         (n)      write weights, in (0, 2)
    o      = F(N(H_pre^T x))
    x      = H_post o + H_res^T x              i.e.  x_{l+1} = H_res x_l + H_post^T F(H_pre x_l)

Row i of each dynamic term is stream i's own ``xn_i W`` (``W_pre``: D, ``W_res``: D x n, ``W_post``: D), and
``H_res[i, j]`` is what stream i gives to stream j. ``Sinkhorn(Z)``: ``M = exp(Z - max_i Z)``, then 20 times
divide every column by its sum, then every row by its sum; rows end summing to 1 exactly, columns to
within the iteration's convergence. The weights, Sinkhorn and the stream mixing run in float32 whatever the
autocast or the parameter dtype (a float64 trunk stays float64), and the mixed streams go back to the
streams' dtype.

Init: ``b_pre = e_(k mod n)``, ``B_res = I``, ``b_post = 1``, ``W_* = 0``, ``s_pre = s_res = s_post = 0.01``
(all learned). So at init ``H_pre = sigmoid(1) = 0.731`` on stream ``k mod n`` and ``0.5`` on the others,
``H_post = 2 sigmoid(1) = 1.462`` on every stream, and ``H_res`` is NOT the identity:
``Sinkhorn(I) = (e I + (J - I)) / (e + n - 1)``, 0.475 on the diagonal and 0.175 elsewhere for n = 4 (the
matrix ``exp(I)`` has equal row and column sums, so one normalization already lands there).
Readout ``N_f(sum_i x_i)``, shared with Hyper-Connections.

Reference: ``lucidrains/hyper-connections``, ``hyper_connections/mHCv2.py`` at 4775103 (line numbers below),
class ``ManifoldConstrainedHyperConnections``, with its defaults (``num_fracs = 1``, ``num_input_views = 1``,
``num_dynamic_alpha_proposals = 1``, ``log_domain_sinkhorn = False``, ``mix_streams_before_norm = False``):

- Sinkhorn: ``sinkhorn_knopps`` (L51-69: float32, column max subtracted and detached, ``exp``, then ``iters``
  rounds of ``l1norm`` over dim -2, then dim -1); ``sinkhorn_iters = 20`` (L240, L345).
- Init (L307-326): ``static_alpha = cat(init_alpha0, eye(n))`` with ``init_alpha0[layer_index % n] = 1``
  (b_pre, B_res), ``dynamic_alpha_fn = 0`` (W_pre, W_res), ``pre_branch_scale = residual_scale = 1e-2``
  (s_pre, s_res); ``static_beta = 1`` (b_post), ``dynamic_beta_fn = 0`` (W_post), ``h_post_scale = 1e-2``
  (s_post). Without ``layer_index`` the reference draws the stream at random (L286, ``randrange``); the suite
  passes k, as for ``hyper``.
- ``width_connection`` (L372-470): ``self.norm`` per stream over D on the un-mixed streams (L398), the weights
  in float32 (L404-417), ``alpha_pre.sigmoid()`` (L423), Sinkhorn on the n x n block (L425),
  ``beta.sigmoid() * 2`` (L441-447), one float32 einsum for the branch input and ``H_res^T x`` (L449), cast
  back (L465); ``depth_connection`` (L472-499) adds ``beta * o`` in float32, cast back.
- The norm (L281, L146-153): a hard-coded RMSNorm (``F.normalize(x) * sqrt(D) * (gamma + 1)``, gamma = 0);
  here the configured ``N`` (the same function up to where eps sits when ``norm_layer: rmsnorm``).
- Streams: n copies of the embedding (L105) summed at the end (L110). The branch's own input norm
  ``N(H_pre^T x)`` and the final norm after the sum are the repository's ``hyper_connections/vit.py``
  (``Attention.norm`` L41, the LayerNorm opening ``FeedForward`` L21, ``Transformer.forward`` L84-92).
- Not implemented: ``mix_streams_before_norm`` (L246, L272-277, L390-394: a learned n x n mix, identity at
  init, of the streams that feed ``N`` and so only the weights; off by default), fractions, several input views,
  several alpha proposals, the log-domain and Triton Sinkhorn.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.schemes.base import NormScheme, Site, register
from models.schemes.hyper import Pending, StreamConnections, carry, read, write

SINKHORN_ITERS = 20  # mHCv2.py's sinkhorn_iters


def autocast_off(t: Tensor) -> torch.autocast:
    """A region where autocast leaves dtypes alone, so what is computed in float32 stays float32."""
    return torch.autocast(t.device.type, enabled=False)


def at_least_float32(t: Tensor) -> Tensor:
    """``t`` in float32 (the reference's ``.float()``), or left in float64."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


def sinkhorn_knopp(logits: Tensor, iters: int = SINKHORN_ITERS) -> Tensor:
    """The doubly stochastic matrix Sinkhorn-Knopp makes of ``exp(logits)`` over the last two dims, in float32.

    Column max subtracted first (the column normalization cancels it), then ``iters`` rounds of: each column
    divided by its sum, then each row. Returned in the dtype of ``logits``.
    """
    with autocast_off(logits):
        z = at_least_float32(logits)
        m = torch.exp(z - z.amax(dim=-2, keepdim=True).detach())  # (..., n, n), every entry in (0, 1]
        for _ in range(iters):
            m = F.normalize(m, p=1, dim=-2)  # each column sums to 1
            m = F.normalize(m, p=1, dim=-1)  # then each row
    return m.to(logits.dtype)


@register(NormScheme.MHC)
class ManifoldHyperConnections(StreamConnections):
    """mHC with n = ``mhc_streams`` streams (equations, init and reference lines in the module docstring)."""

    def __init__(self, site: Site) -> None:
        n, d = site.options.mhc_streams, site.dim
        super().__init__(site, n)
        self.norm_h = site.norm()  # N(x_i)
        self.norm_in = site.branch_norm()  # N(H_pre^T x)
        self.read_0 = nn.Parameter(torch.eye(n)[site.index % n])  # b_pre = e_(k mod n)
        self.depth_0 = nn.Parameter(torch.eye(n))  # B_res = I
        self.write_0 = nn.Parameter(torch.ones(n))  # b_post = 1
        self.w_read = nn.Parameter(torch.zeros(d))  # W_pre
        self.w_depth = nn.Parameter(torch.zeros(d, n))  # W_res
        self.w_write = nn.Parameter(torch.zeros(d))  # W_post
        self.s_pre = nn.Parameter(torch.tensor(0.01))
        self.s_res = nn.Parameter(torch.tensor(0.01))
        self.s_post = nn.Parameter(torch.tensor(0.01))

    def prepare(self, x: Tensor) -> tuple[Tensor, Pending]:
        xn = at_least_float32(self.norm_h(x))  # N(x_i), each stream over D: (B, N, n, D)
        f = xn.dtype  # the element-wise terms below promote to it; the matmuls need their weights cast
        with autocast_off(x):
            h_pre = torch.sigmoid(self.read_0 + self.s_pre * (xn @ self.w_read.to(f)))  # H_pre: (B, N, n)
            h_res = sinkhorn_knopp(self.depth_0 + self.s_res * (xn @ self.w_depth.to(f)))  # H_res: (B, N, n, n)
            h_post = 2 * torch.sigmoid(self.write_0 + self.s_post * (xn @ self.w_write.to(f)))  # H_post: (B, N, n)
            h_in = read(h_pre, x.to(f)).to(x.dtype)  # H_pre^T x: (B, N, D)
        return self.norm_in(h_in), Pending(x, h_res, h_post)

    def update(self, pending: Pending, out: Tensor) -> Tensor:
        x, f = pending.streams, pending.write_conn.dtype
        with autocast_off(out):
            written = write(pending.write_conn, out.to(f))  # H_post o: (B, N, n, D)
            carried = carry(pending.depth_conn, x.to(f))  # H_res^T x: (B, N, n, D)
        return written.to(x.dtype) + carried.to(x.dtype)
