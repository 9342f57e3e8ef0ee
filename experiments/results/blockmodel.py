"""One noise estimate per sweep slice: the randomized-block model ``metric ~ scheme + seed`` and its
many-vs-one contrasts against a reference scheme, with the family-wise error controlled.

Pure functions of numbers (no runs, no files). A slice is the cells of a sweep that differ only in their
scheme (one learning rate, one option); its finished runs are the observations, each seed a block (the seed
fixes the initialisation and the data order, so runs of one seed share part of their noise). The model is
fitted by ordinary least squares on dummies (an intercept, one column per scheme but the reference, one per
seed but the first), so a cell that misses a seed is handled exactly: each contrast's standard error comes
from the residual variance pooled over every cell times its diagonal entry of ``(X'X)^-1``, and the
residual degrees of freedom are ``observations - schemes - seeds + 1``. With two schemes and complete
seeds the model is the paired t-test.

Multiplicity: **Dunnett's many-to-one test on the block model**, single step. Each contrast's adjusted
p-value is ``P(max_j |T_j| >= |t_i|)`` for ``T`` multivariate t with the residual degrees of freedom and the
contrasts' correlation from ``(X'X)^-1`` (0.5 between any two contrasts when the seeds are complete: they
share the reference's mean). Dunnett rather than Holm because the contrasts are positively correlated through
the shared reference: Holm (valid under any dependence) ignores that and at 20 contrasts needs about p <
0.0025 for the first step where Dunnett needs about p < 0.004 for every contrast, so Dunnett detects more
at the same family-wise error. scipy's ``stats.dunnett`` assumes independent groups (one-way layout); with
seeds as blocks the correlation and the degrees of freedom differ, so the multivariate t is evaluated here:
in closed form by a two-dimensional quadrature when the correlations are all equal (complete seeds), else by
scipy's ``multivariate_t.cdf`` (Genz's quasi-Monte Carlo, seeded: the same numbers every time, to about
1e-4).

The pooling assumes every cell has the same spread. :func:`spread_check` tests it (Brown-Forsythe: Levene's
test about the median) on the cells' paired differences to the reference; where it rejects, the caller falls
back to each cell's own paired t-test with :func:`holm` across the cells.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from numpy.polynomial.hermite_e import hermegauss
from numpy.polynomial.legendre import leggauss
from scipy import stats as scipy_stats
from scipy.optimize import brentq
from scipy.special import erf, stdtr  # stdtr(df, x): the t cdf that scipy.stats.t calls, without its per-call checks

QUADRATURE_POINTS = 96  # per axis of the equicorrelated integral: |error| about 2e-6
MVT_SEED = 12345  # the quasi-Monte Carlo of the unequal-correlation case: fixed, so tables are reproducible
EQUAL_CORRELATION_TOL = 1e-9


@dataclass(frozen=True)
class Contrast:
    """One scheme minus the reference in the block model.

    Attributes:
        scheme: the compared scheme.
        estimate: its effect minus the reference's (seed effects removed).
        se: the estimate's standard error (pooled residual SD x sqrt of its ``(X'X)^-1`` diagonal entry).
        df: the residual degrees of freedom.
        t: estimate / se (None without a residual spread or degrees of freedom).
        p: two-sided p-value of ``t`` on ``df`` degrees of freedom, unadjusted (None with ``t``).
        n: the scheme's observations (seeds) in the model.
    """

    scheme: str
    estimate: float
    se: float
    df: int
    t: float | None
    p: float | None
    n: int


@dataclass(frozen=True)
class BlockFit:
    """The fitted block model of one slice.

    Attributes:
        reference: the scheme every contrast is taken against.
        schemes: the compared schemes, in input order (the reference, and schemes with no observation or no
            seed linking them to the reference, left out).
        seeds: the blocks, in first-seen order.
        observations: how many runs entered.
        df: residual degrees of freedom (0: no spread estimate).
        sigma: the pooled residual standard deviation, sqrt(RSS / df); None for df = 0.
        contrasts: one per compared scheme.
        unscaled: ``(X'X)^-1`` restricted to the compared schemes' columns (the contrasts' covariance / sigma^2).
        dropped: schemes that could not be estimated (no observation, or no seed shared with the rest).
    """

    reference: str
    schemes: tuple[str, ...]
    seeds: tuple
    observations: int
    df: int
    sigma: float | None
    contrasts: tuple[Contrast, ...]
    unscaled: np.ndarray
    dropped: tuple[str, ...] = ()

    def correlation(self) -> np.ndarray:
        """The contrasts' correlation matrix."""
        d = np.sqrt(np.diag(self.unscaled))
        return self.unscaled / np.outer(d, d)


def _connected(data: Mapping[str, Mapping], reference: str) -> set[str]:
    """Schemes linked to the reference through shared seeds (the others' effects are not estimable)."""
    seen, frontier = {reference}, [reference]
    while frontier:
        seeds = set(data[frontier.pop()])
        for scheme, values in data.items():
            if scheme not in seen and seeds & set(values):
                seen.add(scheme)
                frontier.append(scheme)
    return seen


def fit_blocks(data: Mapping[str, Mapping], reference: str) -> BlockFit:
    """Fits ``metric ~ scheme + seed`` by least squares.

    Args:
        data: ``{scheme: {seed: value}}``, finished runs only (failed runs are left out by the caller).
        reference: the scheme the contrasts are taken against; it must have an observation.

    Raises:
        ValueError: when the reference has no observation.
    """
    data = {s: {k: float(v) for k, v in values.items()} for s, values in data.items() if values}
    if reference not in data:
        raise ValueError(f"the reference {reference!r} has no observation")
    linked = _connected(data, reference)
    dropped = tuple(s for s in data if s not in linked)
    schemes = tuple(s for s in data if s in linked and s != reference)
    seeds = tuple(dict.fromkeys(k for s in (reference, *schemes) for k in data[s]))
    rows, y = [], []
    for s in (reference, *schemes):
        for k, v in data[s].items():
            x = np.zeros(1 + len(schemes) + len(seeds) - 1)
            x[0] = 1.0
            if s != reference:
                x[1 + schemes.index(s)] = 1.0
            if seeds.index(k) > 0:
                x[len(schemes) + seeds.index(k)] = 1.0
            rows.append(x)
            y.append(v)
    X, y_arr = np.asarray(rows), np.asarray(y)
    xtx_inv = np.linalg.inv(X.T @ X)  # full rank: every scheme and seed linked to the reference
    beta = xtx_inv @ X.T @ y_arr
    residual = y_arr - X @ beta
    df = len(y_arr) - X.shape[1]
    rss = float(residual @ residual)
    scale = max(1.0, float(np.max(np.abs(y_arr))))
    sigma = None if df <= 0 else (0.0 if rss <= (1e-12 * scale) ** 2 * len(y_arr) else math.sqrt(rss / df))
    unscaled = xtx_inv[1 : 1 + len(schemes), 1 : 1 + len(schemes)]
    contrasts = []
    for i, s in enumerate(schemes):
        estimate = float(beta[1 + i])
        se = math.nan if sigma is None else sigma * math.sqrt(unscaled[i, i])
        t = p = None
        if sigma:
            t = estimate / se
            p = float(2 * stdtr(df, -abs(t)))  # = 2 scipy_stats.t.sf(|t|, df)
        contrasts.append(Contrast(s, estimate, se, df, t, p, len(data[s])))
    return BlockFit(reference, schemes, seeds, len(y_arr), df, sigma, tuple(contrasts), unscaled, dropped)


##################################################################################
#                    Dunnett: the maximum of correlated t statistics             #
##################################################################################


def equicorrelated_max_t_cdf(c, m: int, df: float, rho: float = 0.5):
    """``P(max_i |T_i| <= c)`` for ``m`` t statistics on ``df`` degrees of freedom whose normal parts have
    correlation ``rho`` (>= 0) with each other: Dunnett's integral over the shared normal part and the shared
    chi scale, by Gauss-Hermite x Gauss-Legendre quadrature. ``c`` may be an array (one integral per value)."""
    values = np.atleast_1d(np.asarray(c, dtype=np.float64))
    z, wz, s, wu = _nodes(float(df))
    z, wz = z[z > 0], 2 * wz[z > 0]  # the integrand is even in z and the Hermite nodes come in +- pairs: half the work
    # Phi((cs - a z) / b) - Phi((-cs - a z) / b) = (erf(x - y) + erf(x + y)) / 2 with x = cs / (b sqrt 2) and
    # y = a z / (b sqrt 2): erf is about twice as fast as ndtr, and values below 1e-15 (whose m-th power would be
    # a slow subnormal underflow) are set to 0; both change the integral by less than 1e-14
    if rho >= 1.0:  # perfectly correlated: max_i |T_i| = |T|, exactly (the quadrature below would divide by 0)
        out = 1.0 - 2.0 * stdtr(df, -values)
        out[values <= 0] = 0.0
        return float(out[0]) if np.ndim(c) == 0 else out
    k = 1.0 / math.sqrt(2.0 * (1.0 - rho))
    x = (values[:, None] * (k * s)[None, :])[:, :, None]
    y = (k * math.sqrt(rho)) * z
    inner = 0.5 * (erf(x - y) + erf(x + y))
    inner[inner < 1e-15] = 0.0
    out = np.clip(((inner**m) @ wz) @ wu, 0.0, 1.0)
    out[values <= 0] = 0.0
    return float(out[0]) if np.ndim(c) == 0 else out


def _quadrature(df: float) -> tuple[np.ndarray, ...]:
    """Quadrature nodes and weights: the shared normal part (Gauss-Hermite) and the chi scale ``sqrt(chi2_df /
    df)`` at Gauss-Legendre nodes of its probability (so the weights are the Legendre ones)."""
    z, wz = hermegauss(QUADRATURE_POINTS)
    u, wu = leggauss(QUADRATURE_POINTS)
    u, wu = (u + 1) / 2, wu / 2
    s = np.sqrt(scipy_stats.chi2.ppf(u, df) / df) if math.isfinite(df) else np.ones_like(u)
    return z, wz / math.sqrt(2 * math.pi), s, wu


_nodes = lru_cache(maxsize=2048)(_quadrature)  # cached around the plain function, so mutation testing reaches it


def dunnett_p_values(t_values: Sequence[float], corr: np.ndarray, df: float) -> list[float]:
    """Single-step Dunnett adjusted two-sided p-values: ``P(max_j |T_j| >= |t_i|)`` for each contrast, ``T``
    multivariate t with correlation ``corr`` and ``df`` degrees of freedom."""
    corr = np.asarray(corr, dtype=np.float64)
    c = np.abs(np.asarray(t_values, dtype=np.float64))
    m = corr.shape[0]
    if m == 1:
        return [float(p) for p in 2 * stdtr(df, -c)]  # = 2 scipy_stats.t.sf(c, df)
    off = corr[~np.eye(m, dtype=bool)]
    if np.ptp(off) <= EQUAL_CORRELATION_TOL and off[0] >= 0:
        return [float(1.0 - p) for p in equicorrelated_max_t_cdf(c, m, df, float(off[0]))]
    dist = scipy_stats.multivariate_t(shape=corr, df=df)
    inside = [dist.cdf(np.full(m, x), lower_limit=np.full(m, -x), random_state=MVT_SEED) for x in c]
    return [float(np.clip(1.0 - p, 0.0, 1.0)) for p in inside]


def dunnett_critical(m: int, df: float, alpha: float, rho: float = 0.5) -> float:
    """The two-sided critical value of ``m`` equicorrelated contrasts: ``P(max |T_i| <= c) = 1 - alpha``."""
    return _critical_cached(int(m), float(df), float(alpha), float(rho))


def _critical(m: int, df: float, alpha: float, rho: float) -> float:
    if m == 1:
        return float(scipy_stats.t.ppf(1 - alpha / 2, df))
    low = float(scipy_stats.t.ppf(1 - alpha / 2, df))  # one contrast's critical value <= Dunnett's
    high = float(scipy_stats.t.ppf(1 - alpha / (2 * m), df)) * 1.01  # >= Bonferroni's, which bounds Dunnett's
    return float(brentq(lambda c: equicorrelated_max_t_cdf(c, m, df, rho) - (1 - alpha), low, high, xtol=1e-9))


_critical_cached = lru_cache(maxsize=4096)(_critical)


def clear_caches() -> None:
    """Forget the cached quadrature nodes and critical values (tests start from nothing)."""
    _nodes.cache_clear()
    _critical_cached.cache_clear()


def holm(p_values: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjusted p-values (None stays None and does not count as a test)."""
    tested = sorted((p, i) for i, p in enumerate(p_values) if p is not None)
    out: list[float | None] = [None] * len(p_values)
    running, m = 0.0, len(tested)
    for rank, (p, i) in enumerate(tested):
        running = max(running, min(1.0, (m - rank) * p))
        out[i] = running
    return out


def spread_check(groups: Mapping[str, Sequence[float]]) -> float | None:
    """Brown-Forsythe p-value of "every group has the same spread" (scipy's ``levene`` about the median);
    None when it is undefined: fewer than two groups of two or more values, or no spread in any group."""
    samples = [np.asarray(v, dtype=np.float64) for v in groups.values() if len(v) >= 2]
    if len(samples) < 2 or all(np.ptp(x) == 0 for x in samples):
        return None
    p = float(scipy_stats.levene(*samples, center="median").pvalue)
    return p if math.isfinite(p) else None
