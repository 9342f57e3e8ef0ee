"""Group-sequential spending (checked look by look with scipy's multivariate normal), Wortsman et al.'s learning-rate
sensitivity and the effective-compute multiplier (hand-computed values), and the family-wise error of the verdicts
on simulated null sweeps (a fast version of ``python -m experiments.results.simulate``)."""

import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from experiments.results.compute import compute_multiplier, largest_stable_lr, lr_sensitivity, multiplier_interval
from experiments.results.sequential import boundaries, look_thresholds, nominal_levels, spent
from experiments.results.simulate import family_error, sequential_error
from experiments.results.verdicts import clear_caches


@pytest.fixture(autouse=True)
def _fresh_caches():
    """Every test computes its verdicts itself (a cached analysis would hide a change in the code)."""
    clear_caches()


FRACTIONS = [1 / 3, 2 / 3, 1.0]


def _correlation(t):
    t = np.asarray(t)
    return np.sqrt(np.minimum.outer(t, t) / np.maximum.outer(t, t))  # Brownian motion at the looks


def test_obrien_fleming_spending_function():
    z = scipy_stats.norm.ppf(0.975)
    assert spent(1.0, 0.05) == pytest.approx(0.05, rel=1e-12)
    assert spent(1 / 3, 0.05) == pytest.approx(2 * scipy_stats.norm.sf(z * math.sqrt(3)), rel=1e-12)
    assert spent(0.5, 0.05, sides=1) == pytest.approx(scipy_stats.norm.sf(scipy_stats.norm.ppf(0.95) * math.sqrt(2)))
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match=f"information fraction {bad}; valid: 0 < t <= 1"):
            spent(bad, 0.05)


@pytest.mark.parametrize("fractions", [FRACTIONS, [3 / 8, 5 / 8, 1.0], [0.2, 0.5, 0.7, 1.0]])
def test_each_look_spends_its_share_under_the_multivariate_normal(fractions):
    c = np.asarray(boundaries(fractions, 0.05))
    corr = _correlation(fractions)
    previous = 0.0
    for k in range(len(fractions)):
        mvn = scipy_stats.multivariate_normal(cov=corr[: k + 1, : k + 1], abseps=1e-7, releps=1e-7)
        inside = mvn.cdf(c[: k + 1], lower_limit=-c[: k + 1]) if k else 1 - 2 * scipy_stats.norm.sf(c[0])
        assert 1 - inside == pytest.approx(spent(fractions[k], 0.05), abs=5e-6)  # crossed by look k
        assert 1 - inside > previous
        previous = 1 - inside


def test_three_equal_looks_and_the_one_sided_boundaries():
    levels = nominal_levels(FRACTIONS, 0.05)
    assert levels == pytest.approx([0.000687, 0.01610, 0.04388], abs=2e-5)
    assert boundaries([1.0], 0.05) == pytest.approx([scipy_stats.norm.ppf(0.975)], rel=1e-12)
    c = np.asarray(boundaries(FRACTIONS, 0.05, sides=1))  # upper boundary only
    upper = scipy_stats.multivariate_normal(cov=_correlation(FRACTIONS), abseps=1e-7, releps=1e-7).cdf(c)
    assert 1 - upper == pytest.approx(0.05, abs=5e-6)
    assert look_thresholds(2, FRACTIONS, 0.05) == pytest.approx((levels[1], nominal_levels(FRACTIONS, 0.05, 1)[1]))
    for bad in ([0.5, 0.5, 1.0], [0.6, 0.5, 1.0], [0.0, 1.0], [0.5, 1.2], []):
        with pytest.raises(ValueError, match="valid: increasing, within"):
            boundaries(bad, 0.05)
    with pytest.raises(ValueError, match="sides 3"):
        boundaries(FRACTIONS, 0.05, sides=3)
    assert look_thresholds(3, FRACTIONS, 0.05) == pytest.approx((0.04388, 0.04162), abs=2e-5)
    assert look_thresholds(1, FRACTIONS, 0.05) == pytest.approx((0.000687, 0.002193), abs=2e-6)
    for look in (0, 4):
        with pytest.raises(ValueError, match=f"look {look}; valid: 1 to 3"):
            look_thresholds(look, FRACTIONS, 0.05)


def test_wortsman_lr_sensitivity_and_the_largest_stable_rate():
    initial = math.log(256)  # 5.545
    final = {1e-3: 2.40, 3e-3: 2.10, 1e-2: 2.00, 3e-2: 6.00, 1e-1: None}  # 3e-2 worse than init, 1e-1 diverged
    # min(final, initial): 2.40, 2.10, 2.00, 5.545, 5.545 -> mean 3.518; best 2.00
    expected = (2.40 + 2.10 + 2.00 + 2 * initial) / 5 - 2.00
    assert lr_sensitivity(final, initial) == pytest.approx(expected, rel=1e-12)
    assert lr_sensitivity({1e-3: 2.0, 1e-2: 2.0}, initial) == 0.0
    assert largest_stable_lr(final) == 3e-2 and largest_stable_lr({1e-2: None, 1e-1: math.nan}) is None
    for bad_grid, bad_initial in (({}, initial), (final, math.inf)):
        with pytest.raises(ValueError, match="needs a grid of rates and a finite initial loss"):
            lr_sensitivity(bad_grid, bad_initial)


def test_compute_multiplier_interpolates_in_log_steps():
    multiples, losses = [1.0, 1.25, 1.5, 2.0], [2.00, 1.95, 1.92, 1.88]
    # 1.935 lies between 1.25x (1.95) and 1.5x (1.92), half way: exp(ln 1.25 + 0.5 (ln 1.5 - ln 1.25)) = sqrt(1.875)
    assert compute_multiplier(multiples, losses, 1.935) == pytest.approx(math.sqrt(1.25 * 1.5), rel=1e-12)
    assert compute_multiplier(multiples, losses, 1.95) == pytest.approx(1.25, rel=1e-12)
    assert compute_multiplier(multiples, losses, 1.87) is None  # beyond the 2x checkpoint
    # behind the baseline: below 1x along the first segment, 2.05 is one segment "above": exp(-ln 1.25)
    assert compute_multiplier(multiples, losses, 2.05) == pytest.approx(1 / 1.25, rel=1e-12)
    assert compute_multiplier([1.0, 2.0], [2.0, 1.9], 1.95) == pytest.approx(math.sqrt(2), rel=1e-12)  # two suffice
    assert compute_multiplier([1.0, 1.5, 2.0], [2.0, 1.9, 1.9], 1.9) == pytest.approx(1.5)  # the first to reach it
    for bad in (([1.0, 1.0], [2.0, 1.9]), ([1.0], [2.0]), ([1.0, 2.0], [2.0]), ([0.0, 1.0], [2.0, 1.9])):
        with pytest.raises(ValueError):
            compute_multiplier(*bad, 1.95)
    with pytest.raises(ValueError, match="valid: two or more increasing positive multiples"):
        compute_multiplier([1.0, 2.0], [2.0], 1.95)


def test_multiplier_interval_is_the_t_interval_of_the_logs():
    per_seed = [1.2, 1.35, 1.25, None]
    logs = np.log([1.2, 1.35, 1.25])
    half = scipy_stats.t.ppf(0.975, 2) * logs.std(ddof=1) / math.sqrt(3)
    got = multiplier_interval(per_seed)
    assert got == pytest.approx((math.exp(logs.mean()), math.exp(logs.mean() - half), math.exp(logs.mean() + half)))
    assert multiplier_interval([1.2, None]) is None and multiplier_interval([1.2, 0.0, math.inf]) is None
    low_two = multiplier_interval([0.8, 0.9])  # two seeds suffice; multipliers below 1 (the scheme behind) count
    assert low_two is not None and low_two[0] == pytest.approx(math.sqrt(0.72))


def test_null_sweeps_keep_the_family_wise_error_at_alpha():
    """60 null sweeps of 20 cells (seeded; the full 10,000 are in docs/results.md) call at most 5 of them: without
    the adjustment (each cell at p < 0.05) about 1 - 0.95^20 = 64 % of sweeps, 38 of 60, would call something."""
    assert family_error(60, seed=11) * 60 <= 5


def test_staged_looks_keep_the_overall_error_at_alpha():
    """20 null sweeps of 10 cells, looks at 3, 5 and 8 seeds: at most 2 called (each look at 0.05 would call about
    a tenth more)."""
    assert sequential_error(20, (3, 5, 8), cells=10, seed=5) * 20 <= 2


@pytest.mark.slow
def test_many_null_sweeps_keep_the_family_wise_error_at_alpha():
    assert family_error(1000, seed=12) <= 0.05 + 2 * math.sqrt(0.05 * 0.95 / 1000)
    assert sequential_error(300, (3, 5, 8), seed=6) <= 0.05 + 2 * math.sqrt(0.05 * 0.95 / 300)
