"""Seed statistics: intervals and p-values against scipy's own reference routines and a hand enumeration."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy import stats as scipy_stats

from experiments.results import stats
from experiments.results.tables import fmt_estimate, fmt_p

SAMPLE = [1.512, 1.538, 1.497, 1.551, 1.520]  # five seeds of a final loss
BASE = [1.530, 1.561, 1.505, 1.560, 1.548]  # the baseline's five seeds, paired by position


def test_interval_equals_scipys_one_sample_t_interval():
    e = stats.estimate(SAMPLE)
    reference = scipy_stats.ttest_1samp(SAMPLE, 0.0).confidence_interval(0.95)  # another scipy route
    assert e.n == 5 and e.mean == pytest.approx(np.mean(SAMPLE), abs=1e-15)
    assert e.std == pytest.approx(np.std(SAMPLE, ddof=1), rel=1e-12)
    assert (e.low, e.high) == pytest.approx((reference.low, reference.high), rel=1e-12)
    # Pinned numbers, so a change of formula (z instead of t, ddof 0) cannot pass: t_{0.975, 4} = 2.776445.
    assert e.half_width == pytest.approx(2.7764451051977987 * np.std(SAMPLE, ddof=1) / np.sqrt(5), rel=1e-12)
    assert (e.low, e.high) == pytest.approx((1.4971639, 1.5500361), abs=1e-7)


def test_paired_comparison_equals_scipys_paired_t_test_and_an_exact_enumeration():
    v = stats.paired(dict(enumerate(SAMPLE)), dict(enumerate(BASE)))
    reference = scipy_stats.ttest_rel(SAMPLE, BASE)
    interval = reference.confidence_interval(0.95)
    assert v.n == 5 and v.differences == pytest.approx(np.subtract(SAMPLE, BASE).tolist())
    assert v.p_t == pytest.approx(reference.pvalue, rel=1e-12)
    assert (v.difference.low, v.difference.high) == pytest.approx((interval.low, interval.high), rel=1e-12)
    # The sign-flip test by hand: every one of the 2^5 sign patterns of the differences.
    d = np.subtract(SAMPLE, BASE)
    flipped = [abs(np.mean(d * signs)) for signs in itertools.product([1, -1], repeat=len(d))]
    by_hand = np.mean([m >= abs(d.mean()) - 1e-12 for m in flipped])
    assert v.sign_flip_exact and v.p_sign_flip == pytest.approx(by_hand)
    assert v.p_sign_flip == pytest.approx(2 / 32)  # every difference is negative: the two extreme patterns
    assert v.p_t == pytest.approx(0.011507, abs=1e-6)  # pinned


# Seeds listed in another order on each side, seed 3 missing in the middle of the scheme's (it diverged) and
# seed 6 only on the scheme's: the pairs are seeds 1, 2, 4, 5, whatever the positions.
SCHEME_BY_SEED = {4: 1.561, 1: 1.512, 6: 1.490, 5: 1.520, 2: 1.538}
BASE_BY_SEED = {1: 1.530, 2: 1.561, 3: 1.505, 4: 1.560, 5: 1.548}


def test_pairs_are_made_by_seed_not_by_position():
    v = stats.paired(SCHEME_BY_SEED, BASE_BY_SEED)
    by_hand = {1: 1.512 - 1.530, 2: 1.538 - 1.561, 4: 1.561 - 1.560, 5: 1.520 - 1.548}  # -18, -23, +1, -28 (x 1e-3)
    assert sorted(v.keys) == [1, 2, 4, 5] and v.n == 4
    assert dict(zip(v.keys, v.differences, strict=True)) == pytest.approx(by_hand, abs=1e-15)
    # mean -0.017; deviations -1, -6, +18, -11 (x 1e-3): std = sqrt(482e-6 / 3); t = mean / (std / sqrt(4))
    std = (482e-6 / 3) ** 0.5
    assert v.difference.mean == pytest.approx(-0.017, abs=1e-15) and v.difference.std == pytest.approx(std, rel=1e-12)
    t = -0.017 / (std / 2)
    assert t == pytest.approx(-2.682354, abs=1e-6)
    assert v.p_t == pytest.approx(2 * scipy_stats.t.sf(abs(t), df=3), rel=1e-10)
    assert v.p_t == pytest.approx(0.0748989, abs=1e-7)  # pinned
    half = 3.1824463052837078 * std / 2  # t_{0.975, 3}
    assert (v.difference.low, v.difference.high) == pytest.approx((-0.017 - half, -0.017 + half), rel=1e-12)
    # Sign flips: only flipping seed 4's +0.001 keeps |mean| >= 0.017 (it becomes 0.0175); with the two mirror
    # images that is 4 of the 16 patterns.
    assert v.sign_flip_exact and v.p_sign_flip == pytest.approx(4 / 16, abs=1e-12)


def test_two_pairs_are_tested():
    v = stats.paired({1: 1.50, 2: 1.40}, {1: 1.53, 2: 1.41})  # differences -0.03, -0.01
    std = 0.02 / 2**0.5  # |d1 - d2| / sqrt(2)
    t = -0.02 / (std / 2**0.5)  # = -2
    assert v.n == 2 and t == pytest.approx(-2.0)
    assert v.p_t == pytest.approx(2 * scipy_stats.t.sf(2.0, df=1), rel=1e-10)  # 0.2952
    assert v.p_sign_flip == pytest.approx(0.5) == stats.sign_flip_floor(2)


def test_another_confidence_reaches_both_intervals():
    e = stats.estimate(SAMPLE, confidence=0.9)
    half = 2.1318467863266495 * np.std(SAMPLE, ddof=1) / np.sqrt(5)  # t_{0.95, 4}
    assert e.confidence == 0.9 and (e.low, e.high) == pytest.approx((e.mean - half, e.mean + half), rel=1e-12)
    v = stats.paired(dict(enumerate(SAMPLE)), dict(enumerate(BASE)), confidence=0.9)
    d = np.subtract(SAMPLE, BASE)
    half = 2.1318467863266495 * np.std(d, ddof=1) / np.sqrt(5)
    assert (v.difference.low, v.difference.high) == pytest.approx((d.mean() - half, d.mean() + half), rel=1e-12)


def test_identical_runs_differ_by_zero_with_p_one():
    v = stats.paired({1: 1.5, 2: 1.6, 3: 1.55}, {1: 1.5, 2: 1.6, 3: 1.55})
    assert v.difference.mean == 0.0 and (v.difference.low, v.difference.high) == (0.0, 0.0)
    assert v.p_t == 1.0 and v.p_sign_flip == 1.0
    assert fmt_estimate(v.difference, signed=True) == "+0 ± 0 (n = 3)"


def test_one_replicate_has_no_interval():
    e = stats.estimate([1.5144])
    assert e.n == 1 and e.std is None and e.low is None and e.high is None and e.half_width is None
    assert fmt_estimate(e) == "1.514 (n = 1)"  # never "±"
    v = stats.paired({7: 1.5}, {7: 1.6})
    assert v.n == 1 and v.p_t is None and v.p_sign_flip is None and v.difference.half_width is None
    assert v.differences == pytest.approx((-0.1,)) and v.difference.mean == pytest.approx(-0.1)
    assert stats.estimate([]) is None and stats.paired({1: 1.0}, {2: 1.0}) is None  # no common seed
    assert stats.estimate([1.5], confidence=0.9).confidence == 0.9  # the coverage is recorded in every case
    assert stats.estimate([2.0, 2.0], confidence=0.9).confidence == 0.9


def test_a_constant_offset_has_no_t_test_but_a_sign_flip_test():
    v = stats.paired({1: 1.5, 2: 1.25, 3: 1.0}, {1: 1.0, 2: 0.75, 3: 0.5})  # exactly +0.5 on every seed
    assert v.p_t is None  # t = 0.5 / 0: undefined, not "p = 0"
    assert v.p_sign_flip == pytest.approx(0.25) == stats.sign_flip_floor(3)


def test_many_pairs_sample_sign_patterns_reproducibly():
    rng = np.random.default_rng(3)
    a, b = rng.normal(0.0, 1.0, 20), rng.normal(0.3, 1.0, 20)
    first = stats.paired(dict(enumerate(a)), dict(enumerate(b)))
    again = stats.paired(dict(enumerate(a)), dict(enumerate(b)))
    assert not first.sign_flip_exact and first.p_sign_flip == again.p_sign_flip
    assert first.p_t == pytest.approx(scipy_stats.ttest_rel(a, b).pvalue)


def all_sign_flips_p(d: np.ndarray) -> float:
    """The exact two-sided sign-flip p-value by enumerating all 2^n sign patterns (in chunks of 2^16)."""
    n, observed, hits = len(d), abs(d.mean()), 0
    for start in range(0, 2**n, 2**16):
        codes = np.arange(start, min(start + 2**16, 2**n))
        signs = ((codes[:, None] >> np.arange(n)) & 1) * 2.0 - 1.0  # (patterns, n) of +-1
        hits += int(np.sum(np.abs(signs @ d / n) >= observed * (1 - 1e-12)))
    return hits / 2**n


def test_sixteen_pairs_are_still_enumerated_exactly():
    d = np.random.default_rng(5).normal(0.25, 1.0, 16)  # 2^16 patterns: above the 9999 a sampled test draws
    p, exact = stats.sign_flip_p_value(d)
    assert exact and p == pytest.approx(all_sign_flips_p(d), abs=1e-12)
    assert p * 2**16 == pytest.approx(round(p * 2**16), abs=1e-6)  # a count over 65,536 patterns


def test_above_sixteen_pairs_the_sign_flip_p_is_sampled_near_the_exact_one():
    d = np.random.default_rng(11).normal(0.0, 1.0, 20)  # t = 1.11: p about 0.3
    p, exact = stats.sign_flip_p_value(d)
    truth = all_sign_flips_p(d)  # 2^20 patterns, by hand
    assert not exact and 0.05 < truth < 0.95
    assert p * 10000 == pytest.approx(round(p * 10000), abs=1e-6)  # (hits + 1) / (9999 + 1): a sampled value
    assert abs(p - truth) < 4 * (truth * (1 - truth) / 9999) ** 0.5 + 1e-4


def test_constant_means_equal_up_to_rounding_relative_to_the_values():
    x = 1000.1
    twins = stats.estimate([x, float(np.nextafter(x, np.inf))])  # one ulp apart: the same run, rounded differently
    assert twins.std == 0.0 and twins.low == twins.high == twins.mean
    apart = stats.estimate([0.5, 0.5 + 1.5e-12])  # 1.5e-12 apart at a scale of 1: a real (tiny) spread
    assert apart.std > 0 and apart.low < apart.mean < apart.high


def test_sign_flip_floor_is_a_probability():
    assert [stats.sign_flip_floor(n) for n in (0, 1, 2, 3, 16)] == [1.0, 1.0, 0.5, 0.25, 2 / 65536]


def test_interval_bands_equal_the_interval_at_every_point():
    curves = np.array([[3.0, 2.0, 1.6, 1.4], [3.1, 2.2, 1.5, 1.45], [2.9, 2.1, 1.55, 1.3]])  # 3 seeds x 4 steps
    mean, low, high = stats.interval_bands(curves)
    assert high[3] - mean[3] == pytest.approx(4.302652729749462 * np.std([1.4, 1.45, 1.3], ddof=1) / np.sqrt(3))
    for j in range(4):
        e = stats.estimate(curves[:, j])
        assert (mean[j], low[j], high[j]) == pytest.approx((e.mean, e.low, e.high), rel=1e-12)
    one = stats.interval_bands(curves[:1])
    assert all(np.array_equal(one[0], x) for x in one)  # one curve: no band


def test_p_value_formatting():
    assert [fmt_p(p) for p in (None, 1.0, 0.25, 0.01527, 0.0004)] == ["-", "1", "0.25", "0.015", "< 0.001"]


# Power of the two-sided paired (one-sample) t-test at alpha 0.05, from statsmodels 0.15.0's TTestPower
# (installed outside the project for this cross-check only; its results hard-coded here):
#   TTestPower().power(effect_size=d, nobs=n, alpha=0.05)              two-sided
#   TTestPower().solve_power(nobs=n, alpha=0.05, power=0.8)            the detectable effect, in standard deviations
STATSMODELS_POWER = {(1.0, 10): 0.8030968566327218, (1.0, 9): 0.7480170922294764, (2.0, 3): 0.4707494312784346,
                     (0.5, 34): 0.8077775012792737, (0.5, 33): 0.795365841487504}  # fmt: skip
STATSMODELS_DETECTABLE = {2: 11.549889754978167, 3: 3.264043552819638, 4: 2.1279493431921157,
                          5: 1.6819970833232674, 10: 0.9960019107624178}  # fmt: skip
# the same with alternative="larger" (one-sided), alpha 0.025, or power 0.2: what a mix-up would give at n = 3
ONE_SIDED_DETECTABLE_3 = 2.2972747898357215
HALF_ALPHA_DETECTABLE_3 = 4.523203146932625
POWER_02_DETECTABLE_3 = 1.0839946918406143
ONE_SIDED_POWER_2_3 = 0.7121592030328323


def test_power_equals_statsmodels_and_a_monte_carlo_of_the_t_test():
    for (effect, n), reference in STATSMODELS_POWER.items():
        assert stats.paired_t_power(effect, n) == pytest.approx(reference, rel=1e-9), (effect, n)
        assert stats.paired_t_power(-effect, n) == pytest.approx(reference, rel=1e-9)  # two-sided: either sign
    assert stats.paired_t_power(2.0, 3) != pytest.approx(ONE_SIDED_POWER_2_3, abs=0.05)
    assert stats.paired_t_power(0.0, 5) == pytest.approx(0.05, abs=1e-12)  # no effect: the test's level
    # Brute force: 200,000 experiments of 3 pairs with a true difference of 2 standard deviations, each judged by
    # scipy's own paired t-test at p < 0.05.
    rng = np.random.default_rng(0)
    d = rng.normal(2.0, 1.0, size=(200_000, 3))
    p = scipy_stats.ttest_1samp(d, 0.0, axis=1).pvalue
    rate = np.mean(p < 0.05)
    assert abs(rate - stats.paired_t_power(2.0, 3)) < 4 * (0.47 * 0.53 / 200_000) ** 0.5  # about 0.0045
    with pytest.raises(ValueError, match="at least 2 pairs"):
        stats.paired_t_power(1.0, 1)


def test_detectable_effect_is_solved_on_the_noncentral_t():
    for n, reference in STATSMODELS_DETECTABLE.items():
        effect = stats.detectable_effect(n)
        assert effect == pytest.approx(reference, rel=1e-6), n
        assert stats.paired_t_power(effect, n) == pytest.approx(0.8, abs=1e-9)  # solved, not approximated
    three = stats.detectable_effect(3)
    for wrong in (ONE_SIDED_DETECTABLE_3, HALF_ALPHA_DETECTABLE_3, POWER_02_DETECTABLE_3):
        assert three != pytest.approx(wrong, rel=0.02)
    # The normal approximation (z_{0.975} + z_{0.8}) / sqrt(n) = 1.62 at n = 3 would be half the exact answer.
    assert three > 1.9 * (1.959963984540054 + 0.8416212335729143) / 3**0.5
    assert stats.detectable_effect(3, power=0.2) == pytest.approx(POWER_02_DETECTABLE_3, rel=1e-6)
    with pytest.raises(ValueError, match="at least 2 pairs"):
        stats.detectable_effect(1)


def test_seeds_needed_is_the_smallest_n_that_reaches_the_power():
    # effect 0.5: statsmodels' solve_power gives 33.37 pairs, so 34 (power 0.8078; 33 has 0.7954)
    assert stats.seeds_needed(0.05, 0.1) == 34 and stats.seeds_needed(-0.05, 0.1) == 34
    assert stats.seeds_needed(1.0, 1.0) == 10  # solve_power: 9.94 (power at 9: 0.748, at 10: 0.803)
    at_three = STATSMODELS_DETECTABLE[3]
    assert stats.seeds_needed(at_three * 1.001, 1.0) == 3 and stats.seeds_needed(at_three * 0.999, 1.0) == 4
    assert stats.seeds_needed(STATSMODELS_DETECTABLE[2] * 1.001, 1.0) == 2
    assert stats.seeds_needed(0.0, 1.0) is None and stats.seeds_needed(0.01, 1.0) is None  # > 1000 seeds
    assert stats.seeds_needed(0.1, 1.0) == 787  # n with power >= 0.8 for d = 0.1, checked on both sides below
    assert stats.paired_t_power(0.1, 787) >= 0.8 > stats.paired_t_power(0.1, 786)
    with pytest.raises(ValueError, match="positive"):
        stats.seeds_needed(0.1, 0.0)


def test_sensitivity_of_a_paired_comparison_and_where_it_is_undefined():
    v = stats.paired(dict(enumerate(SAMPLE)), dict(enumerate(BASE)))  # 5 pairs
    s = stats.sensitivity(v)
    d = np.subtract(SAMPLE, BASE)
    assert s.n == 5 and s.std == pytest.approx(np.std(d, ddof=1), rel=1e-12) and s.why is None
    assert s.detectable == pytest.approx(STATSMODELS_DETECTABLE[5] * np.std(d, ddof=1), rel=1e-6)
    assert s.needed == stats.seeds_needed(d.mean(), np.std(d, ddof=1))
    assert stats.paired_t_power(abs(d.mean()) / np.std(d, ddof=1), s.needed) >= 0.8
    assert stats.paired_t_power(abs(d.mean()) / np.std(d, ddof=1), s.needed - 1) < 0.8
    one = stats.sensitivity(stats.paired({7: 1.5}, {7: 1.6}))
    assert (one.detectable, one.needed, one.why) == (None, None, "one pair")
    offset = stats.sensitivity(stats.paired({1: 1.5, 2: 1.25, 3: 1.0}, {1: 1.0, 2: 0.75, 3: 0.5}))
    assert (offset.detectable, offset.needed, offset.why) == (None, None, "no spread")
    zero = stats.sensitivity(stats.paired({1: 1.0, 2: 2.0, 3: 3.0}, {1: 2.0, 2: 1.0, 3: 3.0}))  # -1, +1, 0
    assert zero.detectable == pytest.approx(STATSMODELS_DETECTABLE[3], rel=1e-6)  # std 1
    assert (zero.needed, zero.why) == (None, "no difference")
    tiny = stats.sensitivity(stats.paired({1: 1.001, 2: 2.0, 3: 3.0}, {1: 2.0, 2: 1.0, 3: 3.0}))
    assert (tiny.needed, tiny.why) == (None, "more than 1000")
