"""How fast each cell trained: throughput, peak memory, MFU and GPU-hours over its seeds, and its throughput against
the baseline scheme's, paired by seed.

Pure functions of a comparison's cells (:mod:`experiments.results.cells`) and its runs' ``summary.json`` (the
``perf`` block :mod:`experiments.monitoring.throughput` records); the comparison writes what they return as
``speed.md`` and ``speed.csv`` (:func:`experiments.results.tables.write_speed`).

    throughput   tokens/s for the LM, samples/s otherwise (all devices together): mean ± 95 % t-interval over the
                 cell's runs that recorded one (every status: a run that diverged still ran at its speed), and SD
    peak memory  the largest of the runs' peaks (GB)
    MFU          the mean of the runs' measured MFU; ``n/a (cpu)`` when they recorded none
    GPU-hours    the runs' ``wall_time_s`` x devices / 3600, summed (the whole run: start-up and validation too)
    ratio        throughput / the baseline's at the same coordinates, per seed both have; the geometric mean of
                 the ratios with the 95 % t-interval of their mean log, exponentiated (a ratio averages as logs)

A summary is untrusted input: a ``perf`` that is no mapping, a rate that is not a positive number, a negative
memory, an MFU outside (0, 1] or a device count that is not a positive whole number is skipped, and the note names
the run and the field, never a crash. Runs without ``perf`` (written before runs recorded their speed) are ``-``.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass

from experiments.results.cells import Cell, baseline_cell, varying_axes
from experiments.results.formatting import decimals, fmt, fmt_estimate
from experiments.results.stats import CI_NAME, Estimate, estimate

SPEED_TABLE = "speed.md"
SPEED_CSV = "speed.csv"
NOT_MEASURED = "n/a"  # what a run records as its MFU where the device has no peak (a CPU, an unlisted GPU)
UNDER_LOAD = "speed measured under load: compare only runs measured side by side"


@dataclass(frozen=True)
class RunSpeed:
    """One run's checked ``perf`` record.

    Attributes:
        run: the run's name.
        seed: its seed (the pairing key).
        samples_per_s: training samples per second, all devices together.
        tokens_per_s: tokens per second (None where the task has none).
        peak_mem_gb: its peak memory (None where not recorded).
        mfu: its measured MFU in (0, 1] (None: ``n/a``).
        devices: devices it trained on.
        device: their name (``cpu``, ``NVIDIA H100 80GB HBM3``).
        wall_s: its wall time (None where not recorded).
        convention: the FLOP convention its MFU counts by.
    """

    run: str
    seed: object
    samples_per_s: float
    tokens_per_s: float | None
    peak_mem_gb: float | None
    mfu: float | None
    devices: int
    device: str
    wall_s: float | None
    convention: str | None = None

    def rate(self, unit: str) -> float | None:
        return self.tokens_per_s if unit == "tokens/s" else self.samples_per_s


@dataclass(frozen=True)
class Ratio:
    """A cell's throughput over the baseline's, paired by seed: ``exp`` of the mean log ratio and of its interval."""

    n: int
    ratio: float
    low: float | None
    high: float | None

    def text(self) -> str:
        if self.low is None or self.high is None:
            return f"{self.ratio:.3f} (n = 1)"
        return f"{self.ratio:.3f} ({self.low:.3f} to {self.high:.3f}, n = {self.n})"


@dataclass(frozen=True)
class CellSpeed:
    """A cell's speed over its runs that recorded one.

    Attributes:
        cell: the cell.
        runs: its runs' checked records.
        rate: the throughput's mean and interval (None: no run recorded one).
        peak_mem_gb: the largest peak memory.
        mfu: the mean measured MFU (None: none measured).
        mfu_runs: how many runs measured one.
        device_hours: wall time x devices / 3600, summed over ``runs`` (None: no wall time).
        wall_runs: how many of ``runs`` recorded a wall time.
        ratio: against the baseline cell (None: no pair, or the baseline itself).
        is_baseline: whether the cell is the baseline scheme's.
    """

    cell: Cell
    runs: list[RunSpeed]
    rate: Estimate | None
    peak_mem_gb: float | None
    mfu: float | None
    mfu_runs: int
    device_hours: float | None
    wall_runs: int
    ratio: Ratio | None
    is_baseline: bool

    @property
    def on_gpu(self) -> bool:
        return any(r.device != "cpu" for r in self.runs)

    def mfu_text(self) -> str:
        if self.mfu is None:
            names = sorted({r.device for r in self.runs})
            return f"{NOT_MEASURED} ({', '.join(names)})" if names else "-"
        share = "" if self.mfu_runs == len(self.runs) else f" ({self.mfu_runs} of {len(self.runs)} runs)"
        return f"{self.mfu:.1%}{share}"

    def hours_text(self) -> str:
        if not self.runs or self.device_hours is None:
            return "-"
        if not self.on_gpu:
            return f"{NOT_MEASURED} (cpu)"
        share = "" if self.wall_runs == len(self.runs) else f" ({self.wall_runs} of {len(self.runs)} runs)"
        return f"{self.device_hours:.3g}{share}"


@dataclass(frozen=True)
class SpeedTable:
    """A comparison's speed: one :class:`CellSpeed` per cell, the unit, and what was skipped or missing."""

    cells: list[CellSpeed]
    unit: str
    baseline: str | None
    skipped: list[str]  # "run: perf.field=value", one per malformed record
    unrecorded: int  # runs read without a perf block

    @property
    def recorded(self) -> int:
        return sum(len(c.runs) for c in self.cells)


##################################################################################
#                                 Reading perf                                   #
##################################################################################


def _number(value, low: float, high: float = math.inf, low_open: bool = True) -> float | None:
    """``value`` as a float when it is a finite number in the range; else None."""
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        return None
    if value < low or (low_open and value == low) or value > high:
        return None
    return float(value)


def read_perf(run: str, seed: object, summary: dict) -> tuple[RunSpeed | None, str | None]:
    """A run's ``perf`` block, checked: ``(record, None)``; ``(None, None)`` without one; ``(None, problem)`` for a
    record that is not one a run writes (``problem`` names the run and the first bad field)."""
    perf = summary.get("perf")
    if perf is None:
        return None, None
    if not isinstance(perf, dict):
        return None, f"{run}: perf is a {type(perf).__name__}"
    checks = {
        "samples_per_s": _number(perf.get("samples_per_s"), 0.0),
        "tokens_per_s": _number(perf.get("tokens_per_s"), 0.0),
        "peak_mem_gb": _number(perf.get("peak_mem_gb"), 0.0, low_open=False),
        "mfu": _number(perf.get("mfu"), 0.0, 1.0),
    }
    for key, value in checks.items():
        raw = perf.get(key)
        optional = (raw is None and key != "samples_per_s") or (key == "mfu" and raw == NOT_MEASURED)
        if value is None and not optional:
            return None, f"{run}: perf.{key}={repr(raw)[:40]}"
    devices, device = perf.get("devices"), perf.get("device", "?")
    if not isinstance(devices, int) or isinstance(devices, bool) or devices < 1:
        return None, f"{run}: perf.devices={repr(devices)[:40]}"
    if not isinstance(device, str):
        return None, f"{run}: perf.device={repr(device)[:40]}"
    convention = perf.get("flop_convention")
    wall = _number(summary.get("wall_time_s"), 0.0, low_open=False)
    return RunSpeed(run, seed, checks["samples_per_s"], checks["tokens_per_s"], checks["peak_mem_gb"], checks["mfu"],
                    devices, device, wall, convention if isinstance(convention, str) else None), None  # fmt: skip


##################################################################################
#                                   The table                                    #
##################################################################################


def _by_seed(runs: list[RunSpeed], unit: str) -> dict:
    """``{seed: throughput}``; runs without distinct seeds key by position (as :meth:`Cell.values` does)."""
    found = [(r.seed, r.rate(unit)) for r in runs if r.rate(unit) is not None]
    if len({k for k, _ in found}) < len(found):
        return {i: v for i, (_, v) in enumerate(found)}
    return dict(found)


def log_ratio(values: dict, base: dict) -> Ratio | None:
    """``values`` over ``base`` paired by key: the geometric mean of the per-key ratios and the t-interval of the
    mean log ratio, exponentiated; None without a common key."""
    keys = [k for k in values if k in base]
    e = estimate([math.log(values[k]) - math.log(base[k]) for k in keys])
    if e is None:
        return None
    low, high = (None, None) if e.low is None else (math.exp(e.low), math.exp(e.high))
    return Ratio(e.n, math.exp(e.mean), low, high)


def unit_of(speeds: list[RunSpeed], summaries: dict[str, dict]) -> str:
    """``tokens/s`` when every record is an LM run's with tokens, else ``samples/s`` (one unit per table)."""
    lm = all(r.tokens_per_s is not None and summaries.get(r.run, {}).get("task") in (None, "lm") for r in speeds)
    return "tokens/s" if speeds and lm else "samples/s"


def speed_table(cells: list[Cell], summaries: dict[str, dict], baseline: str | None) -> SpeedTable:
    """Every cell's speed over its runs' checked ``perf`` records, paired with ``baseline``'s cell by seed."""
    per_cell: dict[tuple, list[RunSpeed]] = {}
    skipped, unrecorded = [], 0
    for cell in cells:
        per_cell[cell.key] = []
        for row in cell.runs:
            summary = summaries.get(row["run"])
            if not isinstance(summary, dict) or row.get("status") in ("running", "missing"):
                continue
            record, problem = read_perf(row["run"], row.get("seed"), summary)
            if problem is not None:
                skipped.append(problem)
            elif record is None:
                unrecorded += 1
            else:
                per_cell[cell.key].append(record)
    unit = unit_of([r for runs in per_cell.values() for r in runs], summaries)
    out = []
    for cell in cells:
        runs = per_cell[cell.key]
        mfus = [r.mfu for r in runs if r.mfu is not None]
        mems = [r.peak_mem_gb for r in runs if r.peak_mem_gb is not None]
        walls = [r.wall_s * r.devices for r in runs if r.wall_s is not None]
        ref = baseline_cell(cell, cells, baseline)
        ratio = log_ratio(_by_seed(runs, unit), _by_seed(per_cell[ref.key], unit)) if ref is not None else None
        out.append(CellSpeed(cell, runs, estimate([r.rate(unit) for r in runs if r.rate(unit) is not None]),
                             max(mems) if mems else None, sum(mfus) / len(mfus) if mfus else None, len(mfus),
                             sum(walls) / 3600 if walls else None, len(walls), ratio,
                             baseline is not None and cell.scheme == baseline))  # fmt: skip
    return SpeedTable(out, unit, baseline, skipped, unrecorded)


def _coordinate(cell: Cell, axis: str) -> str:
    value = cell.coords.get(axis)
    return f"{value:g}" if isinstance(value, float) else fmt(value)


def _ratio_text(c: CellSpeed) -> str:
    if c.is_baseline:
        return "(baseline)"
    return "-" if c.ratio is None else c.ratio.text()


def speed_markdown(table: SpeedTable, parallel: object = None) -> str:
    """The speed table, one row per cell, and the notes that say how to read it (``parallel``: the sweep's
    ``parallel`` from ``sweep.yaml``, None when not recorded)."""
    axes = varying_axes([c.cell for c in table.cells])
    u = table.unit
    header = [*axes, f"{u} (mean ± {CI_NAME})", f"{u} SD", "peak memory GB (max)", "MFU (mean)", "GPU-hours"]
    header += [f"{u} ratio vs {table.baseline} (95 % CI)"] if table.baseline else []
    header.append("speed recorded")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for c in table.cells:
        row = [_coordinate(c.cell, a) for a in axes]
        std = "-" if c.rate is None or c.rate.std is None else f"{c.rate.std:.{decimals(c.rate.half_width)}f}"
        mem = "-" if c.peak_mem_gb is None else f"{c.peak_mem_gb:.3g}"
        row += [fmt_estimate(c.rate), std, mem, c.mfu_text(), c.hours_text()]
        row += [_ratio_text(c)] if table.baseline else []
        row.append(f"{len(c.runs)} of {len(c.cell.runs)} runs")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n\n" + "\n".join(speed_notes(table, parallel)) + "\n"


def speed_notes(table: SpeedTable, parallel: object = None) -> list[str]:
    """What the speed table's numbers are, whether the runs were measured side by side, and what was skipped."""
    conventions = sorted({r.convention for c in table.cells for r in c.runs if r.convention})
    out = [f"Speed of each cell's runs that recorded one (summary.json perf; every status, since a run that "
           f"diverged still ran at its speed): {table.unit} of training over all devices, mean ± {CI_NAME} "
           "(t-interval over seeds) and SD; peak memory = the largest of the runs' peaks (CUDA's max allocated on "
           "a GPU, the process's peak resident set on a CPU); MFU = the mean of the runs' measured MFU "
           f"(FLOP convention: {'; '.join(conventions) or 'not recorded'}), {NOT_MEASURED} where the device has "
           "no peak in the table (a CPU). GPU-hours = the sum of the runs' wall_time_s x devices / 3600 (the whole "
           "run: start-up and validation included), at the MFU beside it; not counted on a CPU."]  # fmt: skip
    if table.baseline:
        out.append(f"Ratio = {table.unit} over {table.baseline}'s at the same coordinates, paired by seed: the "
                   f"geometric mean of the per-seed ratios with the {CI_NAME} (t-interval of the mean log ratio, "
                   "exponentiated; n = pairs); above 1 is faster.")  # fmt: skip
    if isinstance(parallel, int) and not isinstance(parallel, bool) and parallel == 1:
        out.append("The sweep ran one run at a time (sweep.yaml parallel: 1); other work on the host is not "
                   "recorded.")  # fmt: skip
    elif isinstance(parallel, int) and not isinstance(parallel, bool) and parallel > 1:
        out.append(f"**The sweep ran {parallel} runs at a time (sweep.yaml parallel: {parallel}): {UNDER_LOAD}** "
                   "(runs that shared the host with different neighbours are not comparable).")  # fmt: skip
    else:
        out.append(f"**How many runs shared the host is not recorded: {UNDER_LOAD}.**")
    if table.unrecorded:
        out.append(f"{table.unrecorded} run(s) recorded no speed (summary.json without perf, from before runs "
                   "recorded it): not counted, shown as -.")  # fmt: skip
    if table.skipped:
        out.append(f"Speed records skipped (not a positive number, a negative memory, an MFU outside (0, 1], or not "
                   f"a mapping): {'; '.join(table.skipped)}.")  # fmt: skip
    return out


def speed_csv(table: SpeedTable) -> str:
    """Per cell: the coordinates, the throughput's n, mean, std and interval, peak memory, MFU, device-hours
    (also on a CPU) and the ratio to the baseline with its interval."""
    axes = list(dict.fromkeys(k for c in table.cells for k in c.cell.coords))
    fields = ["unit", "n", "mean", "std", "ci_low", "ci_high", "peak_mem_gb", "mfu", "mfu_runs", "device",
              "device_hours", "gpu_hours", "ratio_n", "ratio", "ratio_ci_low", "ratio_ci_high", "speed_runs",
              "runs"]  # fmt: skip
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow([*axes, *fields])
    for c in table.cells:
        e, r = c.rate, c.ratio
        row = [c.cell.coords.get(a) for a in axes] + [table.unit]
        row += [e.n, e.mean, e.std, e.low, e.high] if e else [0, None, None, None, None]
        row += [c.peak_mem_gb, c.mfu, c.mfu_runs, ";".join(sorted({x.device for x in c.runs})), c.device_hours]
        row += [c.device_hours if c.on_gpu else None]
        row += [r.n, r.ratio, r.low, r.high] if r else [0, None, None, None]
        row += [len(c.runs), len(c.cell.runs)]
        writer.writerow(["" if x is None else x for x in row])
    return out.getvalue()


def any_perf(summaries: dict[str, dict]) -> bool:
    """Whether some run's summary holds a ``perf`` entry (well-formed or not)."""
    return any(isinstance(s, dict) and s.get("perf") is not None for s in summaries.values())
