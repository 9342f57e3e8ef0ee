"""``python -m experiments prune|logit-lens --ckpt PATH``: the analyses' command line and their tables."""

from __future__ import annotations

import argparse
import csv
import math
import sys
from collections.abc import Callable
from pathlib import Path

import lightning as L
import torch

from experiments.analysis.loading import load_module, run_dir_of, validation_batches
from experiments.analysis.logit_lens import logit_lens_table
from experiments.analysis.pruning import plot_pruning, pruning_table
from experiments.reliability.devices import check_device
from experiments.reliability.errors import ArgumentParser, OutputDirError, SuiteError
from experiments.reliability.layout import refuse_existing

OUTPUTS = {"prune": ("pruning.md", "pruning.csv", "pruning.png"), "logit-lens": ("logit_lens.md", "logit_lens.csv")}


def _fmt(value) -> str:
    if isinstance(value, float):
        return "-" if math.isnan(value) else f"{value:.4f}"
    return str(value)


def write_table(rows: list[dict], out_dir: Path, stem: str, header: str) -> tuple[str, list[Path]]:
    """Writes ``<stem>.md`` (with ``header`` above the table) and ``<stem>.csv``; returns the markdown."""
    columns = list(rows[0])
    lines = [header, "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_fmt(r[c]) for c in columns) + " |" for r in rows]
    markdown = "\n".join(lines) + "\n"
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{stem}.md", out_dir / f"{stem}.csv"]
    paths[0].write_text(markdown)
    with paths[1].open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    return markdown, paths


def _describe(module: L.LightningModule, ckpt: Path, n: int) -> str:
    return f"{module.task} / {module.scheme}, {ckpt}, {n} validation batches"


def output_dir(tool: str, args: argparse.Namespace) -> Path:
    """``--out`` (default: the checkpoint's run directory), checked before any work: writable, and the tool's
    files are not already there unless ``--overwrite``."""
    out = args.out or run_dir_of(args.ckpt)
    blocker = next((p for p in [out, *out.parents] if p.exists()), None)
    if blocker is not None and not blocker.is_dir():
        raise OutputDirError(f"--out {out}: {blocker} is a file, not a directory; valid: a directory path")
    refuse_existing([out / name for name in OUTPUTS[tool]], args.overwrite, f"{tool} --out {out}")
    return out


def prune(args: argparse.Namespace, overrides: list[str]) -> list[Path]:
    out = output_dir("prune", args)
    module, datamodule = load_module(args.ckpt, args.config, overrides, args.device)
    batches = validation_batches(datamodule, args.batches, args.device)
    rows = pruning_table(module, batches)
    header = f"# Layer-pruning sensitivity: {_describe(module, args.ckpt, len(batches))}"
    markdown, paths = write_table(rows, out, "pruning", header)
    plot_pruning(rows, out / "pruning.png", f"{module.task} / {module.scheme}: baseline loss {rows[0]['loss']:.4f}")
    print(markdown)
    return [*paths, out / "pruning.png"]


def logit_lens(args: argparse.Namespace, overrides: list[str]) -> list[Path]:
    out = output_dir("logit-lens", args)
    module, datamodule = load_module(args.ckpt, args.config, overrides, args.device, tasks=("lm",))
    batches = validation_batches(datamodule, args.batches, args.device)
    header = f"# Per-stream logit lens: {_describe(module, args.ckpt, len(batches))}"
    markdown, paths = write_table(logit_lens_table(module, batches), out, "logit_lens", header)
    print(markdown)
    return paths


DESCRIPTIONS = {
    "prune": "Layer-pruning sensitivity: the validation loss with every block, then with each block skipped in turn; "
    "writes pruning.md, pruning.csv and pruning.png.",
    "logit-lens": "Per-stream logit lens (language models): each residual stream of the final state read out alone "
    "through the LM head, against the full model; writes logit_lens.md and logit_lens.csv.",
}
TOOLS: dict[str, Callable[[argparse.Namespace, list[str]], list[Path]]] = {"prune": prune, "logit-lens": logit_lens}


def main(argv: list[str]) -> None:
    """``argv[0]`` is the tool ("prune" or "logit-lens"); unknown ``--key=value`` arguments override the config."""
    tool = argv[0] if argv else ""
    if tool not in TOOLS:
        sys.exit(f"usage: python -m experiments {{{','.join(TOOLS)}}} --ckpt PATH ...")
    parser = ArgumentParser(prog=f"python -m experiments {tool}", description=DESCRIPTIONS[tool])
    parser.add_argument("--ckpt", type=Path, required=True, help="a checkpoint of the suite (e.g. .../last.ckpt)")
    parser.add_argument("--config", action="append", default=[], help="config(s) instead of the run's config.yaml")
    parser.add_argument("--batches", type=int, default=8, help="validation batches evaluated")
    parser.add_argument("--out", type=Path, default=None, help="output directory (default: the run directory)")
    parser.add_argument("--overwrite", action="store_true", help="replace this tool's earlier tables and plot")
    default_device = "cuda" if torch.cuda.is_available() else "cpu"
    parser.add_argument("--device", default=default_device, help=f"default: {default_device}")
    args, overrides = parser.parse_known_args(argv[1:])
    if args.batches < 1:
        parser.error(f"--batches must be >= 1, got {args.batches}")
    try:
        check_device(args.device)
        paths = TOOLS[tool](args, overrides)
    except SuiteError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    for path in paths:
        print(f"wrote {path}")


def prune_main(argv: list[str]) -> None:
    """``python -m experiments prune ...``."""
    main(["prune", *argv])


def logit_lens_main(argv: list[str]) -> None:
    """``python -m experiments logit-lens ...``."""
    main(["logit-lens", *argv])
