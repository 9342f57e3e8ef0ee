"""``python -m experiments estimate -c CONFIG [-c ...] [--key=value ...] [--gpu-memory 80GB]``: will a run fit?

Resolves the config as ``fit`` would read it (the ``-c`` files merged in order, then ``--key=value``), and
prints the per-device peak of one training step, without and with activation checkpointing, under the run's
strategy and precision, and whether it fits the device memory named (80 GB unless ``--gpu-memory`` says).
Nothing is allocated: the real network runs on fake tensors over a fake process group of the run's world
size (:mod:`experiments.parallel.memory`). Then one training step runs on fake CUDA tensors in the GPU's dtypes
(:mod:`experiments.parallel.fake_step`): a device or dtype a GPU would refuse ends the command with one
``error:`` line, exit 2, after the memory lines::

    python -m experiments estimate -c configs/lm/olmo-1b.yaml --gpu-memory 80GB
    python -m experiments estimate -c configs/lm/olmo-1b.yaml \\
        --trainer.strategy=experiments.reliability.sharded.ModelParallelStrategy \\
        --trainer.strategy.init_args.data_parallel_size=8 --trainer.strategy.init_args.tensor_parallel_size=1
"""

from __future__ import annotations

import time

from experiments.parallel.fake_step import FakeStepError
from experiments.parallel.memory import fits_line, format_estimate, measure, parse_memory, size
from experiments.reliability.errors import ArgumentParser, SuiteError
from experiments.sweeps.estimate import (
    data_facts,
    fake_step,
    memory_inputs,
    per_device_batch,
    resolve_config,
    task_name,
)
from fileio.checks import InputError

DEFAULT_GPU_MEMORY = "80GB"


def report(argv: list[str], gpu_memory: int) -> tuple[str, str | None]:
    """The lines ``estimate`` prints for one resolved config, and the fake CUDA step's failure (None: it ran)."""
    if not any(a in ("-c", "--config") for a in argv):
        raise InputError("no config given; valid: python -m experiments estimate -c CONFIG.yaml [-c ...]")
    stray = [
        a for i, a in enumerate(argv) if a not in ("-c", "--config") and argv[i - 1 : i] not in (["-c"], ["--config"])
    ]
    stray = [a for a in stray if not (a.startswith("--") and "=" in a)]
    if stray:
        raise InputError(
            f"estimate does not take {stray[0]!r} (command line); valid: -c CONFIG, --key=value, --gpu-memory SIZE"
        )
    config = resolve_config(argv)
    workload, setup = memory_inputs(config)
    lines = [f"{task_name(config)} run: {setup.describe()}, per-device batch {per_device_batch(config, setup)}"]
    for checkpointing in (False, True):
        start = time.perf_counter()
        est = measure(workload, setup, checkpointing)
        own = " (the config's)" if checkpointing == setup.checkpointing else ""
        lines.append(
            f"  activation checkpointing {'on ' if checkpointing else 'off'}{own}: {format_estimate(est)}; "
            f"{fits_line(est, gpu_memory)}  [{time.perf_counter() - start:.1f} s]"
        )
        notes = est.notes
    lines.append(f"  steady between steps (params + grads + optimizer): {size(est.steady)}")
    data_note = data_facts(task_name(config), config, {})[1]
    lines += [f"  note: {n}" for n in (*notes, data_note) if n]
    lines.append("  not counted: CUDA context and workspaces (~0.5-1 GB), allocator fragmentation")
    failure = None
    try:
        step = fake_step(config)
        what = "fake CUDA step (forward, loss, backward, clip, AdamW)"
        lines.append(f"  {what}: {step.describe()}  [{step.seconds:.1f} s]")
        lines += [f"    assumed: {n}" for n in step.notes]
    except FakeStepError as exc:
        failure = f"fake CUDA step of this config failed: {exc}"
        lines.append(f"  fake CUDA step: FAILED ({exc})")
    return "\n".join(lines), failure


def main(args: list[str]) -> None:
    """Entry point of ``python -m experiments estimate``."""
    parser = ArgumentParser(
        prog="python -m experiments estimate",
        description="Per-device peak memory of one training step of a run (fake tensors: nothing is allocated).",
        epilog="Other arguments are the run's own: -c CONFIG (repeatable, merged in order), --key=value overrides.",
    )
    parser.add_argument(
        "--gpu-memory", default=DEFAULT_GPU_MEMORY, help="device memory to fit in: 80GB, 141GB, 96GiB (default 80GB)"
    )
    known, rest = parser.parse_known_args(args)
    gpu_memory = parse_memory(known.gpu_memory)
    text, failure = report(rest, gpu_memory)
    print(text)
    if failure:
        raise SuiteError(failure)
