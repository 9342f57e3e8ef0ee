"""Seed statistics of a sweep: the mean of replicates with its t-interval, and paired comparisons.

Pure functions of numbers (no runs, no files), so the tables and their tests rest on the same code.
scipy does the distributions and the tests; what is written here is only the handling of the cases a
sweep produces and scipy leaves undefined:

- one replicate: a value and ``n = 1``, never an interval (a standard deviation of one number does not exist);
- differences that are all equal (identical runs, or a deterministic offset): the t statistic is 0/0 or
  x/0, so the t-test is reported as p = 1 when the differences are all 0 and as undefined otherwise;
- few pairs: the exact sign-flip permutation test (every one of the 2^n sign patterns of the paired
  differences) is reported next to the t-test, since the t-test's normality assumption cannot be checked
  on three seeds. Its smallest attainable two-sided p-value is 2 / 2^n (0.25 for n = 3): with three
  seeds no difference, however large, is "significant" under it, and the tables say so;
- how much evidence a comparison had: the power of the two-sided paired t-test on the noncentral t
  distribution, the smallest difference ``n`` pairs detect with 80 % power at their paired standard deviation,
  and the seeds an observed difference would need for that power (:func:`sensitivity`); undefined, and said
  so, for one pair or differences without spread.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as scipy_stats
from scipy.optimize import brentq

CONFIDENCE = 0.95
CI_NAME = f"{CONFIDENCE * 100:.0f} % CI"  # how tables and plots name the interval
EXACT_SIGN_FLIP_MAX_N = 16  # 2^16 sign patterns; above that the test samples them (seeded, reproducible)
RANDOM_SIGN_FLIPS = 9999


@dataclass(frozen=True)
class Estimate:
    """The mean of ``n`` replicates and its two-sided t-interval.

    Attributes:
        n: number of replicates.
        mean: their mean.
        std: sample standard deviation (ddof = 1); None for n = 1.
        low, high: the confidence interval of the mean; None for n = 1.
        confidence: the interval's coverage (0.95).
    """

    n: int
    mean: float
    std: float | None
    low: float | None
    high: float | None
    confidence: float = CONFIDENCE

    @property
    def half_width(self) -> float | None:
        """Half the interval's width (the ``± x`` of ``mean ± x``); None without an interval."""
        return None if self.low is None or self.high is None else (self.high - self.low) / 2


def _is_constant(values: np.ndarray) -> bool:
    """All equal up to rounding: the standard deviation is 0, not the float noise of a cancellation."""
    scale = max(1.0, float(np.max(np.abs(values))))
    return float(np.ptp(values)) <= 1e-12 * scale


def estimate(values: Sequence[float], confidence: float = CONFIDENCE) -> Estimate | None:
    """Mean, standard deviation and t-interval of replicates (None for no values).

    The interval is ``mean ± t_{n-1} * std / sqrt(n)`` (scipy's ``t.interval``); with identical values
    it is the single point ``[mean, mean]``.
    """
    x = np.asarray([float(v) for v in values], dtype=np.float64)
    if x.size == 0:
        return None
    mean = float(x.mean())
    if x.size == 1:
        return Estimate(1, mean, None, None, None, confidence)
    if _is_constant(x):
        return Estimate(int(x.size), mean, 0.0, mean, mean, confidence)
    std = float(x.std(ddof=1))
    low, high = scipy_stats.t.interval(confidence, x.size - 1, loc=mean, scale=std / math.sqrt(x.size))
    return Estimate(int(x.size), mean, std, float(low), float(high), confidence)


def interval_bands(replicates: np.ndarray, confidence: float = CONFIDENCE) -> tuple[np.ndarray, ...]:
    """Mean and t-interval of each column of ``replicates`` (shape: replicates x points), e.g. a loss curve
    over seeds at every step; with one replicate the bounds are the curve itself (no band).

    Returns:
        ``(mean, low, high)``, each of shape (points,).
    """
    x = np.asarray(replicates, dtype=np.float64)
    mean = x.mean(axis=0)
    if x.shape[0] < 2:
        return mean, mean, mean
    half = scipy_stats.t.ppf(0.5 + confidence / 2, x.shape[0] - 1) * x.std(axis=0, ddof=1) / math.sqrt(x.shape[0])
    return mean, mean - half, mean + half


def sign_flip_p_value(differences: Sequence[float]) -> tuple[float, bool]:
    """Two-sided p-value of the sign-flip permutation test of "the differences are symmetric about 0".

    Returns:
        ``(p, exact)``: exact over all 2^n sign patterns up to ``EXACT_SIGN_FLIP_MAX_N`` pairs, else from
        ``RANDOM_SIGN_FLIPS`` seeded random patterns.
    """
    d = np.asarray(differences, dtype=np.float64)
    exact = d.size <= EXACT_SIGN_FLIP_MAX_N
    result = scipy_stats.permutation_test(
        (d,),
        lambda sample, axis: np.mean(sample, axis=axis),
        permutation_type="samples",  # one sample: the signs of its observations are flipped
        vectorized=True,
        n_resamples=np.inf if exact else RANDOM_SIGN_FLIPS,
        alternative="two-sided",
        rng=np.random.default_rng(0),
    )
    return float(result.pvalue), exact


def sign_flip_floor(n: int) -> float:
    """The smallest two-sided p-value the exact sign-flip test can give with ``n`` pairs: 2 / 2^n."""
    return min(1.0, 2.0 / 2**n)


@dataclass(frozen=True)
class PairedComparison:
    """A scheme against the baseline, seed by seed: the per-seed differences (scheme - baseline).

    Attributes:
        keys: the replicates (seeds) both sides have, in order.
        differences: scheme - baseline per key.
        difference: their mean with its t-interval.
        p_t: two-sided paired t-test p-value (scipy ``ttest_rel``); 1.0 when every difference is 0, None
            when n < 2 or the differences are equal but not 0 (t undefined).
        p_sign_flip: two-sided sign-flip permutation p-value (None when n < 2).
        sign_flip_exact: whether every sign pattern was enumerated.
    """

    keys: tuple
    differences: tuple[float, ...]
    difference: Estimate
    p_t: float | None
    p_sign_flip: float | None
    sign_flip_exact: bool = True

    @property
    def n(self) -> int:
        return len(self.keys)


def paired(values: Mapping, baseline: Mapping, confidence: float = CONFIDENCE) -> PairedComparison | None:
    """Pairs ``values`` with ``baseline`` by key (the seed) and tests their difference.

    Args:
        values: ``{seed: metric}`` of the scheme's replicates.
        baseline: ``{seed: metric}`` of the baseline's replicates.
        confidence: the interval's coverage.

    Returns:
        The comparison over the seeds both have (None when they share none).
    """
    keys = tuple(k for k in values if k in baseline)
    if not keys:
        return None
    x = np.asarray([float(values[k]) for k in keys], dtype=np.float64)
    y = np.asarray([float(baseline[k]) for k in keys], dtype=np.float64)
    d = x - y
    difference = estimate(d, confidence)
    if d.size < 2:
        return PairedComparison(keys, tuple(d.tolist()), difference, None, None)
    if _is_constant(d):  # scipy's t is 0/0 (nan) or x/0: say what the data say instead
        p_t = 1.0 if float(np.max(np.abs(d))) == 0.0 else None
    else:
        p_t = float(scipy_stats.ttest_rel(x, y).pvalue)
    p_flip, exact = sign_flip_p_value(d)
    return PairedComparison(keys, tuple(d.tolist()), difference, p_t, p_flip, exact)


##################################################################################
#                 How much evidence a paired comparison had (power)              #
##################################################################################

ALPHA = 0.05  # two-sided level of the paired t-test the sensitivity is stated for
POWER = 0.8  # the chance of reaching p < ALPHA that "detectable" and "seeds needed" ask for
MAX_SEEDS = 1000  # seeds_needed gives up above this: "more than 1000 seeds" is answer enough


def paired_t_power(effect: float, n: int, alpha: float = ALPHA) -> float:
    """Power of the two-sided paired t-test with ``n`` pairs at level ``alpha`` when the true mean difference is
    ``effect`` paired standard deviations: P(|T| > t_{1 - alpha/2, n-1}) for T noncentral t with ``n - 1``
    degrees of freedom and noncentrality ``effect * sqrt(n)`` (both tails counted).

    Raises:
        ValueError: for n < 2 (a t-test needs two pairs).
    """
    if n < 2:
        raise ValueError(f"a paired t-test needs at least 2 pairs, got n = {n}")
    df = n - 1
    critical = scipy_stats.t.ppf(1 - alpha / 2, df)
    noncentrality = abs(effect) * math.sqrt(n)
    upper = float(scipy_stats.nct.sf(critical, df, noncentrality))
    # the wrong-sign tail P(T < -critical) = P(-T > critical); scipy's cdf underflows to nan where it is ~0
    lower = float(scipy_stats.nct.sf(critical, df, -noncentrality))
    return upper + (lower if math.isfinite(lower) else 0.0)


def detectable_effect(n: int, alpha: float = ALPHA, power: float = POWER) -> float:
    """The smallest true mean difference, in paired standard deviations, that the two-sided paired t-test with
    ``n`` pairs detects (p < ``alpha``) with probability ``power``: solved exactly on the noncentral t
    distribution (:func:`paired_t_power`), not from the normal approximation.

    Raises:
        ValueError: for n < 2.
    """
    if n < 2:
        raise ValueError(f"a paired t-test needs at least 2 pairs, got n = {n}")
    if not alpha < power < 1:
        raise ValueError(f"power {power} must lie between alpha {alpha} and 1")
    high = 1.0
    while paired_t_power(high, n, alpha) < power:  # n = 2 needs about 11.5 standard deviations
        high *= 2
    return float(brentq(lambda e: paired_t_power(e, n, alpha) - power, 0.0, high, xtol=1e-12, rtol=1e-12))


def seeds_needed(difference: float, std: float, alpha: float = ALPHA, power: float = POWER,
                 max_seeds: int = MAX_SEEDS) -> int | None:  # fmt: skip
    """The smallest number of pairs (seeds) whose two-sided paired t-test reaches p < ``alpha`` with
    probability ``power`` if the true mean difference were ``difference`` with paired standard deviation
    ``std`` (the observed ones); None when more than ``max_seeds`` would be needed (or the difference is 0).

    Raises:
        ValueError: when ``std`` is not positive (no spread: the t-test is undefined, see :func:`paired`).
    """
    if not std > 0 or not math.isfinite(std):
        raise ValueError(f"the paired standard deviation must be positive and finite, got {std}")
    effect = abs(difference) / std
    if effect == 0 or paired_t_power(effect, max_seeds, alpha) < power:
        return None
    low, high = 1, 2  # power(low) < power <= power(high); power grows with n
    while paired_t_power(effect, high, alpha) < power:
        low, high = high, min(2 * high, max_seeds)
    while high - low > 1:
        mid = (low + high) // 2
        if paired_t_power(effect, mid, alpha) >= power:
            high = mid
        else:
            low = mid
    return high


@dataclass(frozen=True)
class Sensitivity:
    """What a paired comparison could have shown: its detectable difference and the seeds its difference needs.

    Attributes:
        n: pairs.
        std: their paired standard deviation (None below 2 pairs).
        detectable: the smallest true mean difference (in the metric's units) the two-sided paired t-test at
            ``alpha`` detects with probability ``power`` from ``n`` pairs of this spread; None when undefined.
        needed: the seeds the observed mean difference needs for that power at that spread; None when
            undefined or above ``MAX_SEEDS`` (``why`` says which).
        why: None, or why a number is missing: ``"one pair"``, ``"no spread"`` (every difference equal),
            ``"no difference"`` (mean 0), ``"more than 1000"``.
        alpha, power: the level and the power both numbers are stated for.
    """

    n: int
    std: float | None
    detectable: float | None
    needed: int | None
    why: str | None = None
    alpha: float = ALPHA
    power: float = POWER


def sensitivity(comparison: PairedComparison, alpha: float = ALPHA, power: float = POWER) -> Sensitivity:
    """:class:`Sensitivity` of a paired comparison, from its own differences."""
    n, d = comparison.n, comparison.difference
    if n < 2:
        return Sensitivity(n, None, None, None, "one pair", alpha, power)
    if not d.std:  # 0.0 (constant differences): a t-test of no spread is undefined
        return Sensitivity(n, 0.0, None, None, "no spread", alpha, power)
    detectable = detectable_effect(n, alpha, power) * d.std
    needed = seeds_needed(d.mean, d.std, alpha, power)
    why = None if needed is not None else "no difference" if d.mean == 0 else f"more than {MAX_SEEDS}"
    return Sensitivity(n, d.std, detectable, needed, why, alpha, power)
