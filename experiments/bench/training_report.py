"""The compiled-training-step report: ``TrainingRow`` (one scheme in one mode; ``TRAINING_COLUMNS``), its
summary from the measured candidates (:func:`summarize_training`), the driver over workloads that measures and
summarizes (:func:`bench_training_steps`), and ``training_step.md`` / ``.csv`` / ``.json`` (:func:`write_training`;
the JSON keeps every candidate's raw step times and graph counts, so each ratio can be recomputed from what was
measured)."""

from __future__ import annotations

import csv
import json
import math
import statistics
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from experiments.bench.measure import Options
from experiments.bench.report import _quantile, _table, paired_ratio
from experiments.bench.run import RunSpec
from experiments.bench.training_step import (
    MODES,
    TrainingCandidate,
    interval_coverage,
    measure_training_step,
    median_interval,
)
from experiments.bench.workloads import Workload

CONFIDENCE = 0.95


@dataclass
class TrainingRow:
    """One scheme in one mode (eager or compiled): its step time and its ratio to the baseline's in that mode.

    Attributes:
        step_ms, step_ms_p25, step_ms_p75: median and quartiles of the timed steps.
        ratio, ratio_low, ratio_high: the median over rounds of ``time[r] / baseline time[r]`` (same mode, same
            round) and the distribution-free 95 % interval of that median (:func:`median_interval`).
        vs_eager, vs_eager_low, vs_eager_high: compiled rows only, ``compiled time[r] / eager time[r]`` of the same
            scheme, likewise (NaN on eager rows).
        graphs: dynamo graphs compiled during this candidate's steps (warm-up included): 0 for eager.
        timed_graphs: of those, during timed steps (a recompilation inside the timing; 0 expected).
        compiled: training's compile path compiled the trunk's Blocks.
    """

    task: str
    size: str
    scheme: str
    mode: str
    baseline: str
    step_ms: float
    step_ms_p25: float
    step_ms_p75: float
    throughput: float
    unit: str
    ratio: float
    ratio_low: float
    ratio_high: float
    vs_eager: float
    vs_eager_low: float
    vs_eager_high: float
    rounds: int
    graphs: int
    timed_graphs: int
    compiled: bool


TRAINING_COLUMNS = [f.name for f in fields(TrainingRow)]


def _ratios(times: Sequence[float], base: Sequence[float]) -> tuple[float, float, float]:
    low, high = median_interval([t / b for t, b in zip(times, base, strict=True)], CONFIDENCE)
    return paired_ratio(times, base), low, high


def summarize_training(
    cands: Sequence[TrainingCandidate], w: Workload, size: str, baseline: str, warmup: int
) -> list[TrainingRow]:
    """One row per candidate, in the candidates' order; ratios against ``baseline`` in the same mode."""
    by = {(c.name, c.mode): c for c in cands}
    rows = []
    for c in cands:
        step = statistics.median(c.times)
        ratio = _ratios(c.times, by[(baseline, c.mode)].times)
        vs_eager = _ratios(c.times, by[(c.name, "eager")].times) if c.mode == "compiled" else (math.nan,) * 3
        rows.append(
            TrainingRow(
                w.task, size, c.name, c.mode, baseline, 1e3 * step, 1e3 * _quantile(c.times, 0.25),
                1e3 * _quantile(c.times, 0.75), w.units_per_step / step, f"{w.unit}/s", *ratio, *vs_eager,
                len(c.times), sum(c.graphs), c.timed_graphs(warmup), c.compiled,
            )
        )  # fmt: skip
    return rows


def raw_record(cands: Sequence[TrainingCandidate], w: Workload, size: str, warmup: int) -> dict:
    """The JSON's record of one workload: every candidate's timed step times (seconds, in round order) and the
    graphs dynamo compiled at each of its steps (warm-up first)."""
    return {
        "task": w.task,
        "size": size,
        "batch_size": w.batch_size,
        "trunk": w.trunk,
        "net": w.net,
        "warmup": warmup,
        "candidates": [
            {"scheme": c.name, "mode": c.mode, "times_s": c.times, "graphs_per_step": c.graphs} for c in cands
        ],
    }


def bench_training_steps(
    workloads: Iterable[Workload], size: str, spec: RunSpec, opts: Options, backend: str, header: dict[str, str]
) -> tuple[list[TrainingRow], list[dict]]:
    """Each workload's schemes measured eager and compiled (:func:`measure_training_step`, one interleaved run per
    workload) and summarized against ``pre`` (or the first label without it); the rows and the JSON's raw records.
    ``header`` gets the wall time."""
    rows, records = [], []
    start = time.perf_counter()
    for w in workloads:
        print(f"[{w.task}/{size}] training step: {len(spec.schemes)} schemes x eager, compiled ({backend}) x "
              f"{spec.steps} rounds after {spec.warmup} ...", flush=True)  # fmt: skip
        cands = measure_training_step(w, spec, opts, backend)
        baseline = "pre" if "pre" in spec.schemes else spec.schemes[0]
        rows += summarize_training(cands, w, size, baseline, spec.warmup)
        records.append(raw_record(cands, w, size, spec.warmup))
        del cands
    header["wall time"] = f"{time.perf_counter() - start:.0f} s"
    return rows, records


def _fmt(x: float, digits: int = 3) -> str:
    return "-" if math.isnan(x) else f"{x:,.{digits}f}"


def _interval(value: float, low: float, high: float) -> str:
    return "-" if math.isnan(value) else f"{value:.3f} [{low:.3f}, {high:.3f}]"


def training_markdown(rows: Sequence[TrainingRow], header: dict[str, str], notes: Sequence[str] = ()) -> str:
    """``training_step.md``: the header, then one table per workload, eager and compiled side by side per scheme."""
    lines = ["# Training step, eager and compiled", ""]
    lines += [f"- {k}: `{v}`" if k == "command" else f"- {k}: {v}" for k, v in header.items()]
    groups: dict[tuple[str, str], list[TrainingRow]] = {}
    for r in rows:
        groups.setdefault((r.task, r.size), []).append(r)
    for (task, size), part in groups.items():
        base = part[0].baseline
        cover = interval_coverage(part[0].rounds, CONFIDENCE)
        lines += ["", f"## {task} / {size}: training step time and its ratio to {base}", ""]
        lines += [
            f"Ratios: the median over {part[0].rounds} rounds of a scheme's step time over {base}'s in the same "
            f"round and mode, [its distribution-free interval: order statistics, coverage {cover:.1%}]. "
            "Graphs: dynamo graphs the compiled module compiled (during timed steps in parentheses: 0).",
            "",
        ]
        head = ["scheme"]
        for mode in MODES:
            head += [f"{mode} ms", f"{mode} p25-p75 ms", f"{mode} ratio to {base}"]
        head += ["compiled / eager", "graphs (timed)", "note"]
        body = []
        for scheme in dict.fromkeys(r.scheme for r in part):
            mine = {r.mode: r for r in part if r.scheme == scheme}
            cells = [scheme]
            for mode in MODES:
                r = mine[mode]
                cells += [_fmt(r.step_ms, 1), f"{_fmt(r.step_ms_p25, 1)}-{_fmt(r.step_ms_p75, 1)}",
                          _interval(r.ratio, r.ratio_low, r.ratio_high)]  # fmt: skip
            c = mine["compiled"]
            cells += [_interval(c.vs_eager, c.vs_eager_low, c.vs_eager_high), f"{c.graphs} ({c.timed_graphs})"]
            cells.append(_row_note(mine["eager"], c))
            body.append(cells)
        lines += _table(head, body)
    if notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def _row_note(eager: TrainingRow, compiled: TrainingRow) -> str:
    """What would make a row's numbers not what its columns say."""
    problems = []
    if not compiled.compiled or compiled.graphs == 0:
        problems.append("NOT COMPILED: no dynamo graph")
    if compiled.timed_graphs:
        problems.append("recompiled while timed")
    if eager.graphs:
        problems.append("the eager module compiled graphs")
    return "; ".join(problems)


def _nulls(record: dict) -> dict:
    """NaN (a ratio a row does not have) as JSON's null."""
    return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in record.items()}


def write_training(out: Path, rows: Sequence[TrainingRow], header: dict[str, str], records: list[dict],
                   notes: Sequence[str] = ()) -> str:  # fmt: skip
    """Writes ``training_step.md``, ``training_step.csv`` and ``training_step.json`` (header, rows and the raw
    times of :func:`raw_record`) into ``out``; returns the markdown."""
    out.mkdir(parents=True, exist_ok=True)
    text = training_markdown(rows, header, notes)
    (out / "training_step.md").write_text(text)
    with open(out / "training_step.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=TRAINING_COLUMNS)
        writer.writeheader()
        writer.writerows(asdict(r) for r in rows)
    payload = {"header": header, "rows": [_nulls(asdict(r)) for r in rows], "runs": records}
    (out / "training_step.json").write_text(json.dumps(payload, indent=1, allow_nan=False) + "\n")
    return text
