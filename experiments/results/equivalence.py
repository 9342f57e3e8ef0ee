"""An answer when a difference is small: TOST equivalence at a declared margin, and what the pooled analysis
could detect (its power, the seeds an observed difference needs, the smallest difference its seeds detect).

Pure functions of numbers. The margin ``delta`` is per metric (:data:`MARGINS`, overridable per sweep):

    val/loss, test/loss   0.02 nats   about 2 % perplexity; the spread between seeds of one tiny-LM cell is
                                      0.005-0.02, and the placements the paper compares differ by 0.02-0.7
    val/ppl, test/ppl     0.15        0.02 nats at the tiny LM's perplexity (~7.5)
    test/acc1             0.005       0.5 points of top-1 (accuracies are fractions here)
    test/downstream/avg   0.005       0.5 points of the downstream average
    test/fid              1.0         one FID point: about the sampling spread of a 500-sample FID (0.6-1.1)

A metric without a margin gets no equivalence verdict (only better / worse / undecided).

TOST (two one-sided tests, Schuirmann 1987): the difference is "equivalent within ±delta" when both
``H0: diff <= -delta`` and ``H0: diff >= +delta`` are rejected, i.e. when ``max(p_lower, p_upper) < alpha``;
the t statistics use the estimate's standard error and degrees of freedom (the pooled block model's, or a
cell's own paired ones). Its p-value is that maximum (the same as statsmodels' ``ttost_paired`` /
``ttost_ind``).
"""

from __future__ import annotations

import math

from scipy import stats as scipy_stats
from scipy.optimize import brentq
from scipy.special import stdtr

from experiments.results.blockmodel import dunnett_critical

MARGINS = {"val/loss": 0.02, "test/loss": 0.02, "val/ppl": 0.15, "test/ppl": 0.15, "test/acc1": 0.005,
           "test/downstream/avg": 0.005, "test/fid": 1.0}  # fmt: skip
HIGHER_IS_BETTER = ("acc", "top1", "top5", "precision", "recall")  # a metric name's last part starts so
POWER = 0.8
MAX_SEEDS = 1000


def higher_is_better(metric: str) -> bool:
    """The metric's direction: accuracies (``test/acc1``, ``test/downstream/avg``), precision / recall and the
    Inception Score grow with quality; losses, perplexities and FID / KID shrink (the paper file's ``better``)."""
    name = metric.lower()
    last = name.rsplit("/", 1)[-1]
    return name.endswith("downstream/avg") or last == "is" or last.startswith(HIGHER_IS_BETTER)


def default_margin(metric: str) -> float | None:
    """The documented margin of a metric (None: no equivalence verdict)."""
    return MARGINS.get(metric)


def tost(estimate: float, se: float, df: float, margin: float) -> float | None:
    """p-value of TOST for ``|true difference| < margin``: the larger of the two one-sided p-values; None
    without a standard error (no spread) or degrees of freedom."""
    if not (se > 0 and math.isfinite(se)) or df <= 0 or not margin > 0:
        return None
    # stdtr(df, x): the t distribution's cdf, which scipy_stats.t.cdf / .sf call after their (slower) argument checks
    p_lower = float(stdtr(df, -(estimate + margin) / se))  # H0: diff <= -margin (t.sf)
    p_upper = float(stdtr(df, (estimate - margin) / se))  # H0: diff >= +margin (t.cdf)
    return max(p_lower, p_upper)


def power(ncp: float, df: float, critical: float) -> float:
    """P(|T| > critical) for T noncentral t with ``df`` degrees of freedom and noncentrality ``ncp`` (both tails)."""
    upper = float(scipy_stats.nct.sf(critical, df, abs(ncp)))
    lower = float(scipy_stats.nct.sf(critical, df, -abs(ncp)))
    return upper + (lower if math.isfinite(lower) else 0.0)


def detectable(se: float, df: float, critical: float, target: float = POWER) -> float:
    """The smallest true difference a test of standard error ``se`` rejects at ``critical`` with probability
    ``target`` (in the metric's units)."""
    high = 1.0
    while power(high, df, critical) < target:
        high *= 2
    return float(brentq(lambda ncp: power(ncp, df, critical) - target, 0.0, high, xtol=1e-10)) * se


def pooled_seeds_needed(difference: float, sigma: float, schemes: int, alpha: float, target: float = POWER,
                        max_seeds: int = MAX_SEEDS) -> int | None:  # fmt: skip
    """The seeds per cell at which the pooled analysis of ``schemes`` cells (the reference among them; every
    cell complete, so each contrast has standard error ``sigma * sqrt(2 / n)`` on ``(schemes - 1)(n - 1)``
    residual degrees of freedom) detects a true ``difference`` with probability ``target`` under Dunnett's
    critical value for ``schemes - 1`` contrasts at ``alpha``; None above ``max_seeds`` or for no difference.

    Raises:
        ValueError: for a residual SD that is not positive, or fewer than two schemes.
    """
    if not sigma > 0 or not math.isfinite(sigma) or schemes < 2:
        raise ValueError(f"needs a positive residual SD and two schemes, got sigma {sigma}, {schemes} schemes")
    m = schemes - 1

    def reaches(n: int) -> bool:
        df = (schemes - 1) * (n - 1)
        return power(abs(difference) / (sigma * math.sqrt(2 / n)), df, dunnett_critical(m, df, alpha)) >= target

    if difference == 0 or not reaches(max_seeds):
        return None
    # start at the normal approximation n = 2 ((c + z_power) sigma / difference)^2, then step to the exact answer
    z = dunnett_critical(m, math.inf, alpha) + float(scipy_stats.norm.ppf(target))
    n = min(max_seeds, max(2, math.ceil(2 * (z * sigma / difference) ** 2)))
    while n > 2 and reaches(n - 1):
        n -= 1
    while not reaches(n):
        n += 1
    return n
