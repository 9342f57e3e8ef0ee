"""Every field of the per-cell fallback's verdicts (spreads differ: each cell's own paired t-test and TOST, Holm
across the slice), including the cells it cannot test: one pair, no spread, no seed shared.

References computed here by other means: scipy's ``ttest_rel``, Holm's step-down written out, TOST by its formula
(statsmodels' ``ttost_paired``), seeds and detectable differences from statsmodels' ``TTestPower`` (0.15.0, run
outside the suite, values hard-coded below) at the fallback's first Holm level, alpha over the slice's cells.
Written for the mutants that changed a field no other test read (the difference, n, margin, threshold, why of an
undecided or decided cell)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as scipy_stats
from scipy.optimize import brentq

from experiments.results.verdicts import HOLM, Verdict, analyse, clear_caches
from tests.experiments.test_verdicts import _slice

SEEDS = tuple(range(1, 9))
# statsmodels 0.15.0, TTestPower().solve_power(..., power=0.8), on the effect sizes (|mean| / sd of the paired
# differences) these tests' seeded data give; the tests check that they still give those effect sizes.
EFFECT_C, PAIRS_C = 0.3269668734674663, 100.810203100149  # effect_size=EFFECT_C, alpha=0.05 / 3 -> nobs
DETECTABLE_8 = 1.450343041929203  # nobs=8, alpha=0.05 / 3 -> effect_size, in SDs
EFFECT_TWO, PAIRS_TWO = 0.3030457633656568, 130.5009863696437  # effect_size=EFFECT_TWO, alpha=0.05 / 5 -> nobs
EFFECT_TINY, PAIRS_TINY = 0.018708286933867713, 34602.20713859752  # effect_size=EFFECT_TINY, alpha=0.05 / 6 -> nobs
DETECTABLE_8_6 = 1.6495360654915068  # nobs=8, alpha=0.05 / 6 -> effect_size, in SDs
FIELDS = ("word", "n", "difference", "p", "p_equivalence", "margin", "analysis", "needed", "detectable", "why",
          "threshold", "look")  # fmt: skip


@pytest.fixture(autouse=True)
def _fresh_caches():
    clear_caches()
    yield
    clear_caches()


def holm_by_hand(p: list[float]) -> list[float]:
    order = sorted(range(len(p)), key=p.__getitem__)
    out, running = [0.0] * len(p), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p) - rank) * p[i]))
        out[i] = running
    return out


def tost_by_hand(d: np.ndarray, margin: float) -> float:
    se, df = d.std(ddof=1) / math.sqrt(len(d)), len(d) - 1
    return max(scipy_stats.t.sf((d.mean() + margin) / se, df), scipy_stats.t.cdf((d.mean() - margin) / se, df))


def same(got: Verdict, want: dict) -> None:
    for name in FIELDS:
        expected, value = want.get(name, Verdict.__dataclass_fields__[name].default), getattr(got, name)
        if isinstance(expected, float):  # statsmodels solves the power to about 1e-8
            assert value == pytest.approx(expected, rel=1e-6 if name == "detectable" else 1e-9), (name, value, expected)
        else:
            assert value == expected, (name, value, expected)


def detectable_by_hand(n: int, alpha: float) -> float:
    """The effect (in SDs) a two-sided paired t-test of n pairs detects with 80 % power, from scipy's noncentral t
    (statsmodels' solver stops short at one degree of freedom)."""
    crit = scipy_stats.t.isf(alpha / 2, n - 1)

    def power(ncp: float) -> float:
        return scipy_stats.nct.sf(crit, n - 1, ncp) + np.nan_to_num(scipy_stats.nct.cdf(-crit, n - 1, ncp))

    return brentq(lambda e: power(e * math.sqrt(n)) - 0.8, 1e-6, 1e4, xtol=1e-12)


def noisy(data: dict) -> dict:
    rng = np.random.default_rng(5)
    return {k: v + rng.normal(0, 0.3) for k, v in data.items()}  # 150 x the others' noise: the spreads differ


def test_decided_and_undecided_cells_carry_their_own_numbers_only():
    data = _slice({"pre": 0.0, "a": -0.05, "b": 0.0, "c": 0.0}, sd=0.002, seeds=SEEDS, rng_seed=3)
    data["c"] = noisy(data["c"])
    result = analyse(data, "pre", "val/loss", 0.02)
    assert result.analysis == HOLM
    diffs = {s: np.array([data[s][k] - data["pre"][k] for k in SEEDS]) for s in "abc"}
    p = holm_by_hand([scipy_stats.ttest_rel([data[s][k] for k in SEEDS],
                                            [data["pre"][k] for k in SEEDS]).pvalue for s in "abc"])  # fmt: skip
    q = holm_by_hand([tost_by_hand(diffs[s], 0.02) for s in "abc"])
    common = {"n": 8, "margin": 0.02, "analysis": HOLM, "threshold": 0.05}
    same(result.verdicts["a"], {"word": "better", "difference": diffs["a"].mean(), "p": p[0], "p_equivalence": q[0],
                                **common})  # fmt: skip
    same(result.verdicts["b"], {"word": "equivalent", "difference": diffs["b"].mean(), "p": p[1],
                                "p_equivalence": q[1], **common})  # fmt: skip
    sd = diffs["c"].std(ddof=1)
    assert abs(diffs["c"].mean()) / sd == pytest.approx(EFFECT_C, rel=1e-12)
    needed, detectable = math.ceil(PAIRS_C), DETECTABLE_8 * sd
    assert needed == 101
    same(result.verdicts["c"], {"word": "undecided", "difference": diffs["c"].mean(), "p": p[2], "p_equivalence": q[2],
                                "needed": needed, "detectable": detectable, **common})  # fmt: skip


def test_the_cells_a_paired_test_cannot_judge_say_why():
    data = _slice({"pre": 0.0, "c": 0.0}, sd=0.002, seeds=SEEDS, rng_seed=3)
    data["c"] = noisy(data["c"])
    pre = data["pre"]
    data["flat"] = {k: v + 0.01 for k, v in pre.items()}  # every seed exactly +0.01: no spread
    data["one"] = {1: pre[1] - 0.01}  # one pair
    data["two"] = {1: pre[1] - 0.01, 2: pre[2] + 0.004}  # two pairs: a test on one degree of freedom
    data["lone"] = {99: 2.0}  # no seed shared with pre
    result = analyse(data, "pre", "val/loss", 0.02)
    assert result.analysis == HOLM
    d_c = np.array([data["c"][k] - pre[k] for k in SEEDS])
    d_two = np.array([data["two"][k] - pre[k] for k in (1, 2)])
    raw = [scipy_stats.ttest_rel([data["c"][k] for k in SEEDS], [pre[k] for k in SEEDS]).pvalue,
           scipy_stats.ttest_rel([data["two"][k] for k in (1, 2)], [pre[k] for k in (1, 2)]).pvalue]  # fmt: skip
    p, q = holm_by_hand(raw), holm_by_hand([tost_by_hand(d_c, 0.02), tost_by_hand(d_two, 0.02)])
    common = {"margin": 0.02, "analysis": HOLM, "threshold": 0.05, "word": "undecided"}
    same(result.verdicts["flat"], {"n": 8, "difference": 0.01, "why": "no spread", **common})
    same(result.verdicts["one"], {"n": 1, "difference": -0.01, "why": "one pair", **common})
    same(result.verdicts["lone"], {"word": "not comparable", "n": 1, "why": "no seed shared"})
    # the undecided numbers at Holm's first level over the slice's five cells, alpha / 5
    sd = d_two.std(ddof=1)
    assert abs(d_two.mean()) / sd == pytest.approx(EFFECT_TWO, rel=1e-12)
    needed = math.ceil(PAIRS_TWO)
    same(result.verdicts["two"], {"n": 2, "difference": d_two.mean(), "p": p[1], "p_equivalence": q[1],
                                  "needed": needed, "detectable": detectable_by_hand(2, 0.01) * sd,
                                  **common})  # fmt: skip
    assert result.verdicts["c"].p == pytest.approx(p[0], rel=1e-9)


def test_cells_after_an_unpaired_one_and_undecided_cells_no_seeds_settle():
    """After a cell with no seed shared, the next cells are still judged; two pairs without spread are "no
    spread" (not "one pair"); a mean difference of exactly 0 with spread needs "no difference" seeds, a tiny one
    "more than 1000" (its TTestPower nobs: 34602), each still with its detectable difference at Holm's first level
    over the slice's six cells. Every level is a look's (0.045, 0.04), not alpha. Exact binary fractions keep the
    differences exact."""
    pre = {k: 2.0 + k / 16 for k in SEEDS}
    data = {"pre": pre, "c": noisy(pre), "lone": {99: 2.0}, "flat2": {1: pre[1] + 0.25, 2: pre[2] + 0.25},
            "zero": {k: v + (0.25 if k % 2 else -0.25) for k, v in pre.items()},
            "tiny": {k: v + 0.001 + (0.05 if k % 2 else -0.05) for k, v in pre.items()},
            "good": {k: v - 0.1 + (0.001 if k % 2 else -0.001) for k, v in pre.items()}}  # fmt: skip
    result = analyse(data, "pre", "val/loss", 0.02, thresholds=(0.045, 0.04))
    assert result.analysis == HOLM
    tested = ("c", "zero", "tiny", "good")
    diffs = {s: np.array([data[s][k] - pre[k] for k in SEEDS]) for s in tested}
    p = dict(zip(tested, holm_by_hand([scipy_stats.ttest_rel([data[s][k] for k in SEEDS],
                                                             [pre[k] for k in SEEDS]).pvalue for s in tested]),
                 strict=True))  # fmt: skip
    q = dict(zip(tested, holm_by_hand([tost_by_hand(diffs[s], 0.02) for s in tested]), strict=True))
    common = {"n": 8, "margin": 0.02, "analysis": HOLM, "threshold": 0.045, "word": "undecided"}
    assert diffs["zero"].mean() == 0.0 and diffs["zero"].std(ddof=1) > 0
    same(result.verdicts["zero"], {"difference": 0.0, "p": p["zero"], "p_equivalence": q["zero"],
                                   "detectable": DETECTABLE_8_6 * diffs["zero"].std(ddof=1), "why": "no difference",
                                   **common})  # fmt: skip
    d = diffs["tiny"]
    assert abs(d.mean()) / d.std(ddof=1) == pytest.approx(EFFECT_TINY, rel=1e-12) and PAIRS_TINY > 1000
    same(result.verdicts["tiny"], {"difference": d.mean(), "p": p["tiny"], "p_equivalence": q["tiny"],
                                   "detectable": DETECTABLE_8_6 * d.std(ddof=1), "why": "more than 1000",
                                   **common})  # fmt: skip
    same(result.verdicts["flat2"], {**common, "n": 2, "difference": 0.25, "why": "no spread"})
    same(result.verdicts["good"], {**common, "word": "better", "difference": diffs["good"].mean(), "p": p["good"],
                                   "p_equivalence": q["good"]})  # fmt: skip
    same(result.verdicts["lone"], {"word": "not comparable", "n": 1, "why": "no seed shared"})
    assert result.verdicts["c"].threshold == 0.045 and result.verdicts["c"].needed is not None
