"""The randomized-block model, Dunnett's many-to-one adjustment, Holm and the spread check against independent
implementations: statsmodels 0.15.0 (OLS with C(scheme) + C(seed), multipletests), scipy's one-way ``dunnett``
and an 8-million-draw Monte Carlo of the multivariate t, their values hard-coded (statsmodels is not a
requirement of the suite)."""

import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from experiments.results.blockmodel import (
    dunnett_critical,
    dunnett_p_values,
    equicorrelated_max_t_cdf,
    fit_blocks,
    holm,
    spread_check,
)
from experiments.results.verdicts import clear_caches


@pytest.fixture(autouse=True)
def _fresh_caches():
    """Every test computes its verdicts itself (a cached analysis would hide a change in the code)."""
    clear_caches()


# A slice with a missing seed (b lacks seeds 2 and 4) and seeds listed out of order (c): the OLS must use
# the dummies, not positions, and the standard errors must differ between the complete and incomplete cells.
UNBALANCED = {
    "pre": {1: 2.10, 2: 2.13, 3: 2.08, 4: 2.11},
    "a": {1: 2.05, 2: 2.11, 3: 2.02, 4: 2.07},
    "b": {1: 2.15, 3: 2.19},
    "c": {2: 2.09, 3: 2.07, 1: 2.12, 4: 2.16},
}
# statsmodels: smf.ols("y ~ C(scheme, Treatment('pre')) + C(seed)", df).fit()
STATSMODELS = {  # params, bse, tvalues, pvalues
    "a": (-0.04250000000000037, 0.020873770280289285, -2.036048084716748, 0.08118497247500953),
    "b": (0.08416666666666715, 0.026947921556039884, 3.123308285265612, 0.016765907545793043),
    "c": (0.0050000000000001155, 0.020873770280289264, 0.2395350687902093, 0.8175533111376521),
}
STATSMODELS_SIGMA, STATSMODELS_DF = 0.029519969028245538, 7
STATSMODELS_UNSCALED = [[0.5, 0.25, 0.25], [0.25, 0.8333333333333333, 0.25], [0.25, 0.25, 0.5]]
# P(max |T_j| >= |t_i|) from 8,000,000 draws of the multivariate t (df 7, the correlation above); MC SE < 2e-4
MONTE_CARLO_DUNNETT = [0.188607125, 0.04189025, 0.99059625]


def test_block_model_equals_statsmodels_ols_with_scheme_and_seed_dummies():
    fit = fit_blocks(UNBALANCED, "pre")
    assert fit.df == STATSMODELS_DF and fit.observations == 14
    assert fit.sigma == pytest.approx(STATSMODELS_SIGMA, rel=1e-10)
    assert [c.scheme for c in fit.contrasts] == ["a", "b", "c"]
    for c in fit.contrasts:
        est, se, t, p = STATSMODELS[c.scheme]
        assert (c.estimate, c.se, c.t, c.p) == pytest.approx((est, se, t, p), rel=1e-9)
        assert c.df == STATSMODELS_DF
    assert [c.n for c in fit.contrasts] == [4, 2, 4]
    np.testing.assert_allclose(fit.unscaled, STATSMODELS_UNSCALED, rtol=1e-9)


def test_two_schemes_on_complete_seeds_are_the_paired_t_test():
    a, b = {3: 1.9, 1: 2.0, 2: 2.3, 5: 2.05}, {1: 2.1, 2: 2.25, 3: 2.0, 5: 2.2}
    fit = fit_blocks({"pre": b, "x": a}, "pre")
    keys = [1, 2, 3, 5]
    ref = scipy_stats.ttest_rel([a[k] for k in keys], [b[k] for k in keys])
    (c,) = fit.contrasts
    assert c.t == pytest.approx(ref.statistic, rel=1e-10) and c.p == pytest.approx(ref.pvalue, rel=1e-10)
    assert c.df == 3 and c.estimate == pytest.approx(np.mean([a[k] - b[k] for k in keys]))


def test_a_scheme_without_a_shared_seed_is_dropped_not_estimated():
    fit = fit_blocks({"pre": {1: 1.0, 2: 1.2}, "x": {1: 0.9, 2: 1.0}, "lone": {7: 0.5}, "none": {}}, "pre")
    assert fit.dropped == ("lone",) and fit.schemes == ("x",)
    with pytest.raises(ValueError, match="reference 'pre'"):
        fit_blocks({"pre": {}, "x": {1: 1.0}}, "pre")


def test_no_residual_df_or_no_spread_gives_no_t():
    one_seed = fit_blocks({"pre": {1: 1.0}, "x": {1: 0.9}}, "pre")
    assert one_seed.df == 0 and one_seed.sigma is None and one_seed.contrasts[0].t is None
    offset = fit_blocks({"pre": {1: 1.0, 2: 1.5}, "x": {1: 0.9, 2: 1.4}}, "pre")  # a deterministic offset
    assert offset.sigma == 0.0 and offset.contrasts[0].p is None
    assert offset.contrasts[0].estimate == pytest.approx(-0.1)


def test_dunnett_on_the_block_model_equals_a_monte_carlo_of_the_multivariate_t():
    fit = fit_blocks(UNBALANCED, "pre")
    p = dunnett_p_values([c.t for c in fit.contrasts], fit.correlation(), fit.df)
    np.testing.assert_allclose(p, MONTE_CARLO_DUNNETT, atol=1e-3)
    assert all(adj >= c.p for adj, c in zip(p, fit.contrasts, strict=True))  # adjusting never lowers a p


@pytest.mark.parametrize("sizes", [(5, 5, 5, 5), (6, 4, 5, 3)])
def test_dunnett_equals_scipys_on_independent_groups(sizes):
    """The one-way layout scipy's dunnett handles: equal group sizes (equal correlations: the quadrature) and
    unequal ones (the multivariate t of scipy's cdf)."""
    rng = np.random.default_rng(7)
    groups = [rng.normal(mu, 1.0, n) for mu, n in zip((0.0, 0.5, 1.2, 0.1), sizes, strict=True)]
    ref = scipy_stats.dunnett(*groups[1:], control=groups[0], rng=np.random.default_rng(1)).pvalue
    total, k = sum(sizes), len(sizes)
    sp = math.sqrt(sum(((g - g.mean()) ** 2).sum() for g in groups) / (total - k))
    t = [(g.mean() - groups[0].mean()) / (sp * math.sqrt(1 / len(g) + 1 / sizes[0])) for g in groups[1:]]
    lam = [math.sqrt((1 / sizes[0]) / (1 / sizes[0] + 1 / n)) for n in sizes[1:]]
    corr = np.outer(lam, lam)
    np.fill_diagonal(corr, 1.0)
    np.testing.assert_allclose(dunnett_p_values(t, corr, total - k), ref, atol=5e-4)


def test_perfectly_correlated_contrasts_are_one_t_statistic():
    """rho = 1: max_i |T_i| is one |T|, whatever m: scipy's t distribution, at finite and infinite df."""
    c = np.array([0.0, 0.5, 1.5, 2.5, 4.0])
    for df in (3.0, 20.0, math.inf):
        expected = scipy_stats.t.cdf(c, df) - scipy_stats.t.cdf(-c, df)
        np.testing.assert_allclose(equicorrelated_max_t_cdf(c, 5, df, rho=1.0), expected, rtol=1e-12, atol=0)
    assert equicorrelated_max_t_cdf(2.0, 3, 10.0, rho=1.0) == pytest.approx(1 - 2 * scipy_stats.t.sf(2.0, 10.0))


def test_equicorrelated_quadrature_equals_scipys_multivariate_t():
    m, df, c = 6, 20, 2.4
    corr = np.full((m, m), 0.5) + 0.5 * np.eye(m)
    mvt = scipy_stats.multivariate_t(shape=corr, df=df)
    ref = mvt.cdf(np.full(m, c), lower_limit=np.full(m, -c), maxpts=2_000_000, random_state=3)
    assert equicorrelated_max_t_cdf(c, m, df) == pytest.approx(ref, abs=2e-4)
    assert equicorrelated_max_t_cdf(0.0, m, df) == 0.0
    # one contrast: the t distribution; rho 0: independent contrasts, the product of their probabilities
    # (the quadrature's error is about 2e-6)
    assert equicorrelated_max_t_cdf(c, 1, df) == pytest.approx(1 - 2 * scipy_stats.t.sf(c, df), abs=1e-5)
    assert equicorrelated_max_t_cdf(2.0, 3, math.inf, rho=0.0) == pytest.approx(
        (1 - 2 * scipy_stats.norm.sf(2.0)) ** 3, abs=1e-9
    )


def test_dunnett_critical_values():
    """Dunnett's table (two-sided, alpha 0.05, df 20): 2.38, 2.54, 2.73 for 2, 3, 5 treatments against the
    control; one contrast is the t quantile."""
    assert dunnett_critical(5, 20, 0.05) == pytest.approx(2.73, abs=0.006)
    assert dunnett_critical(3, 20, 0.05) == pytest.approx(2.54, abs=0.006)
    assert dunnett_critical(2, 20, 0.05) == pytest.approx(2.38, abs=0.006)
    assert dunnett_critical(1, 9, 0.05) == pytest.approx(scipy_stats.t.ppf(0.975, 9), rel=1e-12)
    assert equicorrelated_max_t_cdf(dunnett_critical(20, 40, 0.05), 20, 40) == pytest.approx(0.95, abs=1e-8)


def test_holm_equals_statsmodels_multipletests():
    assert holm([0.01, 0.04, 0.03, 0.005, 0.2]) == pytest.approx([0.04, 0.09, 0.09, 0.025, 0.2], rel=1e-12)
    assert holm([0.02, None, 0.04]) == [0.04, None, 0.04]  # None is no test: two tests, not three
    assert holm([0.6, 0.5]) == [1.0, 1.0]


def test_spread_check_is_brown_forsythe_and_undefined_without_two_groups():
    groups = {"a": [0.1, -0.05, 0.02], "b": [0.3, -0.4, 0.9, 0.0], "c": [0.01, 0.0, 0.02]}
    ref = scipy_stats.levene(*groups.values(), center="median").pvalue
    assert spread_check(groups) == pytest.approx(ref, rel=1e-12)
    assert ref != pytest.approx(scipy_stats.levene(*groups.values(), center="mean").pvalue, rel=1e-3)
    assert spread_check({"a": [0.1, 0.2], "b": [0.3]}) is None
    two = {"a": [0.1, 0.3], "b": [0.2, 0.25]}  # two values per group are enough
    assert spread_check(two) == pytest.approx(scipy_stats.levene(*two.values(), center="median").pvalue)
    assert spread_check({"a": [0.1, 0.1], "b": [0.3, 0.3]}) is None


def test_dunnett_at_other_equal_correlations_small_thresholds_and_reproducibly():
    """Equal correlations other than 0.5 (the quadrature must take the matrix's), a threshold below 1, p-values
    capped at 1 by Holm, and the quasi-Monte Carlo path giving the same numbers twice."""
    m, df = 4, 12
    corr = np.full((m, m), 0.3) + 0.7 * np.eye(m)
    ref = scipy_stats.multivariate_t(shape=corr, df=df).cdf(
        np.full(m, 2.2), lower_limit=np.full(m, -2.2), maxpts=2_000_000, random_state=3
    )
    assert dunnett_p_values([2.2], corr, df)[0] == pytest.approx(1 - ref, abs=3e-4)
    half = np.full((m, m), 0.5) + 0.5 * np.eye(m)
    mvt = scipy_stats.multivariate_t(shape=half, df=df)
    inside = mvt.cdf(np.full(m, 0.8), lower_limit=np.full(m, -0.8), maxpts=2_000_000, random_state=3)
    assert equicorrelated_max_t_cdf(0.8, m, df) == pytest.approx(inside, abs=3e-4) and inside > 0.05
    assert holm([0.7, 0.8]) == [1.0, 1.0]
    fit = fit_blocks(UNBALANCED, "pre")
    t = [c.t for c in fit.contrasts]
    assert dunnett_p_values(t, fit.correlation(), fit.df) == dunnett_p_values(t, fit.correlation(), fit.df)
