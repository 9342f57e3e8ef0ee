"""Norm schemes: one registered class per normalization placement (equations: docs/schemes.md)."""

from models.schemes import attn_res, hyper, mhc, single_stream, two_stream  # noqa: F401  (registers every scheme)
from models.schemes.base import (
    SCHEMES,
    DepthSources,
    DualStream,
    HybridDual,
    NormScheme,
    Readout,
    Scheme,
    SchemeOptions,
    Site,
    State,
    TwoStream,
    get_scheme,
    register,
)

__all__ = [
    "SCHEMES",
    "DepthSources",
    "DualStream",
    "HybridDual",
    "NormScheme",
    "Readout",
    "Scheme",
    "SchemeOptions",
    "Site",
    "State",
    "TwoStream",
    "get_scheme",
    "register",
]
