"""Runs grouped into cells of the grid, with their seed statistics and the paired comparison to a baseline.

A cell is every grid coordinate of a run except its seed: scheme (or a named variant of one, e.g.
``siamese_hybrid-no-input-norm``), overlay, learning rate, warmup, and any further axis the sweep records.
The coordinates come from ``sweep.yaml``'s ``grid`` (what the sweep ran), never from the summary's
``scheme``, which names the trunk's scheme and not the variant. Sweeps written before the grid was recorded
fall back to the summary's scheme and lr and the ``-s<seed>`` suffix of the run name.

Only runs that finished (and did not stall at the data's context-free loss) enter a mean or a paired
difference; the others are counted per cell by status, so a mean never silently hides a failure.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from experiments.results.reading import Reading, Staging, cell_name
from experiments.results.stats import Estimate, PairedComparison, estimate, paired
from experiments.results.verdicts import SliceAnalysis, Verdict, analyse

AXES = ("scheme", "overlay", "lr", "warmup")  # grid coordinates other than the seed, in display order
PRIMARY = "metric"  # a run row's key for the sweep's metric (the header shows its real name)
OK = "finished"  # the only status whose values enter the statistics
STATUS_ORDER = ("finished", "stalled", "diverged", "crashed", "interrupted", "running", "missing")
SEED_SUFFIX = re.compile(r"-s(\d+)$")


def run_coordinates(record: dict, summaries: dict[str, dict]) -> dict[str, dict]:
    """``{run: {axis: value, ..., "seed": seed}}`` from the sweep record's grid (fallback: the summaries)."""
    grid = {g["name"]: g for g in record.get("grid") or [] if isinstance(g, dict) and "name" in g}
    out = {}
    for name, summary in summaries.items():
        if name in grid:
            out[name] = {k: v for k, v in grid[name].items() if k != "name"}
        else:
            seed = SEED_SUFFIX.search(name)
            out[name] = {"scheme": summary.get("scheme", "?"), "lr": summary.get("lr"),
                         "seed": int(seed[1]) if seed else None}  # fmt: skip
    return out


def _hashable(value):
    return value if isinstance(value, str | int | float | bool | type(None)) else json.dumps(value, sort_keys=True)


def cell_key(coords: dict) -> tuple:
    """The coordinates without the seed, known axes first: equal for the seeds of one cell."""
    names = [a for a in AXES if a in coords] + sorted(k for k in coords if k not in AXES and k != "seed")
    return tuple((k, _hashable(coords[k])) for k in names)


def finite(value) -> float | None:
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


@dataclass
class Cell:
    """The runs of one grid cell (rows of :func:`experiments.results.compare.rows`), in sweep order."""

    key: tuple
    runs: list[dict] = field(default_factory=list)

    @property
    def coords(self) -> dict:
        return dict(self.key)

    @property
    def scheme(self) -> str:
        return str(self.coords.get("scheme", "?"))

    def counts(self) -> Counter:
        """Runs per status."""
        return Counter(r["status"] for r in self.runs)

    def values(self, key: str = PRIMARY, status: str = OK) -> dict:
        """``{seed: value}`` of ``key`` over the runs with ``status`` and a finite value.

        Runs without a seed (a sweep without a seeds axis) key by ``None``, so a one-run cell still
        pairs with the baseline's one run; repeated keys fall back to the run's position.
        """
        found = [(r.get("seed"), finite(r.get(key))) for r in self.runs if r["status"] == status]
        found = [(k, v) for k, v in found if v is not None]
        keys = [k for k, _ in found]
        if len(set(keys)) < len(keys):
            return {i: v for i, (_, v) in enumerate(found)}
        return dict(found)

    def protocols(self) -> set[str]:
        """The test protocols (ids) of the cell's tested runs."""
        return {r["protocol_id"] for r in self.runs if r.get("protocol_id")}


def group(table: Iterable[dict]) -> list[Cell]:
    """Cells in first-seen (sweep) order."""
    cells: dict[tuple, Cell] = {}
    for row in table:
        cells.setdefault(row["cell"], Cell(row["cell"])).runs.append(row)
    return list(cells.values())


def varying_axes(cells: list[Cell]) -> list[str]:
    """The coordinates that differ between cells (``scheme`` always): the columns that tell cells apart."""
    names = list(dict.fromkeys(k for c in cells for k, _ in c.key))
    return [n for n in names if n == "scheme" or len({c.coords.get(n) for c in cells}) > 1]


def baseline_cell(cell: Cell, cells: list[Cell], baseline: str | None) -> Cell | None:
    """The cell with the same coordinates but the baseline scheme (None for the baseline itself)."""
    if baseline is None or cell.scheme == baseline:
        return None
    want = tuple((k, baseline if k == "scheme" else v) for k, v in cell.key)
    return next((c for c in cells if c.key == want), None)


@dataclass
class CellStats:
    """A cell's statistics for one metric.

    Attributes:
        cell: the cell.
        value: the mean over finished runs with its interval (None when none finished).
        stalled: the mean over stalled runs (shown only when no run finished).
        versus: the paired comparison with the baseline cell over seeds where both finished.
        is_baseline: whether the cell is the baseline's.
        mixed_protocols: the cell's tested runs were measured under different test protocols, so a test
            metric gets no mean.
        verdict: the cell's verdict against the baseline from its slice's analysis (the sweep's own metric
            only; None for the baseline, other metrics, or without a baseline).
    """

    cell: Cell
    value: Estimate | None
    stalled: Estimate | None
    versus: PairedComparison | None
    is_baseline: bool
    mixed_protocols: bool = False
    verdict: Verdict | None = None


def cell_stats(
    cells: list[Cell],
    key: str = PRIMARY,
    baseline: str | None = None,
    metric: str | None = None,
    reading: Reading | None = None,
) -> list[CellStats]:
    """Mean, interval and paired comparison of ``key`` for every cell.

    A test metric (``test/...``; ``metric`` names what ``key`` holds when it is ``PRIMARY``, the sweep's own
    metric) is averaged only over runs measured under one test protocol, and paired only with a baseline
    measured under the same one. ``reading``: the sweep's margins and looks the verdicts are read with.
    """
    out = []
    is_test = (metric or key).startswith("test/")
    verdicts = {}
    if key == PRIMARY and baseline:
        verdicts = slice_verdicts(cells, baseline, metric or key, key=key, reading=reading)[0]
    for cell in cells:
        mixed = is_test and len(cell.protocols()) > 1
        values = {} if mixed else cell.values(key)
        ref = baseline_cell(cell, cells, baseline)
        versus = None
        if ref is not None and not mixed and (not is_test or cell.protocols() == ref.protocols()):
            base = ref.values(key)
            versus = paired(values, base) if values and base else None
        out.append(
            CellStats(
                cell,
                estimate(list(values.values())),
                estimate(list(cell.values(key, "stalled").values())),
                versus,
                baseline is not None and cell.scheme == baseline,
                mixed,
                verdicts.get(cell.key),
            )  # fmt: skip
        )
    return out


def slice_key(cell: Cell) -> tuple:
    """The cell's coordinates without its scheme: equal for the cells of one slice (one lr, one option)."""
    return tuple((k, v) for k, v in cell.key if k != "scheme")


def slice_verdicts(
    cells: list[Cell],
    reference: str | None,
    metric: str,
    margin: float | None = None,
    key: str = PRIMARY,
    thresholds: tuple[float, float] | None = None,
    reading: Reading | None = None,
) -> tuple[dict[tuple, Verdict], dict[tuple, SliceAnalysis]]:
    """Every cell's verdict against ``reference`` from its slice's block analysis
    (:func:`experiments.results.verdicts.analyse`), and each slice's analysis.

    Only finished runs enter. A test metric is analysed only over cells measured under the reference's test
    protocol; a cell under another is not comparable. ``margin`` defaults to ``reading``'s for the metric (the
    sweep's declared one, else the documented default). When ``reading`` has the sweep's looks (a staged sweep
    compared against its own baseline), each cell is read at its look: on that look's seeds, against that look's
    nominal levels, and its verdict says the look.

    Returns:
        ``({cell key: Verdict}, {slice key: SliceAnalysis})``; the reference's own cells get no verdict (a staged
        slice's analysis is its last look's).
    """
    if reference is None:
        return {}, {}
    reading = reading or Reading()
    margin = reading.margin(metric) if margin is None else margin
    staging = reading.staging if thresholds is None and key == PRIMARY else None
    by_slice: dict[tuple, list[Cell]] = {}
    for cell in cells:
        by_slice.setdefault(slice_key(cell), []).append(cell)
    verdicts, analyses = {}, {}
    for where, members in by_slice.items():
        ref = next((c for c in members if c.scheme == reference), None)
        data, other = {}, {}
        for cell in members:
            if metric.startswith("test/") and ref is not None and cell.protocols() != ref.protocols():
                other[cell.key] = Verdict("not comparable", 0, why="different test protocols")
                continue
            data[cell.scheme] = cell.values(key)
        if ref is None:
            for cell in members:
                verdicts[cell.key] = Verdict("not comparable", 0, why=f"no {reference} cell")
            continue
        if staging is not None:
            verdicts.update(_staged(members, data, reference, metric, margin, staging, other))
            analyses[where] = _at_look(data, reference, metric, margin, staging, staging.look_of(""))
            continue
        analyses[where] = analyse(data, reference, metric, margin, thresholds=thresholds)
        for cell in members:
            if cell.scheme != reference:
                verdicts[cell.key] = other.get(cell.key) or analyses[where].verdicts[cell.scheme]
    return verdicts, analyses


def _at_look(data: dict, reference: str, metric: str, margin: float | None, staging: Staging, look: int):
    seeds = staging.seeds_at(look)
    at_look = {scheme: {k: v for k, v in values.items() if k in seeds} for scheme, values in data.items()}
    return analyse(at_look, reference, metric, margin, thresholds=staging.thresholds(look))


def _staged(members, data, reference, metric, margin, staging: Staging, other: dict) -> dict[tuple, Verdict]:
    """Each cell of a staged slice at its own look (the seeds it had then, the look's levels)."""
    out, analyses = {}, {}
    for cell in members:
        if cell.scheme == reference:
            continue
        if cell.key in other:
            out[cell.key] = other[cell.key]
            continue
        run = cell.runs[0]
        look = staging.look_of(cell_name(run["run"], run.get("seed")))
        if look not in analyses:
            analyses[look] = _at_look(data, reference, metric, margin, staging, look)
        verdict = analyses[look].verdicts[cell.scheme]
        out[cell.key] = (
            verdict if verdict.word == "not comparable" else replace(verdict, look=(look, len(staging.stages)))
        )
    return out


# Recorded with a run's test protocol for provenance, but they name the run, not how it was measured.
RUN_SPECIFIC = frozenset({"samples_file", "weights_sha256"})


def _how_measured(protocol: dict) -> dict:
    return {k: v for k, v in protocol.items() if k not in RUN_SPECIFIC}


def _protocol_text(protocol: dict) -> str:
    """One readable line: flat fields as ``key=value``; a task list (downstream) as its source, the
    number of tasks and questions per task, not the whole nested record."""
    return ", ".join(f"{k}={_value_text(v)}" for k, v in protocol.items())


def _value_text(value) -> str:
    if not isinstance(value, dict):
        return str(value)
    tasks = value.get("tasks")
    if isinstance(tasks, dict):
        docs = {name: t.get("docs", "?") if isinstance(t, dict) else "?" for name, t in tasks.items()}
        per_task = ", ".join(f"{name} {n}" for name, n in docs.items())
        source = f"{value['source']}, " if "source" in value else ""
        return f"{source}{len(tasks)} tasks (questions: {per_task})"
    return "{" + ", ".join(f"{k}={_value_text(v)}" for k, v in value.items()) + "}"


def _protocol_key(protocol: dict) -> str:
    """Identity of a protocol: every field, nested ones included (two protocols differing anywhere differ)."""
    return json.dumps(protocol, sort_keys=True, default=str)


def assign_protocols(table: list[dict]) -> list[str]:
    """Gives every tested row a ``protocol_id`` (``P1``, ``P2`` ... in first-seen order) and returns the
    notes the tables print about them.

    A row's protocol is its summary's ``test_protocol`` (how its test metrics were measured: sample
    counts, sampler, reference set, task list ...). One protocol for all: a note names it. Several: each
    is listed, the tables gain a ``protocol`` column, and test metrics are compared only within one.
    """
    seen: dict[str, str] = {}
    texts: dict[str, str] = {}
    for row in table:
        if not any(k.startswith("test/") for k in row):
            row["protocol_id"] = None
            continue
        protocol = row.get("protocol") or {}
        protocol = _how_measured(protocol)
        key = _protocol_key(protocol) if protocol else ""
        if key not in seen:
            seen[key] = f"P{len(seen) + 1}"
            texts[seen[key]] = _protocol_text(protocol) if protocol else "not recorded"
        row["protocol_id"] = seen[key]
    if not seen or set(seen) == {""}:  # nothing tested, or no tested run records a protocol: nothing to say
        for row in table:
            row["protocol_id"] = None
        return []
    if len(seen) == 1:
        for row in table:
            row["protocol_id"] = row["protocol_id"] and "same"
        return [f"Test protocol of every tested run: {next(iter(texts.values()))}."]
    listed = "; ".join(f"{pid} = {text}" for pid, text in texts.items())
    return [
        f"**Test metrics were measured under {len(seen)} different protocols** (column `protocol`): {listed}. "
        "A test metric is averaged and paired only within one protocol; across protocols it is not comparable."
    ]
