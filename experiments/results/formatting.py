"""How the comparison's numbers are written: a value to 4 significant digits, ``mean ± CI (n = k)`` with as many
digits as its interval supports, a p-value, an amount to two significant digits.

Below every table module (:mod:`experiments.results.tables`, :mod:`experiments.results.speed`) and the plots, so
that each writes a number the same way.
"""

from __future__ import annotations

import math

from experiments.results.stats import Estimate


def fmt(value) -> str:
    """A table value: 4 significant digits, thousands separators for large integers, ``-`` for none."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}" if math.isfinite(value) else str(value)
    if isinstance(value, int) and not isinstance(value, bool) and value > 10000:
        return f"{value:,}"
    return str(value)


def decimals(half_width: float) -> int:
    """Decimals that show two significant digits of the interval's half-width."""
    if half_width <= 0 or not math.isfinite(half_width):
        return 4
    return min(8, max(0, 1 - math.floor(math.log10(half_width))))


def fmt_estimate(e: Estimate | None, signed: bool = False) -> str:
    """``mean ± half-width (n = k)``; one replicate: ``value (n = 1)``; none: ``-``."""
    if e is None:
        return "-"
    sign = "+" if signed else ""
    if e.half_width is None:
        return f"{e.mean:{sign}.4g} (n = 1)"
    d = decimals(e.half_width)
    if e.half_width == 0:  # identical replicates: their value, and a zero-width interval
        return f"{e.mean:{sign}.4g} ± 0 (n = {e.n})"
    return f"{e.mean:{sign}.{d}f} ± {e.half_width:.{d}f} (n = {e.n})"


def fmt_p(p: float | None) -> str:
    if p is None:
        return "-"
    return "< 0.001" if p < 0.001 else f"{p:.2g}"


def fmt_amount(value: float) -> str:
    """A positive amount to two significant digits (``0.19``, ``12``, ``140``): a detectable difference."""
    return f"{value:.0f}" if value >= 100 else f"{value:#.2g}".rstrip(".")
