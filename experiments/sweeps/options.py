"""The sweep file's analysis options, checked on load: ``protocol`` (tune, then compare on fresh seeds),
``stages`` (seeds added in looks until each cell is decided), ``last_evals`` (the metric as the mean of a
run's last evaluations) and ``margins`` (the equivalence margin delta per metric, over the documented defaults).

    protocol:                      # every scheme at its own best learning rate
      kind: tune_then_compare
      lrs: [1.0e-3, 2.5e-3, 6.3e-3, 1.6e-2, 4.0e-2, 1.0e-1]   # log-spaced, increasing
      tuning_seeds: [100, 101]     # each scheme runs every rate on these (an equal tuning budget)
      fresh_seeds: [0, 1, 2]       # then its best rate on these; only they enter the comparison
      initial_loss: 5.545          # optional: the loss at initialisation (default: the runs' first train loss)
    stages: [3, 5, 8]              # with seeds: [0, ..., 7]: 3 seeds, then 5, then 8 for undecided cells
    last_evals: 3                  # the metric: mean of the last 3 validations (default 1: the final one)
    margins: {val/loss: 0.01}      # equivalence margins per metric (default: equivalence.MARGINS per metric)

Every mistake is one line naming the key, the file and what is valid (:class:`OptionError`, exit status 2),
before anything runs. The options are checked here against each other and against the grid keys they replace
(``protocol`` owns the learning rates and seeds; ``stages`` needs ``seeds`` and a ``baseline``).
"""

from __future__ import annotations

import math
from typing import Any

from experiments.reliability.errors import SuiteError
from experiments.results.equivalence import higher_is_better
from experiments.results.reading import MAX_LAST_EVALS
from experiments.results.records import read_record  # noqa: F401 - the sweep's records are read with it
from fileio.checks import InputError, number

PROTOCOL_KINDS = ("tune_then_compare",)
PROTOCOL_KEYS = ("kind", "lrs", "tuning_seeds", "fresh_seeds", "initial_loss", "compute_multiples")
SPACING_TOLERANCE = 1.5  # the largest step of the rate grid over its smallest (a log-spaced grid: 1)


class OptionError(SuiteError):
    """A sweep file's protocol, stages or last_evals the sweep cannot run."""


def _num(value: object, key: str, where: str, kind: type, **bounds: Any) -> float | int:
    try:
        return number(value, key, kind=kind, where=where, **bounds)
    except InputError as err:
        raise OptionError(str(err)) from None


def _list(raw: dict, key: str, where: str, example: str) -> list:
    value = raw.get(key)
    if not isinstance(value, list) or not value:
        raise OptionError(f"{key}={value!r} ({where}); valid: a non-empty list, e.g. {key}: {example}")
    return value


def _seeds(raw: dict, key: str, where: str, minimum: int) -> list[int]:
    seeds = [_num(v, f"{key}[{i}]", where, int, low=0) for i, v in enumerate(_list(raw, key, where, "[0, 1, 2]"))]
    if len(set(seeds)) != len(seeds) or len(seeds) < minimum:
        raise OptionError(f"{key}={raw[key]!r} ({where}); valid: {minimum} or more distinct seeds")
    return seeds


def parse_protocol(raw: object, spec_keys: dict, where: str) -> dict | None:
    """The checked ``protocol`` mapping (None when the file has none).

    Args:
        raw: the file's ``protocol`` value.
        spec_keys: the rest of the sweep file (``lrs`` and ``seeds`` must be absent: the protocol owns them;
            ``metric`` must be a loss, which the tuning minimises).
        where: the file (and part) for the error line.
    """
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise OptionError(f"protocol={raw!r} ({where}); valid: a mapping with kind: tune_then_compare, lrs, ...")
    unknown = sorted(set(raw) - set(PROTOCOL_KEYS))
    if unknown:
        raise OptionError(f"unknown protocol keys {unknown} ({where}); valid: {', '.join(PROTOCOL_KEYS)}")
    if raw.get("kind") not in PROTOCOL_KINDS:
        raise OptionError(f"protocol.kind={raw.get('kind')!r} ({where}); valid: {', '.join(PROTOCOL_KINDS)}")
    for key in ("lrs", "seeds"):
        if spec_keys.get(key) not in (None, []):
            raise OptionError(
                f"{key}={spec_keys[key]!r} beside protocol ({where}); valid: the protocol's lrs, tuning_seeds and "
                "fresh_seeds only"
            )
    metric = spec_keys.get("metric", "val/loss")
    if isinstance(metric, str) and higher_is_better(metric):
        raise OptionError(f"metric={metric!r} with protocol ({where}); valid: a loss (the tuning picks the lowest)")
    example = "[1.0e-3, 3.0e-3, 1.0e-2]"
    lrs = [_num(v, f"protocol.lrs[{i}]", where, float, low=0, low_open=True)
           for i, v in enumerate(_list(raw, "lrs", where, example))]  # fmt: skip
    if len(lrs) < 2 or any(b <= a for a, b in zip(lrs, lrs[1:], strict=False)):
        raise OptionError(f"protocol.lrs={raw['lrs']!r} ({where}); valid: two or more increasing rates")
    steps = [math.log(b / a) for a, b in zip(lrs, lrs[1:], strict=False)]
    if max(steps) > SPACING_TOLERANCE * min(steps):
        raise OptionError(
            f"protocol.lrs={raw['lrs']!r} ({where}) is not log-spaced (ratios "
            f"{', '.join(f'{b / a:.3g}' for a, b in zip(lrs, lrs[1:], strict=False))}); valid: a constant ratio "
            f"within a factor {SPACING_TOLERANCE:g} in log, e.g. {example}"
        )
    tuning = _seeds(raw, "tuning_seeds", where, 1)
    fresh = _seeds(raw, "fresh_seeds", where, 2)
    if shared := sorted(set(tuning) & set(fresh)):
        raise OptionError(
            f"protocol.fresh_seeds share {shared} with tuning_seeds ({where}); valid: seeds the tuning never ran"
        )
    protocol = {"kind": raw["kind"], "lrs": lrs, "tuning_seeds": tuning, "fresh_seeds": fresh}
    if raw.get("initial_loss") is not None:
        protocol["initial_loss"] = _num(raw["initial_loss"], "protocol.initial_loss", where, float, low=0,
                                        low_open=True)  # fmt: skip
    return protocol


def parse_stages(raw: object, seeds: list[int], baseline: object, where: str) -> list[int]:
    """The checked ``stages`` (seeds per cell at each look; the last is the cap, ``len(seeds)``); [] for none."""
    if raw is None or raw == []:
        return []
    example = "stages: [3, 5, 8] with 8 seeds"
    if not isinstance(raw, list):
        raise OptionError(f"stages={raw!r} ({where}); valid: a list of seed counts, e.g. {example}")
    stages = [_num(v, f"stages[{i}]", where, int) for i, v in enumerate(raw)]
    for i, n in enumerate(stages):
        if n < 2:
            raise OptionError(f"stages[{i}]={raw[i]!r} ({where}); valid: 2 or more seeds per cell (a paired test)")
    if len(stages) < 2 or any(b <= a for a, b in zip(stages, stages[1:], strict=False)):
        raise OptionError(f"stages={raw!r} ({where}); valid: two or more increasing seed counts, e.g. {example}")
    if stages[-1] != len(seeds):
        raise OptionError(
            f"stages={raw!r} ends at {stages[-1]} but seeds holds {len(seeds)} ({where}); valid: the last stage is "
            f"the cap, the number of seeds, e.g. {example}"
        )
    if baseline is None:
        raise OptionError(f"stages={raw!r} without a baseline ({where}); valid: a baseline scheme the cells face")
    return stages


def parse_last_evals(raw: object, metric: object, where: str) -> int:
    """The checked ``last_evals`` (1 when absent); above 1 only for a validation metric (``val/...``: a test
    metric is measured once)."""
    if raw is None:
        return 1
    k = int(_num(raw, "last_evals", where, int))
    if not 1 <= k <= MAX_LAST_EVALS:
        raise OptionError(f"last_evals={raw!r} ({where}); valid: 1 to {MAX_LAST_EVALS} validations")
    if k > 1 and not (isinstance(metric, str) and metric.startswith("val/")):
        raise OptionError(
            f"last_evals={k} with metric={metric!r} ({where}); valid: a val/ metric (a test is measured once), or 1"
        )
    return k


def parse_margins(raw: object, where: str) -> dict[str, float]:
    """The checked ``margins``: ``{metric: delta}``, each delta a positive number ({} when absent). A metric not
    named keeps its documented default (:data:`experiments.results.equivalence.MARGINS`); the sweep records them
    in ``sweep.yaml``, where ``compare`` reads them."""
    if raw is None:
        return {}
    example = "margins: {val/loss: 0.01}"
    if not isinstance(raw, dict):
        raise OptionError(f"margins={raw!r} ({where}); valid: a mapping of metric to margin, e.g. {example}")
    out = {}
    for metric, value in raw.items():
        if not isinstance(metric, str) or "/" not in metric:
            raise OptionError(f"margins key {metric!r} ({where}); valid: a metric such as val/loss, e.g. {example}")
        out[metric] = float(_num(value, f"margins.{metric}", where, float, low=0, low_open=True))
    return out
