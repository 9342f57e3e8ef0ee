"""Seeds added in stages until each cell is decided: ``stages: [3, 5, 8]`` with ``seeds`` (8 of them, the cap).

    look 1   every cell runs seeds[:3]; the verdicts at look 1's level; decided cells stop
    look 2   the undecided cells (and the baseline of their slice: the seeds are paired blocks) run seeds[3:5]
    look 3   ... seeds[5:8]; what is still undecided at the cap stays undecided

A look's verdicts come from the comparison's slice analysis over every finished run so far
(:func:`experiments.results.cells.slice_verdicts`), with the adjusted p-values compared with that look's
nominal levels from Lan-DeMets O'Brien-Fleming alpha spending over the information fractions
``stages / cap`` (:func:`experiments.results.sequential.look_thresholds`: two-sided for a difference, one-sided
for each of TOST's tests), so looking three times spends no more than alpha = 0.05 in all. A cell decided at a
look keeps that verdict. Each look is recorded in ``<sweep>/stages.yaml`` (seeds, fractions, the alpha spent so
far, the nominal levels, every active cell's verdict and which cells continue) and ``stages.md`` the first time
all of its runs have ended; later invocations read the recorded looks back and never decide a look again. A run
that crashed or is still running holds its look open (the next invocation reruns or waits for it).
"""

from __future__ import annotations

from pathlib import Path

import yaml

from experiments.results.cells import PRIMARY, group, slice_verdicts
from experiments.results.compare import load_comparison
from experiments.results.measurement import metric_values
from experiments.results.reading import Reading
from experiments.results.records import STAGES_RECORD, STAGES_TABLE, read_record
from experiments.results.sequential import look_thresholds, spent
from experiments.results.verdicts import ALPHA
from experiments.sweeps.spec import Run, SweepSpec, grid
from fileio import atomic_write_text

ENDED = ("finished", "stalled", "diverged")
SPENDING = "Lan-DeMets O'Brien-Fleming alpha spending (two-sided for a difference, one-sided per TOST test)"


def cell_of(run: Run, spec: SweepSpec) -> str:
    """A run's cell: its name without the seed."""
    return run.name(spec).rsplit(f"-s{run.seed}", 1)[0]


def slice_of(run: Run) -> tuple:
    return (run.overlay, run.lr, run.warmup)


def fractions(spec: SweepSpec) -> list[float]:
    """The looks' information fractions: seeds at each stage over the cap's."""
    return [n / spec.stages[-1] for n in spec.stages]


def read_stages(spec: SweepSpec, sweep_dir: Path) -> list[dict]:
    """The looks recorded so far; one line when they were recorded under other stages, seeds or metric."""
    record = read_record(
        sweep_dir / STAGES_RECORD, "stages", ("looks", list), _planned(spec), "recorded its looks",
        "the stages it ran, or a new sweep name", str(spec.source),
    )  # fmt: skip
    return [] if record is None else record["looks"]


def _planned(spec: SweepSpec) -> dict:
    margins = {"margins": dict(spec.margins)} if spec.margins else {}  # the verdicts' margins, when declared
    return {"stages": list(spec.stages), "seeds": list(spec.seeds), "metric": spec.metric,
            "baseline": spec.baseline, "last_evals": spec.last_evals, "alpha": ALPHA, **margins}  # fmt: skip


def _stage_runs(spec: SweepSpec, n: int, active: set[str] | None) -> list[Run]:
    seeds = set(spec.seeds[:n])
    return [r for r in grid(spec) if r.seed in seeds and (active is None or cell_of(r, spec) in active)]


def plan(spec: SweepSpec, looks: list[dict]) -> tuple[int | None, list[Run], list[Run]]:
    """``(next look or None when every look is decided, the runs of that look, every run launched by then)``."""
    active: set[str] | None = None
    launched: dict[str, Run] = {}
    for k, n in enumerate(spec.stages, 1):
        runs = _stage_runs(spec, n, active)
        launched.update((r.name(spec), r) for r in runs)
        if k > len(looks):
            return k, runs, list(launched.values())
        active = set(looks[k - 1]["continue"])
        if not active:
            break
    return None, [], list(launched.values())


def decide(spec: SweepSpec, sweep_dir: Path, look: int, runs: list[Run], launched: list[Run]) -> bool:
    """Records look ``look`` once its runs have all ended (True); False while one has not."""
    looks = read_stages(spec, sweep_dir)
    names = [r.name(spec) for r in launched]
    comparison = load_comparison(sweep_dir, names, spec.metric)
    rows = {row["run"]: row for row in comparison.table}
    if any(rows[r.name(spec)]["status"] not in ENDED for r in runs):
        return False
    values = metric_values(comparison, spec.last_evals)
    for row in comparison.table:
        row[PRIMARY] = values[row["run"]][0]
    cells = group(comparison.table)
    t = fractions(spec)
    difference, equivalence = look_thresholds(look, t, ALPHA)
    verdicts, _ = slice_verdicts(cells, spec.baseline, spec.metric, thresholds=(difference, equivalence),
                                 reading=Reading(margins=spec.margins))  # fmt: skip
    by_key = {row["cell"]: cell_of(r, spec) for r in launched if (row := rows[r.name(spec)])}
    active = {cell_of(r, spec): r for r in runs}
    decided: dict[str, dict] = {}
    for key, verdict in verdicts.items():
        cell = by_key.get(key)
        if cell in active:
            decided[cell] = {"word": verdict.word, "text": verdict.text(), "n": verdict.n, "p": verdict.p,
                             "p_equivalence": verdict.p_equivalence}  # fmt: skip
    going = set()
    if look < len(spec.stages):
        for cell, verdict in decided.items():
            if verdict["word"] == "undecided":
                where = slice_of(active[cell])
                going.add(cell)
                going.update(c for c, r in active.items() if r.scheme == spec.baseline and slice_of(r) == where)
    looks.append({
        "look": look, "seeds_per_cell": spec.stages[look - 1], "seeds": spec.seeds[: spec.stages[look - 1]],
        "fraction": t[look - 1], "alpha_spent": spent(t[look - 1], ALPHA), "nominal_difference": difference,
        "nominal_equivalence": equivalence, "runs": [r.name(spec) for r in runs], "verdicts": decided,
        "continue": sorted(going),
    })  # fmt: skip
    record = {**_planned(spec), "spending": SPENDING, "looks": looks}
    atomic_write_text(sweep_dir / STAGES_TABLE, stages_markdown(record))
    atomic_write_text(sweep_dir / STAGES_RECORD, yaml.safe_dump(record, sort_keys=False))
    return True


def stages_markdown(record: dict) -> str:
    """``stages.md``: per look its seeds and levels, then every cell's verdict at the look that decided it."""
    lines = [
        f"## Stages: seeds per cell {record['stages']} (cap {record['stages'][-1]}), {record['spending']}",
        "",
        "| look | seeds per cell | fraction | alpha spent | nominal p (difference) | nominal p (TOST, each side) "
        "| runs | cells continuing |",
        "|---|---|---|---|---|---|---|---|",
    ]
    final: dict[str, tuple[int, dict]] = {}
    for look in record["looks"]:
        lines.append(
            f"| {look['look']} | {look['seeds_per_cell']} | {look['fraction']:.3g} | {look['alpha_spent']:.4g} | "
            f"{look['nominal_difference']:.4g} | {look['nominal_equivalence']:.4g} | {len(look['runs'])} | "
            f"{', '.join(look['continue']) or '-'} |"
        )
        for cell, verdict in look["verdicts"].items():
            final[cell] = (look["look"], verdict)
    lines += ["", f"| cell | verdict vs {record['baseline']} | look | n |", "|---|---|---|---|"]
    lines += [f"| {cell} | {v['text']} | {k} | {v['n']} |" for cell, (k, v) in final.items()]
    lines += [
        "",
        "Each cell's verdict is the one of the look that decided it (or of the last look it ran); at each look the "
        "adjusted p-values are compared with that look's nominal level, so the looks together spend at most alpha "
        f"= {record['alpha']:g}. The comparison table's verdict column is read at the fixed-sample level, not "
        "these.",
    ]
    return "\n".join(lines) + "\n"
