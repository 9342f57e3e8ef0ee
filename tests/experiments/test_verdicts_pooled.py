"""Every field of the pooled (block-model) path's verdicts: better, worse, equivalent, undecided (with the seeds
needed and the detectable difference, "no difference", "more than 1000", no residual df, no spread), the cells
it drops or finds empty, the slice without its reference, and the slice's own numbers (df, pooled SD, spread p).

References from other implementations, hard-coded (statsmodels is not a requirement of the suite), computed
outside the suite with statsmodels 0.15.0 and scipy:

- each contrast's estimate and standard error, the residual df and SD: ``smf.ols("y ~ C(scheme,
  Treatment('pre')) + C(seed)", df).fit()`` (``params``, ``bse``, ``df_resid``, ``sqrt(scale)``);
- Dunnett's adjusted p-values and critical values: ``P(max_i |T_i| <= c)`` of the equicorrelated (0.5)
  multivariate t by adaptive ``scipy.integrate.quad`` over the chi scale around a 6001-point trapezoid over the
  shared normal part (cross-checked against ``scipy.stats.multivariate_t.cdf`` to 3e-9), the critical value by
  ``brentq``; the code's Gauss quadrature agrees to about 3e-6 in probability, hence the tolerances;
- TOST on the contrast's standard error and df, Holm by ``multipletests(method="holm")``;
- the detectable difference: ``TTestPower().solve_power(nobs=df + 1, alpha=2 * t.sf(critical, df),
  power=0.8)`` times ``sqrt(df + 1) * se`` (the noncentral t at Dunnett's critical value);
- the seeds needed: the smallest ``n`` whose ``TTestPower().power`` at Dunnett's critical value for ``m``
  contrasts on ``m (n - 1)`` df reaches 0.8, ``m + 1`` schemes (the reference among them).

Written for the mutants that changed a field no other test read whole (mutmut on ``verdicts._pooled`` and
``verdicts._analyse``)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as scipy_stats

from experiments.results.sequential import look_thresholds
from experiments.results.verdicts import DUNNETT, analyse, analyse_at_look, clear_caches
from tests.experiments.test_verdicts import _slice
from tests.experiments.test_verdicts_fallback import same

LOOK = (0.045, 0.04)  # a look's (difference, equivalence) levels: not alpha, so a dropped threshold shows
# slice P (below): statsmodels OLS, residual df 12; (estimate, se) per contrast
P_DF, P_SIGMA = 12, 0.005838543175940462
P_OLS = {
    "good": (-0.09615096427097104, 0.004128473471957945),
    "bad": (0.10556235534163386, 0.004128473471957942),
    "same": (0.0006455577238331104, 0.004128473471957943),
    "near": (0.01159489522281472, 0.004128473471957944),
}
P_DUNNETT = {"good": 8.653988636808663e-11, "bad": 2.8892110925937686e-11, "same": 0.9995114821639227,
             "near": 0.0498734415644112}  # fmt: skip
P_TOST_HOLM = {"good": 1.0, "bad": 1.0, "same": 0.0010499414762173006, "near": 0.09668472476605136}
P_NEAR_DETECTABLE, P_NEAR_NEEDED = 0.015338376456313575, 7  # Dunnett critical (4 contrasts, df 12) 2.80708261874987
# slice Z: statsmodels OLS, df 4 (both contrasts' se 0.36004114991154784); Dunnett's p of x; TOST (margin 0.02),
# Holm over the two
Z_DF, Z_SIGMA = 4, 0.4409585518440985
Z_X_ESTIMATE, Z_X_DUNNETT, Z_TOST_HOLM = -0.16666666666666619, 0.8619684731542068, 0.9583648564870892
Z_DETECTABLE, Z_X_NEEDED = 1.5736059537428704, 132  # Dunnett critical (2 contrasts, df 4) 3.31035194593422
# slice Q, one contrast (the paired t-test): TTestPower at the effect of its differences, and at 4 pairs
Q_EFFECT, Q_PAIRS = 0.008660254037862846, 104653.39420288426  # solve_power(effect_size=Q_EFFECT, alpha=0.05)
Q_DETECTABLE_4 = 2.1279493431921157  # solve_power(nobs=4, alpha=0.05) -> effect, in paired SDs


@pytest.fixture(autouse=True)
def _fresh_caches():
    clear_caches()
    yield
    clear_caches()


def check(got, want: dict, rel: float = 3e-5) -> None:
    """``same`` with the looser tolerances of a quadrature (Dunnett's p, the detectable difference)."""
    loose = {k: want.pop(k) for k in ("p", "detectable") if isinstance(want.get(k), float)}
    for name, value in loose.items():
        assert getattr(got, name) == pytest.approx(value, rel=rel, abs=1e-5), (name, getattr(got, name), value)
        want[name] = getattr(got, name)
    same(got, want)


def slice_p() -> dict:
    data = _slice({"pre": 0.0, "good": -0.1, "bad": 0.1, "same": 0.0005, "near": 0.01}, sd=0.006, seeds=(1, 2, 3, 4),
                  rng_seed=4)  # fmt: skip
    data["lone"] = {98: 2.0, 99: 2.1}  # no seed shared with the rest: dropped from the model
    data["failed"] = {}  # no finished run
    return data


def test_every_kind_of_pooled_verdict_carries_its_own_numbers():
    data = slice_p()
    a = analyse(data, "pre", "val/loss", 0.02, thresholds=LOOK)
    assert a.analysis == DUNNETT and a.df == P_DF and a.sigma == pytest.approx(P_SIGMA, rel=1e-9)
    groups = [[data[s][k] - data["pre"][k] for k in (1, 2, 3, 4)] for s in P_OLS]
    assert a.spread_p == pytest.approx(scipy_stats.levene(*groups, center="median").pvalue, rel=1e-12)
    common = {"n": 4, "margin": 0.02, "analysis": DUNNETT, "threshold": LOOK[0]}
    for s, word in (("good", "better"), ("bad", "worse"), ("same", "equivalent")):
        check(a.verdicts[s], {"word": word, "difference": P_OLS[s][0], "p": P_DUNNETT[s],
                              "p_equivalence": P_TOST_HOLM[s], **common})  # fmt: skip
    # p 0.0499: above the look's 0.045 (at alpha 0.05 it would be "worse"); TOST 0.097
    check(a.verdicts["near"], {"word": "undecided", "difference": P_OLS["near"][0], "p": P_DUNNETT["near"],
                               "p_equivalence": P_TOST_HOLM["near"], "needed": P_NEAR_NEEDED,
                               "detectable": P_NEAR_DETECTABLE, **common})  # fmt: skip
    same(a.verdicts["lone"], {"word": "not comparable", "n": 2, "why": "no seed shared"})
    same(a.verdicts["failed"], {"word": "not comparable", "n": 0, "why": "no finished run"})
    assert set(a.verdicts) == {"good", "bad", "same", "near", "lone", "failed"}
    assert a.describe() == (
        "Dunnett, block model (4 contrasts, residual df 12, pooled SD 0.00584; Brown-Forsythe p = 0.31)"
    )
    assert a.verdicts["near"].text() == "undecided (Dunnett, block model: p = 0.05, n = 4): ~7 seeds; detectable 0.015"
    assert a.verdicts["good"].text() == "better (Dunnett, block model: p < 0.001, n = 4)"
    assert a.verdicts["same"].text() == "equivalent within ±0.02 (Dunnett, block model, TOST p = 0.001, n = 4)"
    assert a.verdicts["failed"].text() == "not comparable (no finished run)"


def test_without_sensitivity_or_at_alpha_an_undecided_cell_carries_no_seeds():
    data = slice_p()
    quick = analyse(data, "pre", "val/loss", 0.02, thresholds=LOOK, sensitivity=False).verdicts["near"]
    check(quick, {"word": "undecided", "n": 4, "difference": P_OLS["near"][0], "p": P_DUNNETT["near"],
                  "p_equivalence": P_TOST_HOLM["near"], "margin": 0.02, "analysis": DUNNETT,
                  "threshold": LOOK[0]})  # fmt: skip
    # without a look the levels are alpha's: p 0.0499 < 0.05 is "worse"; at alpha 0.01 "undecided", threshold 0.01
    at_alpha = analyse(data, "pre", "val/loss", 0.02).verdicts["near"]
    assert (at_alpha.word, at_alpha.threshold, at_alpha.needed) == ("worse", 0.05, None)
    strict = analyse(data, "pre", "val/loss", None, alpha=0.01).verdicts["near"]
    assert (strict.word, strict.threshold, strict.margin, strict.p_equivalence) == ("undecided", 0.01, None, None)
    assert strict.needed > P_NEAR_NEEDED  # more seeds at the stricter level


def test_no_difference_and_seeds_needed_of_a_two_contrast_slice():
    """Z: the cell "zero" repeats the reference, so its contrast is exactly 0 (statsmodels' lstsq: -3e-16),
    "x" needs 132 seeds per cell under Dunnett for two contrasts (three schemes; four would need more)."""
    data = {"pre": {1: 1.0, 2: 2.0, 3: 4.0}, "zero": {1: 1.0, 2: 2.0, 3: 4.0}, "x": {1: 1.5, 2: 2.0, 3: 3.0}}
    a = analyse(data, "pre", "val/loss", 0.02, thresholds=LOOK)
    assert a.analysis == DUNNETT and a.df == Z_DF and a.sigma == pytest.approx(Z_SIGMA, rel=1e-9)
    common = {"word": "undecided", "n": 3, "margin": 0.02, "analysis": DUNNETT, "threshold": LOOK[0],
              "p_equivalence": Z_TOST_HOLM, "detectable": Z_DETECTABLE}  # fmt: skip
    check(a.verdicts["zero"], {"difference": 0.0, "p": 1.0, "why": "no difference", **common})
    check(a.verdicts["x"], {"difference": Z_X_ESTIMATE, "p": Z_X_DUNNETT, "needed": Z_X_NEEDED, **common})
    assert a.verdicts["zero"].text() == (
        "undecided (Dunnett, block model: p = 1, n = 3): no difference seeds; detectable 1.6"
    )
    assert a.verdicts["x"].detectable == pytest.approx(a.verdicts["zero"].detectable, rel=1e-12)  # the same se


def test_a_difference_more_than_1000_seeds_would_need():
    """Q: one contrast on complete seeds is the paired t-test: Dunnett's p is ttest_rel's, the seeds needed and
    the detectable difference are TTestPower's (differences of exactly 0.0101 and -0.0099, in turn)."""
    pre = {1: 2.0, 2: 2.25, 3: 2.5, 4: 2.75}
    tiny = {k: v + 0.0001 + (0.01 if k % 2 else -0.01) for k, v in pre.items()}
    a = analyse({"pre": pre, "tiny": tiny}, "pre", "val/loss", 0.001, thresholds=LOOK)
    d = np.array([tiny[k] - pre[k] for k in pre])
    assert abs(d.mean()) / d.std(ddof=1) == pytest.approx(Q_EFFECT, rel=1e-9) and Q_PAIRS > 1000
    se = d.std(ddof=1) / 2
    tost_p = max(scipy_stats.t.sf((d.mean() + 0.001) / se, 3), scipy_stats.t.cdf((d.mean() - 0.001) / se, 3))
    assert tost_p == pytest.approx(0.44301137945431823, rel=1e-9)  # statsmodels' ttost_paired(x, y, -0.001, 0.001)
    same(a.verdicts["tiny"], {"word": "undecided", "n": 4, "difference": pytest.approx(d.mean(), rel=1e-9),
                              "p": pytest.approx(scipy_stats.ttest_rel(list(tiny.values()), list(pre.values())).pvalue,
                                                 rel=1e-9),
                              "p_equivalence": pytest.approx(tost_p, rel=1e-9), "margin": 0.001, "analysis": DUNNETT,
                              "detectable": pytest.approx(Q_DETECTABLE_4 * d.std(ddof=1), rel=1e-6),
                              "why": "more than 1000", "threshold": LOOK[0]})  # fmt: skip


def test_no_residual_df_no_spread_and_no_reference():
    one_seed = analyse({"pre": {1: 1.0}, "x": {1: 0.75}, "y": {1: 1.25}}, "pre", "val/loss", 0.02, thresholds=LOOK)
    assert (one_seed.analysis, one_seed.df, one_seed.sigma, one_seed.spread_p) == (DUNNETT, 0, None, None)
    common = {"word": "undecided", "n": 1, "margin": 0.02, "analysis": DUNNETT, "threshold": LOOK[0]}
    same(one_seed.verdicts["x"], {"difference": pytest.approx(-0.25, abs=1e-12), "why": "no residual df", **common})
    same(one_seed.verdicts["y"], {"difference": pytest.approx(0.25, abs=1e-12), "why": "no residual df", **common})
    assert one_seed.verdicts["x"].text() == "undecided (n = 1): no residual df, no test"
    offset = analyse({"pre": {1: 1.0, 2: 1.5}, "x": {1: 0.75, 2: 1.25}}, "pre", "val/loss", 0.02, thresholds=LOOK)
    assert (offset.df, offset.sigma) == (1, 0.0)
    same(offset.verdicts["x"], {**common, "n": 2, "difference": pytest.approx(-0.25, abs=1e-12), "why": "no spread"})
    no_ref = analyse({"pre": {}, "x": {1: 1.0, 2: 1.1}, "y": {}}, "pre", "val/loss", 0.02, thresholds=LOOK)
    assert (no_ref.analysis, no_ref.spread_p, no_ref.df, no_ref.sigma) == ("", None, None, None)
    same(no_ref.verdicts["x"], {"word": "not comparable", "n": 2, "why": "no finished pre run"})
    same(no_ref.verdicts["y"], {"word": "not comparable", "n": 0, "why": "no finished pre run"})
    assert set(no_ref.verdicts) == {"x", "y"} and no_ref.describe() == "no finished reference run"


@pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")  # scipy's W = x / 0 (see below)
def test_the_spread_check_counts_cells_of_two_seeds():
    """Cells of two shared seeds enter Brown-Forsythe (scipy's levene about the median); the reference is no group
    of its own. (With two values a group's deviations from its median are equal, so the check rejects whenever
    the cells' ranges differ: here p ~ 1e-48.)"""
    data = {"pre": {1: 1.0, 2: 1.5}, "a": {1: 0.9, 2: 1.45}, "b": {1: 1.2, 2: 1.5}, "c": {1: 1.05, 2: 1.52}}
    a = analyse(data, "pre", "val/loss", 0.02)
    groups = [[data[s][k] - data["pre"][k] for k in (1, 2)] for s in "abc"]
    assert a.spread_p == pytest.approx(scipy_stats.levene(*groups, center="median").pvalue, rel=1e-12)


def test_a_difference_of_exactly_one_is_decided_like_any_other():
    """The block model's contrast is exactly 1.0 here (binary fractions); one contrast: p is ttest_rel's."""
    pre = {1: 1.0, 2: 2.0, 3: 4.0}
    x = {1: 2.0625, 2: 2.9375, 3: 5.0}
    p = scipy_stats.ttest_rel(list(x.values()), list(pre.values())).pvalue
    for metric, word in (("val/loss", "worse"), ("test/acc1", "better")):
        v = analyse({"pre": pre, "x": x}, "pre", metric, None).verdicts["x"]
        assert (v.word, v.difference) == (word, 1.0) and v.p == pytest.approx(p, rel=1e-9)


def test_a_look_of_a_staged_sweep_reads_the_slice_at_that_looks_levels():
    """Lan-DeMets O'Brien-Fleming at information 1/3, 2/3, 1 (alpha 0.05; the published levels that
    test_sequential_compute pins): look 1 two-sided 0.000687, TOST 0.002193; look 3 two-sided 0.04388."""
    data, fractions = slice_p(), [1 / 3, 2 / 3, 1.0]
    first = analyse_at_look(data, "pre", "val/loss", 0.02, 1, fractions, sensitivity=False).verdicts
    assert first["good"].threshold == pytest.approx(0.000687, abs=2e-6)
    assert (first["good"].word, first["same"].word, first["near"].word) == ("better", "equivalent", "undecided")
    last = analyse_at_look(data, "pre", "val/loss", 0.02, 3, fractions)
    assert last.verdicts["near"].threshold == pytest.approx(0.04388, abs=2e-5)
    assert last.verdicts["near"].word == "undecided" and last.verdicts["near"].needed == P_NEAR_NEEDED  # p 0.0499
    assert last == analyse(data, "pre", "val/loss", 0.02, thresholds=look_thresholds(3, fractions, 0.05))
    loose = analyse_at_look(data, "pre", "val/loss", 0.02, 3, fractions, alpha=0.1).verdicts["near"]
    assert loose.word == "worse" and loose.threshold == pytest.approx(look_thresholds(3, fractions, 0.1)[0])
    assert (first["near"].needed, first["near"].detectable) == (None, None)
