"""Run a grid of norm schemes x learning rates x warmups x seeds, then compare them.

    python -m experiments sweep configs/sweeps/demo.yaml [--parallel 2] [--dry-run]

Each run is a separate ``python -m experiments fit`` process writing its own run directory, so a
crash or divergence in one run never takes the sweep down. Started again, the sweep skips a run whose
``summary.json`` says it finished (or diverged) and reruns, from an emptied run directory, one that
was killed mid-way ("running"), crashed or was interrupted. The comparison (markdown + CSV
table, PNG plots, TensorBoard custom-scalars layout) is rebuilt from those summary files at the end:
see :mod:`experiments.compare`.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from experiments.compare import write_comparison
from models.schemes import NormScheme

DONE = ("finished", "diverged")


@dataclass
class SweepSpec:
    """A sweep file (YAML). Empty lists mean "what the config says".

    Attributes:
        name: experiment name; runs land in ``<runs_root>/<task>/<name>/<run>``.
        configs: task configs stacked before each scheme overlay.
        schemes: norm schemes (each adds ``configs/norm/<scheme>.yaml``).
        lrs: peak learning rates.
        warmups: warmup lengths in steps.
        seeds: seeds.
        args: extra CLI arguments for every run (e.g. ``--trainer.max_steps=300``).
        metric: the column the table is sorted by and the bar plot shows.
        parallel: runs at once.
        test: also run ``test`` on each run's best checkpoint.
        runs_root: root of run directories.
    """

    name: str
    configs: list[str]
    schemes: list[str]
    lrs: list[float] = field(default_factory=list)
    warmups: list[int] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)
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
        for scheme in spec.schemes:
            if scheme not in NormScheme.__members__.values():
                raise ValueError(f"unknown scheme {scheme!r} in {path}; valid: {', '.join(NormScheme)}")
        for cfg in spec.configs:
            if not Path(cfg).is_file():
                raise FileNotFoundError(f"config {cfg!r} named in {path} does not exist")
        if any(lr <= 0 for lr in spec.lrs):
            raise ValueError(f"learning rates must be positive, got {spec.lrs}")
        if spec.parallel < 1:
            raise ValueError(f"parallel must be >= 1, got {spec.parallel}")
        return spec


@dataclass(frozen=True)
class Run:
    scheme: str
    lr: float | None
    warmup: int | None
    seed: int | None

    def name(self, spec: SweepSpec) -> str:
        parts = [self.scheme]
        if len(spec.lrs) > 1:
            parts.append(f"lr{self.lr:g}")
        if len(spec.warmups) > 1:
            parts.append(f"wu{self.warmup}")
        if len(spec.seeds) > 1:
            parts.append(f"s{self.seed}")
        return "-".join(parts)

    def argv(self, spec: SweepSpec, sub: str = "fit") -> list[str]:
        argv = [sys.executable, "-m", "experiments", sub]
        for cfg in [*spec.configs, f"configs/norm/{self.scheme}.yaml"]:
            argv += ["-c", cfg]
        argv += [f"--runs_root={spec.runs_root}", f"--experiment={spec.name}", f"--run_name={self.name(spec)}"]
        if self.lr is not None:
            argv.append(f"--model.init_args.optim.lr={self.lr}")
        if self.warmup is not None:
            argv.append(f"--model.init_args.optim.warmup_steps={self.warmup}")
        if self.seed is not None:
            argv.append(f"--seed_everything={self.seed}")
        return argv + list(spec.args)


def grid(spec: SweepSpec) -> list[Run]:
    return [
        Run(s, lr, wu, seed)
        for s, lr, wu, seed in itertools.product(
            spec.schemes, spec.lrs or [None], spec.warmups or [None], spec.seeds or [None]
        )
    ]


def task_of(spec: SweepSpec) -> str:
    from experiments.registry import TASK_NAMES

    for cfg in spec.configs:
        class_path = ((yaml.safe_load(Path(cfg).read_text()) or {}).get("model") or {}).get("class_path", "")
        if class_path:
            return TASK_NAMES.get(class_path.rsplit(".", 1)[-1], "task")
    return "task"


def previous_status(summary: Path) -> str | None:
    """The status a run's ``summary.json`` records (None without one; "crashed" if unreadable)."""
    if not summary.exists():
        return None
    try:
        return json.loads(summary.read_text()).get("status", "crashed")
    except (json.JSONDecodeError, OSError):
        return "crashed"


def run_one(run: Run, spec: SweepSpec, sweep_dir: Path, index: int, total: int) -> str:
    """Runs (or skips) one run; prints one progress line; returns its status."""
    name = run.name(spec)
    summary = sweep_dir / name / "summary.json"
    previous = previous_status(summary)
    if previous in DONE:
        print(f"[{index}/{total}] {name}: already done ({previous}), skipped", flush=True)
        return "skipped"
    if (sweep_dir / name).exists():  # killed mid-way ("running" or no summary yet), crashed, interrupted
        print(f"[{index}/{total}] {name}: previous attempt {previous or 'left no summary'}, rerunning", flush=True)
        shutil.rmtree(sweep_dir / name)  # start over, so TensorBoard does not overlay the two attempts
    log = sweep_dir / "logs" / f"{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if spec.parallel > 1:  # share the cores instead of oversubscribing them
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // spec.parallel))
    print(f"[{index}/{total}] {name}: running (log: {log})", flush=True)
    start = time.perf_counter()
    with log.open("w") as fh:
        code = subprocess.call(run.argv(spec), stdout=fh, stderr=subprocess.STDOUT, env=env)
        if code == 0 and spec.test:
            ckpts = sorted((sweep_dir / name / "checkpoints").glob("*.ckpt"), key=lambda p: p.stat().st_mtime)
            if ckpts:  # the newest checkpoint (last.ckpt is written after the best one)
                test_argv = run.argv(spec, "test") + [f"--ckpt_path={ckpts[-1]}"]
                code = subprocess.call(test_argv, stdout=fh, stderr=subprocess.STDOUT, env=env)
            else:
                print(f"[{index}/{total}] {name}: no checkpoint to test", flush=True)
    status = json.loads(summary.read_text()).get("status", "?") if summary.exists() else "crashed"
    if code != 0 and status not in DONE:
        status = "crashed"
        tail = log.read_text().strip().splitlines()[-1:] or ["(no output)"]
        print(f"[{index}/{total}] {name}: CRASHED (exit {code}): {tail[0][:200]}", flush=True)
    else:
        metric = (json.loads(summary.read_text()).get("final_val") or {}).get(spec.metric)
        shown = f"{spec.metric} {metric:.4g}" if metric is not None else ""
        print(f"[{index}/{total}] {name}: {status} in {time.perf_counter() - start:.0f} s {shown}", flush=True)
    if status == "crashed" and not summary.exists():
        summary.parent.mkdir(parents=True, exist_ok=True)
        summary.write_text(json.dumps({"scheme": run.scheme, "lr": run.lr, "status": "crashed", "error": str(log)}))
    return status


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m experiments sweep", description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep_file", help="sweep YAML, e.g. configs/sweeps/demo.yaml")
    parser.add_argument("--parallel", type=int, default=None, help="runs at once (overrides the file)")
    parser.add_argument("--dry-run", action="store_true", help="print the commands and exit")
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
    with ThreadPoolExecutor(spec.parallel) as pool:
        list(pool.map(lambda ir: run_one(ir[1], spec, sweep_dir, ir[0] + 1, len(runs)), enumerate(runs)))
    outputs = write_comparison(sweep_dir, [r.name(spec) for r in runs], spec.metric)
    print(outputs["markdown"].read_text())
    for kind, path in outputs.items():
        print(f"{kind:>14}: {path}")
    print(f"   tensorboard: tensorboard --logdir {sweep_dir}")
