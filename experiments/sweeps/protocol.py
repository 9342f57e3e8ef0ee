"""Every scheme at its own best learning rate: ``protocol: {kind: tune_then_compare, ...}`` of a sweep file.

    tuning  schemes x protocol.lrs x tuning_seeds            every scheme gets the same runs: an equal budget
    pick    each scheme's rate with the lowest mean metric    recorded once in <sweep>/tuning.yaml, then reused
    fresh   schemes x fresh_seeds, each at its picked rate    the only runs the comparison (and export) reads

A tuning run that stalled (the comparison's ``stalled``: no better than the data's context-free loss) or
diverged counts as the loss at initialisation, as Wortsman et al. (2023) count it, and never as worse than not
training (:func:`experiments.results.compute.lr_sensitivity`): the rate of least mean loss, each seed's loss
capped so, is the scheme's pick. The picks are written to ``tuning.yaml`` (with each scheme's per-rate means,
its learning-rate sensitivity and its largest stable rate) the first time every tuning run has ended, and a
later invocation reads them back and never picks again; a ``tuning.yaml`` written under another protocol,
metric or scheme list is refused in one line. Until every tuning run has ended (a crashed or running run:
the next invocation reruns or waits for it), nothing is picked.

The fresh runs are named like the grid's (``pre-lr0.003-s0``) but recorded in ``sweep.yaml`` without a rate, so
the comparison sees one slice in which every scheme sits at its own rate, and its verdicts pair them seed by seed
(the seeds are the blocks) against the baseline at the baseline's own rate.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import yaml

from experiments.results.compare import load_comparison
from experiments.results.compute import largest_stable_lr, lr_sensitivity
from experiments.results.measurement import metric_values
from experiments.results.records import TUNING_RECORD, TUNING_TABLE, read_record
from experiments.sweeps.options import OptionError
from experiments.sweeps.spec import Run, SweepSpec, grid
from fileio import atomic_write_text

ENDED = ("finished", "stalled", "diverged")  # a tuning run that has a final word; crashed ones are rerun
FAILED = ("stalled", "diverged")  # count as the initial loss
MATCH_KEYS = ("kind", "metric", "last_evals", "lrs", "tuning_seeds", "groups_planned")


def group_of(run: Run, spec: SweepSpec) -> str:
    """The cell a picked rate belongs to: the scheme, with the overlay and warmup when the grid varies them."""
    parts = [run.scheme]
    if len(spec.overlays) > 1:
        parts.append(Path(run.overlay).stem)
    if len(spec.warmups) > 1:
        parts.append(f"wu{run.warmup}")
    return "-".join(parts)


def tuning_runs(spec: SweepSpec) -> list[Run]:
    """Every scheme (and overlay, warmup) at every rate on the tuning seeds: the same runs for each."""
    seeds = set(spec.protocol["tuning_seeds"])
    return [r for r in grid(spec) if r.seed in seeds]


def fresh_runs(spec: SweepSpec, picked: dict[str, float]) -> list[Run]:
    """Each group at its picked rate on the fresh seeds."""
    seeds = set(spec.protocol["fresh_seeds"])
    return [r for r in grid(spec) if r.seed in seeds and r.lr == picked[group_of(r, spec)]]


def fresh_record(spec: SweepSpec, runs: list[Run]) -> list[dict]:
    """The fresh runs' ``sweep.yaml`` grid entries: without a rate, so all schemes share one slice."""
    return [{**r.record(spec), "lr": None} for r in runs]


def _planned(spec: SweepSpec) -> dict:
    return {
        "kind": spec.protocol["kind"],
        "metric": spec.metric,
        "last_evals": spec.last_evals,
        "lrs": list(spec.protocol["lrs"]),
        "tuning_seeds": list(spec.protocol["tuning_seeds"]),
        "groups_planned": sorted({group_of(r, spec) for r in grid(spec)}),
    }


def read_tuning(spec: SweepSpec, sweep_dir: Path) -> dict | None:
    """The recorded picks (None before they are made); one line when they were made under another protocol."""
    planned = _planned(spec)
    return read_record(
        sweep_dir / TUNING_RECORD, "tuning", ("groups", dict), {k: planned[k] for k in MATCH_KEYS},
        "picked its rates", "the protocol it was picked under, or a new sweep name", str(spec.source),
    )  # fmt: skip


def picked_rates(record: dict) -> dict[str, float]:
    return {group: float(entry["picked_lr"]) for group, entry in record["groups"].items()}


def _initial_loss(spec: SweepSpec, summaries: dict[str, dict]) -> tuple[float, str]:
    if "initial_loss" in spec.protocol:
        return float(spec.protocol["initial_loss"]), "protocol.initial_loss"
    first = [s["train_curve"][0][1] for s in summaries.values() if s.get("train_curve")]
    first = [float(v) for v in first if isinstance(v, int | float) and math.isfinite(v)]
    if not first:
        raise OptionError(
            f"no tuning run recorded a train loss to take the initial loss from ({spec.source}); valid: "
            "protocol.initial_loss (for the LM: ln of the vocabulary size)"
        )
    return float(statistics.median(first)), f"median first train loss of {len(first)} tuning runs"


def pick(spec: SweepSpec, sweep_dir: Path) -> dict | None:
    """The picks of every group once all its tuning runs have ended (None before that), written to
    ``tuning.yaml`` and ``tuning.md`` the first time; read back every time after."""
    if (record := read_tuning(spec, sweep_dir)) is not None:
        return record
    runs = tuning_runs(spec)
    names = [r.name(spec) for r in runs]
    comparison = load_comparison(sweep_dir, names, spec.metric)
    rows = {row["run"]: row for row in comparison.table}
    if any(rows[n]["status"] not in ENDED for n in names):
        return None
    values = metric_values(comparison, spec.last_evals)
    initial, source = _initial_loss(spec, comparison.summaries)
    groups: dict[str, dict] = {}
    for run, name in zip(runs, names, strict=True):
        entry = groups.setdefault(group_of(run, spec), {"per_lr": {}})
        value = values[name][0] if rows[name]["status"] == "finished" else None
        if value is not None and not math.isfinite(value):
            value = None
        entry["per_lr"].setdefault(run.lr, {})[run.seed] = value
    out = {**_planned(spec), "initial_loss": initial, "initial_loss_from": source, "groups": {}}
    for group, entry in groups.items():
        capped = {lr: statistics.fmean(initial if v is None else min(v, initial) for v in seeds.values())
                  for lr, seeds in entry["per_lr"].items()}  # fmt: skip
        stable = {lr: (None if any(v is None for v in seeds.values()) else capped[lr])
                  for lr, seeds in entry["per_lr"].items()}  # fmt: skip
        best = min(capped, key=lambda lr: (capped[lr], lr))
        out["groups"][group] = {
            "picked_lr": best,
            "sensitivity": lr_sensitivity(capped, initial),
            "largest_stable_lr": largest_stable_lr(stable),
            "tuning_runs": sum(len(seeds) for seeds in entry["per_lr"].values()),
            "per_lr": [
                {"lr": lr, "capped_mean": capped[lr], "seeds": dict(seeds)} for lr, seeds in entry["per_lr"].items()
            ],
        }
    atomic_write_text(sweep_dir / TUNING_TABLE, tuning_markdown(out))
    atomic_write_text(sweep_dir / TUNING_RECORD, yaml.safe_dump(out, sort_keys=False))
    return out


def _lr(value: float | None) -> str:
    return "none" if value is None else f"{value:g}"


def tuning_markdown(record: dict) -> str:
    """``tuning.md``: each group's pick, sensitivity and largest stable rate, then its mean per rate."""
    lrs = record["lrs"]
    head = ["scheme", "picked lr", "LR sensitivity", "largest stable lr", "tuning runs", *(f"lr {lr:g}" for lr in lrs)]
    lines = [
        f"## Tuning: {record['metric']} per rate over tuning seeds {record['tuning_seeds']}",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for group, entry in record["groups"].items():
        means = {float(p["lr"]): p["capped_mean"] for p in entry["per_lr"]}
        cells = [f"{means[lr]:.4f}" if lr in means else "" for lr in lrs]
        lines.append(
            f"| {group} | {_lr(entry['picked_lr'])} | {entry['sensitivity']:.4f} | {_lr(entry['largest_stable_lr'])} "
            f"| {entry['tuning_runs']} | " + " | ".join(cells) + " |"
        )
    lines += [
        "",
        f"Each rate's value is the mean over the tuning seeds of min(final {record['metric']}, initial loss); a "
        f"stalled or diverged run counts as the initial loss {record['initial_loss']:.4f} "
        f"({record['initial_loss_from']}). LR sensitivity (Wortsman et al. 2023) = the mean over the grid minus "
        "the grid's best; the largest stable lr is the largest rate none of whose tuning runs stalled or diverged. "
        "The comparison uses each scheme at its picked rate on the fresh seeds only.",
    ]
    return "\n".join(lines) + "\n"
