"""From measured candidates to the report: ``Row`` (one table and CSV line; ``COLUMNS``), ``summarize``
(medians, quartiles and paired ratios to the baseline), the machine description for the header, the
performance ``targets``, and ``bench.md`` / ``bench.csv`` (``markdown``, ``write_report``)."""

from __future__ import annotations

import csv
import math
import os
import platform
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch

from experiments.bench.measure import (
    Candidate,
    activation_bytes,
    alive_after_forward_bytes,
    norm_time_share,
    peak_step_bytes,
    step_flops,
)
from experiments.bench.references import OURS
from experiments.bench.workloads import Workload


@dataclass
class Row:
    """One line of the results table (also one CSV row)."""

    task: str
    size: str
    group: str  # "schemes", "reference" or "data"
    name: str
    baseline: str
    step_ms: float
    step_ms_p25: float
    step_ms_p75: float
    throughput: float
    unit: str
    step_ratio: float
    act_mb: float
    act_ratio: float
    alive_mb: float
    alive_ratio: float
    params: int
    param_mb: float
    param_ratio: float
    peak_mb: float = math.nan
    tflop: float = math.nan  # model FLOPs per step / 1e12 (scripts/gpu_bench.py)
    mfu: float = math.nan  # tflop / step time / the device's peak
    norm_share: float = math.nan  # share of step time in normalization ops (profiler)
    note: str = ""


COLUMNS = [f.name for f in fields(Row)]


def _quantile(xs: Sequence[float], q: float) -> float:
    return statistics.quantiles(xs, n=4, method="inclusive")[int(q * 4) - 1] if len(xs) > 1 else xs[0]


def paired_ratio(times: Sequence[float], base: Sequence[float]) -> float:
    """Median over rounds of ``times[r] / base[r]``: robust to load that drifts between rounds."""
    return statistics.median(t / b for t, b in zip(times, base, strict=True))


def summarize(
    candidates: Sequence[Candidate],
    w: Workload,
    size: str,
    group: str,
    baseline: str,
    peak_tflops: float | None = None,
    norm_share: bool = False,
) -> list[Row]:
    """One row per candidate, ratios against the candidate named ``baseline``.

    With ``peak_tflops`` (NaN when unknown) model FLOPs per step are counted, and MFU computed against it;
    with ``norm_share`` a few profiled steps give the share of step time spent in norms.
    """
    base = next(c for c in candidates if c.name == baseline)
    acts = {c.name: activation_bytes(c) for c in candidates}
    alive = {c.name: alive_after_forward_bytes(c) for c in candidates}
    rows = []
    for c in candidates:
        step = statistics.median(c.times)
        tflop = step_flops(c) / 1e12 if peak_tflops is not None else math.nan
        rows.append(
            Row(
                task=w.task,
                size=size,
                group=group,
                name=c.name,
                baseline=baseline,
                step_ms=1e3 * step,
                step_ms_p25=1e3 * _quantile(c.times, 0.25),
                step_ms_p75=1e3 * _quantile(c.times, 0.75),
                throughput=w.units_per_step / step,
                unit=f"{w.unit}/s",
                step_ratio=paired_ratio(c.times, base.times),
                act_mb=acts[c.name] / 2**20,
                act_ratio=acts[c.name] / acts[baseline],
                alive_mb=alive[c.name] / 2**20,
                alive_ratio=alive[c.name] / alive[baseline],
                params=c.num_params,
                param_mb=c.param_bytes / 2**20,
                param_ratio=c.param_bytes / base.param_bytes,
                peak_mb=peak_step_bytes(c) / 2**20,
                tflop=tflop,
                mfu=tflop / step / peak_tflops if peak_tflops else math.nan,
                norm_share=norm_time_share(c) if norm_share else math.nan,
                note=c.note,
            )
        )
    return rows


def machine_info(device: torch.device) -> dict[str, str]:
    """What the numbers depend on: versions, device, threads, and how busy the machine was."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = next((ln.split(":", 1)[1].strip() for ln in _cpuinfo() if ln.startswith("model name")), "cpu")
    return {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": f"{device.type}: {name}",
        "threads": f"{torch.get_num_threads()} intra-op of {os.cpu_count()} logical CPUs",
        "load average (1, 5, 15 min)": ", ".join(f"{x:.2f}" for x in os.getloadavg()),
    }


def _cpuinfo() -> list[str]:
    try:
        return Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return []


@dataclass(frozen=True)
class Target:
    """A performance goal checked against the measured rows."""

    what: str
    value: float
    limit: float
    at_most: bool = True

    @property
    def met(self) -> bool:
        return self.value <= self.limit if self.at_most else self.value >= self.limit

    def line(self) -> str:
        goal = f"{'<=' if self.at_most else '>='} {self.limit:g}"
        return f"- {'met   ' if self.met else 'MISSED'} {self.what}: {self.value:.3f} (target {goal})"


#: siamese/pre goals per (task, measure): the sizes they apply to, the limit in eager mode and under compile.
SCHEME_TARGETS: dict[tuple[str, str], tuple[tuple[str, ...], float, float]] = {
    ("lm", "activation memory"): (("tiny", "small"), 1.08, 1.05),
    ("lm", "step time"): (("small",), 1.08, 1.05),
    ("vit", "step time"): (("tiny",), 1.08, 1.08),
    ("dit", "step time"): (("tiny",), 1.08, 1.08),
}


def targets(rows: Sequence[Row], compiled: bool = False) -> list[Target]:
    """The benchmark's goals, for whatever the rows cover (``compiled``: the run used ``torch.compile``)."""
    out = []
    for r in rows:
        where = f"{r.task}/{r.size}" + (" compiled" if compiled else "")
        if r.group == "schemes" and r.name == "siamese" and r.baseline == "pre":
            for (task, measure), (sizes, eager, compiled_limit) in SCHEME_TARGETS.items():
                if task != r.task or r.size not in sizes:
                    continue
                limit = compiled_limit if compiled else eager
                if measure == "step time":
                    out.append(Target(f"{where} siamese/pre step time", r.step_ratio, limit))
                elif _disagree(r):  # the saved-tensor count misses tensors kept outside autograd: the profiler's
                    out.append(Target(f"{where} siamese/pre activation memory (profiler)", r.alive_ratio, limit))
                else:
                    out.append(Target(f"{where} siamese/pre activation memory", r.act_ratio, limit))
        elif r.group == "reference" and r.name == OURS:
            out.append(Target(f"{where} ours/{r.baseline} step time", r.step_ratio, 1.0))
        elif r.group == "data":
            out.append(Target(f"{where} data-loader batches/s over training batches/s", 1 / r.step_ratio, 5.0, False))
    return [t for t in out if not math.isnan(t.value)]


def _disagree(r: Row) -> bool:
    """The two activation-memory measures differ by more than 2% and 0.1 MB (NaN compares False)."""
    return abs(r.alive_mb / r.act_mb - 1) > 0.02 and abs(r.alive_mb - r.act_mb) > 0.1 if r.group != "data" else False


def _fmt(x: float, digits: int = 2) -> str:
    return "-" if math.isnan(x) else f"{x:,.{digits}f}"


def _pct(x: float) -> str:
    return "-" if math.isnan(x) else f"{100 * x:.1f}%"


def _table(head: Sequence[str], body: Iterable[Sequence[str]]) -> list[str]:
    """A markdown table; the first column left-aligned, the numbers right-aligned, a trailing note left."""
    align = ["---"] + ["---:"] * (len(head) - 2) + ["---"]
    return [f"| {' | '.join(row)} |" for row in (head, align, *body)]


def markdown(
    rows: Sequence[Row],
    header: dict[str, str],
    notes: Sequence[str],
    compiled: bool = False,
    claims: Sequence[str] = (),
) -> str:
    """The report: header, one table per (task, size, group), notes, the targets met or missed, and ``claims``
    (lines putting the paper's overhead next to the rows, :mod:`experiments.bench.claims`)."""
    lines = ["# Training-step benchmark", ""]
    lines += [f"- {k}: `{v}`" if k == "command" else f"- {k}: {v}" for k, v in header.items()]
    cuda = any(not math.isnan(r.peak_mb) for r in rows)
    cpu = any(not math.isnan(r.alive_mb) for r in rows)
    flops = any(not math.isnan(r.tflop) for r in rows)
    shares = any(not math.isnan(r.norm_share) for r in rows)
    for (task, size, group), part in _groups(rows).items():
        if group == "data":
            lines += ["", f"## {task} / {size}: data loading vs training", ""]
            lines += _table(
                ["loader", "ms per batch", "batches/s", "data / training batches/s", "note"],
                [[r.name, _fmt(r.step_ms, 3), _fmt(r.throughput, 0), f"{_fmt(1 / r.step_ratio, 1)}x", r.note]
                 for r in part],
            )  # fmt: skip
            continue
        title = "norm schemes" if group == "schemes" else "ours vs reference at identical shapes"
        lines += ["", f"## {task} / {size}: {title} (ratios vs {part[0].baseline})", ""]
        head = ["name", "step ms", "p25-p75 ms", part[0].unit, "step ratio", "act MB", "act ratio",
                *(["alive MB", "alive ratio"] if cpu else []), "params", "param ratio",
                *(["peak step MB"] if cuda else []), *(["TFLOP/step", "MFU"] if flops else []),
                *(["norm share"] if shares else []), "note"]  # fmt: skip
        body = [
            [r.name, _fmt(r.step_ms, 1), f"{_fmt(r.step_ms_p25, 1)}-{_fmt(r.step_ms_p75, 1)}", _fmt(r.throughput, 0),
             _fmt(r.step_ratio, 3), _fmt(r.act_mb), _fmt(r.act_ratio, 3),
             *([_fmt(r.alive_mb), _fmt(r.alive_ratio, 3)] if cpu else []), f"{r.params:,}", _fmt(r.param_ratio, 4),
             *([_fmt(r.peak_mb)] if cuda else []), *([f"{r.tflop:.3g}", _pct(r.mfu)] if flops else []),
             *([_pct(r.norm_share)] if shares else []), r.note]
            for r in part
        ]  # fmt: skip
        lines += _table(head, body)
    notes = list(notes) + [
        f"{r.task}/{r.size} {r.name}: the saved-tensor count ({_fmt(r.act_mb)} MB) and the profiler's memory alive "
        f"after forward ({_fmt(r.alive_mb)} MB) disagree (> 2% and > 0.1 MB): the first misses tensors kept outside "
        "autograd (e.g. in a reference library's checkpoint closure); read the alive columns"
        for r in rows
        if _disagree(r)
    ]
    if notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    if goals := targets(rows, compiled):
        lines += ["", "## Targets", ""] + [g.line() for g in goals]
    if claims:
        lines += ["", "## The paper's overhead claim", ""] + list(claims)
    return "\n".join(lines) + "\n"


def _groups(rows: Sequence[Row]) -> dict[tuple[str, str, str], list[Row]]:
    out: dict[tuple[str, str, str], list[Row]] = {}
    for r in rows:
        out.setdefault((r.task, r.size, r.group), []).append(r)
    return out


def write_report(
    out: Path,
    rows: Sequence[Row],
    header: dict[str, str],
    notes: Sequence[str],
    compiled: bool = False,
    claims: Sequence[str] = (),
) -> str:
    """Writes ``bench.md`` and ``bench.csv`` into ``out``; returns the markdown."""
    out.mkdir(parents=True, exist_ok=True)
    text = markdown(rows, header, notes, compiled, claims)
    (out / "bench.md").write_text(text)
    with open(out / "bench.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(asdict(r) for r in rows)
    return text
