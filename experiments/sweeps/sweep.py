"""Run a grid of norm schemes x learning rates x warmups x seeds, then compare them.

    python -m experiments sweep configs/sweeps/demo.yaml [--parallel 2]        # local processes, then the table
    python -m experiments sweep configs/sweeps/paper-table1.yaml --dry-run     # jobs, compute, sbatch script
    python -m experiments sweep configs/sweeps/paper-table1.yaml               # submits a SLURM job array, returns
    python -m experiments sweep configs/sweeps/paper-table1.yaml --status      # every run: state, job, step, ETA
    python -m experiments sweep configs/sweeps/paper-table1.yaml --collect     # the comparison of what finished

Started again, a sweep skips finished (or diverged) runs and resumes unfinished ones from their newest
checkpoint (``--restart``: from scratch). Two sweeps on one spec share the grid: each run is claimed before it
starts, and a run another sweep (or command) is using is skipped and left to it, never trained twice; the
sweep's own files (``sweep.yaml``, the comparison's tables and plots) are replaced atomically, so of two
writers the last one's file stands whole. Where the runs go is the spec's ``launcher``: local processes
(:mod:`experiments.sweeps.launchers`) or submitit jobs (:mod:`experiments.sweeps.cluster`); while runs train
a progress line per run and the grid's ETA are printed every ``progress_every_s`` seconds. The comparison
(markdown + CSV table, PNG plots, TensorBoard layout) comes from :mod:`experiments.results.compare`.

Exit status: 0 (also when runs were left to another sweep); 1 when a run crashed; 2 for a bad sweep file or
option (one line), or a ``--dry-run`` whose estimate failed for some runs (every run listed, then one ``error:``
line per cause naming its runs); 130 / 143 after Ctrl-C / SIGTERM (the runs save ``interrupted.ckpt`` first;
the same command resumes).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import time
from dataclasses import asdict
from pathlib import Path

import yaml

from experiments.reliability.errors import USAGE_ERROR, ArgumentParser, SuiteError
from experiments.results.compare import load_comparison, write_comparison, write_tables
from experiments.results.runs import SWEEP_RECORD
from experiments.results.tb_layout import comparison_url
from experiments.sweeps.cluster import Submission
from experiments.sweeps.compute_runs import COMPUTE_TABLE, check_budget, longer_runs, write_compute
from experiments.sweeps.launchers import (  # noqa: F401 - the names the sweep has always offered
    DONE,
    IN_USE,
    SIGNAL_EXIT,
    Children,
    SweepStopped,
    has_checkpoint,
    previous_status,
    read_summary,
    run_locally,
    run_one,
)
from experiments.sweeps.measure import MEASUREMENT_TABLE, spread_markdown, with_last_evals
from experiments.sweeps.ownership import SWEEP_MARKER, claim_sweep_dir
from experiments.sweeps.plan import dry_run
from experiments.sweeps.protocol import (
    TUNING_TABLE,
    fresh_record,
    fresh_runs,
    pick,
    picked_rates,
    read_tuning,
    tuning_markdown,
    tuning_runs,
)
from experiments.sweeps.spec import (  # noqa: F401
    NORM_OVERLAYS,
    Run,
    SpecError,
    SweepSpec,
    grid,
    load_specs,
    parse_assignments,
    sweep_dir_of,
    task_of,
)
from experiments.sweeps.stages import STAGES_TABLE, decide, read_stages
from experiments.sweeps.stages import plan as stage_plan
from experiments.sweeps.status import run_states, status_table, watch
from fileio import atomic_write_text


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = ArgumentParser(prog="python -m experiments sweep", description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep_file", help="sweep YAML, e.g. configs/sweeps/demo.yaml")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="print the jobs, their compute and exit")
    mode.add_argument("--status", action="store_true", help="print every run's state and exit")
    mode.add_argument("--collect", action="store_true", help="rebuild the comparison from the finished runs")
    parser.add_argument("--commands", action="store_true", help="with --dry-run: also print each run's command")
    parser.add_argument(
        "--no-memory", action="store_true", help="with --dry-run: skip the peak/GPU column (minutes for paper sizes)"
    )
    parser.add_argument("--parallel", type=int, default=None, help="runs at once (process launcher)")
    parser.add_argument("--restart", action="store_true", help="rerun unfinished runs from scratch")
    parser.add_argument("--wait", action="store_true", help="submitit: stay, print progress, compare at the end")
    parser.add_argument(
        "--progress-every", type=float, default=None, metavar="S", help="seconds between progress lines"
    )
    parser.add_argument("--launcher", action="append", metavar="KEY=VALUE", help="e.g. kind=submitit, partition=gpu")
    parser.add_argument("--budget", action="append", metavar="KEY=VALUE", help="tokens=2e9 | steps=N | epochs=N")
    parser.add_argument("--compute", action="append", metavar="KEY=VALUE", help="mfu=0.35, peak_tflops=312, gpu=A100")
    args = argv[1:] if argv and argv[0] == "sweep" else argv
    return parser.parse_args(args)  # a bad option: one line (UsageExit), exit status 2


def load(args: argparse.Namespace) -> list[SweepSpec]:
    overrides = {key: parse_assignments(getattr(args, key), key) for key in ("launcher", "budget", "compute")}
    specs = load_specs(args.sweep_file, overrides)
    for spec in specs:
        if args.parallel is not None:
            if args.parallel < 1:
                raise SpecError(f"--parallel={args.parallel}; valid: an integer >= 1")
            spec.parallel = args.parallel
        if args.progress_every is not None:
            if args.progress_every <= 0:
                raise SpecError(f"--progress-every={args.progress_every}; valid: seconds > 0")
            spec.progress_every_s = args.progress_every
    return specs


def write_record(
    spec: SweepSpec,
    runs: list[Run],
    sweep_dir: Path,
    sweep_file: str,
    compared: list[Run] | None = None,
    grid_entries: list[dict] | None = None,
) -> None:
    """``sweep.yaml``: the spec as run and the run order (with each run's grid coordinates) the comparison keeps.

    ``compared``: the runs the comparison reads (default ``runs``; a protocol's fresh runs only);
    ``grid_entries``: the coordinates to record (default each run's own).
    """
    record = {
        **asdict(spec),
        "runs": [r.name(spec) for r in (runs if compared is None else compared)],
        "grid": grid_entries if grid_entries is not None else [r.record(spec) for r in runs],
        "sweep_file": sweep_file,
    }
    atomic_write_text(sweep_dir / SWEEP_RECORD, yaml.safe_dump(record, sort_keys=False))


def compare(spec: SweepSpec, runs: list[Run], sweep_dir: Path, only_done: bool = False) -> None:
    """Writes and prints the comparison (``only_done``: the finished and diverged runs only, for ``--collect``)."""
    names = [r.name(spec) for r in runs]
    if only_done:
        names = [n for n in names if previous_status(sweep_dir / n / "summary.json") in DONE]
        if not names:
            print(f"sweep {spec.name}: no run has finished yet; nothing to compare", flush=True)
            return
    outputs = write_comparison(sweep_dir, names, spec.metric)
    if spec.last_evals > 1:  # the tables again, from the mean of each run's last evaluations, and their spread
        comparison = with_last_evals(load_comparison(sweep_dir, names, spec.metric), spec.last_evals)
        outputs.update(write_tables(sweep_dir, comparison))
        outputs["measurement"] = sweep_dir / MEASUREMENT_TABLE
        atomic_write_text(outputs["measurement"], spread_markdown(comparison, spec.last_evals))
    print(outputs["markdown"].read_text())
    if "measurement" in outputs:
        print(outputs["measurement"].read_text())
    for kind, path in outputs.items():
        print(f"{kind:>14}: {path}")
    print(f"   tensorboard: {_tensorboard()} --logdir {sweep_dir}")
    print(f"     then open: {comparison_url(spec.metric)}")
    note = "(validation curves pinned on top, unsmoothed; if 6006 is taken, the port TensorBoard prints)"
    print(f"{'':16}{note}", flush=True)


def _tensorboard() -> str:
    """``tensorboard`` when the shell finds it, else the one installed beside this Python (``.venv/bin/...``)."""
    beside = Path(sys.executable).parent / "tensorboard"
    if shutil.which("tensorboard") or not beside.is_file():
        return "tensorboard"
    return os.path.relpath(beside) if beside.resolve().is_relative_to(Path.cwd().resolve()) else str(beside)


def _submitit(
    spec: SweepSpec,
    runs: list[Run],
    sweep_dir: Path,
    args: argparse.Namespace,
    compare_after: bool = True,
    compared: list[Run] | None = None,
) -> list[str]:
    """Submits the spec's jobs; with ``--wait`` (always for the local executor) watches and compares them
    (``compare_after`` false: watches only, for a protocol's tuning phase; ``compared``: the runs to compare,
    default ``runs``)."""
    submission = Submission(spec, sweep_dir)
    submission.submit(runs, args.restart)
    if not (args.wait or spec.launcher["cluster"] == "local"):
        print(
            f"sweep {spec.name}: watch with `python -m experiments sweep {args.sweep_file} --status`; "
            f"compare what finished with `... --collect`",
            flush=True,
        )
        return []
    stopped: list[int] = []

    def stop(signum: int, frame) -> None:
        stopped.append(signum)
        for job in submission.jobs:  # local jobs: their controller forwards it; cluster jobs are left running
            if spec.launcher["cluster"] == "local" and not job.done():
                job._process.send_signal(signal.SIGTERM)
        submission.pending.clear()
        raise SweepStopped

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        watch(spec, runs, sweep_dir, submission)
    except (KeyboardInterrupt, SweepStopped):
        signum = stopped[0] if stopped else signal.SIGINT
        while spec.launcher["cluster"] == "local" and submission.active():
            time.sleep(0.5)  # the local runs finish their step and save
        where = "its local jobs saved and stopped" if spec.launcher["cluster"] == "local" else "its jobs keep running"
        print(f"sweep {spec.name} stopped watching ({where}); run the same command to resume", file=sys.stderr)
        raise SystemExit(SIGNAL_EXIT[signum]) from None
    finally:
        signal.signal(signal.SIGTERM, previous)
    if compare_after:
        compare(spec, runs if compared is None else compared, sweep_dir)
    return [s.name for s in run_states(spec, runs, sweep_dir) if s.state == "failed"]


def _known_runs(spec: SweepSpec, sweep_dir: Path) -> tuple[list[Run], list[Run]]:
    """(every run the sweep has planned so far, the runs its comparison reads): the grid, or a protocol's tuning
    runs and, once its rates are picked, the fresh runs (and the baseline's longer runs of ``compute_multiples``)."""
    if spec.stages:
        look, runs, launched = stage_plan(spec, read_stages(spec, sweep_dir))
        return launched, launched
    if not spec.protocol:
        return grid(spec), grid(spec)
    record = read_tuning(spec, sweep_dir)
    fresh = fresh_runs(spec, picked_rates(record)) if record else []
    return tuning_runs(spec) + fresh + longer_runs(spec, fresh), fresh


def _record_protocol(spec: SweepSpec, sweep_dir: Path, sweep_file: str) -> list[Run]:
    """Writes ``sweep.yaml`` for a protocol's runs so far; returns the fresh runs (none before the picks). The
    baseline's longer runs (``compute_multiples``) are recorded in its grid, never among the compared runs."""
    record = read_tuning(spec, sweep_dir)
    fresh = fresh_runs(spec, picked_rates(record)) if record else []
    tuning, longer = tuning_runs(spec), longer_runs(spec, fresh)
    entries = [r.record(spec) for r in tuning] + fresh_record(spec, fresh) + [r.record(spec) for r in longer]
    write_record(spec, tuning + fresh + longer, sweep_dir, sweep_file, compared=fresh, grid_entries=entries)
    return fresh


def _print_tuning(spec: SweepSpec, sweep_dir: Path) -> None:
    if spec.protocol and (record := read_tuning(spec, sweep_dir)) is not None:
        print(tuning_markdown(record), flush=True)
        print(f"{'tuning':>14}: {sweep_dir / TUNING_TABLE}", flush=True)


def _print_compute(spec: SweepSpec, sweep_dir: Path, fresh: list[Run]) -> None:
    """``compute_multiples``: the multipliers, computed from the runs as they stand, written and printed."""
    if write_compute(spec, sweep_dir, fresh) is not None:
        print((sweep_dir / COMPUTE_TABLE).read_text(), flush=True)
        print(f"{'compute':>14}: {sweep_dir / COMPUTE_TABLE}", flush=True)


def _print_stages(spec: SweepSpec, sweep_dir: Path) -> None:
    if spec.stages and (sweep_dir / STAGES_TABLE).is_file():
        print((sweep_dir / STAGES_TABLE).read_text(), flush=True)
        print(f"{'stages':>14}: {sweep_dir / STAGES_TABLE}", flush=True)


def _staged(spec: SweepSpec, sweep_dir: Path, args: argparse.Namespace) -> list[str]:
    """Look after look: the look's runs, its verdicts (recorded once), the undecided cells' next seeds; then the
    comparison of every run so far. Returns crashed runs."""
    crashed: list[str] = []
    while True:
        look, runs, launched = stage_plan(spec, read_stages(spec, sweep_dir))
        write_record(spec, grid(spec), sweep_dir, args.sweep_file, compared=launched)
        if look is None:
            break
        print(
            f"sweep {spec.name}: look {look} of {len(spec.stages)}, {spec.stages[look - 1]} seeds per cell: "
            f"{len(runs)} runs into {sweep_dir}",
            flush=True,
        )
        crashed += _run_phase(spec, runs, sweep_dir, args)
        if not decide(spec, sweep_dir, look, runs, launched):
            print(
                f"sweep {spec.name}: look {look} waits for runs that have not ended (crashed, running or in use): "
                f"run `python -m experiments sweep {args.sweep_file}` again",
                flush=True,
            )
            return crashed
    compare(spec, launched, sweep_dir)
    _print_stages(spec, sweep_dir)
    return crashed


def _run_phase(spec: SweepSpec, runs: list, sweep_dir: Path, args: argparse.Namespace) -> list[str]:
    """One phase of a staged or tuned sweep: trained here, or submitted (the same command continues later); the
    runs that crashed."""
    if spec.submitit:
        return _submitit(spec, runs, sweep_dir, args, compare_after=False)
    statuses = run_locally(spec, runs, sweep_dir, args.restart)
    return [name for name, status in statuses.items() if status == "crashed"]


def _tune_then_compare(spec: SweepSpec, sweep_dir: Path, args: argparse.Namespace) -> list[str]:
    """Tuning runs, the picks (once), the fresh runs at them, the comparison of the fresh runs: as far as the runs
    allow now (a submitit sweep submits a phase and returns; the same command continues). Returns crashed runs."""
    fresh = _record_protocol(spec, sweep_dir, args.sweep_file)
    crashed: list[str] = []
    if not fresh:
        tuning = tuning_runs(spec)
        print(
            f"sweep {spec.name}: tuning, {len(tuning)} runs ({len(spec.lrs)} rates x "
            f"{len(spec.protocol['tuning_seeds'])} tuning seed(s) per scheme), then each scheme at its best rate on "
            f"{len(spec.protocol['fresh_seeds'])} fresh seeds, into {sweep_dir}",
            flush=True,
        )
        crashed += _run_phase(spec, tuning, sweep_dir, args)
        if pick(spec, sweep_dir) is None:
            print(
                f"sweep {spec.name}: not every tuning run has ended (crashed, running or in use); no rate is picked "
                f"until they have: run `python -m experiments sweep {args.sweep_file}` again",
                flush=True,
            )
            return crashed
        fresh = _record_protocol(spec, sweep_dir, args.sweep_file)
    _print_tuning(spec, sweep_dir)
    longer = longer_runs(spec, fresh)
    more = f", then {len(longer)} longer runs of the baseline (compute_multiples)" if longer else ""
    print(f"sweep {spec.name}: {len(fresh)} fresh runs, each scheme at its picked rate{more}", flush=True)
    if spec.submitit:
        crashed += _submitit(spec, fresh + longer, sweep_dir, args, compared=fresh)
        _print_compute(spec, sweep_dir, fresh)
        return crashed
    statuses = run_locally(spec, fresh + longer, sweep_dir, args.restart)
    compare(spec, fresh, sweep_dir)
    _print_compute(spec, sweep_dir, fresh)
    return crashed + [name for name, status in statuses.items() if status == "crashed"]


def main(argv: list[str] | None = None) -> int | None:
    """Entry point of ``python -m experiments sweep``; returns 1 when a run crashed."""
    args = parse_args(argv)
    specs = load(args)
    if args.dry_run:
        report, errors = dry_run(specs, args.commands, memory=not args.no_memory)
        print(report, flush=True)
        for line in errors:  # the runs are all listed above; each cause once, naming its runs
            print(f"error: {line}", file=sys.stderr, flush=True)
        return USAGE_ERROR if errors else None
    if args.status or args.collect:
        for spec in specs:
            sweep_dir = sweep_dir_of(spec)
            if not (sweep_dir / SWEEP_MARKER).exists() and not (sweep_dir / SWEEP_RECORD).exists():
                raise SuiteError(f"{sweep_dir} holds no sweep yet ({args.sweep_file}); valid: run the sweep first")
            runs, compared = _known_runs(spec, sweep_dir)
            if args.status:
                print(status_table(spec, sweep_dir, run_states(spec, runs, sweep_dir)), flush=True)
                _print_compute(spec, sweep_dir, compared)
            elif spec.protocol and not compared:
                print(f"sweep {spec.name}: still tuning, no rate picked yet; nothing to compare", flush=True)
            else:
                compare(spec, compared, sweep_dir, only_done=True)
                _print_tuning(spec, sweep_dir)
                _print_compute(spec, sweep_dir, compared)
                _print_stages(spec, sweep_dir)
        return None
    crashed: list[str] = []
    for spec in specs:
        sweep_dir = sweep_dir_of(spec)
        if spec.protocol:
            read_tuning(spec, sweep_dir)  # picks made under another protocol: one line before anything is written
            check_budget(spec)  # compute_multiples on a budget that is not in steps: likewise
        if spec.stages:
            read_stages(spec, sweep_dir)  # looks recorded under other stages: likewise
        claim_sweep_dir(sweep_dir, spec.name, args.sweep_file)
        if spec.protocol:
            crashed += _tune_then_compare(spec, sweep_dir, args)
            continue
        if spec.stages:
            crashed += _staged(spec, sweep_dir, args)
            continue
        runs = grid(spec)
        write_record(spec, runs, sweep_dir, args.sweep_file)
        if spec.submitit:
            crashed += _submitit(spec, runs, sweep_dir, args)
            continue
        print(f"sweep {spec.name}: {len(runs)} runs, {spec.parallel} at a time, into {sweep_dir}", flush=True)
        statuses = run_locally(spec, runs, sweep_dir, args.restart)
        compare(spec, runs, sweep_dir)
        crashed += [name for name, status in statuses.items() if status == "crashed"]
        if held := [name for name, status in statuses.items() if status == IN_USE]:
            print(
                f"sweep {spec.name}: {len(held)} run(s) in use by another sweep or command, left to it: "
                f"{', '.join(held)}; listed as running above; when they end, compare again with "
                f"`python -m experiments sweep {args.sweep_file} --collect`",
                flush=True,
            )
    if crashed:
        print(
            f"error: {len(crashed)} run(s) crashed: {', '.join(crashed)} (their logs are in <sweep>/logs/)",
            file=sys.stderr,
            flush=True,
        )
        return 1
    return None
