"""Text for the LM task: corpora, tokenizers, shards on disk, token windows, and ``TextDataModule``.

    corpus.py         the embedded corpus and user text / jsonl / parquet collections, read as documents
    tokenizers.py     byte-level and BPE tokenizers (one protocol)
    pipeline.py       documents -> token shards: streaming, worker processes, resumable
    prepare.py        ``python -m datamodules.text.prepare``: the pipeline as a command
    shards.py         the shard files and their manifest (``meta.json``), read back as memory maps
    windows.py        fixed-length windows and their resumable samplers; shard_windows.py over shard files
    datamodule.py     ``TextDataModule``

Imported on first use (PEP 562): the prepare command and its workers do not load Lightning.
"""

import importlib

_WHERE = {"TextDataModule": "datamodules.text.datamodule"}


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'datamodules.text' has no attribute {name!r}")


__all__ = ["TextDataModule"]
