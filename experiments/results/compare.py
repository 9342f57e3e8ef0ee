"""Turn run summaries into a comparison: markdown + CSV tables, PNG plots and a TensorBoard layout.

    python -m experiments compare runs/lm/stability                              # rebuild the comparison
    python -m experiments compare runs/lm/stability --export docs/results/stability   # and copy it into the repo
    python -m experiments compare runs/vit/vit-tiny --baseline siamese   # print the cells paired against siamese
    python -m experiments compare docs/results/stability --tables-only   # refresh an export's tables in place

The headline table has one row per cell of the grid (scheme x overlay x lr x warmup): the sweep's metric
as ``mean ± 95 % CI (n)`` over seeds, the paired difference to the spec's ``baseline`` scheme with its
t-test and sign-flip p-values, and every run counted by status; the per-run table follows it
(:mod:`experiments.results.tables`, :mod:`experiments.results.stats`).

A run's status is its summary's (finished, diverged, interrupted, crashed), except that a finished run
whose validation loss stays above ``STALL_RATIO`` x the data's baseline loss (for the LM: the unigram
entropy, what a model scores that ignores context) is reported as **stalled**: it ran to the end but
learned (almost) nothing beyond token frequencies, which is how Post-Norm fails at high learning rates
at small scale rather than blowing up.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

from experiments.reliability.errors import ArgumentParser, SuiteError
from experiments.results import plots, speed, tables
from experiments.results.cells import PRIMARY, Cell, assign_protocols, cell_key, group, run_coordinates
from experiments.results.export import check_target, export
from experiments.results.measurement import MEASUREMENT_TABLE, spread_markdown, with_last_evals
from experiments.results.profiles import plot_depth_profiles
from experiments.results.reading import Reading, read_reading
from experiments.results.runs import SWEEP_RECORD, load_summaries, sweep_record
from experiments.results.tables import STALL_RATIO
from experiments.results.tb_layout import write_layout
from experiments.results.verdict_list import verdicts_markdown
from fileio import atomic_write_text

CELLS_CSV = "comparison_cells.csv"
__all__ = ["STALL_RATIO", "SWEEP_RECORD", "Comparison", "load_comparison", "load_summaries", "write_comparison"]


def sweep_baseline(summaries: dict[str, dict]) -> float | None:
    """The baseline loss the runs report, when they agree on one (they share the data); else None.

    Summaries written before runs recorded it take this value, since it belongs to the data, not the run.
    """
    values = {round(s["baseline_loss"], 9) for s in summaries.values() if s.get("baseline_loss") is not None}
    return values.pop() if len(values) == 1 else None


WHOLE_SPLIT = "whole_split_val"  # summary.json: the final weights validated on the whole split (after fit)


def whole_split_for_all(summaries: dict[str, dict]) -> bool:
    """Whether every run that has a validation has one on the whole split: then those are compared; one run without
    it (recorded before the final validation existed, or run with it off) and all are read at their last in-loop
    validation, so no cell pairs a whole-split value with a sampled one."""
    validated = [s for s in summaries.values() if s.get("final_val") or s.get(WHOLE_SPLIT)]
    return bool(validated) and all(isinstance(s.get(WHOLE_SPLIT), dict) and s[WHOLE_SPLIT] for s in validated)


def validation_of(summary: dict, whole_split: bool) -> dict:
    """The validation metrics a comparison reads of a run: the whole split's or the last in-loop one's."""
    return (summary.get(WHOLE_SPLIT) if whole_split else None) or summary.get("final_val") or {}


def validation_note(summaries: dict[str, dict]) -> list[str]:
    """What the val/ values of a comparison are, said once under its tables."""
    validated = [s for s in summaries.values() if s.get("final_val") or s.get(WHOLE_SPLIT)]
    whole = sum(bool(s.get(WHOLE_SPLIT)) for s in validated)
    if not validated:
        return []
    if whole == len(validated):
        return ["val/ metrics: each run's final weights on the whole validation split (summary.json whole_split_val)"]
    if whole:
        return [f"val/ metrics: the last in-loop validation of every run, since {len(validated) - whole} of "
                f"{len(validated)} runs have no whole-split validation (a comparison never mixes the two)"]  # fmt: skip
    return ["val/ metrics: each run's last in-loop validation (summary.json final_val)"]


def status_of(summary: dict, baseline: float | None, whole_split: bool = False) -> str:
    status = summary.get("status", "?")
    val_loss = validation_of(summary, whole_split).get("val/loss")
    baseline = summary.get("baseline_loss") or baseline
    if status == "finished" and val_loss is not None and baseline and val_loss > STALL_RATIO * baseline:
        return "stalled"
    return status


def rows(summaries: dict[str, dict], metric: str, coordinates: dict[str, dict] | None = None) -> list[dict]:
    """One row per run: its grid coordinates (``coordinates``, default: from the summaries), status,
    losses, the sweep's ``metric`` (key ``metric``), an MoE's routing statistics (``val/moe_*``), test
    metrics and test protocol."""
    coordinates = coordinates or run_coordinates({}, summaries)
    table, baseline, whole = [], sweep_baseline(summaries), whole_split_for_all(summaries)
    for name, s in summaries.items():
        val = validation_of(s, whole)
        coords = coordinates.get(name) or run_coordinates({}, {name: s})[name]
        diverged = s.get("status") == "diverged"
        table.append(
            {
                "run": name,
                **{k: v for k, v in coords.items()},
                "scheme": coords.get("scheme", s.get("scheme", "?")),  # the grid's: a named variant stays named
                "lr": coords.get("lr", s.get("lr")),
                "cell": cell_key({k: v for k, v in coords.items()}),
                "status": status_of(s, baseline, whole),
                "steps": s.get("steps"),
                "train_loss": s.get("final_train_loss"),
                "val_loss": val.get("val/loss"),
                PRIMARY: (s.get("test") or {}).get(metric) if metric.startswith("test/") else val.get(metric),
                "diverged": f"yes (step {s.get('diverged_at')})" if diverged else "no" if "steps" in s else None,
                "spikes": s.get("spikes", 0) if "steps" in s else None,
                "wall_s": s.get("wall_time_s"),
                "params": s.get("params"),
                "protocol": s.get("test_protocol") if isinstance(s.get("test_protocol"), dict) else None,
                **{k: v for k, v in val.items() if k.startswith(tables.ROUTING_PREFIX)},  # MoE: the router at the end
                **{k: v for k, v in (s.get("test") or {}).items() if k.startswith("test/")},
            }
        )
    return table


@dataclass
class Comparison:
    """A sweep's runs, their cells and everything the tables and plots are drawn from."""

    record: dict
    metric: str
    baseline: str | None  # the scheme every cell is paired with (the spec's ``baseline``)
    summaries: dict[str, dict]
    table: list[dict]
    cells: list[Cell]
    protocol_notes: list[str]
    reading: Reading = field(default_factory=Reading)  # the sweep's margins, looks and last_evals

    @property
    def baseline_loss(self) -> float | None:
        return sweep_baseline(self.summaries)

    @property
    def seeds(self) -> list:
        return list(dict.fromkeys(r.get("seed") for r in self.table if r.get("seed") is not None))

    def notes(self) -> str:
        return tables.notes(
            self.cells, self.baseline_loss, self.protocol_notes, self.baseline, self.metric, self.reading
        )

    def block(self, kind: str) -> str:
        """A README block: ``table`` (cells), ``pivot`` (scheme x axis), ``runs`` (per run), ``notes`` or
        ``verdicts`` (the verdicts as prose lines, per word)."""
        if kind == "table":
            cells = tables.cells_markdown(self.cells, self.metric, self.baseline, self.table, self.reading)
            return cells + "\n" + self.notes()
        if kind == "pivot":
            return tables.pivot_markdown(self.cells, self.metric, self.baseline, self.reading) + "\n" + self.notes()
        if kind == "runs":
            return tables.runs_markdown(self.table, self.metric)
        if kind == "verdicts":
            return verdicts_markdown(self.cells, self.metric, self.baseline, self.reading)
        if kind == "notes":
            return self.notes()
        raise SuiteError(f"unknown results block {kind!r}; valid: table, pivot, runs, notes, verdicts")

    def markdown(self) -> str:
        """``comparison.md``: the cells table with its notes, then the per-run table."""
        name = self.record.get("name") or "sweep"
        return (f"## {name}: {self.metric} per cell, over seeds\n\n{self.block('table')}\n"
                f"## {name}: every run\n\n{self.block('runs')}")  # fmt: skip


def load_comparison(sweep_dir: Path, names: list[str] | None = None, metric: str | None = None) -> Comparison:
    """Reads a sweep directory (or an export of one): ``sweep.yaml``, the runs' ``summary.json`` and the records
    the sweep wrote beside them, so the comparison measures and reads the runs as the sweep did: each run's value
    the mean of its last ``last_evals`` validations (:mod:`experiments.results.measurement`), the verdicts at the
    sweep's declared ``margins`` and, for a staged sweep, each cell at its look (:mod:`experiments.results.reading`).
    """
    record = sweep_record(sweep_dir)
    reading = read_reading(sweep_dir, record)  # bad margins / stages / last_evals: one line before reading runs
    metric = metric or record.get("metric", "val/loss")
    summaries = load_summaries(sweep_dir, names)
    table = rows(summaries, metric, run_coordinates(record, summaries))
    protocol_notes = assign_protocols(table) + validation_note(summaries)
    comparison = Comparison(record, metric, record.get("baseline"), summaries, table, group(table), protocol_notes,
                            reading)  # fmt: skip
    return with_last_evals(comparison, reading.last_evals) if reading.last_evals > 1 else comparison


def write_tables(sweep_dir: Path, comparison: Comparison) -> dict[str, Path]:
    """Writes the text outputs only: ``comparison.md``, ``comparison.csv`` (per run), ``comparison_cells.csv``."""
    sweep_dir.mkdir(parents=True, exist_ok=True)
    out = {"markdown": sweep_dir / "comparison.md", "csv": sweep_dir / "comparison.csv"}
    out["cells_csv"] = sweep_dir / CELLS_CSV
    atomic_write_text(out["markdown"], comparison.markdown())
    tables.write_runs_csv(out["csv"], comparison.table, comparison.metric)
    cells = tables.cells_csv(
        comparison.cells, comparison.metric, comparison.baseline, comparison.table, comparison.reading
    )
    atomic_write_text(out["cells_csv"], cells)
    if comparison.reading.last_evals > 1:  # the seed spread beside the measurement's own
        out["measurement"] = sweep_dir / MEASUREMENT_TABLE
        atomic_write_text(out["measurement"], spread_markdown(comparison, comparison.reading.last_evals))
    # the speed table when some run recorded its speed (or an earlier table is there to refresh)
    if speed.any_perf(comparison.summaries) or (sweep_dir / speed.SPEED_TABLE).exists():
        result = speed.speed_table(comparison.cells, comparison.summaries, comparison.baseline)
        out["speed"], out["speed_csv"] = sweep_dir / speed.SPEED_TABLE, sweep_dir / speed.SPEED_CSV
        atomic_write_text(out["speed"], speed.speed_markdown(result, comparison.record.get("parallel")))
        atomic_write_text(out["speed_csv"], speed.speed_csv(result))
    return out


def write_comparison(sweep_dir: Path, names: list[str] | None = None, metric: str | None = None) -> dict[str, Path]:
    """Writes ``comparison.md``, ``comparison.csv`` (per run), ``comparison_cells.csv`` (per cell),
    ``curves.png`` (+ ``stability.png``, ``metric_vs_lr.png`` with several rates, ``depth_profiles.png``
    when the runs logged diagnostics) and the TensorBoard layout. ``metric`` defaults to the sweep's
    (``sweep.yaml``), else ``val/loss``. Each file is replaced atomically; a run still running is listed as
    running, and its directory is neither read nor written (the layout goes into the other runs').

    Returns:
        ``{kind: path}`` of what was written.
    """
    comparison = load_comparison(sweep_dir, names, metric)
    metric = comparison.metric
    out = write_tables(sweep_dir, comparison)
    out["curves"] = sweep_dir / "curves.png"
    title = plots.model_title(comparison.record, comparison.summaries, comparison.seeds, metric)
    plots.plot_curves(comparison.cells, comparison.summaries, out["curves"], title)
    if plots.plot_stability(comparison.cells, sweep_dir / "stability.png", metric):
        out["stability"] = sweep_dir / "stability.png"
    if plots.plot_metric_vs_lr(comparison.cells, sweep_dir / "metric_vs_lr.png", metric):
        out["metric_vs_lr"] = sweep_dir / "metric_vs_lr.png"
    if plot_depth_profiles(sweep_dir, comparison.cells, sweep_dir / "depth_profiles.png"):
        out["depth_profiles"] = sweep_dir / "depth_profiles.png"
    quiet = [n for n, s in comparison.summaries.items() if s.get("status") != "running"]  # nobody writes them
    if layout := write_layout(sweep_dir, quiet, metric):
        out["tb_layout"] = layout
    return out


def against(comparison: Comparison, scheme: str, export_dir: Path | None = None) -> Comparison:
    """The comparison with its cells paired against ``scheme`` (checked to be one of its schemes)."""
    schemes = list(dict.fromkeys(cell.scheme for cell in comparison.cells))
    if scheme not in schemes:
        raise SuiteError(f"--baseline {scheme}: not a scheme of this sweep; valid: {', '.join(schemes)}")
    if export_dir is not None:
        raise SuiteError(
            f"--baseline {scheme} with --export {export_dir}: --baseline only prints (an export is the sweep's "
            "own comparison); valid: one of the two"
        )
    # the looks were spent against the sweep's own baseline: paired with another scheme, every cell is read once
    reading = comparison.reading if scheme == comparison.baseline else replace(comparison.reading, staging=None)
    return replace(comparison, baseline=scheme, reading=reading)


def main(argv: list[str] | None = None) -> None:
    """``python -m experiments compare SWEEP_DIR [--export DIR [--overwrite] | --baseline SCHEME]``."""
    parser = ArgumentParser(
        prog="python -m experiments compare",
        description="Rebuild a sweep directory's comparison (tables, plots, TensorBoard layout) from its runs' "
        "summary.json files; --export copies the small files README's tables are generated from into DIR.",
    )
    parser.add_argument("sweep_dir", type=Path, help="a sweep directory, e.g. runs/lm/stability")
    parser.add_argument(
        "--export", type=Path, metavar="DIR", help="also copy the comparison to DIR (e.g. docs/results/stability)"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace an earlier export in DIR")
    parser.add_argument(
        "--baseline",
        metavar="SCHEME",
        help="only print the cells table paired seed by seed against SCHEME (e.g. a scheme without its DyT "
        "overlay) instead of the sweep's baseline; writes nothing",
    )
    parser.add_argument(
        "--tables-only",
        action="store_true",
        help="rewrite only comparison.md, comparison.csv and comparison_cells.csv from the summaries (no plots, no "
        "TensorBoard layout): refreshes an export such as docs/results/stability, whose runs are not here",
    )
    args = parser.parse_args(argv)
    if not args.sweep_dir.is_dir():
        raise SuiteError(f"{args.sweep_dir} is not a directory; valid: a sweep directory such as runs/lm/demo")
    if not (args.sweep_dir / SWEEP_RECORD).is_file() and not any(args.sweep_dir.glob("*/summary.json")):
        raise SuiteError(f"{args.sweep_dir} holds no sweep.yaml and no */summary.json; valid: a sweep directory")
    if args.tables_only:
        if args.export is not None or args.baseline is not None:
            raise SuiteError("--tables-only rewrites the directory's own tables; valid: without --export/--baseline")
        for kind, p in write_tables(args.sweep_dir, load_comparison(args.sweep_dir)).items():
            print(f"{kind:>14}: {p}")
        return
    if args.baseline is not None:
        print(against(load_comparison(args.sweep_dir), args.baseline, args.export).block("table"), end="")
        return
    if args.export is not None:  # refuse before writing anything
        check_target(args.export, args.sweep_dir, args.overwrite)
    for kind, p in write_comparison(args.sweep_dir).items():
        print(f"{kind:>14}: {p}")
    statuses = Counter(r["status"] for r in load_comparison(args.sweep_dir).table)
    print(f"{'runs':>14}: " + ", ".join(f"{n} {status}" for status, n in statuses.items()))
    if statuses.get("running") or statuses.get("missing"):
        print(f"{'note':>14}: some runs have not finished; compare (and export) again when the sweep is done")
    if args.export is not None:
        for p in export(args.sweep_dir, args.export, args.overwrite):
            print(f"      exported: {p}")
    print(f"   tensorboard: tensorboard --logdir {args.sweep_dir}  (CUSTOM SCALARS: every run per chart)")


if __name__ == "__main__":
    main()
