"""Run a grid of norm schemes x learning rates x warmups x seeds, then compare them.

    python -m experiments sweep configs/sweeps/demo.yaml [--parallel 2] [--dry-run]

Each run is a separate ``python -m experiments fit`` process writing its own run directory, so a
crash or divergence in one run never takes the sweep down. Started again, the sweep skips a run whose
``summary.json`` says it finished (or diverged) and resumes one that was interrupted, killed mid-way
("running") or crashed from its newest readable checkpoint (``--ckpt_path last``, an exact resume;
from scratch when it has none). ``--restart`` reruns those from an emptied directory instead.

Ctrl-C or SIGTERM stops the sweep cleanly: no new run starts, the running ones are stopped the way a
single run is (they save ``interrupted.ckpt``), and the sweep exits 130 / 143 saying how to resume.
The comparison (markdown + CSV table, PNG plots, TensorBoard custom-scalars layout) is rebuilt from
the summary files at the end: see :mod:`experiments.sweeps.compare`.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from experiments.sweeps.compare import SWEEP_RECORD, write_comparison
from models.schemes import NormScheme

DONE = ("finished", "diverged")
SIGNAL_EXIT = {signal.SIGINT: 130, signal.SIGTERM: 143}  # 128 + signal number, as shells report them


class SweepStopped(Exception):
    """Raised in the main thread when the sweep receives SIGTERM (Ctrl-C raises KeyboardInterrupt)."""


class Children:
    """The run processes alive right now, so a stopped sweep can stop them too and start no others.

    Runs start in their own session: a Ctrl-C in the terminal reaches only the sweep, which forwards
    exactly one signal per stop to each run (a second SIGINT would make a run stop without saving).
    """

    def __init__(self) -> None:
        self._procs: set[subprocess.Popen] = set()
        self._lock = threading.Lock()
        self.stopping = threading.Event()

    def call(self, argv: list[str], **kwargs) -> int | None:
        """``subprocess.call`` that registers the process; None (nothing started) once the sweep is stopping."""
        with self._lock:
            if self.stopping.is_set():
                return None
            proc = subprocess.Popen(argv, start_new_session=True, **kwargs)
            self._procs.add(proc)
        try:
            return proc.wait()
        finally:
            with self._lock:
                self._procs.discard(proc)

    def stop(self, signum: int) -> int:
        """Starts no new run and sends ``signum`` to the running ones; returns how many were running."""
        with self._lock:
            self.stopping.set()
            for proc in self._procs:
                proc.send_signal(signum)
            return len(self._procs)


NORM_OVERLAYS = Path("configs/norm")


@dataclass
class SweepSpec:
    """A sweep file (YAML). Empty lists mean "what the config says".

    Attributes:
        name: experiment name; runs land in ``<runs_root>/<task>/<name>/<run>``.
        configs: task configs stacked before each scheme overlay.
        schemes: norm schemes, or named variants of one (each adds ``configs/norm/<entry>.yaml``, e.g.
            ``siamese_hybrid-no-input-norm``).
        overlays: configs of which each run stacks one (e.g. the shapes of a depth study); the run name
            gets the file's stem.
        lrs: peak learning rates.
        warmups: warmup lengths in steps.
        seeds: seeds; each sets ``seed_everything`` (model init) and, unless ``seed_data`` is false, the
            DataModule's ``seed`` (data order), so seeds are independent replicates.
        seed_data: whether a seed also varies the data order.
        baseline: the scheme every other scheme is compared with, seed by seed (e.g. ``pre``).
        args: extra CLI arguments for every run (e.g. ``--trainer.max_steps=300``).
        metric: the column the table is sorted by and the bar plot shows.
        parallel: runs at once.
        test: also run ``test`` on each run's best checkpoint.
        runs_root: root of run directories.
    """

    name: str
    configs: list[str]
    schemes: list[str]
    overlays: list[str] = field(default_factory=list)
    lrs: list[float] = field(default_factory=list)
    warmups: list[int] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)
    seed_data: bool = True
    baseline: str | None = None
    args: list[str] = field(default_factory=list)
    metric: str = "val/loss"
    parallel: int = 1
    test: bool = False
    runs_root: str = "runs"

    @classmethod
    def load(cls, path: str) -> SweepSpec:
        if not Path(path).is_file():
            raise FileNotFoundError(f"sweep file {path!r} does not exist")
        raw = yaml.safe_load(Path(path).read_text()) or {}
        unknown = set(raw) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown sweep keys {sorted(unknown)}; valid: {sorted(cls.__dataclass_fields__)}")
        spec = cls(**raw)
        variants = sorted(p.stem for p in NORM_OVERLAYS.glob("*.yaml") if p.stem not in set(NormScheme))
        for scheme in spec.schemes:
            if scheme not in NormScheme.__members__.values() and scheme not in variants:
                valid = ", ".join([*NormScheme, *variants])
                raise ValueError(f"unknown scheme {scheme!r} in {path}; valid: {valid}")
        if spec.baseline is not None and spec.baseline not in spec.schemes:
            raise ValueError(f"baseline {spec.baseline!r} in {path} is not one of its schemes {spec.schemes}")
        for cfg in [*spec.configs, *spec.overlays]:
            if not Path(cfg).is_file():
                raise FileNotFoundError(f"config {cfg!r} named in {path} does not exist")
        if any(lr <= 0 for lr in spec.lrs):
            raise ValueError(f"learning rates must be positive, got {spec.lrs}")
        if spec.parallel < 1:
            raise ValueError(f"parallel must be >= 1, got {spec.parallel}")
        return spec


@dataclass(frozen=True)
class Run:
    """One point of the grid; ``scheme`` is a scheme or a named variant of one (its norm overlay's name)."""

    scheme: str
    lr: float | None
    warmup: int | None
    seed: int | None
    overlay: str | None = None

    def name(self, spec: SweepSpec) -> str:
        parts = [self.scheme]
        if len(spec.overlays) > 1:
            parts.append(Path(self.overlay).stem)
        if len(spec.lrs) > 1:
            parts.append(f"lr{self.lr:g}")
        if len(spec.warmups) > 1:
            parts.append(f"wu{self.warmup}")
        if len(spec.seeds) > 1:
            parts.append(f"s{self.seed}")
        return "-".join(parts)

    def argv(self, spec: SweepSpec, sub: str = "fit") -> list[str]:
        argv = [sys.executable, "-m", "experiments", sub]
        overlays = [self.overlay] if self.overlay else []
        for cfg in [*spec.configs, *overlays, str(NORM_OVERLAYS / f"{self.scheme}.yaml")]:
            argv += ["-c", cfg]
        argv += [f"--runs_root={spec.runs_root}", f"--experiment={spec.name}", f"--run_name={self.name(spec)}"]
        if self.lr is not None:
            argv.append(f"--model.init_args.optim.lr={self.lr}")
        if self.warmup is not None:
            argv.append(f"--model.init_args.optim.warmup_steps={self.warmup}")
        if self.seed is not None:
            argv.append(f"--seed_everything={self.seed}")
            if spec.seed_data:
                argv.append(f"--data.init_args.seed={self.seed}")
        return argv + list(spec.args)

    def record(self, spec: SweepSpec) -> dict:
        """What ``sweep.yaml`` keeps of the run: its name and its coordinates in the grid."""
        overlay = Path(self.overlay).stem if self.overlay else None
        return {"name": self.name(spec), "scheme": self.scheme, "overlay": overlay, "lr": self.lr,
                "warmup": self.warmup, "seed": self.seed}  # fmt: skip


def grid(spec: SweepSpec) -> list[Run]:
    """Every run: schemes x overlays x lrs x warmups x seeds, seeds varying fastest."""
    return [
        Run(s, lr, wu, seed, overlay)
        for s, overlay, lr, wu, seed in itertools.product(
            spec.schemes, spec.overlays or [None], spec.lrs or [None], spec.warmups or [None], spec.seeds or [None]
        )
    ]


def task_of(spec: SweepSpec) -> str:
    from experiments.reliability.layout import TASK_NAMES

    for cfg in spec.configs:
        class_path = ((yaml.safe_load(Path(cfg).read_text()) or {}).get("model") or {}).get("class_path", "")
        if class_path:
            return TASK_NAMES.get(class_path.rsplit(".", 1)[-1], "task")
    return "task"


def read_summary(summary: Path) -> dict:
    """A run's ``summary.json`` ({} without one; status "crashed" if unreadable, e.g. half-written)."""
    if not summary.exists():
        return {}
    try:
        return {"status": "crashed", **json.loads(summary.read_text())}
    except (json.JSONDecodeError, OSError):
        return {"status": "crashed"}


def previous_status(summary: Path) -> str | None:
    """The status a run's ``summary.json`` records (None without one; "crashed" if unreadable)."""
    return read_summary(summary).get("status")


def has_checkpoint(run_dir: Path) -> bool:
    return any((run_dir / "checkpoints").glob("*.ckpt"))


def run_one(
    run: Run, spec: SweepSpec, sweep_dir: Path, index: int, total: int, children: Children, restart: bool = False
) -> str:
    """Runs, resumes or skips one run; prints one progress line; returns its status."""
    name, tag = run.name(spec), f"[{index}/{total}] {run.name(spec)}"
    run_dir = sweep_dir / name
    summary = run_dir / "summary.json"
    previous = previous_status(summary)
    untested = spec.test and previous == "finished" and "test" not in read_summary(summary)
    if previous in DONE and not untested:
        print(f"{tag}: already done ({previous}), skipped", flush=True)
        return "skipped"
    if children.stopping.is_set():
        return "not started"
    argv = run.argv(spec)
    if untested:  # stopped during its test: the fit stands, only the test runs
        print(f"{tag}: finished but not tested, testing", flush=True)
    elif run_dir.exists():  # interrupted, killed mid-way ("running" or no summary yet), crashed
        attempt = f"previous attempt {previous or 'left no summary'}"
        if restart or not has_checkpoint(run_dir):
            print(f"{tag}: {attempt}, rerunning from scratch", flush=True)
            shutil.rmtree(run_dir)  # so TensorBoard does not overlay the two attempts
        else:
            print(f"{tag}: {attempt}, resuming from its last checkpoint", flush=True)
            argv.append("--ckpt_path=last")  # the newest readable checkpoint; curves continue exactly
    log = sweep_dir / "logs" / f"{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if spec.parallel > 1:  # share the cores instead of oversubscribing them
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // spec.parallel))
    print(f"{tag}: running (log: {log})", flush=True)
    start = time.perf_counter()
    with log.open("a" if untested or "--ckpt_path=last" in argv else "w") as fh:
        code = 0 if untested else children.call(argv, stdout=fh, stderr=subprocess.STDOUT, env=env)
        testing = code == 0 and spec.test
        if testing:
            ckpts = sorted((run_dir / "checkpoints").glob("*.ckpt"), key=lambda p: p.stat().st_mtime)
            if ckpts:  # the newest checkpoint (last.ckpt is written after the best one)
                test_argv = run.argv(spec, "test") + [f"--ckpt_path={ckpts[-1]}"]
                code = children.call(test_argv, stdout=fh, stderr=subprocess.STDOUT, env=env)
            else:
                print(f"{tag}: no checkpoint to test", flush=True)
    if code is None:  # the sweep stopped before this process could start
        return "not started"
    record = read_summary(summary)
    status = record.get("status", "crashed")
    if status == "interrupted":
        print(f"{tag}: interrupted at step {record.get('steps', '?')} (run the sweep again to resume)", flush=True)
    elif code != 0 and children.stopping.is_set():  # stopped during its test, or before fit could save anything
        status = "interrupted"
        what = "test interrupted (run the sweep again to test it)" if testing else "stopped before its first step"
        print(f"{tag}: {what}", flush=True)
    elif code != 0 and status not in DONE:
        status = "crashed"
        tail = log.read_text().strip().splitlines()[-1:] or ["(no output)"]
        print(f"{tag}: CRASHED (exit {code}): {tail[0][:200]}", flush=True)
    else:
        metric = (record.get("final_val") or {}).get(spec.metric)
        shown = f"{spec.metric} {metric:.4g}" if metric is not None else ""
        print(f"{tag}: {status} in {time.perf_counter() - start:.0f} s {shown}", flush=True)
    if status == "crashed" and not summary.exists():
        summary.parent.mkdir(parents=True, exist_ok=True)
        summary.write_text(json.dumps({"scheme": run.scheme, "lr": run.lr, "status": "crashed", "error": str(log)}))
    return status


def _raise_stopped(signum: int, frame) -> None:
    raise SweepStopped


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m experiments sweep", description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep_file", help="sweep YAML, e.g. configs/sweeps/demo.yaml")
    parser.add_argument("--parallel", type=int, default=None, help="runs at once (overrides the file)")
    parser.add_argument("--dry-run", action="store_true", help="print the commands and exit")
    parser.add_argument(
        "--restart", action="store_true", help="rerun unfinished runs from scratch instead of resuming them"
    )
    args = parser.parse_args(argv[1:] if argv and argv[0] == "sweep" else argv)
    try:
        spec = SweepSpec.load(args.sweep_file)
    except (ValueError, FileNotFoundError, yaml.YAMLError) as err:
        sys.exit(f"error: {err}")
    if args.parallel is not None:
        spec.parallel = max(1, args.parallel)
    runs = grid(spec)
    sweep_dir = Path(spec.runs_root) / task_of(spec) / spec.name
    if args.dry_run:
        for run in runs:
            print(" ".join(run.argv(spec)))
        return
    print(f"sweep {spec.name}: {len(runs)} runs, {spec.parallel} at a time, into {sweep_dir}", flush=True)
    sweep_dir.mkdir(parents=True, exist_ok=True)  # the spec as run, and the run order the comparison keeps
    record = {**asdict(spec), "runs": [r.name(spec) for r in runs], "grid": [r.record(spec) for r in runs],
              "sweep_file": args.sweep_file}  # fmt: skip
    (sweep_dir / SWEEP_RECORD).write_text(yaml.safe_dump(record, sort_keys=False))
    children, stopped_by = Children(), None
    previous_handler = signal.signal(signal.SIGTERM, _raise_stopped)
    pool = ThreadPoolExecutor(spec.parallel)
    try:
        futures = [
            pool.submit(run_one, run, spec, sweep_dir, i + 1, len(runs), children, args.restart)
            for i, run in enumerate(runs)
        ]
        for future in futures:
            future.result()
    except (KeyboardInterrupt, SweepStopped) as stop:
        stopped_by = signal.SIGINT if isinstance(stop, KeyboardInterrupt) else signal.SIGTERM
        running = children.stop(stopped_by)
        print(f"sweep {spec.name}: {stopped_by.name}, {running} running run(s) saving interrupted.ckpt", flush=True)
        try:
            pool.shutdown(wait=True, cancel_futures=True)
        except (KeyboardInterrupt, SweepStopped):  # asked again: the runs stop now, without saving
            children.stop(signal.SIGINT)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        signal.signal(signal.SIGTERM, previous_handler)
    if stopped_by is not None:
        print(f"sweep {spec.name} stopped: run the same command again to resume it", file=sys.stderr, flush=True)
        raise SystemExit(SIGNAL_EXIT[stopped_by])
    outputs = write_comparison(sweep_dir, [r.name(spec) for r in runs], spec.metric)
    print(outputs["markdown"].read_text())
    for kind, path in outputs.items():
        print(f"{kind:>14}: {path}")
    print(f"   tensorboard: tensorboard --logdir {sweep_dir}")
