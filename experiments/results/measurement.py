"""A run's value for the sweep's metric, and the measurement's own spread: ``last_evals: k`` in a sweep file.

One measurement for the sweep and for every later ``compare`` of it: the sweep (its tuning picks, its staged
looks, its tables) and :func:`experiments.results.compare.load_comparison` (which reads ``last_evals`` from
``sweep.yaml``) both take a run's value from :func:`run_value`, so an exported comparison shows the numbers the
sweep decided on.

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

from experiments.results.cells import OK, PRIMARY, group


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


MEASUREMENT_TABLE = "measurement.md"


def with_last_evals(comparison, k: int):
    """The comparison with every run's value replaced by the mean of its last ``k`` validations (and its
    measurement SD under ``measurement_sd``), the cells regrouped: what the tables are written from."""
    values = metric_values(comparison, k)
    for row in comparison.table:
        row[PRIMARY], row["measurement_sd"] = values[row["run"]]
    comparison.cells = group(comparison.table)
    return comparison


def spread_markdown(comparison, k: int) -> str:
    """``measurement.md``: per cell the seed spread (SD over seeds of the runs' values) beside the measurement's
    own spread (the runs' SDs over their last ``k`` validations, pooled as a root mean square)."""
    lines = [
        f"## {comparison.metric}: mean of each run's last {k} validations; seed spread vs measurement spread",
        "",
        "| cell | n | mean | SD over seeds | SD over a run's last evaluations (pooled) | ratio |",
        "|---|---|---|---|---|---|",
    ]
    for cell in comparison.cells:
        runs = [r for r in cell.runs if r.get("status") == OK and r.get(PRIMARY) is not None]
        values = [float(r[PRIMARY]) for r in runs]
        within = [float(r["measurement_sd"]) for r in runs if r.get("measurement_sd") is not None]
        seed_sd = statistics.stdev(values) if len(values) > 1 else None
        pooled = math.sqrt(statistics.fmean(s * s for s in within)) if within else None
        ratio = f"{pooled / seed_sd:.2g}" if seed_sd and pooled is not None else "-"
        name = "-".join(str(v) for _, v in cell.key if v is not None)
        mean = f"{statistics.fmean(values):.4f}" if values else "-"
        lines.append(f"| {name} | {len(values)} | {mean} | {_sd(seed_sd)} | {_sd(pooled)} | {ratio} |")
    lines += [
        "",
        "ratio = measurement SD / seed SD: near 1 or above, the evaluation's own noise is a large part of the seed "
        "spread, and a longer validation (more batches) narrows the comparison more cheaply than more seeds.",
    ]
    return "\n".join(lines) + "\n"


def _sd(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"
