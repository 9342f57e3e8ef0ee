"""How a sweep's verdicts are read: the equivalence margin it declared, and, for a sweep run in stages, the look
each cell's verdict belongs to. Read from the sweep directory (``sweep.yaml``, ``stages.yaml``) so that
``compare`` states the verdicts the way the sweep reached them.

    margins    sweep.yaml's ``margins: {metric: delta}`` (the sweep file's), else the documented default per metric
               (:data:`experiments.results.equivalence.MARGINS`); the tables name which one they used
    stages     sweep.yaml's ``stages: [3, 5, 8]`` and ``seeds``; ``stages.yaml`` names the cells each look decided
               on. A cell is read at the last look it took part in (the one that decided it, or the last it
               ran), on the seeds of that look only, against that look's Lan-DeMets O'Brien-Fleming nominal
               levels (:func:`experiments.results.sequential.look_thresholds`): at looks after 3, 5, 8 of 8
               seeds, 0.00137 / 0.0147 / 0.0451 two-sided. A cell no recorded look holds (the sweep's first
               look still running) is read at the look in progress.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from experiments.reliability.errors import SuiteError
from experiments.results.equivalence import default_margin
from experiments.results.records import STAGES_RECORD, read_record
from experiments.results.sequential import look_thresholds
from experiments.results.verdicts import ALPHA

MAX_LAST_EVALS = 1000


@dataclass(frozen=True)
class Staging:
    """A staged sweep's looks, as ``compare`` reads its verdicts.

    Attributes:
        stages: seeds per cell at each look (the last is the cap).
        seeds: the sweep's seeds in order; look k ran ``seeds[:stages[k - 1]]``.
        cell_looks: ``{cell name: the last look it took part in}`` from ``stages.yaml``.
    """

    stages: tuple[int, ...]
    seeds: tuple
    cell_looks: dict[str, int] = field(default_factory=dict)

    @property
    def recorded(self) -> int:
        """How many looks ``stages.yaml`` holds."""
        return max(self.cell_looks.values(), default=0)

    def look_of(self, cell: str) -> int:
        """The look a cell is read at: its last recorded one, else the look in progress."""
        return self.cell_looks.get(cell, min(self.recorded + 1, len(self.stages)))

    def seeds_at(self, look: int) -> set:
        return set(self.seeds[: self.stages[look - 1]])

    def thresholds(self, look: int) -> tuple[float, float]:
        """``(difference, equivalence)`` nominal levels of the look."""
        return look_thresholds(look, [n / self.stages[-1] for n in self.stages], ALPHA)


@dataclass(frozen=True)
class Reading:
    """What a comparison's verdicts are read with (the defaults: documented margins, one fixed-sample look).

    Attributes:
        margins: the sweep's declared margins ``{metric: delta}``.
        staging: the sweep's looks (None: not staged).
        last_evals: the sweep's metric is the mean of each run's last ``last_evals`` validations.
    """

    margins: dict[str, float] = field(default_factory=dict)
    staging: Staging | None = None
    last_evals: int = 1

    def margin(self, metric: str) -> float | None:
        return self.margins.get(metric, default_margin(metric))

    def margin_source(self, metric: str) -> str:
        """Where the margin of ``metric`` comes from, for the tables' notes."""
        if metric in self.margins:
            return f"declared by the sweep's margins for {metric}"
        return f"the documented default for {metric}"


def cell_name(run: str, seed: object) -> str:
    """A run's cell as the sweep names it: the run name without its ``-s<seed>``."""
    return run.rsplit(f"-s{seed}", 1)[0] if seed is not None else run


def _margins(record: dict, where: str) -> dict[str, float]:
    raw = record.get("margins") or {}
    if not isinstance(raw, dict):
        raise SuiteError(f"{where}: margins={raw!r}; valid: a mapping of metric to a positive margin")
    out = {}
    for metric, value in raw.items():
        if not isinstance(value, int | float) or isinstance(value, bool) or not 0 < value < float("inf"):
            raise SuiteError(f"{where}: margins.{metric}={value!r}; valid: a positive number")
        out[str(metric)] = float(value)
    return out


def _staging(sweep_dir: Path, record: dict, where: str) -> Staging | None:
    stages, seeds = record.get("stages") or [], record.get("seeds") or []
    if not stages:
        return None
    if (
        not isinstance(stages, list)
        or not all(isinstance(n, int) and not isinstance(n, bool) for n in stages)
        or any(b <= a for a, b in zip(stages, stages[1:], strict=False))
        or stages[0] < 2
        or not isinstance(seeds, list)
        or stages[-1] != len(seeds)
    ):
        raise SuiteError(f"{where}: stages={stages!r} with seeds={seeds!r}; valid: the increasing seed counts a "
                         "staged sweep records, the last one the number of seeds")  # fmt: skip
    planned = {"stages": stages, "seeds": seeds, "metric": record.get("metric", "val/loss"),
               "baseline": record.get("baseline"), "last_evals": last_evals_of(record, where),
               "alpha": ALPHA}  # fmt: skip
    looks = read_record(sweep_dir / STAGES_RECORD, "stages", ("looks", list), planned, "recorded its looks",
                        "the stages.yaml of this sweep's own run", where)  # fmt: skip
    cell_looks: dict[str, int] = {}
    for i, look in enumerate((looks or {}).get("looks", []), 1):
        verdicts = look.get("verdicts") if isinstance(look, dict) else None
        if not isinstance(verdicts, dict) or look.get("look") != i:
            raise SuiteError(f"{sweep_dir / STAGES_RECORD}: look {i} is not one a staged sweep records; valid: "
                             "the stages.yaml of this sweep's own run")  # fmt: skip
        cell_looks.update(dict.fromkeys(map(str, verdicts), i))
    return Staging(tuple(stages), tuple(seeds), cell_looks)


def last_evals_of(record: dict, where: str = "sweep.yaml") -> int:
    """The ``last_evals`` a sweep recorded (1 when absent: the final validation); one line for another value."""
    k = record.get("last_evals", 1)
    if k is None:
        return 1
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_LAST_EVALS:
        raise SuiteError(f"{where}: last_evals={k!r}; valid: a whole number from 1 to {MAX_LAST_EVALS}")
    return k


def read_reading(sweep_dir: Path, record: dict) -> Reading:
    """The margins, stages and ``last_evals`` a sweep directory's ``sweep.yaml`` (``record``) and ``stages.yaml``
    give its comparison; one line (:class:`SuiteError`) for values no sweep writes."""
    where = str(sweep_dir / "sweep.yaml")
    return Reading(_margins(record, where), _staging(sweep_dir, record, where), last_evals_of(record, where))
