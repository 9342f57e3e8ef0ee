"""Normalization layers by name: ``layernorm`` | ``rmsnorm`` (timm-style string-or-class factory)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from enum import StrEnum

from torch import nn


class NormLayer(StrEnum):
    """The closed set of normalization layers a trunk can be built with."""

    LAYERNORM = "layernorm"
    RMSNORM = "rmsnorm"


_NORM_CLASSES: dict[NormLayer, type[nn.Module]] = {
    NormLayer.LAYERNORM: nn.LayerNorm,
    NormLayer.RMSNORM: nn.RMSNorm,
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
    factory = get_norm_layer(norm)
    if factory is nn.LayerNorm:
        return nn.LayerNorm(dim, eps=eps, elementwise_affine=affine)
    if factory is nn.RMSNorm:
        return nn.RMSNorm(dim, eps=eps, elementwise_affine=affine)
    return factory(dim, eps=eps, elementwise_affine=affine)
