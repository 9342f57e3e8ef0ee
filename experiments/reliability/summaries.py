"""A run's ``summary.json`` handed back to a reader: every field a reader uses has its JSON type, or one line.

Shared by the comparison (:mod:`experiments.results.runs`) and ``export`` (its model card reads the test
metrics): a summary edited or written by something else (``test`` as a list, a metric as a string) is
``run summary X: test=[...] is a list; valid: dict``, never an ``AttributeError`` deep inside a reader.
"""

from __future__ import annotations

from pathlib import Path

from experiments.reliability.errors import SuiteError

_NUMBER = (int, float)
# What the comparison reads from a summary, and the JSON types it may hold (None is always allowed).
SUMMARY_FIELDS: dict[str, tuple[type, ...]] = {
    "task": (str,), "scheme": (str,), "status": (str,), "error": (str,), "lr": _NUMBER, "params": (int,),
    "steps": (int,), "wall_time_s": _NUMBER, "final_train_loss": _NUMBER, "final_val": (dict,),
    "baseline_loss": _NUMBER, "diverged_at": (int,), "spikes": (int,), "train_curve": (list,),
    "val_curve": (list,), "test": (dict,), "test_protocol": (dict,), "whole_split_val": (dict,),
    "whole_split_val_protocol": (dict,),
}  # fmt: skip


def check_summary(summary: dict, path: Path) -> dict:
    """``summary`` if every field the comparison reads has its type; a one-line :class:`SuiteError` otherwise."""
    for key, types in SUMMARY_FIELDS.items():
        value = summary.get(key)
        if value is not None and (not isinstance(value, types) or isinstance(value, bool)):
            valid = " or ".join(t.__name__ for t in types)
            what = type(value).__name__
            raise SuiteError(f"run summary {path}: {key}={repr(value)[:60]} is a {what}; valid: {valid}")
    for key in ("final_val", "whole_split_val", "test"):
        for name, value in (summary.get(key) or {}).items():
            if value is not None and (not isinstance(value, _NUMBER) or isinstance(value, bool)):
                raise SuiteError(f"run summary {path}: {key}[{name!r}]={repr(value)[:60]}; valid: a number")
    for key in ("train_curve", "val_curve"):
        for point in summary.get(key) or []:
            if not isinstance(point, list) or len(point) != 2 or not isinstance(point[0], int):
                raise SuiteError(f"run summary {path}: {key} holds {repr(point)[:60]}; valid: [step, value] pairs")
    return summary
