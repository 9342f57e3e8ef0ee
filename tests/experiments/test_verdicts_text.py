"""The verdict lines' wording in the cases the exports rarely hold: no p-value, p exactly 0.001, an amount of
exactly 100, an undecided cell without a test or a reason, an equivalence read at a look, a slice whose spread
cannot be checked or that has one contrast. Written for the formatting mutants that the table tests
(test_compare*.py, test_paper_table.py) and the verdict tests left alive (mutmut on ``Verdict.text / settle /
stage``, ``SliceAnalysis.describe``, ``_amount``, ``_p``)."""

from __future__ import annotations

from experiments.results.verdicts import DUNNETT, HOLM, SliceAnalysis, Verdict


def test_p_values_and_amounts_at_their_edges():
    assert Verdict("better", 3, -0.1, None, analysis=DUNNETT).text() == "better (Dunnett, block model: p -, n = 3)"
    assert Verdict("worse", 4, 0.1, 0.001, analysis=HOLM).text() == "worse (paired t, Holm: p = 0.001, n = 4)"
    assert Verdict("worse", 4, 0.1, 0.00099, analysis=HOLM).text() == "worse (paired t, Holm: p < 0.001, n = 4)"
    amounts = {100.0: "100", 250.4: "250", 99.4: "99", 12.0: "12", 0.5: "0.50", 0.0123: "0.012"}
    for value, shown in amounts.items():
        v = Verdict("undecided", 3, 0.01, 0.5, analysis=DUNNETT, needed=40, detectable=value)
        assert v.text() == f"undecided (Dunnett, block model: p = 0.5, n = 3): ~40 seeds; detectable {shown}", value


def test_undecided_and_not_comparable_cells_without_a_test_or_a_reason():
    assert Verdict("undecided", 3).text() == "undecided (n = 3): no test"
    assert Verdict("undecided", 1, why="one pair").text() == "undecided (n = 1): one pair, no test"
    assert Verdict("undecided", 3, detectable=0.5).text() == "undecided (n = 3): no difference seeds; detectable 0.50"
    assert Verdict("not comparable", 0).text() == "not comparable"
    assert Verdict("not comparable", 0, why="no finished run").text() == "not comparable (no finished run)"


def test_a_look_gives_the_difference_its_level_and_the_equivalence_none():
    kw = {"margin": 0.02, "analysis": DUNNETT, "threshold": 0.0094, "look": (2, 3)}
    assert Verdict("better", 5, -0.1, 0.0004, **kw).text() == (
        "better (Dunnett, block model: p < 0.001, n = 5, look 2 of 3 at p < 0.0094)"
    )
    assert Verdict("equivalent", 5, 0.001, 0.5, 0.004, **kw).text() == (
        "equivalent within ±0.02 (Dunnett, block model, TOST p = 0.004, n = 5, look 2 of 3)"
    )
    assert Verdict("better", 5, -0.1, 0.0004, analysis=DUNNETT).stage(False) == ""


def test_a_slice_described_with_one_or_two_contrasts_and_no_spread_check():
    one = SliceAnalysis({"x": Verdict("undecided", 2)}, DUNNETT, None, df=1, sigma=0.0)
    assert one.describe() == "Dunnett, block model (1 contrast, residual df 1; spread not checkable)"
    two = {"x": Verdict("better", 3), "y": Verdict("undecided", 3), "z": Verdict("not comparable", 1)}
    assert SliceAnalysis(two, DUNNETT, 0.5, df=4, sigma=0.01234).describe() == (
        "Dunnett, block model (2 contrasts, residual df 4, pooled SD 0.0123; Brown-Forsythe p = 0.5)"
    )
    assert SliceAnalysis(two, HOLM, 0.0123).describe() == (
        "paired t, Holm over 2 cells (spreads differ: Brown-Forsythe p = 0.012)"
    )
    assert SliceAnalysis({}, "", None).describe() == "no finished reference run"
