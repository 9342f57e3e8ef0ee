"""Tokenize a corpus into train/val/test shards once, ahead of training.

    python -m datamodules.prepare_text --input embedded --out data/text/kjv-byte --tokenizer byte
    python -m datamodules.prepare_text --input my_texts/ --out data/text/mine --tokenizer bpe --vocab-size 8192

The output directory can then be passed as `data.source` to TextDataModule. A BPE tokenizer is
trained on the leading (training) fraction of the text only, so validation and test text never
shape the vocabulary.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

from datamodules.shards import prepare_text_shards


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line arguments of `python -m datamodules.prepare_text`."""
    parser = argparse.ArgumentParser(prog="python -m datamodules.prepare_text", description=__doc__.split("\n")[0])
    parser.add_argument("--input", required=True, help="'embedded', a text file, or a directory of .txt/.md")
    parser.add_argument("--out", required=True, help="shard directory to write")
    parser.add_argument("--tokenizer", choices=["byte", "bpe"], default="byte")
    parser.add_argument("--vocab-size", type=int, default=4096, help="BPE vocabulary size (ignored for byte)")
    parser.add_argument("--val-fraction", type=float, default=0.05)
    parser.add_argument("--test-fraction", type=float, default=0.05)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point: prepares shards and prints a one-line summary."""
    args = parse_args(argv)
    start = time.perf_counter()
    try:
        meta = prepare_text_shards(
            args.input, args.out, args.tokenizer, args.vocab_size, args.val_fraction, args.test_fraction
        )
    except (FileNotFoundError, ValueError) as err:
        raise SystemExit(f"error: {err}") from None
    splits = ", ".join(f"{k}={v:,}" for k, v in meta.split_tokens.items())
    print(
        f"wrote {args.out}: corpus={meta.corpus} tokenizer={meta.tokenizer} vocab_size={meta.vocab_size} "
        f"dtype={meta.dtype} tokens {splits} in {time.perf_counter() - start:.1f}s"
    )


if __name__ == "__main__":
    main()
