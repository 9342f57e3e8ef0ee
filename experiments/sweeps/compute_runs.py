"""The effective-compute multiplier of a tune-then-compare sweep: ``protocol.compute_multiples``.

    fresh     every scheme at its picked rate on the fresh seeds (as without the option)
    + longer  the baseline at its picked rate on each fresh seed, once per multiple m, for m x the budget's steps
    compute   per scheme that beats the baseline, per seed: the step multiple at which that seed's baseline curve
              (1x = its fresh run, then the longer runs) reaches the scheme's loss; their interval over seeds

A longer run is a complete run, not a checkpoint of one: its ``trainer.max_steps`` and its warmup
(``optim.warmup_steps``) are m times the 1x run's, so its cosine decays to the same floor at its own end. A
checkpoint in the middle of a longer cosine schedule is not annealed: its loss sits above an annealed run's of
the same length, and the multiplier read from it would be too large. Everything else (the peak rate, the floor
``min_lr_ratio``, batches, validation interval) stays as the 1x run has it. The runs are named like the fresh
run they stretch, with the multiple after it (``pre-lr0.00631-s1-x1.25``): grid names end in ``-s<seed>``, so
no name of the grid is ever taken, and the fresh runs keep their names and order.

The multiplier of a seed is :func:`experiments.results.compute.compute_multiplier` of that seed's curve, at the
steps actually run over the 1x steps (rounding: 1.25 x 121 steps = 151 is 1.2479x), and the scheme's interval
over seeds :func:`~experiments.results.compute.multiplier_interval`. Each run's value is its final value of the
sweep's metric (the whole-split validation of the final weights when every run has one), never a mean of its
last evaluations: a longer run's in-loop evaluations sit at other points of its schedule than the 1x run's.
"Beats the baseline" is the sweep's own verdict (``better``, as in ``comparison.md``); any other verdict gets no
multiplier and says why. A run that has not ended leaves its seed, and the scheme's interval, ``pending``.
Written to ``compute.yaml`` and ``compute.md`` beside ``tuning.yaml`` whenever the sweep, ``--status`` or
``--collect`` looks; recomputed from the runs every time (nothing is decided once), so resuming is free.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import yaml

from experiments.results.cells import slice_verdicts
from experiments.results.compare import load_comparison, validation_of, whole_split_for_all
from experiments.results.compute import compute_multiplier, multiplier_interval
from experiments.sweeps.compute_option import COMPUTE_KEY, multiple_tag
from experiments.sweeps.estimate import resolve_config, run_extra_args
from experiments.sweeps.protocol import ENDED, group_of
from experiments.sweeps.spec import Run, SpecError, SweepSpec, grid
from fileio import atomic_write_text

COMPUTE_RECORD = "compute.yaml"
COMPUTE_TABLE = "compute.md"
CONFIDENCE = 0.95
PENDING = "pending"


@dataclass(frozen=True)
class MultipleRun(Run):
    """The baseline's fresh run stretched to ``multiple`` x its steps: ``max_steps`` and ``warmup_steps`` scaled,
    given after everything else on its command line, so they win over the spec's ``args`` and budget."""

    multiple: float = 1.0
    max_steps: int = 0
    warmup_steps: int = 0
    base_steps: int = 0

    def base(self) -> Run:
        """The fresh run this one stretches (its 1x point)."""
        return Run(self.scheme, self.lr, self.warmup, self.seed, self.overlay)

    def name(self, spec: SweepSpec) -> str:
        return f"{self.base().name(spec)}-{multiple_tag(self.multiple)}"

    def argv(self, spec: SweepSpec, sub: str = "fit", extra: list[str] | None = None) -> list[str]:
        scaled = [f"--trainer.max_steps={self.max_steps}", f"--model.init_args.optim.warmup_steps={self.warmup_steps}"]
        return super().argv(spec, sub, extra) + scaled  # Run.argv names the run by self.name: -x<m>

    def record(self, spec: SweepSpec) -> dict:
        """A fresh run's entry (no rate: one slice), with the multiple and the steps it trains."""
        return {**self.base().record(spec), "name": self.name(spec), "lr": None, "multiple": self.multiple,
                "max_steps": self.max_steps, "warmup_steps": self.warmup_steps}  # fmt: skip


def multiples_of(spec: SweepSpec) -> list[float]:
    """The spec's ``protocol.compute_multiples`` ([] without the option)."""
    return list((spec.protocol or {}).get(COMPUTE_KEY) or [])


def schedule_of(spec: SweepSpec, run: Run) -> tuple[int, int]:
    """``(max_steps, warmup_steps)`` the run's command line resolves to.

    Raises:
        SpecError: one line when the budget is not in steps or the warmup is in epochs: then there is nothing
            a multiple of steps could stretch.
    """
    config = resolve_config(run.argv(spec, extra=run_extra_args(spec, run))[4:])
    steps = (config.get("trainer") or {}).get("max_steps")
    optim = (((config.get("model") or {}).get("init_args") or {}).get("optim")) or {}
    where = f"protocol.{COMPUTE_KEY}={multiples_of(spec)} ({spec.source})"
    if not isinstance(steps, int) or isinstance(steps, bool) or steps <= 0:
        raise SpecError(
            f"{where}: {run.name(spec)} resolves trainer.max_steps={steps!r}; valid: a budget in optimizer steps "
            "(budget.steps, budget.tokens or --trainer.max_steps=N in args)"
        )
    if optim.get("warmup_epochs"):
        raise SpecError(
            f"{where}: {run.name(spec)} warms up for optim.warmup_epochs={optim['warmup_epochs']!r}; valid: a "
            "warmup in steps (optim.warmup_steps), which the longer runs stretch"
        )
    return steps, int(optim.get("warmup_steps") or 0)


def stretch(spec: SweepSpec, run: Run) -> list[MultipleRun]:
    """The longer runs of one fresh baseline run, one per multiple, in the spec's order.

    Raises:
        SpecError: when two multiples round to the same number of steps, or one to the 1x steps.
    """
    steps, warmup = schedule_of(spec, run)
    out = [MultipleRun(run.scheme, run.lr, run.warmup, run.seed, run.overlay, multiple=m, max_steps=round(m * steps),
                       warmup_steps=round(m * warmup), base_steps=steps) for m in multiples_of(spec)]  # fmt: skip
    counts = [steps] + [r.max_steps for r in out]
    if any(b <= a for a, b in zip(counts, counts[1:], strict=False)):
        raise SpecError(
            f"protocol.{COMPUTE_KEY}={multiples_of(spec)} ({spec.source}) round to {counts} steps of a "
            f"{steps}-step budget; valid: multiples whose steps increase"
        )
    return out


def longer_runs(spec: SweepSpec, fresh: list[Run]) -> list[MultipleRun]:
    """The baseline's longer runs for the fresh runs (each fresh baseline run stretched); [] without the option."""
    if not multiples_of(spec):
        return []
    out = [m for r in fresh if r.scheme == spec.baseline for m in stretch(spec, r)]
    taken = {r.name(spec) for r in grid(spec)}
    for run in out:  # never, by construction (grid names end in -s<seed>); a name taken would mix two runs' files
        if run.name(spec) in taken:
            raise SpecError(f"the longer run {run.name(spec)!r} takes a grid run's name ({spec.source})")
    return out


def check_budget(spec: SweepSpec) -> None:
    """One line before anything runs when the longer runs cannot be planned (the budget is not in steps)."""
    if multiples_of(spec):
        seed = spec.protocol["fresh_seeds"][0]
        run = next(r for r in grid(spec) if r.scheme == spec.baseline and r.seed == seed)
        stretch(spec, run)


def _final(summaries: dict, rows: dict, name: str, metric: str, whole: bool) -> tuple[float | None, str]:
    """``(value, "")`` of a finished run's final metric, or ``(None, why)``: pending, or ended without one."""
    status = rows[name]["status"]
    if status not in ENDED:
        return None, f"{PENDING}: {name} {status if status != 'missing' else 'not started'}"
    value = validation_of(summaries[name], whole).get(metric) if status == "finished" else None
    if not isinstance(value, int | float) or not math.isfinite(value):
        return None, f"{name} {status}: no usable final {metric}"
    return float(value), ""


def _seed_entry(seed, scheme_run: str, curve: list[tuple[float, str]], values: dict) -> dict:
    loss, why = values[scheme_run]
    entry = {"seed": seed, "run": scheme_run, "loss": loss, "baseline": [values[n][0] for _, n in curve],
             "multiplier": None}  # fmt: skip
    whys = [why] + [values[n][1] for _, n in curve]
    if pending := [w for w in whys if w.startswith(PENDING)]:
        return {**entry, "note": pending[0]}
    if missing := [w for w in whys if w]:
        return {**entry, "note": missing[0]}
    multiples = [m for m, _ in curve]
    found = compute_multiplier(multiples, entry["baseline"], loss)
    if found is None:
        return {**entry, "note": f"beyond the last multiple ({multiples[-1]:.4g}x): the baseline never reached it"}
    return {**entry, "multiplier": found}


def compute_record(spec: SweepSpec, sweep_dir: Path, fresh: list[Run], longer: list[MultipleRun]) -> dict:
    """Every non-baseline scheme's multiplier per seed and over seeds, or why it has none (the record written to
    ``compute.yaml``)."""
    names = [r.name(spec) for r in fresh] + [r.name(spec) for r in longer]
    both = load_comparison(sweep_dir, names, spec.metric)
    rows = {row["run"]: row for row in both.table}
    whole = whole_split_for_all(both.summaries)
    values = {n: _final(both.summaries, rows, n, spec.metric, whole) for n in names}
    compared = load_comparison(sweep_dir, [r.name(spec) for r in fresh], spec.metric)  # as comparison.md reads it
    verdicts, _ = slice_verdicts(compared.cells, spec.baseline, spec.metric, reading=compared.reading)
    cell_of = {row["run"]: row["cell"] for row in compared.table}
    by_base = {}
    for run in longer:
        by_base.setdefault(run.base(), []).append((run.max_steps / run.base_steps, run.name(spec)))
    baselines = {(r.overlay, r.warmup, r.seed): r for r in fresh if r.scheme == spec.baseline}  # at its own rate
    groups: dict[str, dict] = {}
    for run in fresh:
        if run.scheme == spec.baseline:
            continue
        base = baselines[(run.overlay, run.warmup, run.seed)]
        group = groups.setdefault(group_of(run, spec), {"baseline": group_of(base, spec), "runs": []})
        group["runs"].append((run, base))
    out_groups = {}
    for group, entry in groups.items():
        pairs = entry["runs"]
        ended = all(not values[r.name(spec)][1].startswith(PENDING) for pair in pairs for r in pair)
        verdict = verdicts.get(cell_of[pairs[0][0].name(spec)])
        word = PENDING if not ended else verdict.word if verdict is not None else "not comparable"
        out = {"baseline": entry["baseline"], "verdict": word, "multiplier": None, "low": None, "high": None,
               "confidence": CONFIDENCE, "n": 0}  # fmt: skip
        if word == PENDING:
            out["note"] = f"{PENDING}: fresh runs have not all ended"
        elif word != "better":
            out["note"] = f"no better than {spec.baseline} ({word}): no multiplier"
        else:
            seeds = []
            for run, base in pairs:
                curve = [(1.0, base.name(spec)), *by_base.get(base, [])]
                seeds.append(_seed_entry(run.seed, run.name(spec), curve, values))
            out["seeds"] = seeds
            found = [s["multiplier"] for s in seeds if s["multiplier"] is not None]
            out["n"] = len(found)
            if any(s.get("note", "").startswith(PENDING) for s in seeds):
                out["note"] = f"{PENDING}: " + "; ".join(
                    s["note"] for s in seeds if s.get("note", "").startswith(PENDING)
                )
            elif (interval := multiplier_interval(found, CONFIDENCE)) is None:
                out["note"] = f"{len(found)} seed(s) with a multiplier; an interval needs two"
            else:
                out["multiplier"], out["low"], out["high"] = interval
        out_groups[group] = out
    steps = sorted({(r.multiple, r.max_steps, r.warmup_steps, r.base_steps) for r in longer})
    return {
        "metric": spec.metric,
        "baseline": spec.baseline,
        COMPUTE_KEY: multiples_of(spec),
        "longer_runs": [{"multiple": m, "max_steps": s, "warmup_steps": w, "base_steps": b} for m, s, w, b in steps],
        "values": "whole-split validation of the final weights" if whole else "last in-loop validation",
        "groups": out_groups,
    }


def _x(value: float | None) -> str:
    return "" if value is None else f"{value:.3g}x"


def compute_markdown(record: dict) -> str:
    """``compute.md``: each scheme's multiplier with its interval and per-seed values, or why it has none."""
    conf = f"{CONFIDENCE:.0%}"
    lines = [
        f"## Effective compute: {record['baseline']}'s steps that reach each scheme's {record['metric']}",
        "",
        f"| scheme | verdict vs {record['baseline']} | multiplier | {conf} interval | seeds | per seed |",
        "|---|---|---|---|---|---|",
    ]
    for group, entry in record["groups"].items():
        if entry["multiplier"] is not None:
            value, interval = _x(entry["multiplier"]), f"{_x(entry['low'])} - {_x(entry['high'])}"
        else:
            value, interval = entry["note"], ""
        per_seed = ", ".join(f"s{s['seed']} {_x(s['multiplier']) or s['note']}" for s in entry.get("seeds", []))
        lines.append(f"| {group} | {entry['verdict']} | {value} | {interval} | {entry['n']} | {per_seed} |")
    checkpoints = ", ".join(f"{r['max_steps']} steps (x{r['multiple']:g}, warmup {r['warmup_steps']})"
                            for r in record["longer_runs"])  # fmt: skip
    base = record["longer_runs"][0]["base_steps"] if record["longer_runs"] else "?"
    lines += [
        "",
        f"The baseline's curve per fresh seed: its fresh run ({base} steps, 1x), then {checkpoints or 'none'}, each a "
        "complete run with its warmup and cosine decay stretched to its length. A seed's multiplier is the step "
        f"multiple at which that curve, interpolated linearly in log steps, reaches the scheme's final "
        f"{record['metric']} on that seed ({record['values']}); the interval is the t-interval of the seeds' log "
        "multipliers, exponentiated (geometric mean). Only a scheme the sweep's verdict calls better gets one.",
    ]
    return "\n".join(lines) + "\n"


def write_compute(spec: SweepSpec, sweep_dir: Path, fresh: list[Run]) -> dict | None:
    """Computes and writes ``compute.yaml`` / ``compute.md`` (atomically); None without the option or picks."""
    if not multiples_of(spec) or not fresh:
        return None
    record = compute_record(spec, sweep_dir, fresh, longer_runs(spec, fresh))
    atomic_write_text(sweep_dir / COMPUTE_TABLE, compute_markdown(record))
    atomic_write_text(sweep_dir / COMPUTE_RECORD, yaml.safe_dump(record, sort_keys=False))
    return record
