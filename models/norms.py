"""Normalization layers by name: ``layernorm`` | ``rmsnorm`` (timm-style string-or-class factory).

``rmsnorm`` is :class:`RMSNorm`: ``nn.RMSNorm`` with the same parameters and forward bits, whose CPU
float backward keeps only its input and the per-row ``1 / rms`` (as LayerNorm's fused kernel does). Torch's
CPU ``rms_norm`` is composite: autograd keeps the input, the normalized copy and every intermediate, and
runs about fifteen element-wise passes in backward, which made each RMSNorm ~5x the cost of a LayerNorm.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from enum import StrEnum

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable


class NormLayer(StrEnum):
    """The closed set of normalization layers a trunk can be built with."""

    LAYERNORM = "layernorm"
    RMSNORM = "rmsnorm"


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


_NORM_CLASSES: dict[NormLayer, type[nn.Module]] = {
    NormLayer.LAYERNORM: nn.LayerNorm,
    NormLayer.RMSNORM: RMSNorm,
}

NormFactory = Callable[..., nn.Module]


def get_norm_layer(norm: str | type[nn.Module] | functools.partial) -> NormFactory:
    """Resolves ``"layernorm"``/``"rmsnorm"``, a class, or a partial into a factory ``f(dim, eps=, ...)``.

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


def build_norm(norm: str | type[nn.Module] | functools.partial, dim: int, eps: float, affine: bool = True) -> nn.Module:
    """One fresh norm instance over the last dimension (``affine=False`` drops weight and bias)."""
    return get_norm_layer(norm)(dim, eps=eps, elementwise_affine=affine)
