"""Single-stream schemes: Pre-, Post-, Peri-Norm, DeepNorm, Mix-LN, HybridNorm, LayerNorm Scaling, OLMo 2's
reordered norm and Keel.

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


@register(NormScheme.LNS)
class LayerNormScaling(PreNorm):
    """LayerNorm Scaling (Sun et al., "The Curse of Depth in Large Language Models", 2025):
    Pre-Norm whose branch-input norm output is scaled down with depth::

        x = x + F(N(x) / sqrt(b + 1))          readout N_f(x) (unscaled)

    The factor is per block, 1-based: both sublayers of block ``b`` (0-based) use ``1 / sqrt(b + 1)``, so the
    first block is unscaled. That is the authors' first upload (lmsdss/LayerNorm-Scaling, commit 5d4dd11,
    ``peft_pretraining/modeling_llama.py``, ``LlamaDecoderLayer.forward``, the branch then named ``cod``:
    ``scale_factor = 1 / math.sqrt(self.layer_index + 1)`` after ``input_layernorm`` and after
    ``post_attention_layernorm``, ``layer_index`` the 0-based decoder-layer index; the final ``LlamaModel.norm``
    is not scaled) and OLMo-core's ``LayerNormScaledTransformerBlock`` (``ln_scale = 1 / sqrt(block_idx + 1)``
    on ``attention_norm(x)`` and ``feed_forward_norm(h)``). The repository's HEAD lower-cases ``NORM_TYPE`` and
    then compares it with ``'LNS'``, so no branch of it runs; the first upload is the code that ran.

    Init: the authors' ``LNS`` path draws every Linear from the plain normal(``initializer_range``) and warn that
    a depth-scaled output init (GPT-2's / OLMo's, ``scaled_output_init``) diminishes the effect;
    ``configs/norm/lns.yaml`` therefore turns ``scaled_output_init`` off (docs/schemes.md).
    Under adaLN the non-affine norm's output is scaled, then modulated.
    """

    def __init__(self, site: Site) -> None:
        super().__init__(site)
        self.scale = 1.0 / math.sqrt(site.block + 1)  # a Python float: the multiply keeps nothing for backward

    def prepare(self, x: Tensor) -> tuple[Tensor, Tensor]:
        return self.norm(x) * self.scale, x


@register(NormScheme.REORDERED)
class ReorderedNorm(Scheme):
    """OLMo 2's reordered norm (OLMo et al., "2 OLMo 2 Furious", 2024): the norm on the branch OUTPUT only::

        x = x + N(F(x))                         readout N_f(x)

    No branch-input norm: F reads the raw residual (adaLN's non-affine norm is added in DiT). OLMo-core's
    ``ReorderedNormTransformerBlock`` (``attention_norm(attention(x))``, ``feed_forward_norm(feed_forward(h))``)
    and transformers' ``Olmo2DecoderLayer`` (``post_attention_layernorm``, ``post_feedforward_layernorm``; the
    model's final ``norm``). Not Peri-LN: ``peri`` normalizes the branch input as well (docs/schemes.md).
    OLMo 2 pairs it with QK-norm over the whole projection: ``qk_norm: true`` with ``qk_norm_scope: full``.
    """

    readout = FinalNorm

    def __init__(self, site: Site) -> None:
        super().__init__(site)
        self.cond_norm = site.cond_norm()
        self.norm = site.norm()

    def prepare(self, x: Tensor) -> tuple[Tensor, Tensor]:
        return self.cond_norm(x), x

    def update(self, x: Tensor, out: Tensor) -> Tensor:
        return x + self.norm(out)


@register(NormScheme.KEEL)
class Keel(Scheme):
    """Keel (Chen & Wei, ByteDance Seed, "Post-LayerNorm Is Back: Stable, ExpressivE, and Deep", arXiv 2601.19895):
    Post-Norm whose skip path is scaled Highway-style and whose branch reads a normalized input::

        x = N_1(alpha * x + F(N_2(x))),    alpha = L = 2 * depth (the number of sublayers)     readout x

    No public code: implemented from the paper's equation, ``x_{l+1} = LN_1(alpha x_l + F(LN_2(x_l)))`` with
    ``alpha = L``, L the number of sub-layers as its summaries state it (a fixed scalar, no special init). The
    difference from DeepNorm is the branch-input norm ``N_2`` and ``alpha`` growing as L, not ``(2L)^(1/4)``,
    with no down-scaled init. Under adaLN ``N_2`` is the non-affine norm that is modulated.
    """

    readout = PassThrough

    def __init__(self, site: Site) -> None:
        super().__init__(site)
        self.alpha = float(2 * site.depth)
        self.norm_in = site.branch_norm()  # N_2
        self.norm = site.norm()  # N_1

    def prepare(self, x: Tensor) -> tuple[Tensor, Tensor]:
        return self.norm_in(x), x

    def update(self, x: Tensor, out: Tensor) -> Tensor:
        return self.norm(self.alpha * x + out)
