"""The command line of ``python -m experiments.bench``: scheme parsing, the argument parser, and ``main``,
which runs every requested task through :mod:`experiments.bench.run` and writes the report."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from experiments.bench.measure import Options
from experiments.bench.report import Row, machine_info, write_report
from experiments.bench.run import RunSpec, bench_tasks
from experiments.bench.workloads import SIZES, TASKS, Workload
from models.schemes import NormScheme


def parse_schemes(text: str) -> list[str]:
    """``"all"`` or a comma list; repeats get ``#2``, ``#3`` so ``pre,pre`` measures noise."""
    names = [s.value for s in NormScheme] if text == "all" else [s.strip() for s in text.split(",") if s.strip()]
    valid = {s.value for s in NormScheme}
    for s in names:
        if s not in valid:
            raise SystemExit(f"error: unknown scheme {s!r}; valid: all, {', '.join(sorted(valid))}")
    seen: dict[str, int] = {}
    labels = []
    for s in names:
        seen[s] = seen.get(s, 0) + 1
        labels.append(s if seen[s] == 1 else f"{s}#{seen[s]}")
    return labels


def build_parser() -> argparse.ArgumentParser:
    summary = sys.modules[__package__].__doc__.split("\n\n")[0]  # the package docstring's first paragraph
    p = argparse.ArgumentParser(prog="python -m experiments.bench", description=summary)
    p.add_argument("--task", choices=[*TASKS, "all"], default="all")
    p.add_argument("--size", choices=list(SIZES), default="tiny")
    p.add_argument("--schemes", default="all", help="comma list of norm schemes, or 'all'")
    p.add_argument("--steps", type=int, default=15, help="measured rounds (each steps every candidate once)")
    p.add_argument("--warmup", type=int, default=3, help="unmeasured rounds first")
    p.add_argument("--batch-size", type=int, default=None, help="override the size's batch")
    p.add_argument("--compile", action="store_true", help="torch.compile every network")
    p.add_argument("--bf16", action="store_true", help="bfloat16 autocast")
    p.add_argument("--checkpointing", action="store_true", help="activation checkpointing per block")
    p.add_argument("--no-reference", action="store_true", help="skip timm / diffusers / transformers")
    p.add_argument("--data-batches", type=int, default=200, help="batches timed from the text DataModule (0: skip)")
    p.add_argument("--data-dir", default="data/text", help="text DataModule shard cache")
    p.add_argument("--profile", action="store_true", help="also write torch.profiler op tables per scheme")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads on CPU (default 1: on a shared machine extra OpenMP threads stall at "
        "barriers and multiply step times; 0 keeps torch's default)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="output directory (default runs/bench/<task>-<size>)")
    return p


def main(argv: Sequence[str] | None = None) -> list[Row]:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.steps < 1 or args.warmup < 0:
        raise SystemExit("error: --steps must be >= 1 and --warmup >= 0")
    if args.threads and args.device == "cpu":
        torch.set_num_threads(args.threads)
    schemes = parse_schemes(args.schemes)
    tasks = list(TASKS) if args.task == "all" else [args.task]
    args.out = args.out or f"runs/bench/{args.task}-{args.size}"
    opts = Options(torch.device(args.device), args.bf16, args.compile, args.checkpointing)
    header = {"command": shlex.join(["python", "-m", "experiments.bench", *argv]), **machine_info(opts.device)}
    header["settings"] = (
        f"{args.steps} measured rounds after {args.warmup} warm-up rounds; bf16 {'on' if args.bf16 else 'off'}, "
        f"compile {'on' if args.compile else 'off'}, checkpointing {'on' if args.checkpointing else 'off'}; "
        "activation memory: saved-for-backward bytes of one forward (of the compiled graph under --compile)"
    )
    spec = RunSpec(
        schemes, args.steps, args.warmup, args.seed, not args.no_reference, args.data_batches, args.data_dir,
        Path(args.out) if args.profile else None,
    )  # fmt: skip
    workloads = [SIZES[args.size][task] for task in tasks]
    if args.batch_size:
        workloads = [Workload(w.task, w.trunk, w.net, args.batch_size) for w in workloads]
    rows, notes = bench_tasks(workloads, args.size, spec, opts, header)
    header["load average after (1, 5, 15 min)"] = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    text = write_report(Path(args.out), rows, header, notes)
    print(text)
    print(f"wrote {Path(args.out) / 'bench.md'} and {Path(args.out) / 'bench.csv'}")
    return rows
