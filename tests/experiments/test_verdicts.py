"""TOST, the pooled analysis' power and the four verdicts of a slice, against statsmodels 0.15.0 values
(``ttost_paired``, ``ttost_ind``) hard-coded, the paired t-test's own power functions and hand-built slices."""

import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from experiments.results.blockmodel import dunnett_critical, holm
from experiments.results.equivalence import (
    default_margin,
    detectable,
    higher_is_better,
    pooled_seeds_needed,
    power,
    tost,
)
from experiments.results.stats import detectable_effect, seeds_needed
from experiments.results.verdicts import DUNNETT, HOLM, analyse, clear_caches


@pytest.fixture(autouse=True)
def _fresh_caches():
    """Every test computes its verdicts itself (a cached analysis would hide a change in the code)."""
    clear_caches()


def test_tost_equals_statsmodels_ttost_paired_and_ttost_ind():
    x1, x2 = np.array([2.05, 2.11, 2.02, 2.07]), np.array([2.10, 2.13, 2.08, 2.11])
    d = x1 - x2
    se = d.std(ddof=1) / math.sqrt(4)
    # statsmodels: ttost_paired(x1, x2, -0.08, 0.08)[0], ttost_paired(x1, x2, -0.03, 0.03)[0]
    assert tost(d.mean(), se, 3, 0.08) == pytest.approx(0.010937699391379063, rel=1e-9)
    assert tost(d.mean(), se, 3, 0.03) == pytest.approx(0.8802787006819994, rel=1e-9)
    a, b = np.array([0.81, 0.79, 0.80, 0.82, 0.80]), np.array([0.805, 0.80, 0.795, 0.81])
    sp = math.sqrt(((a - a.mean()) ** 2).sum() + ((b - b.mean()) ** 2).sum()) / math.sqrt(7)
    # statsmodels: ttost_ind(a, b, -0.02, 0.02, usevar="pooled")[0]
    assert tost(a.mean() - b.mean(), sp * math.sqrt(1 / 5 + 1 / 4), 7, 0.02) == pytest.approx(
        0.011944782851297497, rel=1e-9
    )
    assert tost(0.0, 0.0, 3, 0.02) is None and tost(0.0, 0.1, 0, 0.02) is None and tost(0.0, 0.1, 3, 0) is None


def test_with_one_contrast_the_pooled_power_is_the_paired_t_tests():
    """Two schemes on complete seeds: the block model is the paired t-test (residual SD = paired SD / sqrt 2), so
    its seeds needed and detectable difference equal the paired t-test's (tests/experiments/test_stats.py pins
    those to statsmodels' TTestPower)."""
    diff, sd_pairs = 0.05, 0.08
    assert pooled_seeds_needed(diff, sd_pairs / math.sqrt(2), 2, 0.05) == seeds_needed(diff, sd_pairs, 0.05)
    n = 5
    se = sd_pairs / math.sqrt(n)
    crit = dunnett_critical(1, n - 1, 0.05)
    assert detectable(se, n - 1, crit) == pytest.approx(detectable_effect(n, 0.05) * sd_pairs, rel=1e-7)
    assert power(0.0, 4, crit) == pytest.approx(0.05, abs=1e-9)


def test_pooled_seeds_needed_is_the_smallest_n_at_the_power_under_dunnett():
    diff, sigma, schemes = 0.03, 0.04, 21
    n = pooled_seeds_needed(diff, sigma, schemes, 0.05)

    def at(k):
        df = (schemes - 1) * (k - 1)
        return power(diff / (sigma * math.sqrt(2 / k)), df, dunnett_critical(schemes - 1, df, 0.05))

    assert at(n) >= 0.8 > at(n - 1)
    assert n > pooled_seeds_needed(diff, sigma, 2, 0.05)  # 20 contrasts cost seeds against one
    assert pooled_seeds_needed(0.0, sigma, schemes, 0.05) is None
    assert pooled_seeds_needed(1e-4, sigma, schemes, 0.05) is None  # more than 1000
    with pytest.raises(ValueError):
        pooled_seeds_needed(diff, 0.0, schemes, 0.05)


def test_directions_and_margins():
    assert [higher_is_better(m) for m in ("val/loss", "test/fid", "val/ppl", "test/kid")] == [False] * 4
    assert [higher_is_better(m) for m in ("test/acc1", "test/downstream/avg", "test/precision", "test/is")] == [
        True
    ] * 4
    assert (default_margin("val/loss"), default_margin("test/acc1"), default_margin("test/fid")) == (0.02, 0.005, 1.0)
    assert default_margin("val/moe_aux") is None


def _slice(effects: dict[str, float], sd: float = 0.01, seeds=(1, 2, 3), rng_seed: int = 0) -> dict:
    rng = np.random.default_rng(rng_seed)
    block = {k: rng.normal(0, 0.05) for k in seeds}
    return {s: {k: 2.0 + e + block[k] + rng.normal(0, sd) for k in seeds} for s, e in effects.items()}


def test_the_four_verdicts_of_a_pooled_slice():
    data = _slice({"pre": 0.0, "good": -0.1, "bad": 0.1, "same": 0.0005, "near": 0.015}, sd=0.006)
    data["failed"] = {}
    a = analyse(data, "pre", "val/loss", 0.02)
    assert a.analysis == DUNNETT and a.df == 8  # 15 runs - 5 schemes - 3 seeds + 1
    words = {s: v.word for s, v in a.verdicts.items()}
    assert words == {"good": "better", "bad": "worse", "same": "equivalent", "near": "undecided",
                     "failed": "not comparable"}  # fmt: skip
    # the same slice read as an accuracy: better and worse swap
    assert analyse(data, "pre", "test/acc1", 0.02).verdicts["good"].word == "worse"
    # no margin: nothing is equivalent
    assert analyse(data, "pre", "val/loss", None).verdicts["same"].word == "undecided"
    near = a.verdicts["near"]
    assert near.needed is not None and near.needed > 3 and near.detectable > abs(near.difference)
    assert near.text().startswith("undecided (Dunnett, block model: p = ") and ", n = 3): ~" in near.text()
    assert "detectable" in near.text()
    assert a.verdicts["good"].text().startswith("better (Dunnett, block model: p ")
    assert a.verdicts["same"].text().startswith("equivalent within ±0.02 (Dunnett, block model, TOST p ")


def test_unequal_spreads_fall_back_to_each_cells_paired_test_with_holm():
    seeds = tuple(range(1, 9))
    data = _slice({"pre": 0.0, "a": -0.05, "b": 0.0, "c": 0.0}, sd=0.002, seeds=seeds, rng_seed=3)
    rng = np.random.default_rng(5)
    data["c"] = {k: v + rng.normal(0, 0.3) for k, v in data["c"].items()}  # one cell 150 x noisier
    a = analyse(data, "pre", "val/loss", 0.02)
    assert a.analysis == HOLM and a.spread_p < 0.05
    raw = [scipy_stats.ttest_rel([data[s][k] for k in seeds], [data["pre"][k] for k in seeds]).pvalue
           for s in ("a", "b", "c")]  # fmt: skip
    assert [a.verdicts[s].p for s in ("a", "b", "c")] == pytest.approx(holm(raw), rel=1e-9)
    assert a.verdicts["a"].word == "better" and a.verdicts["a"].analysis == HOLM
    assert "spreads differ" in a.describe() and "over 3 cells" in a.describe()
    # TOST per cell on its own paired differences (formula of statsmodels' ttost_paired), Holm over the cells
    tosts = []
    for s in ("a", "b", "c"):
        d = np.array([data[s][k] - data["pre"][k] for k in seeds])
        se = d.std(ddof=1) / math.sqrt(len(d))
        tosts.append(max(scipy_stats.t.sf((d.mean() + 0.02) / se, 7), scipy_stats.t.cdf((d.mean() - 0.02) / se, 7)))
    assert [a.verdicts[s].p_equivalence for s in ("a", "b", "c")] == pytest.approx(holm(tosts), rel=1e-9)
    assert a.verdicts["b"].word == "equivalent" and a.verdicts["b"].text().startswith("equivalent within ±0.02 (")
    c = a.verdicts["c"]  # undecided: the paired t-test's own numbers at Holm's first level, alpha / 3
    d = np.array([data["c"][k] - data["pre"][k] for k in seeds])
    assert c.word == "undecided" and c.needed == seeds_needed(d.mean(), d.std(ddof=1), 0.05 / 3)
    assert c.detectable == pytest.approx(detectable_effect(8, 0.05 / 3) * d.std(ddof=1), rel=1e-9)
    data["lone"] = {99: 2.0}  # no seed shared with pre
    assert analyse(data, "pre", "val/loss", 0.02).verdicts["lone"].word == "not comparable"


def test_a_slice_without_its_reference_or_spread():
    no_ref = analyse({"pre": {}, "x": {1: 1.0, 2: 1.1}}, "pre", "val/loss", 0.02)
    assert no_ref.verdicts["x"].word == "not comparable" and no_ref.analysis == ""
    one_seed = analyse({"pre": {1: 1.0}, "x": {1: 0.9}}, "pre", "val/loss", 0.02).verdicts["x"]
    assert one_seed.word == "undecided" and one_seed.why == "no residual df" and one_seed.n == 1


def test_a_stricter_look_threshold_leaves_a_cell_undecided():
    data = _slice({"pre": 0.0, "x": -0.02}, sd=0.004, seeds=(1, 2, 3, 4))
    loose = analyse(data, "pre", "val/loss", None)
    strict = analyse(data, "pre", "val/loss", None, thresholds=(0.0005, 0.0005))
    assert loose.verdicts["x"].word == "better" and 0.0005 < loose.verdicts["x"].p < 0.05
    assert strict.verdicts["x"].word == "undecided" and strict.verdicts["x"].threshold == 0.0005
