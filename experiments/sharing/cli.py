"""``python -m experiments export --ckpt RUN/checkpoints/last.ckpt [--format hf|timm|diffusers] --out DIR``.

    LM   -> hf         transformers folder: AutoModelForCausalLM (trust_remote_code=True) / PreTrainedTokenizerFast
    ViT  -> timm       timm hub layout: timm.create_model("local-dir:DIR") after importing DIR/suite_vit.py
    DiT  -> diffusers  pipeline folder: DiffusionPipeline.from_pretrained(DIR, trust_remote_code=True)

The format defaults from the run's task. Refused in one line (exit 2) before any work: an unknown format,
a format that does not fit the task, an existing DIR without ``--overwrite`` (or one that is not an export
of this suite), a checkpoint that is not a suite run's. The export is built beside DIR and renamed into
place only when complete and checked: reloaded in a fresh interpreter without the suite, with the library's
own calls, its outputs compared with the suite's network (``--no-check`` skips this for very large models).
The run's ``summary.json`` travels along, so ``python -m experiments compare EXPORTS`` tabulates a folder of
exports as it does a sweep directory.
"""

from __future__ import annotations

import argparse
import importlib
import re
import shutil
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

from experiments.monitoring.records import SUMMARY_FILE
from experiments.reliability.errors import ArgumentParser, CheckpointError, SuiteError
from experiments.reliability.layout import run_dir_of_checkpoint
from experiments.sharing.card import write_card
from experiments.sharing.checkpoint import RunCheckpoint, read_run_checkpoint
from experiments.sharing.output import check_out, folder_size, human_size, staged
from experiments.sharing.report import ExportOptions
from experiments.sharing.vae import vae_directory

# format -> (the task it exports, the module whose ``export`` writes it)
FORMATS = {
    "hf": ("lm", "experiments.sharing.hf"),
    "timm": ("vit", "experiments.sharing.timm_export"),
    "diffusers": ("dit", "experiments.sharing.diffusers_export"),
}
DEFAULT_FORMAT = {task: name for name, (task, _) in FORMATS.items()}
_BLOCK = re.compile(r"trunk\.blocks\.(\d+)\.")  # the trunk's Blocks in a state dict


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="python -m experiments export", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--ckpt", required=True, help="a run's checkpoint, e.g. runs/lm/tiny/siamese/checkpoints/last.ckpt"
    )
    parser.add_argument("--out", required=True, help="the folder to write (must not exist; see --overwrite)")
    parser.add_argument("--format", default=None, help="hf | timm | diffusers (default: the one for the run's task)")
    parser.add_argument("--overwrite", action="store_true", help="replace --out if it is an earlier export")
    parser.add_argument(
        "--tokenizer", default=None, help="LM: directory of the run's tokenizer if not found from the run"
    )
    parser.add_argument(
        "--vae", default=None, help="DiT: AutoencoderKL directory to ship (default: the run's vae_path)"
    )
    parser.add_argument("--no-check", action="store_true", help="skip reloading the export to compare outputs")
    return parser


def check_network_builds(run: RunCheckpoint) -> None:
    """Builds the run's network on PyTorch's meta device (shapes only, no memory) and loads the checkpoint's
    tensors into it, so hyperparameters edited to absurd sizes (a width of 2**40, a window of 2**62) or that
    do not match the weights are refused in one line before anything is allocated or written. The depth is
    compared with the Blocks the weights hold first, before anything is built.

    Raises:
        CheckpointError: the hyperparameters do not build a network, or build one the weights do not fit.
    """
    import torch

    depth, blocks = run.hparams["trunk"].get("depth"), len({m[1] for k in run.weights() if (m := _BLOCK.match(k))})
    if isinstance(depth, int) and not isinstance(depth, bool) and blocks and depth > blocks:
        raise CheckpointError(
            f"checkpoint {run.path}: its hyperparameters say trunk depth {depth} but its weights hold {blocks} "
            f"block{'s' if blocks != 1 else ''}; valid: the hyperparameters the run was trained with (they are saved "
            "in the checkpoint by fit)"
        )  # before building: a million blocks take minutes to build even on the meta device
    try:
        with torch.device("meta"), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "copying from a non-meta parameter ... is a no-op": only shapes count
            run.network()
    except CheckpointError:
        raise
    except (ValueError, RuntimeError, OverflowError, TypeError, KeyError, MemoryError, SystemError) as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        raise CheckpointError(
            f"checkpoint {run.path}: its hyperparameters do not build a network ({first}); valid: the "
            "hyperparameters the run was trained with (they are saved in the checkpoint by fit)"
        ) from None


def main(argv: Sequence[str] | None = None) -> int:
    """Exports a checkpoint; prints what was written and how it was checked."""
    args = build_parser().parse_args(argv)
    if args.format is not None and args.format not in FORMATS:
        raise SuiteError(f"--format {args.format!r} is not a format; valid: {', '.join(FORMATS)}")
    out = Path(args.out)
    check_out(out, args.overwrite, run_dir_of_checkpoint(args.ckpt), Path(args.ckpt))
    run = read_run_checkpoint(args.ckpt)
    check_out(out, args.overwrite, run.run_dir, run.path)
    check_network_builds(run)
    fmt = args.format or DEFAULT_FORMAT[run.task]
    if FORMATS[fmt][0] != run.task:
        raise SuiteError(
            f"--format {fmt} exports {FORMATS[fmt][0]} runs but {args.ckpt} is a {run.task} run; "
            f"valid: --format {DEFAULT_FORMAT[run.task]} (or leave --format out)"
        )
    options = ExportOptions(
        tokenizer=Path(args.tokenizer) if args.tokenizer else None,
        vae=Path(args.vae) if args.vae else None,
        check=not args.no_check,
    )
    if fmt == "diffusers":
        vae_directory(run, options)  # the VAE it ships decodes the DiT's latents: checked before anything is written
    exporter = importlib.import_module(FORMATS[fmt][1])  # imports its library (seconds): after every check
    start = time.perf_counter()
    with staged(out, args.overwrite, run.run_dir, run.path) as (folder, scratch):
        report = exporter.export(run, folder, scratch, options)
        if run.run_dir is not None and (run.run_dir / SUMMARY_FILE).is_file():  # compare reads a folder of exports
            shutil.copyfile(run.run_dir / SUMMARY_FILE, folder / SUMMARY_FILE)
        write_card(run, report, folder)
    size, files = folder_size(out)
    print(f"export: {out} ({report.library}, {report.model_class}, scheme {run.scheme}, step {run.step}): "
          f"{human_size(size)} in {files} files, {time.perf_counter() - start:.1f} s")  # fmt: skip
    if report.load_s is not None:
        print(f"check: reloaded without the suite in {report.load_s:.2f} s; " + "; ".join(report.checks))
    for note in report.notes:
        print(f"note: {note}")
    return 0
