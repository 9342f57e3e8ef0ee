"""Tokenizing a corpus of any size into shards: streaming, parallel, bounded in memory, resumable, deterministic.

    input files --read (this process)--> documents, each with its split from a hash of its text
                --batches of ~4 MB of text--> worker processes: the `tokenizers` library encodes each document
                                               alone, an end-of-document id after it
                --in input order--> ShardWriter per split (bounded files) --> meta.json (the manifest)

Memory holds a few batches per worker whatever the corpus size. Every ``checkpoint_bytes`` of text (and at each
input file's end) the writers are flushed to disk and ``state.json`` records where the reading stands and how
long every shard file is; a preparation started again with the same spec truncates the shards to that state
and goes on from there, so its output is byte for byte the one an uninterrupted run writes. A BPE tokenizer is
trained first on a bounded sample (the leading ``bpe_sample_bytes`` of training documents), so neither the
vocabulary nor the memory it needs depend on the corpus size, and validation / test text never shapes it.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import shutil
import signal
import tempfile
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from tqdm import tqdm

from datamodules.text.corpus import InputFile, Piece, iter_pieces, list_inputs, load_embedded_corpus
from datamodules.text.shards import (
    META_FILE,
    SHARD_TOKENS,
    SPLITS,
    ShardMeta,
    ShardWriter,
    check_fractions,
    fractions,
    publish,
    shard_dtype,
    split_of_key,
    token_split_meta,
    tokenizer_hash,
)
from datamodules.text.tokenizers import (
    BPE_FILE,
    MIN_BPE_VOCAB,
    BPETokenizer,
    ByteTokenizer,
    TextTokenizer,
    TokenizerKind,
    iter_chunks,
)
from fileio import atomic_write_json

STATE_FILE = "state.json"
EOD_TOKEN = "<|endoftext|>"  # the end-of-document token a BPE trained here gets (GPT-2 / GPT-NeoX's name)
EOD_NAMES = (EOD_TOKEN, "<|end_of_text|>", "</s>", "<eos>", "<|eos|>")
BYTE_EOD = 0xFF  # never a byte of UTF-8 text: the byte tokenizer's end of document
BATCH_CHARS = 4 << 20


class Stopped(Exception):
    """The preparation was asked to stop (SIGTERM / Ctrl-C); its state is saved, the same command resumes."""


@dataclass
class PrepareSpec:
    """What to prepare; two preparations of equal specs (and unchanged inputs) write identical bytes.

    Attributes:
        inputs: "embedded", or files / directories of .txt .md .jsonl(.gz/.zst) .parquet.
        tokenizer: "byte", "bpe" (trained here), or a tokenizer.json (or a directory holding one).
        vocab_size: the model's id space; for "bpe" also the size trained; None: the tokenizer's own size.
        val_fraction: expected fraction of documents (of tokens, for a single document) for validation.
        test_fraction: the same for test.
        text_key: JSON key / parquet column of the text.
        shard_tokens: tokens per shard file at most.
        bpe_sample_bytes: training text the BPE sees at most.
        eod_token: the end-of-document token of a given tokenizer.json (None: found by its usual names).
    """

    inputs: list[str]
    tokenizer: str = "byte"
    vocab_size: int | None = 4096
    val_fraction: float = 0.05
    test_fraction: float = 0.05
    text_key: str = "text"
    shard_tokens: int = SHARD_TOKENS
    bpe_sample_bytes: int = 1 << 30
    eod_token: str | None = None

    def record(self, files: list[InputFile]) -> dict:
        """The spec with the inputs' sizes and modification times: a changed input is another spec."""
        stamp = [[str(f.path.resolve()), f.size, f.path.stat().st_mtime_ns] for f in files]
        return json.loads(json.dumps({**asdict(self), "files": stamp}))  # as state.json holds it


class Prepared(NamedTuple):
    meta: ShardMeta
    text_bytes: int
    seconds: float


@dataclass
class _Progress:
    """Where a preparation stands: the next piece to read and what the writers hold."""

    input_index: int = 0
    pieces_done: int = 0
    documents: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SPLITS, 0))
    input_documents: list[int] = field(default_factory=list)
    text_bytes: int = 0


#################################################################################
#                                   Tokenizer                                   #
#################################################################################


def _single_document(spec: PrepareSpec, files: list[InputFile] | None) -> bool:
    return files is None or (len(files) == 1 and files[0].kind == "text")


def _sample(spec: PrepareSpec, files: list[InputFile] | None) -> Iterator[str]:
    """The BPE's training text: training documents from the start, ``bpe_sample_bytes`` at most."""
    budget = spec.bpe_sample_bytes
    if files is None or _single_document(spec, files):  # one document: its leading training fraction
        if files is None:
            text = load_embedded_corpus().text
        elif files[0].size <= budget:
            text = files[0].path.read_text(encoding="utf-8")
        else:  # a text file larger than the sample: its first bytes (a character cut at the end is dropped)
            with open(files[0].path, "rb") as fh:
                text = fh.read(budget).decode("utf-8", errors="ignore")
        train = text[: int(len(text) * (1.0 - spec.val_fraction - spec.test_fraction))]
        yield from iter_chunks(train[:budget])
        return
    for item in files:
        for piece, _ in iter_pieces(item, spec.text_key):
            if split_of_key(piece.key, spec.val_fraction, spec.test_fraction) != 0:
                continue
            yield piece.text[:budget]
            budget -= len(piece.text)
            if budget <= 0:
                return


def build_tokenizer(spec: PrepareSpec, files: list[InputFile] | None, directory: Path) -> tuple[TextTokenizer, int]:
    """The tokenizer (trained, loaded or byte) saved into ``directory``, and its end-of-document id."""
    if spec.tokenizer == "byte":
        tok: TextTokenizer = ByteTokenizer()
        tok.save(directory)
        return tok, BYTE_EOD
    if (directory / BPE_FILE).is_file():  # a resumed preparation keeps the tokenizer it trained
        hf = Tokenizer.from_file(str(directory / BPE_FILE))
    elif spec.tokenizer == "bpe":
        if spec.vocab_size is None or not MIN_BPE_VOCAB <= spec.vocab_size <= 2**32 - 1:
            raise ValueError(f"bpe_vocab_size={spec.vocab_size} must lie in [{MIN_BPE_VOCAB}, 2**32-1]")
        hf = Tokenizer(models.BPE())
        hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        hf.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=spec.vocab_size, min_frequency=2, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False, special_tokens=[EOD_TOKEN],
        )  # fmt: skip
        hf.train_from_iterator(_sample(spec, files), trainer=trainer)
    else:
        path = Path(spec.tokenizer)
        path = path / BPE_FILE if path.is_dir() else path
        if not path.is_file():
            raise FileNotFoundError(f"tokenizer {spec.tokenizer!r} does not exist; valid: byte, bpe, a tokenizer.json")
        try:
            hf = Tokenizer.from_file(str(path))
        except Exception as err:  # noqa: BLE001 - the library raises a bare Exception for a malformed file
            raise ValueError(f"{str(path)!r} is not a tokenizers tokenizer.json ({err})") from None
    tok = BPETokenizer(hf)
    names = [spec.eod_token] if spec.eod_token else list(EOD_NAMES)
    eod = next((i for n in names if (i := hf.token_to_id(n)) is not None), None)
    if eod is None:
        raise ValueError(f"tokenizer {spec.tokenizer!r} has no end-of-document token {names}; valid: --eod-token NAME")
    tok.save(directory)
    return tok, eod


#################################################################################
#                            Workers: tokenize a batch                          #
#################################################################################

_WORKER: dict = {}


def _init_worker(tokenizer_json: str | None, eod: int | None, main: bool = False) -> None:
    if not main:  # forked with the parent's handlers: Ctrl-C reaches the whole process group, the parent decides
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # Pool.terminate() ends a worker with SIGTERM
    _WORKER["hf"] = Tokenizer.from_str(tokenizer_json) if tokenizer_json else None
    _WORKER["eod"] = None if eod is None else np.array([eod], dtype=np.uint32)


def encode_batch(batch: list[tuple[int, str, bool]]) -> tuple[list[np.ndarray], list[int]]:
    """(ids per split, documents per split) of ``batch``: (split, text, end of document) triples in order."""
    hf, eod = _WORKER["hf"], _WORKER["eod"]
    if hf is None:
        ids = [np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.uint32) for _, text, _ in batch]
    else:
        encodings = hf.encode_batch([text for _, text, _ in batch], add_special_tokens=False)
        ids = [np.asarray(e.ids, dtype=np.uint32) for e in encodings]
    parts: list[list[np.ndarray]] = [[], [], []]
    documents = [0, 0, 0]
    for (split, _, end), arr in zip(batch, ids, strict=True):
        parts[split].append(arr)
        if end:
            documents[split] += 1
            if eod is not None:
                parts[split].append(eod)
    out = [np.concatenate(p) if p else np.zeros(0, dtype=np.uint32) for p in parts]
    return out, documents


#################################################################################
#                                   The loop                                    #
#################################################################################


def _pieces(
    spec: PrepareSpec, files: list[InputFile] | None, start: _Progress
) -> Iterator[tuple[int, int, Piece, int]]:
    """(input index, piece index, piece, input bytes consumed) from where ``start`` says, in order."""
    if files is None:  # the embedded corpus: one document, in memory
        chunks = list(iter_chunks(load_embedded_corpus().text))
        for k in range(start.pieces_done, len(chunks)):
            yield 0, k, Piece(chunks[k], 0, end=k == len(chunks) - 1), 0
        return
    for i in range(start.input_index, len(files)):
        skip = start.pieces_done if i == start.input_index else 0
        for k, (piece, position) in enumerate(iter_pieces(files[i], spec.text_key, skip), skip):
            yield i, k, piece, position


class _Assembler:
    """Appends each tokenized batch to its split's shard writer, in input order, and saves a resumable state.

    A state is saved at the end of every input and every ``checkpoint_bytes`` of text. ``consistent`` is what a
    stop saves: the writers and the progress after the last whole batch, never half of one.
    """

    def __init__(
        self,
        directory: Path,
        record: dict,
        writers: list[ShardWriter],
        state: _Progress,
        files: list[InputFile] | None,
        checkpoint_bytes: int,
        bar: tqdm,
    ) -> None:
        self.directory, self.record, self.writers, self.state = directory, record, writers, state
        self.files, self.checkpoint_bytes, self.bar = files, checkpoint_bytes, bar
        self.names = [w.prefix for w in writers]
        self.single = self.names == ["tokens"]
        self.start, self.tokens_at_start = time.monotonic(), self.tokens()
        self.last_checkpoint = state.text_bytes
        self.consistent = self.snapshot()

    def tokens(self) -> int:
        return sum(w.tokens for w in self.writers)

    def snapshot(self) -> tuple[list[dict], dict]:
        return [w.state() for w in self.writers], asdict(self.state)

    def bytes_before(self, index: int) -> int:
        """Input bytes of the files before input ``index`` (the progress bar counts input bytes)."""
        return sum(f.size for f in (self.files or [])[:index])

    def consume(self, result: tuple[list[np.ndarray], list[int]], where: tuple[int, int, int, bool, int]) -> None:
        """Appends one batch's ids; ``where`` = (input index, next piece, input position, input done, text chars)."""
        ids, documents = result
        state = self.state
        for split, arr in enumerate(ids):
            self.writers[0 if self.single else split].append(arr)
            state.documents[SPLITS[split]] += documents[split]
        index, next_piece, position, input_done, text = where
        state.input_documents[index] += sum(documents)
        state.input_index, state.pieces_done = (index + 1, 0) if input_done else (index, next_piece)
        state.text_bytes += text
        self.bar.update(max(0, self.bytes_before(index) + position - self.bar.n) if self.files else text)
        elapsed = max(time.monotonic() - self.start, 1e-9)
        made = self.tokens() - self.tokens_at_start
        self.bar.set_postfix_str(
            f"{state.text_bytes / elapsed / 1e6:.1f} MB/s text, {made / elapsed / 1e6:.2f}M tok/s", refresh=False
        )
        self.consistent = self.snapshot()
        if input_done or state.text_bytes - self.last_checkpoint >= self.checkpoint_bytes:
            self.save()
            self.last_checkpoint = state.text_bytes

    def save(self) -> None:
        """Flushes the shards and records the last consistent state (``state.json``)."""
        _checkpoint(self.directory, self.record, self.writers, self.names, self.consistent)


class _Encoder:
    """Tokenizes batches in this process (``workers == 0``) or in a pool of worker processes.

    Results reach ``sink`` in submission order; at most ``2 * workers`` batches are in flight, which bounds the
    memory whatever the corpus size.
    """

    def __init__(self, workers: int, tokenizer_json: str | None, eod: int | None, sink: _Assembler) -> None:
        self.workers, self.sink = workers, sink
        self.pending: deque = deque()
        self.pool = None
        if workers > 0:
            os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread per worker: the processes are the parallelism
            context = multiprocessing.get_context("fork")
            self.pool = context.Pool(workers, initializer=_init_worker, initargs=(tokenizer_json, eod))
        else:
            _init_worker(tokenizer_json, eod, main=True)

    def submit(self, batch: list, where: tuple) -> None:
        if self.pool is None:
            self.sink.consume(encode_batch(batch), where)
            return
        self.pending.append((self.pool.apply_async(encode_batch, (batch,)), where))
        while len(self.pending) > 2 * self.workers:
            result, at = self.pending.popleft()
            self.sink.consume(result.get(), at)

    def drain(self, stop: threading.Event | None) -> None:
        while self.pending:
            if stop is not None and stop.is_set():
                raise Stopped
            result, at = self.pending.popleft()
            self.sink.consume(result.get(), at)

    def terminate(self, grace_s: float = 60.0) -> None:
        """Ends the workers after their in-flight batches (at most ``2 * workers + 1``; not consumed: redone on resume).

        Never kills a worker while it writes a result: ``Pool.terminate`` does, and the pool's result thread then
        waits forever for the rest of that message (a SIGTERM'd preparation hung about once in 7 tries on a
        loaded machine). Only a batch still unfinished after ``grace_s`` gets the old, abrupt end.
        """
        if self.pool is None:
            return
        pool, self.pool = self.pool, None
        pool.close()  # no new batches; the workers exit once the queued ones are done
        deadline = time.monotonic() + grace_s
        for result, _ in self.pending:
            result.wait(max(0.0, deadline - time.monotonic()))
        if all(result.ready() for result, _ in self.pending):
            pool.join()
        else:
            pool.terminate()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool.join()


def _feed(spec: PrepareSpec, files: list[InputFile] | None, state: _Progress, encoder: _Encoder,
          stop: threading.Event | None, single: bool) -> None:  # fmt: skip
    """Cuts the inputs, from where ``state`` says, into batches of ~``BATCH_CHARS`` that never span two inputs."""
    batch, size, previous = [], 0, None
    for index, k, piece, position in _pieces(spec, files, state):
        if stop is not None and stop.is_set():
            raise Stopped
        if previous is not None and index != previous[0]:  # the previous input is complete
            encoder.submit(batch, (previous[0], 0, previous[1], True, size))
            batch, size = [], 0
        split = 0 if single else split_of_key(piece.key, spec.val_fraction, spec.test_fraction)
        batch.append((split, piece.text, piece.end))
        size += len(piece.text)
        previous = (index, position)
        if size >= BATCH_CHARS:
            encoder.submit(batch, (index, k + 1, position, False, size))
            batch, size = [], 0
    if previous is not None:
        encoder.submit(batch, (previous[0], 0, previous[1], True, size))
    encoder.drain(stop)


def prepare_corpus(
    spec: PrepareSpec,
    directory: Path,
    workers: int = 0,
    progress: bool = True,
    stop: threading.Event | None = None,
    checkpoint_bytes: int = 256 << 20,
) -> Prepared:
    """Writes the shards, the tokenizer and meta.json of ``spec`` into ``directory`` (resuming its state.json).

    Args:
        spec: what to prepare.
        directory: the staging directory; holds the finished set (and no state.json) on return.
        workers: tokenizer processes; 0 tokenizes in this process (the library's own threads).
        progress: show a bar with the input's MB/s and tokens/s.
        stop: set it to stop at the next batch (state saved; :class:`Stopped` is raised).
        checkpoint_bytes: text between two saved states.
    """
    check_fractions(spec.val_fraction, spec.test_fraction)
    files = None if spec.inputs == ["embedded"] else list_inputs(spec.inputs)
    single = _single_document(spec, files)
    small_text = files is not None and len(files) == 1 and files[0].kind == "text" and files[0].size < 1 << 16
    if small_text and not files[0].path.read_bytes().strip():  # a careless empty source would "train" on nothing
        raise ValueError(f"text file {str(files[0].path)!r} is empty; valid: a UTF-8 text file with some text")
    record = spec.record(files or [])
    directory.mkdir(parents=True, exist_ok=True)
    saved = json.loads((directory / STATE_FILE).read_text()) if (directory / STATE_FILE).is_file() else None
    if saved is not None and saved["spec"] != record:
        raise ValueError(f"{str(directory)!r} holds an unfinished preparation of another spec; valid: --overwrite")
    tok, eod = build_tokenizer(spec, files, directory)
    vocab_size = 256 if spec.tokenizer == "byte" else (spec.vocab_size or tok.vocab_size)
    if tok.vocab_size > vocab_size:  # the id space: a tokenizer.json with gaps has ids beyond its token count
        count = tok.hf.get_vocab_size(with_added_tokens=True)
        raise ValueError(
            f"tokenizer {spec.tokenizer!r} has ids up to {tok.vocab_size - 1} ({count} tokens), more than "
            f"vocab_size={vocab_size} holds; valid: --vocab-size {tok.vocab_size} or more"
        )
    names = ["tokens"] if single else list(SPLITS)
    writers = [ShardWriter(directory, name, shard_dtype(vocab_size), spec.shard_tokens) for name in names]
    state = _Progress(input_documents=[0] * len(files or [1]))
    if saved is not None:
        for writer, name in zip(writers, names, strict=True):
            writer.restore(saved["writers"][name])
        state = _Progress(**saved["progress"])
    total = sum(f.size for f in files) if files else 0
    initial = sum(f.size for f in (files or [])[: state.input_index])
    bar = tqdm(total=total or None, initial=initial, unit="B", unit_scale=True, unit_divisor=1024,
               desc="prepare_text", disable=not progress, mininterval=1.0, dynamic_ncols=True)  # fmt: skip
    sink = _Assembler(directory, record, writers, state, files, checkpoint_bytes, bar)
    hf_json = None if spec.tokenizer == "byte" else tok.hf.to_str()
    encoder = _Encoder(workers, hf_json, None if single else eod, sink)  # one document: nothing to separate
    try:
        _feed(spec, files, state, encoder, stop, single)
    except (Stopped, KeyboardInterrupt):
        encoder.terminate()
        sink.save()
        done = sink.consistent[1]["text_bytes"]
        raise Stopped(f"stopped after {done / 1e6:,.1f} MB of text; the same command resumes from there") from None
    finally:
        encoder.close()
        bar.close()
    for writer in writers:
        writer.close()
    meta = _manifest(spec, files, single, writers, tok, eod, vocab_size, state, directory)
    if meta.num_tokens == 0:
        raise ValueError(f"text source {', '.join(spec.inputs)!r} is empty; it needs some text")
    atomic_write_json(directory / META_FILE, asdict(meta))
    (directory / STATE_FILE).unlink(missing_ok=True)
    return Prepared(meta, state.text_bytes, time.monotonic() - sink.start)


def _checkpoint(directory: Path, record: dict, writers: list[ShardWriter], names: list[str], consistent) -> None:
    """Flushes the shards and records ``consistent`` (writer states and progress after a whole batch)."""
    for writer in writers:
        writer.sync()
    writer_states, progress = consistent
    payload = {"spec": record, "writers": dict(zip(names, writer_states, strict=True)), "progress": progress}
    atomic_write_json(directory / STATE_FILE, payload, indent=None)


def spec_sha256(record: dict) -> str:
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()


def _manifest(spec, files, single, writers, tok, eod, vocab_size, state, directory) -> ShardMeta:
    spec_hash = spec_sha256(spec.record(files or []))
    if files is None:
        corpus, source = load_embedded_corpus().name, "embedded"
    else:
        first = Path(spec.inputs[0]).resolve()
        corpus = first.stem.split(".")[0] or "corpus"
        source = ", ".join(str(Path(s).resolve()) for s in spec.inputs)
    inputs = [{"path": str(f.path), "bytes": f.size, "documents": n}
              for f, n in zip(files or [], state.input_documents, strict=False)]  # fmt: skip
    if single:
        return token_split_meta(writers[0], tok, directory, vocab_size, corpus, source, spec.val_fraction,
                                spec.test_fraction, inputs=inputs, spec_sha256=spec_hash)  # fmt: skip
    empty = [s for s, w in zip(SPLITS, writers, strict=True) if w.tokens == 0]
    if empty:
        total = sum(state.documents.values())
        raise ValueError(
            f"the {'/'.join(empty)} split got no document of {total}: a split by document needs more documents "
            "(or give one text file, which is split by tokens)"
        )
    return ShardMeta(
        spec_sha256=spec_hash,
        dtype=shard_dtype(vocab_size).name,
        vocab_size=vocab_size,
        tokenizer=tok.kind,
        tokenizer_vocab_size=tok.vocab_size,
        num_tokens=sum(w.tokens for w in writers),
        split_tokens={s: w.tokens for s, w in zip(SPLITS, writers, strict=True)},
        split_fractions=fractions(spec.val_fraction, spec.test_fraction),
        corpus=corpus,
        source=source,
        split_by="document",
        files={s: w.segments() for s, w in zip(SPLITS, writers, strict=True)},
        split_documents=dict(state.documents),
        tokenizer_sha256=tokenizer_hash(directory, tok.kind),
        eod_id=eod,
        max_token_id=max(w.max_id for w in writers),
        inputs=inputs,
    )


def prepare_text_shards(
    source: str,
    out_dir: str | Path,
    tokenizer: TokenizerKind | str = "byte",
    vocab_size: int = 4096,
    val_fraction: float = 0.05,
    test_fraction: float = 0.05,
) -> ShardMeta:
    """Tokenizes `source` ("embedded", a file or a directory of inputs) into `out_dir` in this process.

    What ``TextDataModule.prepare_data`` calls; the command line (``python -m datamodules.text.prepare``)
    adds worker processes, resuming, a progress bar and the overwrite policy. See
    :func:`datamodules.text.pipeline.prepare_corpus`.
    """
    spec = PrepareSpec(inputs=[source], tokenizer=tokenizer, vocab_size=vocab_size, val_fraction=val_fraction,
                       test_fraction=test_fraction)  # fmt: skip
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=out_dir))  # unique per writer, same file system
    try:
        meta = prepare_corpus(spec, staging, workers=0, progress=False).meta
        publish(staging, out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return meta
