"""Learning-rate robustness and differences in compute rather than in loss.

Pure functions of numbers.

- :func:`lr_sensitivity`: Wortsman et al. (2023, "Small-scale proxies for large-scale Transformer training
  instabilities") define a scheme's learning-rate sensitivity over a grid of rates as the mean over the grid of
  ``min(final loss, initial loss)`` minus the grid's best final loss: a run that diverged (or crashed, or never
  finished) counts as the initial loss, and no run counts as worse than not training. 0 means every rate
  reached the best loss; large values mean a narrow basin. :func:`largest_stable_lr` is the largest rate whose
  run did not diverge.
- :func:`compute_multiplier`: the effective-compute multiplier of a scheme that beats the baseline: the baseline
  is trained past its budget with checkpoints at 1x, 1.25x, 1.5x, 2x ... of the steps; the multiplier is the
  step multiple at which the baseline's loss (interpolated linearly in log steps between checkpoints) reaches the
  scheme's final loss. ``1.25`` reads "the scheme's loss costs the baseline 1.25x the compute". Beyond the last
  checkpoint it is not extrapolated (``None``, "more than the last checkpoint"); a scheme no better than the
  baseline's own budget gets 1 or less.
- :func:`multiplier_interval`: over seeds (each seed's scheme loss against the same seed's baseline curve),
  the t-interval of the log multipliers, transformed back (a multiplier is a ratio: its log is what averages).
  A t-interval rather than a bootstrap because a sweep has 3-8 seeds, where a bootstrap's percentiles are a
  handful of distinct values.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
from scipy import stats as scipy_stats


def lr_sensitivity(final: Mapping[float, float | None], initial: float) -> float:
    """Wortsman et al.'s learning-rate sensitivity: ``mean_lr min(final[lr], initial) - min_lr final[lr]``.

    Args:
        final: ``{lr: final loss}``; None (or a non-finite loss) for a run that diverged, crashed or stalled
            without a usable loss: it counts as ``initial``.
        initial: the loss at initialisation (for the LM, ln of the vocabulary size).

    Raises:
        ValueError: for an empty grid or an initial loss that is not finite.
    """
    if not final or not math.isfinite(initial):
        raise ValueError(f"needs a grid of rates and a finite initial loss, got {len(final)} rates, {initial}")
    capped = [initial if v is None or not math.isfinite(v) else min(float(v), initial) for v in final.values()]
    return float(np.mean(capped) - min(capped))


def largest_stable_lr(final: Mapping[float, float | None]) -> float | None:
    """The largest rate whose run gave a finite final loss (None when none did)."""
    stable = [lr for lr, v in final.items() if v is not None and math.isfinite(v)]
    return max(stable) if stable else None


def compute_multiplier(multiples: Sequence[float], baseline_losses: Sequence[float], loss: float) -> float | None:
    """The step multiple at which the baseline reaches ``loss``.

    Args:
        multiples: the baseline's checkpoints as multiples of the budget, increasing, starting at 1 (1, 1.25, 1.5,
            2, ...).
        baseline_losses: its loss at each.
        loss: the scheme's final loss at the budget (1x).

    Returns:
        The multiple, interpolated linearly in log(steps) between the two checkpoints that bracket ``loss`` (the
        loss curve is close to linear in log steps there). A ``loss`` at or above the baseline's 1x loss is
        extrapolated below 1 along the first segment (a scheme behind the baseline costs it less than its
        budget). None when the baseline does not reach ``loss`` by its last checkpoint.

    Raises:
        ValueError: for fewer than two checkpoints, multiples not increasing, or lengths that differ.
    """
    m = [float(x) for x in multiples]
    y = [float(v) for v in baseline_losses]
    if len(m) < 2 or len(m) != len(y) or any(b <= a for a, b in zip(m, m[1:], strict=False)) or m[0] <= 0:
        raise ValueError(f"checkpoints {m} with losses {y}; valid: two or more increasing positive multiples")
    if loss >= y[0]:
        i = 0  # behind (or level with) the baseline at its budget: the first segment, extended below 1x
    else:
        i = next((k for k in range(len(m) - 1) if y[k] >= loss >= y[k + 1]), None)
        if i is None:
            return None
    if y[i] == y[i + 1]:
        return m[i]
    fraction = (y[i] - loss) / (y[i] - y[i + 1])
    return float(math.exp(math.log(m[i]) + fraction * (math.log(m[i + 1]) - math.log(m[i]))))


def multiplier_interval(multipliers: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float] | None:
    """``(geometric mean, low, high)`` of per-seed multipliers: the t-interval of their logs, exponentiated;
    None without two finite multipliers (a seed whose baseline never reached its loss has no multiplier)."""
    logs = np.log([float(x) for x in multipliers if x is not None and math.isfinite(x) and x > 0])
    if logs.size < 2:
        return None
    mean, sd = float(logs.mean()), float(logs.std(ddof=1))
    half = float(scipy_stats.t.ppf(0.5 + confidence / 2, logs.size - 1)) * sd / math.sqrt(logs.size)
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)
