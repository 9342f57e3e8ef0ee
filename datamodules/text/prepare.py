"""Tokenize a corpus into train/val/test shards once, ahead of training: streaming, in worker processes.

    python -m datamodules.text.prepare --input embedded --out data/text/kjv-byte --tokenizer byte
    python -m datamodules.text.prepare --input my_texts/ --out data/text/mine --tokenizer bpe --vocab-size 8192
    python -m datamodules.text.prepare --input /data/fineweb-edu/sample/100BT --out data/text/corpus \\
        --tokenizer /models/gpt-neox-20b/tokenizer.json --vocab-size 50304 --workers 32

Inputs are files or directories of .txt/.md (a document per file), .jsonl/.jsonl.gz/.jsonl.zst (a document
per line, ``--text-key``) and .parquet (a document per row, ``--text-key`` column). The output directory can
be passed as ``data.source`` to TextDataModule. A progress bar shows the input's MB/s and tokens/s.

Interrupted (SIGTERM, Ctrl-C: exit 143 / 130, the state saved within a batch) or killed, the same command
resumes where the last saved state stands and writes the same bytes an uninterrupted run would. A finished
``--out`` is left alone by the same command; one holding another corpus's shards (or other files) is refused
unless ``--overwrite``, which builds the new set beside the old one and then replaces it. Bad input is one
line ``error: ...`` and exit status 2, with nothing written. One preparation at a time per ``--out``: a second
one (started at the same moment or later) stops in one line naming the first (exit 2), which finishes whole;
what ``--out`` holds is decided only once the lock is held.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from datamodules.text.corpus import list_inputs
from datamodules.text.pipeline import STATE_FILE, PrepareSpec, Stopped, prepare_corpus, spec_sha256
from datamodules.text.shards import SHARD_TOKENS, check_fractions, has_shards, publish, read_meta, shard_dtype
from datamodules.text.tokenizers import check_bpe_vocab_size
from fileio.checks import InputError, number
from fileio.locks import claim_output, unlock

STAGING = ".prepare"  # inside --out: the set being written and its state.json
LOCK = ".prepare.lock"
USAGE_ERROR, SIGNAL_EXIT = 2, {signal.SIGINT: 130, signal.SIGTERM: 143}


class PrepareError(Exception):
    """Bad input, said in one line."""


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line arguments of `python -m datamodules.text.prepare`."""
    parser = argparse.ArgumentParser(prog="python -m datamodules.text.prepare", description=__doc__.split("\n")[0])
    parser.add_argument("--input", required=True, action="append", help="'embedded', a file or a directory (repeat)")
    parser.add_argument("--out", required=True, help="shard directory to write")
    parser.add_argument("--tokenizer", default="byte", help="byte, bpe (trained here) or a tokenizer.json")
    parser.add_argument("--vocab-size", type=int, default=None, help="bpe: size to train (4096); a tokenizer.json: "
                        "the model's id space (default: the tokenizer's size)")  # fmt: skip
    parser.add_argument("--val-fraction", type=float, default=0.05)
    parser.add_argument("--test-fraction", type=float, default=0.05)
    parser.add_argument("--text-key", default="text", help="JSON key / parquet column holding the text")
    parser.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 1), help="tokenizer processes")
    parser.add_argument("--shard-tokens", type=int, default=SHARD_TOKENS, help="tokens per shard file at most")
    parser.add_argument("--bpe-sample-mb", default="1024", help="training text a BPE sees at most")
    parser.add_argument("--eod-token", default=None, help="end-of-document token of a given tokenizer.json")
    parser.add_argument("--checkpoint-mb", default="256", help="text between two saved states")
    parser.add_argument("--overwrite", action="store_true", help="replace another corpus's shards in --out")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    try:
        return parser.parse_args(argv)
    except SystemExit as exit_:
        if exit_.code not in (0, None):
            raise SystemExit(USAGE_ERROR) from None
        raise


def make_spec(args: argparse.Namespace) -> tuple[PrepareSpec, list]:
    """The spec and its input files, every value checked before anything is written."""
    if args.tokenizer not in ("byte", "bpe") and not Path(args.tokenizer).exists():
        raise PrepareError(f"--tokenizer {args.tokenizer!r} does not exist; valid: byte, bpe, a tokenizer.json path")
    for name in ("workers", "shard_tokens"):
        if getattr(args, name) < (0 if name == "workers" else 1):
            raise PrepareError(f"--{name.replace('_', '-')}={getattr(args, name)}; valid: a positive integer")
    for name in ("bpe_sample_mb", "checkpoint_mb"):  # finite sizes: "inf" and "nan" are refused too
        option = f"--{name.replace('_', '-')}"
        setattr(args, name, number(getattr(args, name), option, low=0, low_open=True, where="command line"))
    check_fractions(args.val_fraction, args.test_fraction)
    vocab = args.vocab_size if args.vocab_size is not None else (4096 if args.tokenizer == "bpe" else None)
    if args.tokenizer == "bpe":
        check_bpe_vocab_size(vocab)
    elif vocab is not None and args.tokenizer != "byte":
        shard_dtype(vocab)  # the model's id space must fit a shard dtype
    spec = PrepareSpec(
        inputs=list(args.input), tokenizer=args.tokenizer, vocab_size=vocab, val_fraction=args.val_fraction,
        test_fraction=args.test_fraction, text_key=args.text_key, shard_tokens=args.shard_tokens,
        bpe_sample_bytes=int(args.bpe_sample_mb * 2**20), eod_token=args.eod_token,
    )  # fmt: skip
    if spec.inputs == ["embedded"]:
        return spec, []
    if "embedded" in spec.inputs:
        raise PrepareError("--input embedded cannot be mixed with files; valid: embedded alone, or files")
    return spec, list_inputs(spec.inputs)  # missing or unknown inputs: one line now, before the output exists


def check_out_path(out: Path) -> None:
    """``--out`` can be a directory: not a file, not under one."""
    if out.exists() and not out.is_dir():
        raise PrepareError(f"--out {str(out)!r} is a file; valid: a directory path")
    for parent in out.parents:
        if parent.exists():
            if not parent.is_dir():
                raise PrepareError(f"--out {str(out)!r} lies under {str(parent)!r}, which is a file")
            break


def claim_out(out: Path, record: dict, overwrite: bool) -> str:
    """Decides what the command does with ``--out``: "fresh", "resume", "done"; refuses what is not its own.
    Called under the output's lock (:func:`lock_out`), so no other preparation changes ``--out`` meanwhile."""
    check_out_path(out)
    if not out.exists():
        return "fresh"
    staging = out / STAGING
    digest = spec_sha256(record)
    if has_shards(out) and read_meta(out).spec_sha256 == digest and not staging.exists():
        return "done"
    if (staging / STATE_FILE).is_file():
        import json

        saved = json.loads((staging / STATE_FILE).read_text()).get("spec")
        if saved == record:
            return "resume"
        if not overwrite:
            raise PrepareError(
                f"--out {str(out)!r} holds an unfinished preparation of another corpus or settings; "
                "valid: the same command as before, another --out, or --overwrite"
            )
        shutil.rmtree(staging)
    others = [p.name for p in out.iterdir() if p.name not in (STAGING, LOCK)]
    if others and not overwrite:
        what = f"the shards of corpus {read_meta(out).corpus!r}" if has_shards(out) else f"{len(others)} other file(s)"
        raise PrepareError(f"--out {str(out)!r} already holds {what}; valid: another --out, or --overwrite")
    return "fresh"


def lock_out(out: Path) -> IO[str]:
    """Takes ``--out``'s lock (``.prepare.lock``, an ``flock`` the kernel drops when this process ends however
    it ends: a killed preparation never blocks the next).

    Raises:
        PrepareError: another preparation holds it (one line naming it); nothing is changed.
    """
    try:
        return claim_output(out, LOCK, "prepare_text", "finds it done")
    except InputError as err:
        raise PrepareError(str(err)) from None


def release(lock: IO[str], out: Path, created: bool) -> None:
    """Drops ``--out``'s lock and its file; a directory this command created and left empty goes too."""
    unlock(lock, remove=True)
    if created:
        with contextlib.suppress(OSError):  # not empty (another preparation's files): kept
            out.rmdir()


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point: prepares shards with a progress bar and prints a one-line summary."""
    args = parse_args(argv)
    try:
        spec, files = make_spec(args)
        out = Path(args.out)
        check_out_path(out)
        created = not out.exists()
        out.mkdir(parents=True, exist_ok=True)
        lock = lock_out(out)  # first: what --out holds is decided under the lock, never before another's publish
        try:
            decision = claim_out(out, spec.record(files), args.overwrite)
        except PrepareError:
            release(lock, out, created)
            raise
        if decision == "done":
            release(lock, out, created)
            print(f"{out}: already prepared with these inputs and settings; nothing to do")
            return
        if decision == "resume":
            print(f"{out}: resuming the unfinished preparation in {out / STAGING}", file=sys.stderr)
        stop, stopped_by = threading.Event(), []

        def on_signal(signum: int, frame) -> None:
            stopped_by.append(signum)
            stop.set()  # the loop stops at its next batch and saves its state

        previous = {s: signal.signal(s, on_signal) for s in SIGNAL_EXIT}
        try:
            prepared = prepare_corpus(spec, out / STAGING, workers=args.workers, progress=not args.no_progress,
                                      stop=stop, checkpoint_bytes=int(args.checkpoint_mb * 2**20))  # fmt: skip
        except (FileNotFoundError, ValueError):  # an input found bad mid-way: a fresh attempt leaves nothing
            if decision == "fresh":
                shutil.rmtree(out / STAGING, ignore_errors=True)
            release(lock, out, created)
            raise
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        publish(out / STAGING, out)
        shutil.rmtree(out / STAGING, ignore_errors=True)
        release(lock, out, created=False)
    except Stopped as stop_:
        signum = stopped_by[0] if stopped_by else signal.SIGINT
        print(f"prepare_text: {signal.Signals(signum).name}, {stop_}", file=sys.stderr, flush=True)
        raise SystemExit(SIGNAL_EXIT[signum]) from None
    except (PrepareError, FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        raise SystemExit(USAGE_ERROR) from None
    meta, secs = prepared.meta, max(prepared.seconds, 1e-9)
    splits = ", ".join(f"{k}={v:,}" for k, v in meta.split_tokens.items())
    docs = ", ".join(f"{k}={v:,}" for k, v in meta.split_documents.items())
    print(
        f"wrote {args.out}: corpus={meta.corpus} tokenizer={meta.tokenizer} vocab_size={meta.vocab_size} "
        f"dtype={meta.dtype} split_by={meta.split_by} tokens {splits} documents {docs} in {secs:.1f}s "
        f"({prepared.text_bytes / secs / 1e6:.1f} MB/s of text, {meta.num_tokens / secs / 1e6:.2f}M tokens/s)"
    )


if __name__ == "__main__":
    main()
