"""Verdicts that settle: every cell of a sweep, against a reference scheme, is **better**, **worse**,
**equivalent within ±delta** or **undecided**, from one analysis per slice with the family-wise error controlled.

A slice is the cells that differ only in their scheme (one learning rate, one option). Its finished runs go
into the randomized-block model (:mod:`experiments.results.blockmodel`; stalled, diverged and crashed runs are
left out, never averaged in):

1. Brown-Forsythe on the cells' paired differences to the reference (:func:`blockmodel.spread_check`). Where
   it rejects equal spread (p < alpha), each cell keeps its own paired t-test and TOST, adjusted by Holm over
   the slice's cells ("paired t, Holm").
2. Otherwise every contrast is tested on the pooled residual variance, adjusted by Dunnett on the block model
   ("Dunnett, block model"), and its TOST uses the same standard error and degrees of freedom, adjusted by
   Holm over the slice's cells (so a slice's equivalence claims are family-wise controlled too).
3. The verdict: the adjusted difference p below the threshold (alpha; at a group-sequential look, that look's
   nominal level) -> better or worse by the sign and the metric's direction; else the adjusted TOST p below
   its threshold -> equivalent within ±delta; else undecided, with the seeds per cell the pooled analysis
   needs for 80 % power at the observed difference and the smallest difference its seeds detect.

A cell with no finished run, or a slice whose reference has none, is **not comparable**.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

from experiments.results import blockmodel, sequential
from experiments.results.blockmodel import dunnett_critical, dunnett_p_values, fit_blocks, holm, spread_check
from experiments.results.equivalence import POWER, detectable, higher_is_better, pooled_seeds_needed, tost
from experiments.results.sequential import look_thresholds
from experiments.results.stats import detectable_effect, paired, seeds_needed

ALPHA = 0.05
DUNNETT = "Dunnett, block model"
HOLM = "paired t, Holm"
WORDS = ("better", "worse", "equivalent", "undecided", "not comparable")


@dataclass(frozen=True)
class Verdict:
    """One cell against the reference.

    Attributes:
        word: one of :data:`WORDS`.
        n: the cell's finished seeds in the analysis.
        difference: scheme - reference (the block model's contrast, or the mean paired difference).
        p: the adjusted two-sided p-value of the difference (None: no test).
        p_equivalence: the adjusted TOST p-value (None: no margin or no test).
        margin: the equivalence margin delta.
        analysis: :data:`DUNNETT` or :data:`HOLM` ("" when not comparable).
        needed: seeds per cell the analysis needs for 80 % power at the observed difference (None: see ``why``).
        detectable: the smallest true difference the analysis detects with 80 % power at its seeds.
        why: why a number is missing (``no spread``, ``no residual df``, ``more than 1000``, ...).
        threshold: the level the adjusted p-values were compared with.
        look: ``(k, K)`` when the verdict is read at look ``k`` of a sweep run in ``K`` stages (its ``threshold``
            is then that look's nominal level); None for a fixed-sample verdict.
    """

    word: str
    n: int
    difference: float | None = None
    p: float | None = None
    p_equivalence: float | None = None
    margin: float | None = None
    analysis: str = ""
    needed: int | None = None
    detectable: float | None = None
    why: str | None = None
    threshold: float = ALPHA
    look: tuple[int, int] | None = None

    @property
    def decided(self) -> bool:
        return self.word in ("better", "worse", "equivalent")

    def text(self) -> str:
        """``better (Dunnett, block model: p = 0.003, n = 3)`` and the like; undecided says what would settle it."""
        if self.word == "not comparable":
            return "not comparable" + (f" ({self.why})" if self.why else "")
        if self.word in ("better", "worse"):
            return f"{self.word} ({self.analysis}: p {_p(self.p)}, n = {self.n}{self.stage()})"
        if self.word == "equivalent":
            tost_p, look = _p(self.p_equivalence), self.stage(False)
            return f"equivalent within ±{self.margin:g} ({self.analysis}, TOST p {tost_p}, n = {self.n}{look})"
        how = f"{self.analysis}: p {_p(self.p)}, " if self.analysis and self.p is not None else ""
        return f"undecided ({how}n = {self.n}{self.stage()}): {self.settle()}"

    def stage(self, level: bool = True) -> str:
        """``, look 1 of 3 at p < 0.00069`` for a staged verdict (with its look's nominal level for the
        difference; ``level`` False: without it); "" for a fixed-sample verdict."""
        if self.look is None:
            return ""
        at = f" at p < {self.threshold:.2g}" if level else ""
        return f", look {self.look[0]} of {self.look[1]}{at}"

    def settle(self) -> str:
        """What would settle an undecided cell: ``~12 seeds; detectable 0.031``."""
        if self.detectable is None:
            return f"{self.why}, no test" if self.why else "no test"
        seeds = f"~{self.needed} seeds" if self.needed is not None else f"{self.why or 'no difference'} seeds"
        return f"{seeds}; detectable {_amount(self.detectable)}"


def _p(p: float | None) -> str:
    return "-" if p is None else "< 0.001" if p < 0.001 else f"= {p:.2g}"


def _amount(value: float) -> str:
    return f"{value:.0f}" if value >= 100 else f"{value:#.2g}".rstrip(".")


def _word(difference: float, higher: bool) -> str:
    return "better" if (difference > 0) == higher else "worse"


def _decide(diff, p, p_eq, higher, threshold, threshold_eq) -> str:
    if p is not None and p < threshold and diff != 0:
        return _word(diff, higher)
    if p_eq is not None and p_eq < threshold_eq:
        return "equivalent"
    return "undecided"


def _pooled(fit, data, reference, margin, higher, alpha, threshold, threshold_eq, sensitivity) -> dict[str, Verdict]:
    out = {s: Verdict("not comparable", len(data[s]), why="no seed shared") for s in fit.dropped}
    if not fit.contrasts:
        return out
    m = len(fit.contrasts)
    if not fit.sigma:  # no residual df, or identical runs: no test
        why = "no residual df" if fit.sigma is None else "no spread"
        for c in fit.contrasts:
            out[c.scheme] = Verdict("undecided", c.n, c.estimate, margin=margin, analysis=DUNNETT, why=why,
                                    threshold=threshold)  # fmt: skip
        return out
    p_adj = dunnett_p_values([c.t for c in fit.contrasts], fit.correlation(), fit.df)
    p_eq = holm([tost(c.estimate, c.se, c.df, margin) if margin else None for c in fit.contrasts])
    critical = dunnett_critical(m, fit.df, alpha)  # complete seeds' correlation 0.5: what "detectable" assumes
    for c, p, q in zip(fit.contrasts, p_adj, p_eq, strict=True):
        word = _decide(c.estimate, p, q, higher, threshold, threshold_eq)
        if word != "undecided" or not sensitivity:
            out[c.scheme] = Verdict(word, c.n, c.estimate, p, q, margin, DUNNETT, threshold=threshold)
            continue
        needed = pooled_seeds_needed(c.estimate, fit.sigma, m + 1, alpha)
        why = None if needed is not None else "no difference" if c.estimate == 0 else "more than 1000"
        out[c.scheme] = Verdict(word, c.n, c.estimate, p, q, margin, DUNNETT, needed,
                                detectable(c.se, c.df, critical, POWER), why, threshold)  # fmt: skip
    return out


def _per_cell(data, reference, margin, higher, alpha, threshold, threshold_eq, sensitivity) -> dict[str, Verdict]:
    schemes = [s for s in data if s != reference]
    comparisons = {s: paired(data[s], data[reference]) for s in schemes}
    p_adj = holm([c.p_t if c is not None and c.difference.std else None for c in comparisons.values()])
    p_eq = holm([
        tost(c.difference.mean, c.difference.std / math.sqrt(c.n), c.n - 1, margin)
        if margin and c is not None and c.n > 1 and c.difference.std else None
        for c in comparisons.values()
    ])  # fmt: skip
    m = len(schemes)
    out = {}
    for s, p, q in zip(schemes, p_adj, p_eq, strict=True):
        c = comparisons[s]
        if c is None:
            out[s] = Verdict("not comparable", len(data[s]), why="no seed shared")
            continue
        d = c.difference
        word = _decide(d.mean, p, q, higher, threshold, threshold_eq)
        if word != "undecided" or not sensitivity:
            out[s] = Verdict(word, c.n, d.mean, p, q, margin, HOLM, threshold=threshold)
            continue
        if c.n < 2 or not d.std:
            why = "one pair" if c.n < 2 else "no spread"
            out[s] = Verdict(word, c.n, d.mean, p, q, margin, HOLM, why=why, threshold=threshold)
            continue
        needed = seeds_needed(d.mean, d.std, alpha / m)  # Holm's first step: alpha / m
        why = None if needed is not None else "no difference" if d.mean == 0 else "more than 1000"
        out[s] = Verdict(word, c.n, d.mean, p, q, margin, HOLM, needed, detectable_effect(c.n, alpha / m) * d.std,
                         why, threshold)  # fmt: skip
    return out


@dataclass(frozen=True)
class SliceAnalysis:
    """The verdicts of one slice and how they were reached.

    Attributes:
        verdicts: ``{scheme: Verdict}`` for every scheme but the reference.
        analysis: :data:`DUNNETT` or :data:`HOLM` ("" without a reference).
        spread_p: the Brown-Forsythe p-value (None: not checkable).
        df: residual degrees of freedom of the block model; sigma its pooled residual SD.
    """

    verdicts: dict[str, Verdict]
    analysis: str
    spread_p: float | None
    df: int | None = None
    sigma: float | None = None

    def describe(self) -> str:
        """One line: the analysis, its degrees of freedom and the spread check."""
        if not self.analysis:
            return "no finished reference run"
        m = len([v for v in self.verdicts.values() if v.word != "not comparable"])
        check = "spread not checkable" if self.spread_p is None else f"Brown-Forsythe p = {self.spread_p:.2g}"
        if self.analysis == HOLM:
            return f"{HOLM} over {m} cells (spreads differ: {check})"
        sd = "" if not self.sigma else f", pooled SD {self.sigma:.3g}"
        return f"{DUNNETT} ({m} contrast{'s' if m != 1 else ''}, residual df {self.df}{sd}; {check})"


def analyse(data: Mapping[str, Mapping], reference: str, metric: str, margin: float | None, alpha: float = ALPHA,
            thresholds: tuple[float, float] | None = None, sensitivity: bool = True) -> SliceAnalysis:  # fmt: skip
    """The verdict of every scheme of one slice against ``reference``.

    Args:
        data: ``{scheme: {seed: value}}`` of the finished runs (a scheme with none is not comparable).
        reference: the scheme compared with.
        metric: the metric's name (its direction: :func:`equivalence.higher_is_better`).
        margin: the equivalence margin (None: no equivalence verdict).
        alpha: the family-wise level.
        thresholds: ``(difference, equivalence)`` levels of a group-sequential look
            (:func:`experiments.results.sequential.look_thresholds`); default ``(alpha, alpha)``.
        sensitivity: compute an undecided cell's seeds needed and detectable difference (the slow part; the
            simulations leave it out).
    """
    key = tuple((s, tuple(sorted(((k, float(v)) for k, v in d.items()), key=repr))) for s, d in data.items())
    return _analyse_cached(key, reference, metric, margin, alpha, thresholds or (alpha, alpha), sensitivity)


def analyse_at_look(data: Mapping[str, Mapping], reference: str, metric: str, margin: float | None, look: int,
                    fractions: Sequence[float], alpha: float = ALPHA,
                    sensitivity: bool = True) -> SliceAnalysis:  # fmt: skip
    """:func:`analyse` at look ``look`` (1-based) of a staged sweep whose looks have the information fractions
    ``fractions`` (seeds at each stage over the cap's): the adjusted p-values are compared with that look's
    Lan-DeMets O'Brien-Fleming nominal levels (:func:`experiments.results.sequential.look_thresholds`)."""
    return analyse(data, reference, metric, margin, alpha, look_thresholds(look, fractions, alpha), sensitivity)


def _analyse(key, reference, metric, margin, alpha, thresholds, sensitivity) -> SliceAnalysis:
    data = {s: dict(values) for s, values in key}
    empty = {s: Verdict("not comparable", 0, why="no finished run") for s, v in data.items() if not v}
    data = {s: v for s, v in data.items() if v}
    if reference not in data:
        why = f"no finished {reference} run"
        return SliceAnalysis({s: Verdict("not comparable", len(data.get(s, {})), why=why)
                              for s in (*data, *empty) if s != reference}, "", None)  # fmt: skip
    higher = higher_is_better(metric)
    groups = {}  # each cell's paired differences to the reference (the spread check's groups)
    for s in data:
        common = [k for k in data[s] if k in data[reference]]
        if s != reference and len(common) >= 2:
            groups[s] = [data[s][k] - data[reference][k] for k in common]
    spread_p = spread_check(groups)
    args = (data, reference, margin, higher, alpha, *thresholds, sensitivity)
    if spread_p is not None and spread_p < alpha:
        return SliceAnalysis({**_per_cell(*args), **empty}, HOLM, spread_p)
    fit = fit_blocks(data, reference)
    return SliceAnalysis({**_pooled(fit, *args), **empty}, DUNNETT, spread_p, fit.df, fit.sigma)


_analyse_cached = lru_cache(maxsize=256)(_analyse)  # the tables ask for a slice's verdicts several times


def clear_caches() -> None:
    """Forget every cached analysis, critical value, quadrature and boundary (tests start from nothing)."""
    _analyse_cached.cache_clear()
    blockmodel.clear_caches()
    sequential.clear_caches()
