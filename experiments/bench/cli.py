"""The command line of ``python -m experiments.bench``: scheme parsing, the argument parser, and ``main``,
which runs every requested task through :mod:`experiments.bench.run` and writes the report."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from experiments.bench.claims import claim_lines, paper_overhead
from experiments.bench.measure import Options
from experiments.bench.report import Row, machine_info, write_report
from experiments.bench.run import RECOMPUTE_LABELS, RunSpec, bench_tasks
from experiments.bench.scaling import ScalingRow, bench_scaling, scaling_workloads, write_scaling
from experiments.bench.training_report import TrainingRow, bench_training_steps, write_training
from experiments.bench.training_step import BACKENDS
from experiments.bench.workloads import SIZES, TASKS, Workload
from experiments.reliability.errors import ArgumentParser, UsageExit
from fileio.checks import InputError, number, output_dir
from models.norms import NormLayer
from models.schemes import NormScheme


def parse_schemes(text: str) -> list[str]:
    """``"all"`` or a comma list; repeats get ``#2``, ``#3`` so ``pre,pre`` measures noise. A scheme may carry
    ``:<norm_layer>`` (``pre:dyt``: every norm DyT) and ``@on`` / ``@off`` / ``@auto`` (its ``recompute_norms``):
    ``siamese,siamese@off`` measures recomputation."""
    names = [s.value for s in NormScheme] if text == "all" else [s.strip() for s in text.split(",") if s.strip()]
    valid = {s.value for s in NormScheme}
    if not names:
        raise UsageExit(
            f"--schemes {text!r} names no scheme; valid: all, or a comma list of {', '.join(sorted(valid))}"
        )
    for s in names:
        base, at, recompute = s.partition("@")
        scheme, colon, layer = base.partition(":")
        if scheme not in valid:
            raise UsageExit(f"unknown scheme {scheme!r}; valid: all, {', '.join(sorted(valid))}")
        if colon and layer not in {n.value for n in NormLayer}:
            raise UsageExit(f"unknown norm layer in {s!r}; valid: {', '.join(n.value for n in NormLayer)}")
        if at and recompute not in RECOMPUTE_LABELS:
            raise UsageExit(f"unknown recompute suffix {s!r}; valid: {scheme}@on, {scheme}@off, {scheme}@auto")
    seen: dict[str, int] = {}
    labels = []
    for s in names:
        seen[s] = seen.get(s, 0) + 1
        labels.append(s if seen[s] == 1 else f"{s}#{seen[s]}")
    return labels


def build_parser() -> argparse.ArgumentParser:
    summary = sys.modules[__package__].__doc__.split("\n\n")[0]  # the package docstring's first paragraph
    p = ArgumentParser(prog="python -m experiments bench", description=summary)
    p.add_argument("--task", choices=[*TASKS, "moe", "all"], default="all", help="all: lm, vit, dit (not moe)")
    p.add_argument("--size", choices=list(SIZES), default="tiny")
    p.add_argument("--schemes", default="all", help="comma list of norm schemes, or 'all'")
    p.add_argument("--steps", default=15, help="measured rounds (each steps every candidate once)")
    p.add_argument("--warmup", default=3, help="unmeasured rounds first")
    p.add_argument("--batch-size", default=None, help="override the size's batch")
    p.add_argument("--compile", action="store_true", help="torch.compile every network")
    p.add_argument("--bf16", action="store_true", help="bfloat16 autocast")
    p.add_argument("--checkpointing", action="store_true", help="activation checkpointing per block")
    p.add_argument("--no-reference", action="store_true", help="skip timm / diffusers / transformers")
    p.add_argument("--data-batches", default=200, help="batches timed from the text DataModule (0: skip)")
    p.add_argument("--data-dir", default="data/text", help="text DataModule shard cache")
    p.add_argument("--profile", action="store_true", help="also write torch.profiler op tables per scheme")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument(
        "--threads",
        default=1,
        help="torch intra-op threads on CPU (default 1: on a shared machine extra OpenMP threads stall at "
        "barriers and multiply step times; 0 keeps torch's default)",
    )
    p.add_argument(
        "--recompute-norms",
        choices=list(RECOMPUTE_LABELS),
        default="auto",
        help="TrunkConfig.recompute_norms of every scheme without an @on/@off suffix (default auto)",
    )
    p.add_argument("--norm-share", action="store_true", help="profile a few steps: share of step time in norms")
    scaling = p.add_argument_group("scaling sweep (--scaling: the LM's pre vs siamese at growing width and depth)")
    scaling.add_argument("--scaling", action="store_true", help="run the scaling sweep instead of the tables")
    scaling.add_argument("--widths", default="128,512,1024", help="widths, at --width-depth blocks")
    scaling.add_argument("--depths", default="2,4,8", help="depths, at --depth-width")
    scaling.add_argument("--width-depth", default=2)
    scaling.add_argument("--depth-width", default=256)
    scaling.add_argument("--scaling-batch", default="8x128", help="sequences x tokens per step")
    training = p.add_argument_group(
        "compiled training step (--training-step: every scheme's task module eager and compiled as fit compiles it)"
    )
    training.add_argument(
        "--training-step", action="store_true", help="time the training step eager and compiled instead of the tables"
    )
    training.add_argument(
        "--compile-backend", choices=list(BACKENDS), default="inductor",
        help="parallel.compile_backend of the compiled modules (default inductor, what training uses)",
    )  # fmt: skip
    p.add_argument("--seed", default=0, help="seed of every network's init and batch (0 to 2^63 - 1)")
    p.add_argument("--out", default=None, help="output directory (default runs/bench/<task>-<size>, or scaling)")
    return p


def _ints(text: str, flag: str) -> list[int]:
    try:
        values = [int(v) for v in text.replace("x", ",").split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1 or max(values) > MAX_SIZE:
        raise UsageExit(f"{flag} {text!r}; valid: integers from 1 to {MAX_SIZE} separated by commas")
    return values


MAX_SIZE = 1 << 16  # a width, depth, sequence count or length of the scaling sweep (65536: far past any GPU)
MAX_ROUNDS = 10_000  # measured / warm-up rounds: each steps every candidate once (10k rounds of 13 schemes: hours)


def check_numbers(args: argparse.Namespace) -> None:
    """Every count and size of the command line checked before anything is built (one line each)."""
    where = "command line"
    args.steps = number(args.steps, "--steps", kind=int, low=1, high=MAX_ROUNDS, where=where)
    args.warmup = number(args.warmup, "--warmup", kind=int, low=0, high=MAX_ROUNDS, where=where)
    args.threads = number(args.threads, "--threads", kind=int, low=0, high=4096, where=where)
    args.data_batches = number(args.data_batches, "--data-batches", kind=int, low=0, high=1_000_000, where=where)
    if args.batch_size is not None:
        args.batch_size = number(args.batch_size, "--batch-size", kind=int, low=1, high=1 << 20, where=where)
    args.width_depth = number(args.width_depth, "--width-depth", kind=int, low=1, high=1024, where=where)
    args.depth_width = number(args.depth_width, "--depth-width", kind=int, low=1, high=1 << 16, where=where)
    args.seed = number(args.seed, "--seed", kind=int, low=0, high=(1 << 63) - 1, where=where)  # torch.manual_seed's


def check_paths(args: argparse.Namespace) -> None:
    """Where the report (and ``--profile``'s tables) will go, and the shard cache the data timing reads, checked
    before anything is measured: a file in the way or a directory that cannot be written is one line now, not
    an error after minutes of measuring."""
    output_dir(args.out, "--out")
    if args.data_batches and not args.scaling:
        output_dir(args.data_dir, "--data-dir")


def check_device(text: str) -> torch.device:
    """``--device`` as torch reads it, refused in one line when torch cannot name it or this machine lacks it.

    Raises:
        UsageExit: ``--device 'cuda' ...: this machine has no CUDA device; valid: cpu``, and the like.
    """
    available = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    available += ["mps"] if torch.backends.mps.is_available() else []
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise UsageExit(
            f"--device {text!r} is not a device torch knows (command line); valid: {', '.join(available)}"
        ) from None
    if device.type not in available:
        raise UsageExit(f"--device {text!r}: this machine has no {device.type} device; valid: {', '.join(available)}")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise UsageExit(f"--device {text!r}: this machine has {torch.cuda.device_count()} CUDA device(s); valid: "
                        f"cuda:0 to cuda:{torch.cuda.device_count() - 1}")  # fmt: skip
    return device


def main(argv: Sequence[str] | None = None) -> list[Row]:
    """``python -m experiments bench``: every option, and where the report goes, checked first; then the measuring.

    Raises:
        UsageExit: a bad option, number or path (one line, exit status 2), before anything is measured.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    default_out = "scaling" if args.scaling else f"{args.task}-{args.size}"
    args.out = args.out or f"runs/bench/{'training-step-' if args.training_step else ''}{default_out}"
    if args.training_step and (args.scaling or args.compile):
        other = "--scaling" if args.scaling else "--compile"
        raise UsageExit(
            f"--training-step with {other}: --training-step times every scheme eager and compiled itself; "
            "valid: one of --training-step, --scaling, or the tables (with or without --compile)"
        )
    try:
        check_numbers(args)
        check_paths(args)
    except InputError as err:  # a UsageExit: one line and exit 2 through python -m experiments.bench too
        raise UsageExit(str(err)) from None
    device = check_device(args.device)
    if args.threads and args.device == "cpu":
        torch.set_num_threads(args.threads)
    schemes = parse_schemes(args.schemes)
    tasks = list(TASKS) if args.task == "all" else [args.task]
    opts = Options(device, args.bf16, args.compile, args.checkpointing)
    header = {"command": shlex.join(["python", "-m", "experiments", "bench", *argv]), **machine_info(opts.device)}
    header["settings"] = (
        f"{args.steps} measured rounds after {args.warmup} warm-up rounds; bf16 {'on' if args.bf16 else 'off'}, "
        f"compile {'on' if args.compile else 'off'}, checkpointing {'on' if args.checkpointing else 'off'}, "
        f"recompute_norms {args.recompute_norms}; "
        "activation memory: saved-for-backward bytes of one forward (of the compiled graph under --compile)"
    )
    spec = RunSpec(
        schemes, args.steps, args.warmup, args.seed, not args.no_reference, args.data_batches, args.data_dir,
        Path(args.out) if args.profile else None, norm_share=args.norm_share,
        recompute_norms=RECOMPUTE_LABELS[args.recompute_norms],
    )  # fmt: skip
    if args.scaling:
        return scaling_main(args, spec, opts, header)
    workloads = [SIZES[args.size][task] for task in tasks]
    if args.batch_size:
        workloads = [Workload(w.task, w.trunk, w.net, args.batch_size) for w in workloads]
    if args.training_step:
        return training_main(args, workloads, spec, opts, header)
    rows, notes = bench_tasks(workloads, args.size, spec, opts, header)
    header["load average after (1, 5, 15 min)"] = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    claims = claim_lines(rows, paper_overhead())
    text = write_report(Path(args.out), rows, header, notes, compiled=args.compile, claims=claims)
    print(text)
    print(f"wrote {Path(args.out) / 'bench.md'} and {Path(args.out) / 'bench.csv'}")
    return rows


def scaling_main(args: argparse.Namespace, spec: RunSpec, opts: Options, header: dict[str, str]) -> list[ScalingRow]:
    """``--scaling``: :mod:`experiments.bench.scaling` over the requested widths and depths."""
    if args.task not in ("lm", "all"):
        raise UsageExit(f"--scaling sweeps the LM; got --task {args.task}; valid: --task lm")
    batch = _ints(args.scaling_batch, "--scaling-batch")
    if len(batch) != 2:
        raise UsageExit(f"--scaling-batch {args.scaling_batch!r}; valid: SEQUENCESxTOKENS, e.g. 8x128")
    shapes = scaling_workloads(
        _ints(args.widths, "--widths"), _ints(args.depths, "--depths"), args.width_depth, args.depth_width, *batch
    )
    header["wall time"] = "(running)"
    start = time.perf_counter()
    rows = bench_scaling(shapes, spec, opts)
    header["wall time"] = f"{time.perf_counter() - start:.0f} s"
    header["load average after (1, 5, 15 min)"] = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    text = write_scaling(Path(args.out), rows, header)
    print(text)
    print(f"wrote {Path(args.out) / 'scaling.md'}, scaling.csv and scaling.png")
    return rows


def training_main(
    args: argparse.Namespace, workloads: Sequence[Workload], spec: RunSpec, opts: Options, header: dict[str, str]
) -> list[TrainingRow]:
    """``--training-step``: :mod:`experiments.bench.training_step` for each workload, written by
    :func:`~experiments.bench.training_report.write_training`."""
    header["settings"] = (
        f"{args.steps} measured rounds after {args.warmup} warm-up rounds (compilation), every scheme eager and "
        f"compiled interleaved in one process; compile: parallel.compile (each trunk Block, "
        f"experiments.parallel.compile.compile_blocks), backend {args.compile_backend}; bf16 "
        f"{'on' if args.bf16 else 'off'}, checkpointing {'on' if args.checkpointing else 'off'}, recompute_norms "
        f"{args.recompute_norms}; step: training_step, backward, AdamW, schedule, zero_grad, on_train_batch_end"
    )
    rows, records = bench_training_steps(workloads, args.size, spec, opts, args.compile_backend, header)
    header["load average after (1, 5, 15 min)"] = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    text = write_training(Path(args.out), rows, header, records)
    print(text)
    print(f"wrote {Path(args.out) / 'training_step.md'}, training_step.csv and training_step.json")
    return rows
