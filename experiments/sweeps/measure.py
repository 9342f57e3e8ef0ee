"""A run's value for the sweep's metric, and the measurement's own spread: ``last_evals: k`` in a sweep file.

With ``k = 1`` (the default) a run's value is its final validation (``summary.json``'s ``final_val``, what the
comparison's run table holds). With ``k > 1`` it is the mean of the metric over the run's last ``k``
validations (``val_curve``), which averages out the evaluation's own noise (a validation on a sample of the
split, the last steps' fluctuation), and the standard deviation over those ``k`` is the measurement's spread,
to be read beside the spread between seeds: when it is a large part of the seed spread, more validation
(``limit_val_batches``) is cheaper than more seeds. A run with fewer than ``k`` validations uses those it has
(its spread then over fewer; none with one).
"""

from __future__ import annotations

import math
import statistics

from experiments.results.cells import PRIMARY


def last_evaluations(summary: dict, metric: str, k: int) -> list[float]:
    """The metric's finite values at the run's last ``k`` validations that logged it, oldest first."""
    values = []
    for point in summary.get("val_curve") or []:
        metrics = point[1] if isinstance(point, list | tuple) and len(point) == 2 else None
        value = metrics.get(metric) if isinstance(metrics, dict) else None
        if isinstance(value, int | float) and not isinstance(value, bool):
            values.append(float(value))
    return [v for v in values[-k:] if math.isfinite(v)]


def run_value(summary: dict, row_value: float | None, metric: str, k: int) -> tuple[float | None, float | None]:
    """``(value, measurement SD)`` of one run: its final value when ``k`` is 1 or the metric is a test metric
    (measured once), else the mean and SD of its last ``k`` validations."""
    if k == 1 or not metric.startswith("val/"):
        return row_value, None
    values = last_evaluations(summary, metric, k)
    if not values:
        return row_value, None
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else None)


def metric_values(comparison, k: int) -> dict[str, tuple[float | None, float | None]]:
    """``{run: (value, measurement SD)}`` for every run of a :class:`~experiments.results.compare.Comparison`."""
    return {
        row["run"]: run_value(comparison.summaries.get(row["run"], {}), row.get(PRIMARY), comparison.metric, k)
        for row in comparison.table
    }
