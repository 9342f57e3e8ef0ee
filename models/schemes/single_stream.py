"""Single-stream schemes: Pre-, Post-, Peri-Norm, DeepNorm, Mix-LN and HybridNorm.

Each class is one residual site; ``prepare`` returns (branch input, state) and ``update`` writes
the branch output ``o = F(branch input)`` back. Read the two methods as the equation.
"""

from __future__ import annotations

import math

from torch import Tensor

from models.schemes.base import NormScheme, Scheme, Site, register
from models.schemes.readouts import FinalNorm, PassThrough


@register(NormScheme.PRE)
class PreNorm(Scheme):
    """Pre-Norm (GPT-2, ViT):  ``x = x + F(N(x))``; readout ``N_f(x)``."""

    readout = FinalNorm

    def __init__(self, site: Site) -> None:
        super().__init__(site)
        self.norm = site.branch_norm()

    def prepare(self, x: Tensor) -> tuple[Tensor, Tensor]:
        return self.norm(x), x

    def update(self, x: Tensor, out: Tensor) -> Tensor:
        return x + out


@register(NormScheme.POST)
class PostNorm(Scheme):
    """Post-Norm (original Transformer):  ``x = N(x + F(x))``; readout ``x``."""

    readout = PassThrough

    def __init__(self, site: Site) -> None:
        super().__init__(site)
        self.cond_norm = site.cond_norm()
        self.norm = site.norm()

    def prepare(self, x: Tensor) -> tuple[Tensor, Tensor]:
        return self.cond_norm(x), x

    def update(self, x: Tensor, out: Tensor) -> Tensor:
        return self.norm(x + out)


@register(NormScheme.PERI)
class PeriNorm(Scheme):
    """Peri-LN / sandwich norm:  ``x = x + N_out(F(N_in(x)))``; readout ``N_f(x)``."""

    readout = FinalNorm

    def __init__(self, site: Site) -> None:
        super().__init__(site)
        self.norm_in = site.branch_norm()
        self.norm_out = site.norm()

    def prepare(self, x: Tensor) -> tuple[Tensor, Tensor]:
        return self.norm_in(x), x

    def update(self, x: Tensor, out: Tensor) -> Tensor:
        return x + self.norm_out(out)


@register(NormScheme.DEEPNORM)
class DeepNorm(Scheme):
    """DeepNet (Wang et al., 2022):  ``x = N(alpha * x + F(x))``, ``alpha = (2L)^(1/4)``.

    At init, value, attention-output and MLP weights are scaled by ``beta = (8L)^(-1/4)``
    (:meth:`branch_init_gain`, applied by the trunk's ``init_weights``). Readout ``x``.
    """

    readout = PassThrough

    def __init__(self, site: Site) -> None:
        super().__init__(site)
        self.alpha = (2 * site.depth) ** 0.25
        self.cond_norm = site.cond_norm()
        self.norm = site.norm()

    def prepare(self, x: Tensor) -> tuple[Tensor, Tensor]:
        return self.cond_norm(x), x

    def update(self, x: Tensor, out: Tensor) -> Tensor:
        return self.norm(self.alpha * x + out)

    @classmethod
    def branch_init_gain(cls, depth: int) -> float:
        return (8 * depth) ** -0.25


@register(NormScheme.MIXLN)
class MixLN(Scheme):
    """Mix-LN (Li et al., 2025): blocks ``b < floor(mix_ratio * L)`` are Post-Norm, the rest Pre-Norm.

    Readout ``N_f(x)``.
    """

    readout = FinalNorm

    def __init__(self, site: Site) -> None:
        super().__init__(site)
        is_post = site.block < math.floor(site.options.mix_ratio * site.depth)
        self.inner = PostNorm(site) if is_post else PreNorm(site)

    def prepare(self, x: Tensor) -> tuple[Tensor, Tensor]:
        return self.inner.prepare(x)

    def update(self, x: Tensor, out: Tensor) -> Tensor:
        return self.inner.update(x, out)


@register(NormScheme.HYBRID)
class HybridNorm(Scheme):
    """HybridNorm (Zhuo et al., 2025): QKV-norm attention, Post-Norm MLP.

    attention: ``x = x + Attn(x) / c``, with Q, K, V each normalized per head after projection
    MLP:       ``u = N(x);  x = u + F(u) / c``
    readout:   ``N_f(x)``

    ``c = 1``; with ``hybrid_depth_scaling`` (paper Table 3) ``c = sqrt(2 (b + 1))``, SiameseNorm's X-stream
    depth scaling on HybridNorm's single stream.
    """

    readout = FinalNorm
    qkv_norm = True

    def __init__(self, site: Site) -> None:
        super().__init__(site)
        self.is_attn = site.kind == "attn"
        self.c = site.depth_scale if site.options.hybrid_depth_scaling else 1.0
        self.cond_norm = site.cond_norm()
        if not self.is_attn:
            self.norm = site.norm()

    def prepare(self, x: Tensor) -> tuple[Tensor, Tensor]:
        if self.is_attn:
            return self.cond_norm(x), x
        u = self.norm(x)
        return self.cond_norm(u), u

    def update(self, x: Tensor, out: Tensor) -> Tensor:
        return x + out / self.c
