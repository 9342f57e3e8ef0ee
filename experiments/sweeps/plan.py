"""``sweep SPEC --dry-run``: the job list, each run's compute and the grid's, and what would be submitted.

Nothing is written. The FLOPs and GPU-hours come from :mod:`experiments.sweeps.estimate`; the GPU-hours
assume the accelerator and MFU of the spec's ``compute`` block (``--compute mfu=0.35`` changes them), and
the line says so, since an MFU is an assumption until measured on the cluster. The ``peak/GPU`` column is
one training step's per-device peak under the run's strategy, precision and activation checkpointing,
measured on fake tensors (:mod:`experiments.parallel.memory`; one measurement per distinct shape), against
the memory of ``compute.gpu``: ``ok`` or ``OVER``; ``cpu`` for a run that trains on CPU (nothing measured).

A run whose estimate fails (a network whose step raises, a config the estimate cannot read) is listed with
``error`` and its cause in its note, the other runs as usual; the caller prints one ``error:`` line per cause,
naming the runs, and exits 2 (``sweep.main``). Never a traceback.
"""

from __future__ import annotations

import math
from pathlib import Path

from experiments.parallel.memory import size
from experiments.sweeps.cluster import SUBMITIT_DIR, sbatch_script
from experiments.sweeps.compute_runs import longer_runs, multiples_of, stretch
from experiments.sweeps.estimate import Estimate, estimate, gpu_memory_of, memory_estimate, run_extra_args
from experiments.sweeps.protocol import fresh_runs, group_of, picked_rates, read_tuning, tuning_runs
from experiments.sweeps.spec import Run, SweepSpec, grid, sweep_dir_of
from experiments.sweeps.stages import plan as stage_plan
from experiments.sweeps.stages import read_stages


def _count(value: float | None) -> str:
    """``1.28B``, ``390.9M``, ``819k``: parameters, tokens and images at a glance."""
    if value is None:
        return "?"
    for factor, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.4g}{suffix}"
    return f"{value:.4g}"


def _flops(value: float | None) -> str:
    return "?" if value is None else f"{value:.3g}"


def _launcher_line(spec: SweepSpec, jobs: int) -> str:
    la = spec.launcher
    if not spec.submitit:
        return f"launcher: local processes, {spec.parallel} at a time"
    array = f"array of {jobs}, {min(jobs, la['array_parallelism'])} at a time" if jobs > 1 else "one job"
    where = f"partition {la['partition']}, " if la["partition"] else ""
    return (
        f"launcher: submitit {la['cluster']}, {where}{la['nodes']} node(s) x {la['gpus_per_node']} GPU(s) per job, "
        f"{la['timeout_min']} min each, {array}; requeue on SIGUSR1 {la['signal_delay_s']} s before the limit"
    )


def _budget_line(spec: SweepSpec, est: Estimate) -> str:
    if not spec.budget:
        return "budget: as the configs say"
    ((kind, value),) = spec.budget.items()
    unit = "tokens" if est.task == "lm" else "images"
    per = f"{est.per_step:,} {unit}" if est.per_step else "?"
    steps = f"{est.steps:,}" if est.steps else "?"
    return f"budget: {kind} {value:,} -> {steps} steps of {per} (override: --budget {kind}=N)"


def _memory_cell(mem: object, capacity: int) -> tuple[str, str]:
    """(``50.04 GB ok`` / ``222.1 GB OVER`` / ``cpu``, a note) for the peak/GPU column."""
    if isinstance(mem, str):
        return ("cpu" if mem.startswith("runs on CPU") else "?"), mem
    verdict = "ok" if mem.peak <= capacity else "OVER"
    return f"{size(mem.peak)} {verdict}", "; ".join(mem.notes)


def _cause(exc: Exception) -> str:
    """An exception as one line: its message's first line, with its type when the message does not say it."""
    line = (str(exc).strip().splitlines() or [""])[0]
    return line if isinstance(exc, ValueError | RuntimeError) and line else f"{type(exc).__name__}: {line}"


def _failed(spec: SweepSpec, run: Run, exc: Exception, failures: dict[str, list[str]]) -> str:
    """Records that ``run``'s estimate failed (runs grouped by cause) and returns the cause."""
    cause = _cause(exc)
    failures.setdefault(cause, []).append(f"{spec.name}/{run.name(spec)}")
    return cause


def _estimate(spec: SweepSpec, run: Run, failures: dict[str, list[str]]) -> Estimate:
    try:
        return estimate(spec, run)
    except Exception as exc:  # noqa: BLE001 - listed as an error row; the other runs still are
        cause = _failed(spec, run, exc, failures)
        return Estimate(run.name(spec), "?", 0, None, None, None, None, None, None, None, f"error: {cause}")


def _memory(spec: SweepSpec, run: Run, capacity: int, failures: dict[str, list[str]]) -> tuple[str, str]:
    try:
        return _memory_cell(memory_estimate(spec, run), capacity)
    except Exception as exc:  # noqa: BLE001 - listed as an error row; the other runs still are
        return "error", f"error: {_failed(spec, run, exc, failures)}"


def planned_runs(spec: SweepSpec) -> tuple[list[Run], str | None]:
    """The runs the sweep would launch, and a line on what follows that cannot be listed yet: a protocol's
    tuning runs (and its fresh runs once the rates are picked), or the whole grid."""
    if spec.stages:
        look, runs, launched = stage_plan(spec, read_stages(spec, sweep_dir_of(spec)))
        if look is None:
            return launched, "every look is decided: nothing left to run"
        most = len(grid(spec)) - len(launched)
        return runs, (
            f"look {look} of {len(spec.stages)} ({spec.stages[look - 1]} seeds per cell; {len(launched) - len(runs)} "
            f"run(s) of earlier looks not listed); then up to {most} more runs if every cell stays undecided, "
            f"seeds per cell {spec.stages} (cap {spec.stages[-1]})"
        )
    if not spec.protocol:
        return grid(spec), None
    tuning, record = tuning_runs(spec), read_tuning(spec, sweep_dir_of(spec))
    if record is not None:
        fresh = fresh_runs(spec, picked_rates(record))
        return tuning + fresh + longer_runs(spec, fresh), None
    groups = len({group_of(r, spec) for r in tuning})
    fresh = groups * len(spec.protocol["fresh_seeds"])
    return tuning, (
        f"then: {fresh} fresh runs ({groups} schemes x {len(spec.protocol['fresh_seeds'])} fresh seeds), each at its "
        f"scheme's rate picked from the {len(tuning)} tuning runs above ({len(tuning) // max(groups, 1)} per scheme)"
    )


def _longer_line(spec: SweepSpec, failures: dict[str, list[str]]) -> str | None:
    """Before the picks: the baseline's longer runs (``compute_multiples``) that will follow, with their compute,
    estimated on stand-ins at the grid's first rate (the rate does not change a run's compute)."""
    if not multiples_of(spec) or read_tuning(spec, sweep_dir_of(spec)) is not None:
        return None
    seeds = spec.protocol["fresh_seeds"]
    stand_ins = [m for r in grid(spec) if r.scheme == spec.baseline and r.seed in seeds and r.lr == spec.lrs[0]
                 for m in stretch(spec, r)]  # fmt: skip
    ests = [_estimate(spec, run, failures) for run in stand_ins]
    flops = sum(e.train_flops + (e.test_flops or 0) for e in ests if e.train_flops is not None)
    hours = [e.gpu_hours for e in ests if e.gpu_hours is not None]
    first = stand_ins[0]
    one_seed = stand_ins[: len(multiples_of(spec))]
    steps = ", ".join(f"{r.max_steps} (x{r.multiple:g}, warmup {r.warmup_steps})" for r in one_seed)
    cost = f"{flops:.3g} FLOPs, {_fmt_hours(sum(hours))} GPU-hours" if len(hours) == len(ests) else "compute unknown"
    return (
        f"then: {len(stand_ins)} longer runs of the baseline {spec.baseline} at its picked rate (compute_multiples: "
        f"{first.base_steps}-step budget -> {steps} steps, on each of {len(seeds)} fresh seeds), named like "
        f"{first.name(spec).replace(f'lr{first.lr:g}', 'lr<picked>')}: {cost}"
    )


def dry_run(specs: list[SweepSpec], commands: bool = False, memory: bool = True) -> tuple[str, list[str]]:
    """The report ``--dry-run`` prints for every part of a sweep file (``memory``: with the peak/GPU column), and
    one line per cause of a failed estimate, naming its runs (empty when every run was estimated)."""
    out: list[str] = []
    failures: dict[str, list[str]] = {}
    for spec in specs:
        runs, later = planned_runs(spec)
        ests = [_estimate(spec, run, failures) for run in runs]
        capacity, found = gpu_memory_of(spec.compute["gpu"])
        mems = [_memory(spec, run, capacity, failures) if memory else ("", "") for run in runs]
        sweep_dir = sweep_dir_of(spec)
        out += [
            f"sweep {spec.name} ({spec.source}): {len(runs)} jobs into {sweep_dir}",
            "  " + _launcher_line(spec, len(runs)),
            "  " + _budget_line(spec, ests[0]),
        ]
        if memory:
            out.append(
                f"  memory: peak/GPU of one training step vs {size(capacity)} ({found}); activation checkpointing as "
                "configured (python -m experiments estimate -c ... shows both settings)"
            )
        width = max(len(e.run) for e in ests)
        unit = "tokens" if ests[0].task in ("lm", "?") else "images"
        mem_head = f"  {'peak/GPU':>13}" if memory else ""
        out.append(
            f"  {'#':>3}  {'run':<{width}}  {'params':>8}  {'steps':>9}  {unit:>8}  {'FLOPs':>9}  "
            f"{'GPU-h':>8}  {'wall-h':>7}{mem_head}  note"
        )
        for i, (e, (cell, mem_note)) in enumerate(zip(ests, mems, strict=True), 1):
            wall = e.gpu_hours / e.world if e.gpu_hours is not None and e.world else None
            flops = None if e.train_flops is None else e.train_flops + (e.test_flops or 0)
            note = "; ".join(n for n in (e.note, mem_note) if n)
            mem_col = f"  {cell:>13}" if memory else ""
            out.append(
                f"  {i:>3}  {e.run:<{width}}  {_count(e.params):>8}  {e.steps or 0:>9,}  {_count(e.samples):>8}  "
                f"{_flops(flops):>9}  {_fmt_hours(e.gpu_hours):>8}  {_fmt_hours(wall):>7}{mem_col}  {note}"
            )
        known = [e for e in ests if e.gpu_hours is not None]
        flops = sum(e.train_flops + (e.test_flops or 0) for e in known)
        hours = sum(e.gpu_hours for e in known)
        c = spec.compute
        tested = " incl. FID sampling" if any(e.test_flops for e in ests) else ""
        measured = sum(e.mfu_source != "assumed" for e in ests)
        if later:
            out.append(f"  {later}")
        if longer := _longer_line(spec, failures):
            out.append(f"  {longer}")
        out.append(
            f"  grid: {len(runs)} runs, {flops:.3g} FLOPs{tested}, {_fmt_hours(hours)} GPU-hours at {c['mfu']:.0%} MFU "
            + (f"({measured} run(s) at their network's measured MFU) " if measured else "")
            + f"of {c['peak_tflops']:g} TFLOP/s per GPU ({c['gpu']})"
            + (f"; {len(ests) - len(known)} run(s) unknown" if len(known) < len(ests) else "")
        )
        walls = [e.gpu_hours / e.world for e in known if e.world]
        if spec.submitit and walls:
            jobs_per_run = math.ceil(max(walls) * 60 / spec.launcher["timeout_min"])
            out.append(
                f"  per run: up to {max(walls):,.1f} h on {known[0].world} GPU(s), i.e. {jobs_per_run} job(s) of "
                f"{spec.launcher['timeout_min']} min, requeued in between"
            )
        if spec.submitit and spec.launcher["cluster"] == "slurm":
            script = sbatch_script(spec, len(runs), Path(sweep_dir / SUBMITIT_DIR).resolve())
            out += ["  sbatch script (submitit):"] + [f"    {line}" for line in script.splitlines() if line.strip()]
        if commands:
            lines = [" ".join(["python", *r.argv(spec, extra=run_extra_args(spec, r))[1:]]) for r in runs]
            out += ["  commands:"] + [f"    {line}" for line in lines]
        out.append("")
    errors = [f"estimate of {len(runs)} run(s) failed ({', '.join(runs)}): {cause}" for cause, runs in failures.items()]
    return "\n".join(out).rstrip(), errors


def _fmt_hours(hours: float | None) -> str:
    if hours is None:
        return "?"
    return f"{hours:,.0f}" if hours >= 10 else f"{hours:.2g}"
