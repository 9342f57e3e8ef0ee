"""Normalization layers by name: ``layernorm`` | ``rmsnorm`` | ``dyt`` | ``derf`` (timm-style string-or-class factory).

``rmsnorm`` is :class:`RMSNorm`: ``nn.RMSNorm`` with the same parameters and forward bits, whose CPU
float backward keeps only its input and the per-row ``1 / rms`` (as LayerNorm's fused kernel does). Torch's
CPU ``rms_norm`` is composite: autograd keeps the input, the normalized copy and every intermediate, and
runs about fifteen element-wise passes in backward, which made each RMSNorm ~5x the cost of a LayerNorm.

``dyt`` is :class:`DyT`, Dynamic Tanh: an element-wise ``weight * tanh(alpha * x) + bias`` that takes a norm's
place without normalizing anything (no mean, no variance, no epsilon). ``derf`` is :class:`Derf`, Dynamic erf, its
successor: ``weight * erf(alpha * x + s) + bias`` with a learned scalar shift ``s`` as well.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable


class NormLayer(StrEnum):
    """The closed set of normalization layers a trunk can be built with."""

    LAYERNORM = "layernorm"
    RMSNORM = "rmsnorm"
    DYT = "dyt"
    DERF = "derf"


class _RMSNormFunction(torch.autograd.Function):
    """``x * rsqrt(mean(x^2) + eps) * w`` over the last dimension; saves ``x`` and ``rstd`` only.

    The forward is the op sequence of ATen's CPU ``rms_norm`` (bit-identical, checked by the tests);
    the backward is the closed form ``dx = rstd * (a - x_hat * mean(a * x_hat))``, ``a = dy * w``.
    """

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor | None, eps: float) -> Tensor:
        rstd = torch.rsqrt((x * x).mean(-1, keepdim=True) + eps)  # (..., 1)
        y = x * rstd
        if weight is not None:
            y.mul_(weight)  # in place: one fresh tensor per norm, not two
        ctx.save_for_backward(x, rstd, weight)
        return y

    @staticmethod
    @once_differentiable  # in-place scratch buffers; nothing in the suite takes second derivatives
    def backward(ctx, dy: Tensor) -> tuple[Tensor | None, Tensor | None, None]:
        x, rstd, weight = ctx.saved_tensors
        x_hat = x * rstd
        product = dy * x_hat  # scratch: dy * x_hat for the weight gradient, then a * x_hat
        dw = product.flatten(0, -2).sum(0) if weight is not None and ctx.needs_input_grad[1] else None
        if not ctx.needs_input_grad[0]:
            return None, dw, None
        a = dy * weight if weight is not None else dy.clone()
        torch.mul(a, x_hat, out=product)
        dot = product.mean(-1, keepdim=True)  # (..., 1)
        return a.sub_(x_hat.mul_(dot)).mul_(rstd), dw, None


class RMSNorm(nn.RMSNorm):
    """``nn.RMSNorm`` (same parameters, state dict and forward bits) with a lean CPU backward.

    The lean path runs for float32/float64 CPU inputs over one normalized dimension outside autocast and
    ``torch.compile`` (inductor fuses the composite itself); everything else is ``nn.RMSNorm``'s.
    """

    def forward(self, x: Tensor) -> Tensor:
        lean = (
            x.device.type == "cpu"
            and x.dtype in (torch.float32, torch.float64)
            and len(self.normalized_shape) == 1
            and self.eps is not None
            and not torch.is_autocast_enabled("cpu")
            and not torch.compiler.is_compiling()
        )
        if not lean:
            return F.rms_norm(x, self.normalized_shape, self.weight, self.eps)
        return _RMSNormFunction.apply(x, self.weight, self.eps)


#: DyT's ``alpha_init_value`` in the reference code (``dynamic_tanh.py``).
DYT_ALPHA_INIT = 0.5


@dataclass(frozen=True)
class DyTInit:
    """How one point-wise layer (DyT, Derf) starts: alpha's value and whether it has a per-channel shift (read only
    when the layer is DyT or Derf)."""

    alpha: float = DYT_ALPHA_INIT
    bias: bool = True


class DyT(nn.Module):
    """Dynamic Tanh (Zhu et al., "Transformers without Normalization", CVPR 2025)::

        DyT(x) = weight * tanh(alpha * x) + bias        alpha: one learnable scalar; weight, bias: (D,)

    The reference ``DynamicTanh`` (jiachenzhu/DyT, ``dynamic_tanh.py``): alpha starts at ``alpha_init_value`` 0.5,
    weight at 1, bias at 0; its DiT port's non-affine form (for adaLN) is ``tanh(alpha * x)`` with alpha still
    learnable; its LLaMA port's form (it replaces RMSNorm, which has no shift) is ``weight * tanh(alpha * x)``.
    The same parameter names as the reference, so its state dicts load.

    Args:
        dim: width D of the last dimension.
        eps: ignored (DyT has no epsilon); accepted so every norm layer builds with the same call.
        elementwise_affine: weight (and bias); without, ``tanh(alpha * x)``.
        bias: the shift; False gives the LLaMA port's ``weight * tanh(alpha * x)``.
        alpha_init: alpha's initial value.
    """

    def __init__(
        self,
        dim: int,
        eps: float | None = None,
        elementwise_affine: bool = True,
        bias: bool = True,
        alpha_init: float = DYT_ALPHA_INIT,
    ) -> None:
        super().__init__()
        self.normalized_shape = (dim,)
        self.alpha_init = alpha_init
        self.alpha = nn.Parameter(torch.full((1,), float(alpha_init)))
        self.weight = nn.Parameter(torch.ones(dim)) if elementwise_affine else None
        self.bias = nn.Parameter(torch.zeros(dim)) if elementwise_affine and bias else None

    def forward(self, x: Tensor) -> Tensor:
        y = torch.tanh(self.alpha * x)
        if self.weight is not None:
            y = y * self.weight
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return f"{self.normalized_shape[0]}, alpha_init={self.alpha_init}, affine={self.weight is not None}"


class Derf(nn.Module):
    """Dynamic erf (Chen, Lu, Zhu, Sun, Liu, "Stronger Normalization-Free Transformers", arXiv 2512.10938)::

        Derf(x) = weight * erf(alpha * x + s) + bias       alpha, s: one learnable scalar each; weight, bias: (D,)

    The reference ``Dynamic_erf`` (zlab-princeton/Derf at 8dd9ea3, ``DiT/dynamic_erf.py``, ``ViT/dynamic_erf.py``
    and the nanoGPT patch ``language model/model_derf.patch``): alpha starts at ``alpha_init_value`` (0.5 in the
    ViT and DiT ports, 1.0 in the DiT-XL runs and the GPT-2 port), the shift at ``shift_init_value`` 0, weight at 1,
    bias at 0; the DiT port's non-affine form (for adaLN) is ``erf(alpha * x + s)``, alpha and s still learned.
    The same parameter names as the reference, so its state dicts load. ``bias=False`` drops the per-channel
    bias (never the scalar shift), for the RMSNorm-style ports.

    Args:
        dim: width D of the last dimension.
        eps: ignored (Derf has no epsilon); accepted so every norm layer builds with the same call.
        elementwise_affine: weight (and bias); without, ``erf(alpha * x + s)``.
        bias: the per-channel bias.
        alpha_init: alpha's initial value.
        shift_init: s's initial value.
    """

    def __init__(
        self,
        dim: int,
        eps: float | None = None,
        elementwise_affine: bool = True,
        bias: bool = True,
        alpha_init: float = DYT_ALPHA_INIT,
        shift_init: float = 0.0,
    ) -> None:
        super().__init__()
        self.normalized_shape = (dim,)
        self.alpha_init, self.shift_init = alpha_init, shift_init
        self.alpha = nn.Parameter(torch.full((1,), float(alpha_init)))
        self.shift = nn.Parameter(torch.full((1,), float(shift_init)))
        self.weight = nn.Parameter(torch.ones(dim)) if elementwise_affine else None
        self.bias = nn.Parameter(torch.zeros(dim)) if elementwise_affine and bias else None

    def forward(self, x: Tensor) -> Tensor:
        y = torch.erf(self.alpha * x + self.shift)
        if self.weight is not None:
            y = y * self.weight
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return (
            f"{self.normalized_shape[0]}, alpha_init={self.alpha_init}, shift_init={self.shift_init}, "
            f"affine={self.weight is not None}"
        )


#: The point-wise layers that take a norm's place: a scalar alpha, no statistics (``DyTInit`` sets both).
POINTWISE = (DyT, Derf)

_NORM_CLASSES: dict[NormLayer, type[nn.Module]] = {
    NormLayer.LAYERNORM: nn.LayerNorm,
    NormLayer.RMSNORM: RMSNorm,
    NormLayer.DYT: DyT,
    NormLayer.DERF: Derf,
}

NormFactory = Callable[..., nn.Module]


def get_norm_layer(norm: str | type[nn.Module] | functools.partial) -> NormFactory:
    """Resolves ``"layernorm"``/``"rmsnorm"``/``"dyt"``, a class, or a partial into a factory ``f(dim, eps=, ...)``.

    Raises:
        ValueError: for an unknown name, listing the valid ones.
    """
    if isinstance(norm, str):
        try:
            return _NORM_CLASSES[NormLayer(norm.lower())]
        except ValueError:
            valid = ", ".join(n.value for n in NormLayer)
            raise ValueError(f"unknown norm_layer {norm!r}; valid: {valid}") from None
    if isinstance(norm, (functools.partial, type)):
        return norm
    raise TypeError(f"norm_layer must be a name, a class or a partial, got {type(norm).__name__}")


def build_norm(
    norm: str | type[nn.Module] | functools.partial,
    dim: int,
    eps: float,
    affine: bool = True,
    dyt: DyTInit = DyTInit(),
) -> nn.Module:
    """One fresh norm instance over the last dimension (``affine=False`` drops weight and bias; ``dyt`` is read
    only when the layer is :class:`DyT` or :class:`Derf`)."""
    factory = get_norm_layer(norm)
    if factory in POINTWISE:
        return factory(dim, elementwise_affine=affine, bias=dyt.bias, alpha_init=dyt.alpha)
    return factory(dim, eps=eps, elementwise_affine=affine)
