"""The comparison as text: the per-cell table (``mean ± 95 % CI (n)`` and the paired difference to the
baseline), a scheme x axis pivot of it, the per-run table, and their CSV forms.

Every table the suite prints, writes or puts in README comes from here, so they cannot disagree. An
interval is shown only where it exists: one seed reads ``1.514 (n = 1)``. The number of digits follows
the interval (two significant digits of its half-width), so a table never claims more precision than
its seeds support.
"""

from __future__ import annotations

import csv
import io
import math
import statistics
from pathlib import Path

from experiments.results.cells import (
    AXES,
    PRIMARY,
    STATUS_ORDER,
    Cell,
    CellStats,
    cell_stats,
    slice_verdicts,
    varying_axes,
)
from experiments.results.equivalence import higher_is_better
from experiments.results.formatting import fmt, fmt_amount, fmt_estimate, fmt_p
from experiments.results.reading import Reading
from experiments.results.stats import (
    ALPHA,
    CI_NAME,
    MAX_SEEDS,
    POWER,
    PairedComparison,
    Sensitivity,
    sensitivity,
    sign_flip_floor,
)
from fileio import atomic_write_text

STALL_RATIO = 0.9  # stalled: final val loss > 90 % of the context-free baseline
RUN_COLUMNS = ["run", "scheme", "lr", "status", "steps", "train_loss", "val_loss", PRIMARY, "diverged", "spikes",
               "wall_s", "params"]  # fmt: skip
CSV_COORDINATES = ["overlay", "warmup", "seed"]  # the per-run CSV adds the grid coordinates after the scheme
DOWNSTREAM = "test/downstream/"
# An MoE LM's router on the validation set at the end (experiments.tasks.lm): every one goes to the CSVs,
# the markdown tables show ROUTING_SHOWN next to the metric, so a reader sees whether a scheme changes routing.
ROUTING_PREFIX = "val/moe_"
ROUTING = ("val/moe_aux", "val/moe_entropy", "val/moe_load_max", "val/moe_load_min", "val/moe_load_ratio")
ROUTING_SHOWN = ("val/moe_aux", "val/moe_entropy", "val/moe_load_ratio")


def in_markdown(metric: str) -> bool:
    """Whether a test metric gets a markdown column: per-task downstream scores go to the CSV only (their
    average ``test/downstream/avg`` is shown), so a dozen tasks do not flood the table."""
    return not metric.startswith(DOWNSTREAM) or metric == f"{DOWNSTREAM}avg"


def tested_metrics(table: list[dict]) -> list[str]:
    """Every ``test/...`` metric some run has, in first-seen order."""
    return list(dict.fromkeys(k for r in table for k in r if k.startswith("test/")))


def routing_metrics(table: list[dict], markdown: bool = False) -> list[str]:
    """The MoE routing statistics (``val/moe_*``) some run has, in ``ROUTING`` order (markdown: ``ROUTING_SHOWN``)."""
    found = {k for r in table for k in r if k.startswith(ROUTING_PREFIX)}
    order = ROUTING_SHOWN if markdown else ROUTING + tuple(sorted(found - set(ROUTING)))
    return [m for m in order if m in found]


##################################################################################
#                                   Formatting                                   #
##################################################################################


def fmt_sensitivity(s: Sensitivity) -> str:
    """``0.19 / ~7 seeds``: the smallest difference the pairs could detect, then the seeds the observed
    difference would need; or why they are undefined (``one pair``, ``no spread``)."""
    if s.detectable is None:
        return "one pair, no test" if s.why == "one pair" else f"{s.why}: no t-test"
    needed = f"~{s.needed} seeds" if s.needed is not None else (
        "no difference to detect" if s.why == "no difference" else f"> {MAX_SEEDS} seeds")  # fmt: skip
    return f"{fmt_amount(s.detectable)} / {needed}"


def fmt_status_counts(cell: Cell) -> str:
    """``3 finished`` / ``2 finished, 1 diverged``: every run of the cell is accounted for."""
    counts = cell.counts()
    order = [s for s in STATUS_ORDER if s in counts] + sorted(s for s in counts if s not in STATUS_ORDER)
    return ", ".join(f"{counts[s]} {s}" for s in order)


def fmt_wall(seconds) -> str:
    return "-" if seconds is None else f"{float(seconds):.0f}"


def _value_text(stats: CellStats) -> str:
    if stats.value is not None:
        return fmt_estimate(stats.value)
    if stats.stalled is not None:
        return f"stalled {fmt_estimate(stats.stalled)}"
    return "-"


def _versus_text(stats: CellStats, baseline: str) -> tuple[str, str, str]:
    """(difference, p of the t-test, p of the sign-flip test) for the cell against the baseline."""
    if stats.is_baseline:
        return "(baseline)", "", ""
    v: PairedComparison | None = stats.versus
    if v is None:
        return "-", "-", "-"
    return fmt_estimate(v.difference, signed=True), fmt_p(v.p_t), fmt_p(v.p_sign_flip)


def _verdict_text(stats: CellStats) -> str:
    """The cell's verdict against the baseline (``better (Dunnett, block model: p = 0.004, n = 3)``)."""
    if stats.is_baseline:
        return ""
    return "-" if stats.verdict is None else stats.verdict.text()


def _coordinate(cell: Cell, axis: str) -> str:
    value = cell.coords.get(axis)
    return f"{value:g}" if isinstance(value, float) else fmt(value)


def _row(values: list[str]) -> str:
    return "| " + " | ".join(values) + " |"


##################################################################################
#                                     Tables                                     #
##################################################################################


def _spreads(cell: Cell) -> tuple[float | None, float | None]:
    """``(SD over seeds, SD over a run's last evaluations pooled as a root mean square)`` of a cell's finished
    runs; None where there is no such spread."""
    runs = [r for r in cell.runs if r.get("status") == "finished" and r.get(PRIMARY) is not None]
    values = [float(r[PRIMARY]) for r in runs]
    within = [float(r["measurement_sd"]) for r in runs if r.get("measurement_sd") is not None]
    seed_sd = statistics.stdev(values) if len(values) > 1 else None
    return seed_sd, (math.sqrt(statistics.fmean(s * s for s in within)) if within else None)


def spread_text(cell: Cell) -> str:
    """``0.021 / 0.0042``: the seed SD, then the measurement's own SD (``-`` where there is none)."""
    return " / ".join("-" if v is None else f"{v:.2g}" for v in _spreads(cell))


def cells_markdown(
    cells: list[Cell], metric: str, baseline: str | None, table: list[dict], reading: Reading | None = None
) -> str:
    """One row per cell: ``metric`` as ``mean ± CI (n)`` (with, for a sweep whose metric is the mean of each
    run's last ``k`` validations, the SD over seeds next to the SD over a run's last ``k``), the paired
    difference to ``baseline`` with its t-test and sign-flip p-values and the verdict, an MoE's routing
    statistics and the test metrics' means, and every run counted by status."""
    reading = reading or Reading()
    axes = varying_axes(cells)
    primary = cell_stats(cells, PRIMARY, baseline, metric, reading)
    k = reading.last_evals
    tests = [m for m in routing_metrics(table, markdown=True) + tested_metrics(table) if in_markdown(m) and m != metric]
    test_stats = {m: cell_stats(cells, m, baseline, reading=reading) for m in tests}
    header = [*axes, metric]
    if k > 1:
        header.append(f"SD: seeds / a run's last {k} evals")
    if baseline:
        header += [f"Δ {metric} vs {baseline}", "p (paired t, unadjusted)", "p (sign-flip)", "verdict"]
    header += [*tests, "runs"]
    lines = [_row(header), "|" + "---|" * len(header)]
    for i, stats in enumerate(primary):
        cells_text = [_coordinate(stats.cell, a) for a in axes] + [_value_text(stats)]
        if k > 1:
            cells_text.append(spread_text(stats.cell))
        if baseline:
            cells_text += [*_versus_text(stats, baseline), _verdict_text(stats)]
        for m in tests:
            s = test_stats[m][i]
            cells_text.append("mixed protocols" if s.mixed_protocols else fmt_estimate(s.value))
        lines.append(_row([*cells_text, fmt_status_counts(stats.cell)]))
    return "\n".join(lines) + "\n"


def pivot_markdown(cells: list[Cell], metric: str, baseline: str | None, reading: Reading | None = None) -> str:
    """Schemes as rows, the other swept axis (lr, else overlay, else warmup) as columns; each entry
    ``mean ± CI (n)`` and, below it, the paired difference to the baseline with both p-values."""
    axes = [a for a in varying_axes(cells) if a != "scheme"]
    column_axis = next((a for a in ("lr", "overlay", "warmup") if a in axes), axes[0] if axes else None)
    row_axes = ["scheme", *[a for a in axes if a != column_axis]]
    stats = {s.cell.key: s for s in cell_stats(cells, PRIMARY, baseline, metric, reading)}
    columns = list(dict.fromkeys(_coordinate(c, column_axis) for c in cells)) if column_axis else [metric]
    rows: dict[tuple, dict[str, CellStats]] = {}
    for cell in cells:
        row = tuple(_coordinate(cell, a) for a in row_axes)
        rows.setdefault(row, {})[_coordinate(cell, column_axis) if column_axis else metric] = stats[cell.key]
    names = {"lr": "lr", "overlay": "", "warmup": "warmup"}
    header = [*row_axes, *[f"{names.get(column_axis, column_axis)} {c}".strip() for c in columns]]
    lines = [_row(header), "|" + "---|" * len(header)]
    for row, entries in rows.items():
        texts = []
        for c in columns:
            s = entries.get(c)
            if s is None:
                texts.append("")
                continue
            text = _value_text(s)
            failed = {k: v for k, v in s.cell.counts().items() if k != "finished"}
            if s.value is None and s.stalled is not None:
                failed.pop("stalled", None)  # the text says so already
            if failed:
                text += "; " + ", ".join(f"{v} {k}" for k, v in failed.items())
            if baseline and not s.is_baseline and s.versus is not None:
                v = s.versus
                n = "" if s.value is not None and v.n == s.value.n else f", {v.n} pairs"
                if v.n < 2:  # one pair: a difference, no test
                    text += f"<br>Δ {fmt_estimate(v.difference, signed=True)}"
                else:
                    diff = fmt_estimate(v.difference, signed=True).rsplit(" (n = ", 1)[0]
                    p_t = fmt_p(v.p_t)
                    p_t = p_t if p_t.startswith("<") else f"= {p_t}"
                    text += f"<br>Δ {diff}{n}, p {p_t} (t, unadjusted), {fmt_p(v.p_sign_flip)} (sign-flip)"
            if baseline and not s.is_baseline and s.verdict is not None:
                text += f"<br>**{s.verdict.text()}**"
            texts.append(text)
        lines.append(_row([*row, *texts]))
    return "\n".join(lines) + "\n"


def run_table_columns(table: list[dict], markdown: bool, metric: str) -> list[str]:
    """The per-run columns: the sweep's metric unless it is ``val/loss`` (a column already), the test
    metrics (markdown: without per-task downstream scores), ``protocol`` when runs differ in it."""
    base = [c for c in RUN_COLUMNS if c != PRIMARY or metric != "val/loss"]
    tests = [] if markdown else routing_metrics(table)  # per-run routing: CSV only
    tests += [m for m in tested_metrics(table) if in_markdown(m) or not markdown]
    tests = [m for m in tests if m != metric]  # a test metric the sweep is compared by has its own column
    protocol = ["protocol"] if any(r.get("protocol_id") not in (None, "same") for r in table) else []
    if markdown:
        return base + tests + protocol
    return base[:2] + CSV_COORDINATES + base[2:] + tests + protocol


def runs_markdown(table: list[dict], metric: str) -> str:
    """One row per run, in sweep order: what each run did (status, steps, losses, tests, time)."""
    names = run_table_columns(table, markdown=True, metric=metric)
    header = [metric if c == PRIMARY else c for c in names]
    lines = [_row(header), "|" + "---|" * len(header)]
    for r in table:
        values = {**r, "wall_s": fmt_wall(r.get("wall_s")), "protocol": r.get("protocol_id")}
        lines.append(_row([fmt(values.get(c)) for c in names]))
    return "\n".join(lines) + "\n"


def sensitivity_note(cells: list[Cell], metric: str, baseline: str | None) -> str | None:
    """One line: for every cell paired with the baseline, the smallest difference its pairs could detect and
    the seeds its observed difference would need (:func:`experiments.results.stats.sensitivity`); None when no
    cell has a paired comparison."""
    if not baseline:
        return None
    axes = [a for a in varying_axes(cells) if a != "scheme"]
    entries = []
    for s in cell_stats(cells, PRIMARY, baseline, metric):
        if s.is_baseline or s.versus is None:
            continue
        where = ", ".join(f"{a} {_coordinate(s.cell, a)}" for a in axes if s.cell.coords.get(a) is not None)
        label = ", ".join(x for x in (s.cell.scheme, where) if x)
        pairs = "" if s.value is not None and s.versus.n == s.value.n else f" ({s.versus.n} pairs)"
        entries.append(f"{label}{pairs}: {fmt_sensitivity(sensitivity(s.versus))}")
    if not entries:
        return None
    power = f"{POWER * 100:.0f} %"
    return (f"Evidence of each Δ (detectable / seeds needed): the smallest true difference the paired t-test "
            f"(two-sided, alpha {ALPHA:g}) finds with {power} power from these pairs at their paired standard "
            "deviation, and the seeds the observed Δ would need for that power: "
            + "; ".join(entries) + ".")  # fmt: skip


def verdict_note(cells: list[Cell], metric: str, baseline: str, reading: Reading | None = None) -> str:
    """What the verdicts mean and, per slice, the analysis that gave them (:mod:`experiments.results.verdicts`);
    the margin used and where it comes from; for a staged sweep, the looks' levels."""
    reading = reading or Reading()
    margin = reading.margin(metric)
    direction = "higher" if higher_is_better(metric) else "lower"
    equivalent = (f"**equivalent within ±{margin:g}** = TOST on the same standard error and degrees of freedom, "
                  f"Holm-adjusted over the slice, p < {ALPHA:g} (margin δ = {margin:g}, "
                  f"{reading.margin_source(metric)}); " if margin
                  else f"no equivalence margin is declared for {metric}; ")  # fmt: skip
    slices = slice_verdicts(cells, baseline, metric, reading=reading)[1]
    axes = [a for a in varying_axes(cells) if a != "scheme"]
    per_slice = []
    for where, analysis in slices.items():
        label = ", ".join(f"{a} {v:g}" if isinstance(v, float) else f"{a} {v}" for a, v in where if a in axes)
        per_slice.append((f"{label}: " if label else "") + analysis.describe())
    return (f"Verdict (against {baseline}, {direction} {metric} is better; stalled, diverged and crashed runs left "
            f"out): one randomized-block analysis per slice ({metric} ~ scheme + seed, one pooled residual variance), "
            f"**better** / **worse** = Dunnett's many-to-one test on it, family-wise p < {ALPHA:g} (p shown "
            "adjusted); " + equivalent + "**undecided** = neither, with the seeds per cell the pooled analysis needs "
            f"for {POWER * 100:.0f} % power at the observed Δ and the smallest Δ its seeds detect. Where "
            f"Brown-Forsythe rejects equal spread (p < {ALPHA:g}), each cell's own paired t-test and TOST with Holm "
            "across the slice. The paired t and sign-flip p-values are per cell, unadjusted. "
            + "; ".join(per_slice) + "." + _staging_note(reading))  # fmt: skip


def _staging_note(reading: Reading) -> str:
    """For a staged sweep: which seeds and levels each look's verdicts were read at."""
    staging = reading.staging
    if staging is None:
        return ""
    looks = "; ".join(
        f"look {k}: {n} seeds, p < {staging.thresholds(k)[0]:.2g} (TOST, each side: {staging.thresholds(k)[1]:.2g})"
        for k, n in enumerate(staging.stages, 1)
    )
    return (f" Seeds in stages {list(staging.stages)} ({staging.recorded} look(s) recorded in stages.yaml): each cell "
            "is read at the last look it took part in, on that look's seeds, against that look's Lan-DeMets "
            f"O'Brien-Fleming nominal level (the verdict names the look): {looks}.")  # fmt: skip


def notes(
    cells: list[Cell],
    baseline_loss: float | None,
    protocol_notes: list[str],
    baseline: str | None,
    metric: str | None = None,
    reading: Reading | None = None,
) -> str:
    """What the numbers mean: interval, tests, each comparison's evidence, the stall line, the test protocols."""
    reading = reading or Reading()
    n_max = max((len(c.values()) for c in cells), default=0)
    if n_max < 2:
        out = ["One finished run per cell (n = 1): each value stands alone, with no interval and no paired test; "
               "a difference of a few hundredths may be within what another seed would move."]  # fmt: skip
        if baseline:
            out.append(f"Δ = scheme - {baseline} on the same seed.")
    else:
        out = [f"mean ± {CI_NAME} (t-interval over seeds; n = finished runs). Stalled, diverged and crashed runs "
               "are counted in `runs`, never averaged in."]  # fmt: skip
        if baseline:
            out.append(f"Δ = scheme - {baseline}, paired by seed over seeds where both finished; two-sided p-values "
                       "of the paired t-test and of the exact sign-flip permutation test, whose smallest possible "
                       f"value with n = {n_max} pairs is {sign_flip_floor(n_max):.2g}.")  # fmt: skip
            if metric is not None and (evidence := sensitivity_note(cells, metric, baseline)):
                out.append(evidence)
            if metric is not None:
                out.append(verdict_note(cells, metric, baseline, reading))
        if reading.last_evals > 1:
            out.append(f"Each run's {metric or 'metric'} is the mean of its last {reading.last_evals} validations "
                       f"(the sweep's last_evals); SD: seeds / a run's last {reading.last_evals} evals = the SD "
                       "between the seeds' values, then each run's SD over those validations pooled as a root mean "
                       "square: where the second is near the first, the evaluation's own noise is a large part of "
                       "the seed spread (more validation batches narrow the comparison more cheaply than more "
                       "seeds).")  # fmt: skip
    if any(k.startswith(ROUTING_PREFIX) for c in cells for r in c.runs for k in r):
        out.append("MoE routing at the last validation (means over its batches): `val/moe_aux` = load-balancing "
                   "loss summed over the MoE layers (1 per layer for a uniform router), `val/moe_entropy` = "
                   "expert-usage entropy / ln E (1 = every expert equally used), `val/moe_load_ratio` = busiest / "
                   "idlest expert's token count, mean over layers (load max / min per expert: comparison_cells.csv). "
                   "The router is dropless: no token is dropped.")  # fmt: skip
    if baseline_loss is not None:
        line = STALL_RATIO * baseline_loss
        out.append(f"Context-free baseline loss of the data: {baseline_loss:.4f}. stalled = finished with val_loss "
                   f"above {STALL_RATIO:g} x baseline = {line:.4f}.")  # fmt: skip
    out += protocol_notes
    return "\n".join(out) + "\n"


##################################################################################
#                                      CSV                                       #
##################################################################################


def _csv_value(column: str, value):
    if column == "wall_s" and isinstance(value, int | float):
        return f"{value:.1f}"
    return "" if value is None else value


def write_runs_csv(path: Path, table: list[dict], metric: str) -> None:
    """The per-run table with every test metric (per-task downstream scores included); the metric's
    column is named after it."""
    names = run_table_columns(table, markdown=False, metric=metric)
    fh = io.StringIO(newline="")
    writer = csv.writer(fh)
    writer.writerow([metric if c == PRIMARY else c for c in names])
    for r in table:
        values = {**r, "protocol": r.get("protocol_id")}
        writer.writerow([_csv_value(c, values.get(c)) for c in names])
    atomic_write_text(path, fh.getvalue())  # two comparisons at once: each file is one of them, whole


def cells_csv(
    cells: list[Cell], metric: str, baseline: str | None, table: list[dict], reading: Reading | None = None
) -> str:
    """Per cell and metric (the sweep's, an MoE's routing statistics, then every test metric): the markdown's
    ``mean ± CI (n)`` and ``Δ`` texts, then n, mean, std, CI, and the paired difference to the baseline with
    its CI and both p-values; plus the run counts per status."""
    axes = [a for a in AXES if any(a in c.coords for c in cells)]
    axes += list(dict.fromkeys(k for c in cells for k in c.coords if k not in axes))
    metrics = {PRIMARY: metric, **{m: m for m in routing_metrics(table) + tested_metrics(table) if m != metric}}
    fields = ["n", "mean", "std", "ci_low", "ci_high"]
    paired_fields = ["diff_n", "diff_mean", "diff_ci_low", "diff_ci_high", "p_paired_t", "p_sign_flip", "diff_std",
                     "detectable_diff", "seeds_needed", "evidence"]  # fmt: skip
    within = (reading or Reading()).last_evals > 1  # the measurement's own spread beside the seeds' ("std")
    header = [*axes, *STATUS_ORDER, *(["measurement_sd"] if within else [])]
    verdict_fields = ["verdict", "verdict_text", "verdict_p_adjusted", "verdict_p_tost", "verdict_margin",
                      "verdict_analysis", "verdict_n", "verdict_seeds_needed", "verdict_detectable",
                      "verdict_level", "verdict_look"]  # fmt: skip
    if baseline:
        header += verdict_fields
    for name in metrics.values():  # the table's text first (``mean ± CI (n)``), then the numbers
        header += [name] + (["Δ " + name] if baseline else [])
        header += [f"{name} {f}" for f in fields + (paired_fields if baseline else [])]
    stats = {key: cell_stats(cells, key, baseline, name, reading) for key, name in metrics.items()}
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(header)
    for i, cell in enumerate(cells):
        counts = cell.counts()
        row = [cell.coords.get(a, "") for a in axes] + [counts.get(s, 0) for s in STATUS_ORDER]
        row += [_spreads(cell)[1]] if within else []
        if baseline:
            v = stats[PRIMARY][i].verdict
            look = "" if v is None or v.look is None else f"{v.look[0]} of {v.look[1]}"
            row += [""] * len(verdict_fields) if v is None else [v.word, v.text(), v.p, v.p_equivalence, v.margin,
                                                                  v.analysis, v.n, v.needed, v.detectable,
                                                                  v.threshold, look]  # fmt: skip
        for key in metrics:
            s = stats[key][i]
            e = s.value
            row.append("mixed protocols" if s.mixed_protocols else _value_text(s))
            if baseline:
                row.append(_versus_text(s, baseline)[0])
            row += [e.n, e.mean, e.std, e.low, e.high] if e else [0, "", "", "", ""]
            if baseline:
                v = s.versus
                d = v.difference if v else None
                if v:
                    e_v = sensitivity(v)
                    row += [v.n, d.mean, d.low, d.high, v.p_t, v.p_sign_flip, e_v.std, e_v.detectable, e_v.needed,
                            fmt_sensitivity(e_v)]  # fmt: skip
                else:
                    row += [0, "", "", "", "", "", "", "", "", ""]
        writer.writerow(["" if x is None else x for x in row])
    return out.getvalue()
