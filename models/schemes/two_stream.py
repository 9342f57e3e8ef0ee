"""Two-stream schemes: ResiDual (with a Post-LN or a HybridNorm main stream), SiameseNorm and SiameseNorm
with a HybridNorm X stream.

SiameseNorm (arXiv 2602.08064) keeps a Post-Norm-like stream X and a Pre-Norm-like stream Y.
Every sublayer reads both through ONE shared branch and writes its output to both::

          x ──N_X──┬──────────────────────(+ o/c)──▶ x'
                   │                        ▲
                   └─(+)── N_in ── F ── o ──┤
                     ▲                      ▼
          y ──┬─N_Y──┘                     (+ o)
              └─────────────────────────────┴─────▶ y'

    readout:  N_o(N_a(x) + N_b(y))
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from models.schemes.base import DualStream, HybridDual, NormScheme, Scheme, Site, TwoStream, register
from models.schemes.readouts import HybridDualReadout, ResiDualReadout, SiameseFusion


@register(NormScheme.RESI_DUAL)
class ResiDual(Scheme):
    """ResiDual (Xie et al., 2023): a Post-LN stream plus an un-normalized sum of branch outputs.

    ``o = F(x);  x = N(x + o);  d = d + o``; both streams start from the embedding;
    readout ``x + N_d(d)``.
    """

    readout = ResiDualReadout
    prologue_reads = ("post",)

    def __init__(self, site: Site) -> None:
        super().__init__(site)
        self.cond_norm = site.cond_norm()
        self.norm = site.norm()

    @staticmethod
    def init_state(h: Tensor) -> DualStream:
        return DualStream(post=h, delta=h)

    def prepare(self, state: DualStream) -> tuple[Tensor, DualStream]:
        return self.cond_norm(state.post), state

    def update(self, state: DualStream, out: Tensor) -> DualStream:
        return DualStream(post=self.norm(state.post + out), delta=state.delta + out)


@register(NormScheme.RESI_DUAL_HYBRID)
class ResiDualHybrid(Scheme):
    """ResiDual's topology with a HybridNorm main stream (paper Table 3: the second stream alone is not
    what makes SiameseNorm work).

    attention: ``o = Attn(x);         x = x + o;  d = d + o``   (QKV-norm attention)
    MLP:       ``u = N(x);  o = F(u);  x = u + o;  d = d + o``
    readout:   ``N_x(x) + N_d(d)``; both streams start from the embedding.
    """

    readout = HybridDualReadout
    qkv_norm = True
    prologue_reads = ("hybrid",)

    def __init__(self, site: Site) -> None:
        super().__init__(site)
        self.is_attn = site.kind == "attn"
        self.cond_norm = site.cond_norm()
        if not self.is_attn:
            self.norm = site.norm()

    @staticmethod
    def init_state(h: Tensor) -> HybridDual:
        return HybridDual(hybrid=h, delta=h)

    def prepare(self, state: HybridDual) -> tuple[Tensor, HybridDual]:
        if self.is_attn:
            return self.cond_norm(state.hybrid), state
        u = self.norm(state.hybrid)
        return self.cond_norm(u), HybridDual(hybrid=u, delta=state.delta)

    def update(self, state: HybridDual, out: Tensor) -> HybridDual:
        return HybridDual(hybrid=state.hybrid + out, delta=state.delta + out)


@register(NormScheme.SIAMESE)
class SiameseNorm(Scheme):
    """SiameseNorm, official DeiT/DiT form (diagram in the module docstring).

    ``x = N_X(x);  o = F(N_in(x + N_Y(y)));  x = x + o / c;  y = y + o``
    with ``c = sqrt(2 (b + 1))`` (1 without ``depth_scaling``) and ``N_in`` dropped without
    ``input_norm`` (paper Table 3). Both streams start from the embedding.
    """

    readout = SiameseFusion

    def __init__(self, site: Site) -> None:
        super().__init__(site)
        opts = site.options
        self.c = site.depth_scale if opts.depth_scaling else 1.0
        self.norm_x = site.norm()
        self.norm_y = site.norm()
        self.norm_in = site.branch_norm() if opts.input_norm else site.cond_norm()
        self.recompute_wins = True  # N_X, N_Y and N_in keep post, pre and x + N_Y(y): only post and pre are needed

    @staticmethod
    def init_state(h: Tensor) -> TwoStream:
        return TwoStream(post=h, pre=h)

    def prepare(self, state: TwoStream) -> tuple[Tensor, TwoStream]:
        x = self.norm_x(state.post)  # post-norm of X, at the start of the sublayer
        return self.norm_in(x + self.norm_y(state.pre)), TwoStream(post=x, pre=state.pre)

    def update(self, state: TwoStream, out: Tensor) -> TwoStream:
        return TwoStream(post=state.post + out / self.c, pre=state.pre + out)


@register(NormScheme.SIAMESE_HYBRID)
class SiameseHybrid(SiameseNorm):
    """SiameseNorm with a HybridNorm X stream (the paper's language-model setting).

    attention: ``h = g * x + N_Y(y)`` (g learnable per channel, init 1), QKV-norm attention on h,
               then ``x = x + o / c;  y = y + o``
    MLP:       exactly :class:`SiameseNorm`.
    """

    qkv_norm = True

    def __init__(self, site: Site) -> None:
        super().__init__(site)
        self.is_attn = site.kind == "attn"
        if self.is_attn:
            del self.norm_x, self.norm_in
            self.gain = nn.Parameter(torch.ones(site.dim))
            self.cond_norm = site.cond_norm()
            self.recompute_wins = site.conditioned  # g x + N_Y(y) keeps only x, y and its result

    def prepare(self, state: TwoStream) -> tuple[Tensor, TwoStream]:
        if not self.is_attn:
            return super().prepare(state)
        return self.cond_norm(self.gain * state.post + self.norm_y(state.pre)), state
