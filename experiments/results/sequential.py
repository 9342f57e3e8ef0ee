"""Seeds added in stages without inflating false positives: Lan-DeMets alpha spending with the O'Brien-Fleming
form, for K looks at information fractions ``t_1 < ... < t_K = 1`` (a stage's seeds over the cap's).

The spending function says how much of the error ``alpha`` may be used up by information ``t``:

    two-sided:  alpha(t) = 2 - 2 Phi(z_{1 - alpha/2} / sqrt(t))
    one-sided:  alpha(t) = 1 - Phi(z_{1 - alpha} / sqrt(t))        (each of TOST's two tests)

Look k's boundary ``c_k`` is chosen so that the chance under the null of first crossing at look k equals
``alpha(t_k) - alpha(t_{k-1})``. The standardized statistics at the looks are those of one Brownian motion
(``Z_k = S(t_k) / sqrt(t_k)``, independent increments), so the crossing probabilities are computed by recursive
numerical integration of the density of ``S`` over the continuation region (Armitage, McPherson and Rowe 1969;
Simpson's rule on ``GRID`` points per look), not read from a table. At three equally spaced looks and alpha
0.05 (two-sided) the boundaries are 3.395, 2.407, 2.015, i.e. nominal two-sided p-values of 0.0007, 0.016,
0.044 (the first is ``alpha(1/3)`` itself; the test suite checks every look's crossing probability, and the
total 0.05, with scipy's multivariate normal). An early look needs overwhelming evidence, the last one almost
the fixed design's 0.05. The classical O'Brien-Fleming boundaries (a constant times ``sqrt(K / k)``, not a
spending function) give about 0.0005 / 0.014 / 0.045; spending differs in that the looks need not be planned
in advance or equally spaced.

A look's nominal level is used with the t statistics of the pooled analysis (:mod:`experiments.results.verdicts`):
the adjusted p-value of a difference is compared with the two-sided nominal level of the look, each one-sided
test of TOST with the one-sided one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache

import numpy as np
from scipy import stats as scipy_stats
from scipy.optimize import brentq

GRID = 801  # Simpson points per look (odd): crossing probabilities to about 1e-9
LIMIT = 9.0  # the one-sided continuation region is cut at -LIMIT standard deviations (P < 1e-18)


def spent(t: float, alpha: float, sides: int = 2) -> float:
    """The O'Brien-Fleming-type spending function: the error spent by information fraction ``t`` (0 < t <= 1)."""
    if not 0 < t <= 1:
        raise ValueError(f"information fraction {t}; valid: 0 < t <= 1")
    z = scipy_stats.norm.ppf(1 - alpha / sides)
    return float(sides * scipy_stats.norm.sf(z / math.sqrt(t)))


def _simpson_weights(n: int, h: float) -> np.ndarray:
    w = np.ones(n)
    w[1:-1:2], w[2:-1:2] = 4.0, 2.0
    return w * h / 3


def boundaries(fractions: Sequence[float], alpha: float, sides: int = 2) -> list[float]:
    """The z boundaries ``c_1 ... c_K`` of the looks (reject at look k when ``|Z_k| >= c_k``, or ``Z_k >= c_k``
    one-sided).

    Raises:
        ValueError: for fractions that are not increasing within (0, 1], or sides other than 1 and 2.
    """
    return list(_boundaries_cached(tuple(float(x) for x in fractions), float(alpha), int(sides)))


def _boundaries(fractions: tuple[float, ...], alpha: float, sides: int) -> tuple[float, ...]:
    """The recursion of :func:`boundaries` (cached: the tables ask for the same looks many times)."""
    t = [float(x) for x in fractions]
    if not t or any(not 0 < x <= 1 for x in t) or any(b <= a for a, b in zip(t, t[1:], strict=False)):
        raise ValueError(f"information fractions {t}; valid: increasing, within (0, 1]")
    if sides not in (1, 2):
        raise ValueError(f"sides {sides}; valid: 1 or 2")
    out: list[float] = []
    grid = weights = density = None  # the sub-density of S(t_{k-1}) on the continuation region
    previous = 0.0
    for k, tk in enumerate(t):
        target = spent(tk, alpha, sides) - (spent(t[k - 1], alpha, sides) if k else 0.0)
        root_t = math.sqrt(tk)
        if k == 0:
            c = float(scipy_stats.norm.isf(target / sides))
        else:
            step = math.sqrt(tk - previous)

            def crossing(c: float, grid=grid, weights=weights, density=density, step=step, root_t=root_t) -> float:
                upper = scipy_stats.norm.sf((c * root_t - grid) / step)
                lower = scipy_stats.norm.cdf((-c * root_t - grid) / step) if sides == 2 else 0.0
                return float(np.sum(weights * density * (upper + lower)))

            c = float(brentq(lambda c, target=target: crossing(c) - target, 0.0, 40.0, xtol=1e-12))
        out.append(c)
        low = -c * root_t if sides == 2 else -LIMIT * root_t
        new_grid = np.linspace(low, c * root_t, GRID)
        new_weights = _simpson_weights(GRID, (c * root_t - low) / (GRID - 1))
        if k == 0:
            density = scipy_stats.norm.pdf(new_grid / root_t) / root_t
        else:
            step = math.sqrt(tk - previous)
            kernel = scipy_stats.norm.pdf((new_grid[:, None] - grid[None, :]) / step) / step
            density = kernel @ (weights * density)
        grid, weights, previous = new_grid, new_weights, tk
    return tuple(out)


_boundaries_cached = lru_cache(maxsize=128)(_boundaries)  # around the plain function: mutation testing reaches it


def clear_caches() -> None:
    """Forget the cached boundaries."""
    _boundaries_cached.cache_clear()


def nominal_levels(fractions: Sequence[float], alpha: float, sides: int = 2) -> list[float]:
    """Each look's nominal p-value threshold: ``sides * (1 - Phi(c_k))``."""
    return [float(sides * scipy_stats.norm.sf(c)) for c in boundaries(fractions, alpha, sides)]


def look_thresholds(look: int, fractions: Sequence[float], alpha: float) -> tuple[float, float]:
    """``(difference, equivalence)`` levels of look ``look`` (1-based): the two-sided nominal level for the
    adjusted difference p-value, and the one-sided one for each of TOST's tests.

    Raises:
        ValueError: for a look outside 1 .. len(fractions).
    """
    if not 1 <= look <= len(fractions):
        raise ValueError(f"look {look}; valid: 1 to {len(fractions)}")
    return nominal_levels(fractions, alpha, 2)[look - 1], nominal_levels(fractions, alpha, 1)[look - 1]
