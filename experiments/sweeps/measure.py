"""The sweep's measurement (``last_evals``) lives in :mod:`experiments.results.measurement`, where ``compare``
reads it too; the sweep's own modules import it from here."""

from experiments.results.measurement import (
    MEASUREMENT_TABLE,
    last_evaluations,
    metric_values,
    run_value,
    spread_markdown,
    with_last_evals,
)

__all__ = ["MEASUREMENT_TABLE", "last_evaluations", "metric_values", "run_value", "spread_markdown", "with_last_evals"]
