"""``protocol.compute_multiples`` of a tune-then-compare sweep file, checked on load.

    protocol:
      kind: tune_then_compare
      ...
      compute_multiples: [1.25, 1.5, 2.0]   # the baseline, at its picked rate, also trained 1.25x, 1.5x, 2x as long

Each multiple adds, on every fresh seed, one run of the baseline scheme at its picked rate, trained for that
multiple of the budget's steps on its own complete schedule (:mod:`experiments.sweeps.compute_runs`); the fresh
baseline run itself is the curve's 1x point. From that curve each scheme that beats the baseline gets its
effective-compute multiplier (:func:`experiments.results.compute.compute_multiplier`).

The key lives in ``protocol`` but is split off before :func:`experiments.sweeps.options.parse_protocol` reads the
rest, so a protocol without it is exactly what it was: the same runs, the same ``tuning.yaml``. A mistake is one
line naming the value, the file and what is valid (:class:`~experiments.sweeps.options.OptionError`, exit 2).
"""

from __future__ import annotations

from experiments.sweeps.options import OptionError
from fileio.checks import InputError, number

COMPUTE_KEY = "compute_multiples"
MAX_MULTIPLE = 16.0  # a longer baseline run than 16x the budget is a typo (125 for 1.25), not a plan
EXAMPLE = "compute_multiples: [1.25, 1.5, 2.0]"


def split_protocol(raw: object) -> tuple[object, object]:
    """``(the protocol without compute_multiples, compute_multiples or None)``; anything but a mapping unchanged."""
    if not isinstance(raw, dict) or COMPUTE_KEY not in raw:
        return raw, None
    rest = {k: v for k, v in raw.items() if k != COMPUTE_KEY}
    return rest, raw[COMPUTE_KEY]


def multiple_tag(multiple: float) -> str:
    """The run-name suffix of a multiple: ``x1.25`` (grid run names end in ``-s<seed>``, so never collide)."""
    return f"x{multiple:g}"


def parse_compute_multiples(raw: object, baseline: object, where: str) -> list[float]:
    """The checked multiples: increasing numbers above 1 (1x is the fresh baseline run itself) and at most
    :data:`MAX_MULTIPLE`, whose run-name tags differ; a baseline scheme must be named.

    Raises:
        OptionError: one line naming the value, ``where`` and what is valid.
    """
    valid = f"valid: a list of increasing multiples above 1 and at most {MAX_MULTIPLE:g}, e.g. {EXAMPLE}"
    if not isinstance(raw, list) or not raw:
        raise OptionError(f"protocol.{COMPUTE_KEY}={raw!r} ({where}); {valid}")
    multiples = []
    for i, value in enumerate(raw):
        try:
            m = float(number(value, f"protocol.{COMPUTE_KEY}[{i}]", kind=float, where=where))
        except InputError:
            raise OptionError(
                f"protocol.{COMPUTE_KEY}[{i}]={value!r} is not a finite number ({where}); {valid}"
            ) from None
        if not 1 < m <= MAX_MULTIPLE:
            raise OptionError(f"protocol.{COMPUTE_KEY}[{i}]={value!r} ({where}); {valid}")
        multiples.append(m)
    tags = [multiple_tag(m) for m in multiples]
    if any(b <= a for a, b in zip(multiples, multiples[1:], strict=False)) or len(set(tags)) < len(tags):
        raise OptionError(f"protocol.{COMPUTE_KEY}={raw!r} ({where}); {valid}")
    if baseline is None:
        raise OptionError(
            f"protocol.{COMPUTE_KEY}={raw!r} without a baseline ({where}); valid: a baseline scheme, whose longer "
            "runs the other schemes' losses are read against"
        )
    return multiples
