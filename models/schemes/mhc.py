"""Manifold-constrained Hyper-Connections (mHC; Xie et al., DeepSeek, arXiv 2512.24880), in two forms.

Hyper-Connections with n streams (``mhc_streams``, default 4) whose residual mixer is projected onto the
doubly stochastic matrices, so the carried-over streams stay a convex mixture of the old ones at every depth,
and whose read and write weights are kept positive. State: ``x`` with n streams per token, ``(B, N, n, D)``,
n copies of the embedding. Per sublayer k, in both forms::

    o = F(N(H_pre^T x))
    x = H_post o + H_res^T x            i.e.  stream j gets  H_post[j] o + sum_i H_res[i, j] x_i

``H_res[i, j]`` is what stream i gives to stream j. The forms differ in how the per-token weights are made
(``mhc_variant``). The weights, Sinkhorn and the stream mixing run in float32 whatever the autocast or the
parameter dtype (a float64 trunk stays float64), and the mixed streams go back to the streams' dtype.
Readout ``N_f(sum_i x_i)``, shared with Hyper-Connections (Megatron-LM averages the streams before its final
norm: the same function up to where the norm's eps sits).

``mhc_variant: paper`` (the default; the zoo's) -- the paper's Eqs. 7-9 with its reordered RMSNorm (Sec. 4.3.1)
as production code runs them. The n streams are flattened into one ``nD`` vector per token and one projection
makes all ``n^2 + 2n`` logits; the RMS normalization is applied after the matmul::

    v      = vec(x)                                             (nD)
    m      = (v Phi^T) * rsqrt(mean(v^2) + 1e-6)                (n + n + n^2)   Phi: (n^2 + 2n) x nD
    H_pre  = sigmoid(a_pre  * m_pre  + b_pre) + eps             (n)
    H_post = 2 * sigmoid(a_post * m_post + b_post)              (n)
    H_res  = Sinkhorn_eps(a_res * m_res + b_res)                (n x n)

``Sinkhorn_eps(Z)``: ``M = softmax(Z over j) + eps``, divide every column by (its sum + eps), then 19 times:
every row by (its sum + eps), then every column; ``eps = 1e-6`` (``hc_eps``), 20 normalization rounds in all
(``hc_sinkhorn_iters``). Sources: DeepSeek-V4's ``inference/model.py`` ``Block.hc_pre`` / ``hc_post`` and
``hc_split_sinkhorn`` as its public ports restate them (e.g. xtuner's ``hc_decoder_layer.py``; the weights
themselves are not read here), which fix the layout ``[pre | post | res]``, the eps terms and
``hc_post``'s ``sum_i comb[i, j] x_i``. Init, which an inference file does not have, from Megatron-LM's
training code (``megatron/core/transformer/hyper_connection.py`` at d98e8a6, ``HyperConnectionModule``):
``Phi`` xavier-uniform (``mapping_proj``), ``b = 0``, ``a_pre = a_post = a_res = 0.01``
(``mhc_init_gating_factor``). So at init ``H_pre ~ 1/2``, ``H_post ~ 1`` and ``H_res ~ J / n``, each moved
by the small random ``0.01 * m``. The branch's own norm ``N`` after the read is the layer's input norm in both
codes. Megatron's Sinkhorn differs (``exp`` of the row-max-shifted logits, rows first, ``clamp(min=eps)``); the
DeepSeek-V4 one is implemented.

``mhc_variant: mhcv2`` -- ``lucidrains/hyper-connections``, ``hyper_connections/mHCv2.py`` at 4775103 (line
numbers below), class ``ManifoldConstrainedHyperConnections`` with its defaults: each stream normalized and
projected on its own::

    xn_i   = N(x_i)                                           each stream normalized on its own, before mixing
    H_pre  = sigmoid(b_pre + s_pre * xn W_pre)                (n)      read weights, in (0, 1)
    H_res  = Sinkhorn(B_res + s_res * xn W_res)               (n x n)  carry-over, doubly stochastic
    H_post = 2 * sigmoid(b_post + s_post * xn W_post)         (n)      write weights, in (0, 2)

Row i of each dynamic term is stream i's own ``xn_i W`` (``W_pre``: D, ``W_res``: D x n, ``W_post``: D).
``Sinkhorn(Z)``: ``M = exp(Z - max_i Z)``, then 20 times divide every column by its sum, then every row by its
sum; rows end summing to 1 exactly, columns to within the iteration's convergence.
Init: ``b_pre = e_(k mod n)``, ``B_res = I``, ``b_post = 1``, ``W_* = 0``, ``s_pre = s_res = s_post = 0.01``
(all learned). So at init ``H_pre = sigmoid(1) = 0.731`` on stream ``k mod n`` and ``0.5`` on the others,
``H_post = 2 sigmoid(1) = 1.462`` on every stream, and ``H_res`` is NOT the identity:
``Sinkhorn(I) = (e I + (J - I)) / (e + n - 1)``, 0.475 on the diagonal and 0.175 elsewhere for n = 4.

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

Cost (both forms): each normalization round is ``m / (m.sum(dim) + eps)`` (the reference's ``F.normalize(p=1)``
computes the same quotient for positive ``m`` through a norm kernel, a clamp and an expand, several times
slower at n x n), and the rounds run inside :class:`SinkhornRounds`, which keeps only the rounds' input for
backward and recomputes the rounds there (Megatron-LM's ``SinkhornKnopp`` recomputes them too) instead of
autograd's 40 saved intermediates.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from models.schemes.base import NormScheme, Site, register
from models.schemes.hyper import Pending, StreamConnections, at_least_float32, autocast_off, read, write_and_carry

SINKHORN_ITERS = 20  # mHCv2.py's sinkhorn_iters; DeepSeek-V4's and Megatron-LM's hc_sinkhorn_iters
HC_EPS = 1e-6  # DeepSeek-V4's hc_eps (the Sinkhorn's and H_pre's eps)
HC_NORM_EPS = 1e-6  # DeepSeek-V4's norm_eps of the RMS rescale; Megatron-LM's norm_eps
GATING_INIT = 0.01  # Megatron-LM's mhc_init_gating_factor: a_pre, a_post, a_res at init
MHC_VARIANTS = ("paper", "mhcv2")


def _normalize(m: Tensor, dim: int, eps: float) -> tuple[Tensor, Tensor]:
    """``(m / s, s)`` with ``s = m.sum(dim) + eps`` (no eps term when ``eps == 0``: the same bits as without)."""
    s = m.sum(dim, keepdim=True)
    if eps:
        s = s + eps
    return m / s, s


class SinkhornRounds(torch.autograd.Function):
    """``m <- m / (m.sum(d) + eps)`` for each ``d`` of ``dims`` in turn; backward recomputes the rounds.

    Only the input is kept. Backward replays the rounds to get each round's output ``y`` and divisor ``s`` (the
    n x n intermediates live during backward only), then runs them back with the quotient rule of one round,
    ``dL/dm = (g - sum_d(g * y)) / s`` (``y = m / s``, ``s = sum_d m + eps``), in plain tensor ops, so
    ``torch.compile`` traces it.
    """

    @staticmethod
    def forward(ctx, m: Tensor, dims: tuple[int, ...], eps: float) -> Tensor:
        ctx.save_for_backward(m)
        ctx.dims, ctx.eps = dims, eps
        for d in dims:
            m, _ = _normalize(m, d, eps)
        return m

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None]:
        (m,) = ctx.saved_tensors
        rounds = []
        for d in ctx.dims:
            m, s = _normalize(m, d, ctx.eps)
            rounds.append((m, s))
        for d, (y, s) in zip(reversed(ctx.dims), reversed(rounds), strict=True):
            grad = (grad - (grad * y).sum(d, keepdim=True)) / s
        return grad, None, None


def sinkhorn_knopp(logits: Tensor, iters: int = SINKHORN_ITERS) -> Tensor:
    """mHCv2's doubly stochastic matrix of ``exp(logits)`` over the last two dims, in float32.

    Column max subtracted first (the column normalization cancels it), then ``iters`` rounds of: each column
    divided by its sum, then each row. Returned in the dtype of ``logits``.
    """
    with autocast_off(logits):
        z = at_least_float32(logits)
        m = torch.exp(z - z.amax(dim=-2, keepdim=True).detach())  # (..., n, n), every entry in (0, 1]
        m = SinkhornRounds.apply(m, (-2, -1) * iters, 0.0)  # columns, then rows, iters times
    return m.to(logits.dtype)


def sinkhorn_eps(logits: Tensor, iters: int = SINKHORN_ITERS, eps: float = HC_EPS) -> Tensor:
    """DeepSeek-V4's ``hc_split_sinkhorn`` on the n x n logits (last two dims), in float32.

    ``softmax`` over each row, ``+ eps``; the columns divided by (their sum + eps); then ``iters - 1`` rounds of
    rows, then columns, each divided by (its sum + eps). Returned in the dtype of ``logits``.
    """
    with autocast_off(logits):
        m = torch.softmax(at_least_float32(logits), dim=-1) + eps
        m = SinkhornRounds.apply(m, (-2,) + (-1, -2) * (iters - 1), eps)
    return m.to(logits.dtype)


@register(NormScheme.MHC)
class ManifoldHyperConnections(StreamConnections):
    """mHC with n = ``mhc_streams`` streams; ``mhc_variant`` picks the form (module docstring).

    Building this class builds the variant's class (:class:`PaperMHC` or :class:`MHCv2`), both subclasses.
    """

    def __new__(cls, site: Site | None = None) -> ManifoldHyperConnections:
        if cls is ManifoldHyperConnections and site is not None:
            cls = VARIANTS[site.options.mhc_variant]
        return super().__new__(cls)


class PaperMHC(ManifoldHyperConnections):
    """The paper's mHC as DeepSeek-V4 runs it: one projection of the flattened streams (module docstring)."""

    def __init__(self, site: Site) -> None:
        n, d = site.options.mhc_streams, site.dim
        super().__init__(site, n)
        self.n = n
        self.norm_in = site.branch_norm()  # N(H_pre^T x)
        self.hc_fn = nn.Parameter(nn.init.xavier_uniform_(torch.empty(n * n + 2 * n, n * d)))  # Phi
        self.hc_base = nn.Parameter(torch.zeros(n * n + 2 * n))  # [b_pre | b_post | b_res]
        self.hc_scale = nn.Parameter(torch.full((3,), GATING_INIT))  # a_pre, a_post, a_res

    def prepare(self, x: Tensor) -> tuple[Tensor, Pending]:
        n = self.n
        with autocast_off(x):
            xf = at_least_float32(x)
            v = xf.flatten(-2)  # vec(x): (B, N, nD)
            f = v.dtype
            m = (v @ self.hc_fn.to(f).T) * torch.rsqrt(v.square().mean(-1, keepdim=True) + HC_NORM_EPS)
            a = self.hc_scale.to(f)
            a = torch.cat([a[0].expand(n), a[1].expand(n), a[2].expand(n * n)])  # a_pre, a_post, a_res per logit
            z = m * a + self.hc_base.to(f)  # (B, N, n^2 + 2n): [pre | post | res]
            h_pre = torch.sigmoid(z[..., :n]) + HC_EPS  # H_pre: (B, N, n)
            h_post = 2 * torch.sigmoid(z[..., n : 2 * n])  # H_post: (B, N, n)
            h_res = sinkhorn_eps(z[..., 2 * n :].unflatten(-1, (n, n)))  # H_res: (B, N, n, n)
            h_in = read(h_pre, xf).to(x.dtype)  # H_pre^T x: (B, N, D)
        return self.norm_in(h_in), Pending(x, h_res, h_post)

    def update(self, pending: Pending, out: Tensor) -> Tensor:
        return write_and_carry(pending, out)  # H_post o + H_res^T x


class MHCv2(ManifoldHyperConnections):
    """lucidrains' mHCv2: each stream normalized and projected on its own (module docstring)."""

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
        return write_and_carry(pending, out)  # H_post o + H_res^T x


VARIANTS: dict[str, type[ManifoldHyperConnections]] = {"paper": PaperMHC, "mhcv2": MHCv2}
assert tuple(VARIANTS) == MHC_VARIANTS
