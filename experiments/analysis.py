"""Post-hoc analyses of a trained checkpoint (DESIGN.md section 6)::

    python -m experiments prune --ckpt runs/lm/tiny/siamese/checkpoints/last.ckpt [--batches 8] [--out DIR]
    python -m experiments logit-lens --ckpt runs/lm/tiny/siamese/checkpoints/last.ckpt [--batches 8]

``prune`` (every task) measures layer-pruning sensitivity: the validation loss with all blocks, then
with each block skipped in turn (``skip_blocks``), on the same fixed validation batches (DiT: the same
seeded evaluation noise), and writes ``pruning.md``, ``pruning.csv`` and ``pruning.png``.

``logit-lens`` (language models) reads the final residual state stream by stream: each stream's own
readout (``readout.streams``) goes through the LM head, and its top-1 prediction is compared with the
full model's, overall and where the streams disagree with each other; each stream's next-token
accuracy and loss come alongside. Writes ``logit_lens.md`` and ``logit_lens.csv``.

The module and its DataModule are rebuilt with the suite's CLI from the run directory's saved
``config.yaml`` (the checkpoint's ``../config.yaml``), or from ``--config`` files plus any CLI overrides
given after the options, and the checkpoint's weights are loaded into it.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import itertools
import logging
import math
import sys
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
import yaml
from lightning.fabric.utilities.apply_func import move_data_to_device
from torch import Tensor

from experiments.diagnostics import find_trunk

# Keys a saved ``fit`` config carries that the run-less CLI does not take.
_SUBCOMMAND_KEYS = ("ckpt_path", "weights_only", "verbose", "return_predictions")


class AnalysisError(Exception):
    """A user-facing problem, reported as one line (exit status 2)."""


##################################################################################
#                                  Loading                                       #
##################################################################################


@contextlib.contextmanager
def _quiet(*loggers: str):
    """Raises the given loggers to WARNING for the duration."""
    saved = {name: logging.getLogger(name).level for name in loggers}
    for name in loggers:
        logging.getLogger(name).setLevel(logging.WARNING)
    try:
        yield
    finally:
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)


def run_dir_of(ckpt: Path) -> Path:
    """``runs/<task>/<exp>/<run>`` for ``.../<run>/checkpoints/x.ckpt``, else the checkpoint's folder."""
    return ckpt.parent.parent if ckpt.parent.name == "checkpoints" else ckpt.parent


def load_module(
    ckpt: Path, configs: list[str], overrides: list[str], device: str, tasks: tuple[str, ...] = ("lm", "vit", "dit")
) -> tuple[L.LightningModule, L.LightningDataModule]:
    """Rebuilds the LightningModule and DataModule through the suite's CLI and loads the weights.

    Args:
        ckpt: the checkpoint.
        configs: configs to build from; empty: the run directory's saved ``config.yaml``.
        overrides: CLI overrides (``--model.init_args....=...``) applied on top.
        device: where the module goes.
        tasks: the tasks the caller can analyse; another task is an error before any weight is read.
    """
    from experiments.cli import SuiteCLI

    if not ckpt.is_file():
        raise AnalysisError(f"checkpoint {str(ckpt)!r} does not exist")
    with tempfile.TemporaryDirectory() as tmp:
        if not configs:
            saved = run_dir_of(ckpt) / "config.yaml"
            if not saved.is_file():
                raise AnalysisError(f"no config.yaml next to {ckpt.parent}; pass --config CONFIG [--config OVERLAY]")
            config = yaml.safe_load(saved.read_text()) or {}
            for key in _SUBCOMMAND_KEYS:
                config.pop(key, None)
            configs = [str(Path(tmp) / "config.yaml")]
            Path(configs[0]).write_text(yaml.safe_dump(config))
        args = [arg for cfg in configs for arg in ("-c", cfg)] + list(overrides) + ["--trainer.logger=false"]
        with warnings.catch_warnings(), _quiet("lightning.pytorch.utilities.rank_zero", "lightning.fabric"):
            warnings.filterwarnings("ignore", message="LightningCLI's args parameter")  # we are the command line
            cli = SuiteCLI(args=args, run=False)  # builds a Trainer too: its accelerator banner is noise here
    task = getattr(cli.model, "task", type(cli.model).__name__)
    if task not in tasks:
        raise AnalysisError(f"{ckpt} is a {task!r} checkpoint; this tool takes {', '.join(tasks)} checkpoints")
    payload = torch.load(ckpt, map_location="cpu", weights_only=False)
    try:
        cli.model.load_state_dict(payload["state_dict"])
    except (RuntimeError, KeyError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise AnalysisError(f"checkpoint {ckpt} does not fit the rebuilt model: {first}") from None
    return cli.model.to(device).eval(), cli.datamodule


def validation_batches(datamodule: L.LightningDataModule, n: int, device: str) -> list:
    """The first ``n`` validation batches (the validation loader is not shuffled), on ``device``."""
    datamodule.prepare_data()
    datamodule.setup("validate")
    batches = [move_data_to_device(b, device) for b in itertools.islice(datamodule.val_dataloader(), n)]
    if not batches:
        raise AnalysisError("the validation set is empty")
    return batches


##################################################################################
#                           Layer-pruning sensitivity                            #
##################################################################################


def batch_loss(module: L.LightningModule, batch, skip: frozenset[int]) -> tuple[Tensor, int]:
    """The task's validation loss on one batch with ``skip`` blocks skipped, and its weight."""
    if module.task == "lm":
        inputs, targets = batch[:, :-1], batch[:, 1:]  # (B, N) each
        logits = module.net(inputs, skip_blocks=skip)  # (B, N, V)
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten()), targets.numel()
    if module.task == "vit":
        images, labels = batch
        return F.cross_entropy(module._eval_net()(images, skip_blocks=skip), labels), len(labels)
    if module.task == "dit":
        latents, labels = batch
        ema = module.ema.module
        gen = torch.Generator(device=latents.device).manual_seed(1000 + int(labels[0]))  # as in model_step
        net = lambda x, t, y: ema(x, t, y, skip_blocks=skip)  # noqa: E731
        return module.diffusion_loss(net, latents, labels, generator=gen), len(labels)
    raise AnalysisError(f"no validation loss for task {module.task!r}")


@torch.no_grad()
def mean_loss(module: L.LightningModule, batches: list, skip: frozenset[int] = frozenset()) -> float:
    """Weighted mean validation loss over ``batches`` (weights as the task's own val metric)."""
    total, weight = 0.0, 0
    for batch in batches:
        loss, n = batch_loss(module, batch, skip)
        total, weight = total + float(loss) * n, weight + n
    return total / weight


def pruning_table(module: L.LightningModule, batches: list) -> list[dict]:
    """A baseline row, then one row per block: the loss with that block skipped and the increase."""
    depth = len(find_trunk(module).blocks)
    base = mean_loss(module, batches)
    rows = [{"skipped": "none", "loss": base, "increase": 0.0, "relative": 0.0}]
    for b in range(depth):
        loss = mean_loss(module, batches, frozenset({b}))
        rows.append({"skipped": f"block_{b}", "loss": loss, "increase": loss - base, "relative": (loss - base) / base})
    return rows


def plot_pruning(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    blocks = rows[1:]
    fig, ax = plt.subplots(figsize=(max(5.0, 1.5 + 0.45 * len(blocks)), 4))
    ax.bar([r["skipped"].removeprefix("block_") for r in blocks], [r["increase"] for r in blocks], color="#4a7ab5")
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xlabel("skipped block")
    ax.set_ylabel("validation loss increase")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


##################################################################################
#                              Per-stream logit lens                             #
##################################################################################


@torch.no_grad()
def logit_lens_table(module: L.LightningModule, batches: list) -> list[dict]:
    """One row per stream of the final state (+ the full readout): agreement, accuracy, loss."""
    net = module.net
    captured: dict[str, object] = {}
    handle = net.trunk.readout.register_forward_hook(lambda m, args, out: captured.update(state=args[0]))
    stats: dict[str, dict[str, float]] = {}
    positions = disagree = 0
    try:
        for batch in batches:
            inputs, targets = batch[:, :-1], batch[:, 1:]  # (B, N) each
            full = net(inputs)  # (B, N, V); the hook keeps the state the readout saw
            logits = {"full": full} | {k: net.head(v) for k, v in net.trunk.readout.streams(captured["state"]).items()}
            top1 = {k: v.argmax(-1) for k, v in logits.items()}  # (B, N) each
            stream_preds = torch.stack([p for k, p in top1.items() if k != "full"])  # (S, B, N)
            mask = (stream_preds != stream_preds[0]).any(0)  # positions where the streams disagree
            positions, disagree = positions + targets.numel(), disagree + int(mask.sum())
            for name, pred in top1.items():
                s = stats.setdefault(name, dict.fromkeys(("agree", "agree_masked", "correct", "loss"), 0.0))
                same = pred == top1["full"]
                s["agree"] += float(same.sum())
                s["agree_masked"] += float((same & mask).sum())
                s["correct"] += float((pred == targets).sum())
                flat = logits[name].flatten(0, 1).float()
                s["loss"] += float(F.cross_entropy(flat, targets.flatten(), reduction="sum"))
    finally:
        handle.remove()
    return [
        {
            "stream": name,
            "agreement": s["agree"] / positions,
            "agreement_where_streams_disagree": s["agree_masked"] / disagree if disagree else math.nan,
            "streams_disagree": disagree / positions,
            "accuracy": s["correct"] / positions,
            "loss": s["loss"] / positions,
        }
        for name, s in sorted(stats.items(), key=lambda kv: kv[0] == "full")  # streams first, full last
    ]


##################################################################################
#                               Tables and the CLI                               #
##################################################################################


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


def prune(args: argparse.Namespace, overrides: list[str]) -> list[Path]:
    module, datamodule = load_module(args.ckpt, args.config, overrides, args.device)
    batches = validation_batches(datamodule, args.batches, args.device)
    rows = pruning_table(module, batches)
    out = args.out or run_dir_of(args.ckpt)
    header = f"# Layer-pruning sensitivity: {_describe(module, args.ckpt, len(batches))}"
    markdown, paths = write_table(rows, out, "pruning", header)
    plot_pruning(rows, out / "pruning.png", f"{module.task} / {module.scheme}: baseline loss {rows[0]['loss']:.4f}")
    print(markdown)
    return [*paths, out / "pruning.png"]


def logit_lens(args: argparse.Namespace, overrides: list[str]) -> list[Path]:
    module, datamodule = load_module(args.ckpt, args.config, overrides, args.device, tasks=("lm",))
    batches = validation_batches(datamodule, args.batches, args.device)
    header = f"# Per-stream logit lens: {_describe(module, args.ckpt, len(batches))}"
    markdown, paths = write_table(
        logit_lens_table(module, batches), args.out or run_dir_of(args.ckpt), "logit_lens", header
    )
    print(markdown)
    return paths


TOOLS: dict[str, Callable[[argparse.Namespace, list[str]], list[Path]]] = {"prune": prune, "logit-lens": logit_lens}


def main(argv: list[str]) -> None:
    """``argv[0]`` is the tool ("prune" or "logit-lens"); unknown ``--key=value`` arguments override the config."""
    tool = argv[0] if argv else ""
    if tool not in TOOLS:
        sys.exit(f"usage: python -m experiments {{{','.join(TOOLS)}}} --ckpt PATH ...")
    parser = argparse.ArgumentParser(prog=f"python -m experiments {tool}", description=__doc__.split("\n\n")[0])
    parser.add_argument("--ckpt", type=Path, required=True, help="a checkpoint of the suite (e.g. .../last.ckpt)")
    parser.add_argument("--config", action="append", default=[], help="config(s) instead of the run's config.yaml")
    parser.add_argument("--batches", type=int, default=8, help="validation batches evaluated")
    parser.add_argument("--out", type=Path, default=None, help="output directory (default: the run directory)")
    default_device = "cuda" if torch.cuda.is_available() else "cpu"
    parser.add_argument("--device", default=default_device, help=f"default: {default_device}")
    args, overrides = parser.parse_known_args(argv[1:])
    if args.batches < 1:
        parser.error(f"--batches must be >= 1, got {args.batches}")
    try:
        paths = TOOLS[tool](args, overrides)
    except AnalysisError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    for path in paths:
        print(f"wrote {path}")
