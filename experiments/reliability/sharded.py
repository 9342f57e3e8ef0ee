"""Sharded (distributed) checkpoints: a folder per save, as ``ModelParallelStrategy`` writes it, written
atomically and read safely.

    <name>.ckpt/                    ModelParallelStrategy(save_distributed_checkpoint=True)
      __<rank>_0.distcp             each rank's shards of the weights and the optimizer state (raw bytes)
      .metadata                     where each tensor's chunks are (torch.distributed.checkpoint; a pickle)
      meta.pt                       the rest of the Lightning checkpoint (hparams, loops, callbacks), rank 0
      consolidated.ckpt (+ .json)   the suite's cache: the same checkpoint as one file (made on first read)

A save is complete when both ``.metadata`` and ``meta.pt`` exist (Lightning writes ``meta.pt`` after every
rank's shards). Lightning writes them into the folder in place, over the previous save's files, so a kill or a
full disk in the middle would leave one folder mixing two saves. The suite's :class:`ModelParallelStrategy`
(``configs/trainer/fsdp2.yaml``) has every rank write into a hidden ``.<name>.save.<random>.partial`` folder
beside it instead; when every rank has written, rank 0 swaps it in with one rename (:func:`fileio.publish_dir`).
``--ckpt_path last`` never sees a partial folder (it is not a ``*.ckpt``), and the next save removes it.

``.metadata`` is a pickle, which torch reads with plain ``pickle.load``: the suite unpickles it first with an allow-
list of the checkpoint format's own classes, so a hostile folder is refused before torch (or Lightning, when it
resumes) unpickles anything.

Consolidation gathers the weights, and only the weights, into one file in the single-process layout
(``experiments.parallel.packed``): every command that reads checkpoints (test, evaluate, lm-eval, export,
prune, logit-lens) then reads it like any other. The cache records the sizes and times of the files it was
made from and is made again when they change, so it is never silently stale.
"""

from __future__ import annotations

import errno
import io
import json
import os
import pickle
import shutil
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import strategies
from torch.distributed.checkpoint.api import CheckpointException

from experiments.parallel.packed import unpack_state_dict
from experiments.reliability.errors import CheckpointError, free_space_note
from fileio import atomic_file, atomic_write_json, publish_dir, temp_dir

METADATA, META = ".metadata", "meta.pt"
CACHE, STAMP = "consolidated.ckpt", "consolidated.json"

# Every global a torch.distributed.checkpoint .metadata pickle names (besides torch dtypes): nothing that runs code.
_DCP = "torch.distributed.checkpoint.metadata"
_DCP_CLASSES = ("Metadata", "MetadataIndex", "StorageMeta", "TensorProperties", "TensorStorageMetadata",
                "ChunkStorageMetadata", "BytesStorageMetadata", "_MEM_FORMAT_ENCODING")  # fmt: skip
_ALLOWED = {(_DCP, name) for name in _DCP_CLASSES} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("collections", "OrderedDict"),
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED or (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name}")


def read_metadata(path: Path) -> Any:
    """The checkpoint's ``.metadata``, unpickled with the allow-list; a one-line CheckpointError otherwise."""
    try:
        return _MetadataUnpickler(io.BytesIO((path / METADATA).read_bytes())).load()
    except pickle.UnpicklingError as err:
        raise CheckpointError(
            f"sharded checkpoint {path}: has a {METADATA} naming {err}, which is not part of the checkpoint format, "
            "so the suite refuses to unpickle it (valid: a folder ModelParallelStrategy saved)"
        ) from None
    except Exception as err:  # noqa: BLE001 - a truncated or garbled pickle: one line, whatever the error
        raise CheckpointError(
            f"sharded checkpoint {path}: has an unreadable {METADATA} ({type(err).__name__})"
        ) from None


def sharded_problem(path: str | Path) -> str | None:
    """Why the folder ``path`` is not a complete, safe sharded checkpoint, or None."""
    path = Path(path)
    missing = [name for name in (METADATA, META) if not (path / name).is_file()]
    if missing:
        return (
            f"is an incomplete sharded checkpoint (no {' or '.join(missing)}: its save did not finish, or the "
            "folder is not a checkpoint)"
        )
    try:
        metadata = read_metadata(path)
    except CheckpointError as err:
        return str(err).split(": ", 1)[1]
    stored = {item.relative_path for item in (metadata.storage_data or {}).values()}
    absent = sorted(name for name in stored if not (path / name).is_file())
    if absent:
        return f"is an incomplete sharded checkpoint (missing {', '.join(absent[:3])})"
    return None


def sharded_view(path: str | Path) -> dict[str, Any]:
    """The checkpoint ``path`` without reading its shards: ``meta.pt``'s entries (hparams, loops) and a
    ``state_dict`` of meta-device tensors of the single-process shapes, from ``.metadata`` alone (what
    checking that a checkpoint fits a model needs, at no cost for a model of any size)."""
    path = Path(path)
    if problem := sharded_problem(path):
        raise CheckpointError(f"checkpoint {path} {problem}")
    shapes = {
        key.removeprefix("state_dict."): torch.empty(tuple(item.size), device="meta")
        for key, item in read_metadata(path).state_dict_metadata.items()
        if key.startswith("state_dict.") and hasattr(item, "size")
    }
    return {**_load_meta(path), "state_dict": unpack_state_dict(shapes)}


def _source_stamp(path: Path) -> dict[str, list[int]]:
    files = sorted(p for p in path.iterdir() if p.is_file() and p.name not in (CACHE, STAMP))
    return {p.name: [p.stat().st_size, p.stat().st_mtime_ns] for p in files}


def _load_meta(path: Path) -> dict[str, Any]:
    try:
        meta = torch.load(path / META, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - refused globals, truncation: one line
        raise CheckpointError(f"sharded checkpoint {path}: its {META} is not a plain checkpoint ({err})") from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"sharded checkpoint {path}: its {META} holds {type(meta).__name__}, not a dict")
    return meta


def consolidate(path: str | Path, out: str | Path) -> Path:
    """Writes the sharded checkpoint ``path`` as one Lightning checkpoint file ``out`` (weights, no optimizer).

    Raises:
        CheckpointError: the folder is incomplete, unsafe or not a checkpoint (one line).
    """
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.format_utils import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    path, out = Path(path), Path(out)
    problem = sharded_problem(path)
    if problem:
        raise CheckpointError(f"checkpoint {path} {problem}")
    meta = _load_meta(path)
    weights: dict[str, Any] = {}
    planner = _EmptyStateDictLoadPlanner(keys={"state_dict"})
    _load_state_dict(weights, storage_reader=FileSystemReader(path), planner=planner, no_dist=True)
    state = weights.get("state_dict")
    if not isinstance(state, dict):
        raise CheckpointError(f"sharded checkpoint {path} holds no model weights ('state_dict')")
    checkpoint = {**meta, "state_dict": unpack_state_dict(state), "consolidated_from": str(path)}
    with atomic_file(out) as f:
        torch.save(checkpoint, f)
    return out


def consolidated(path: str | Path) -> Path:
    """The one-file form of the sharded checkpoint ``path``: its cache inside the folder, made (again) when the
    shards are newer than it or it is missing."""
    path = Path(path)
    cache, stamp_file = path / CACHE, path / STAMP
    stamp = _source_stamp(path)
    try:
        fresh = cache.is_file() and json.loads(stamp_file.read_text()) == stamp
    except (OSError, ValueError):
        fresh = False
    if not fresh:
        consolidate(path, cache)
        atomic_write_json(stamp_file, stamp)
    return cache


class ModelParallelStrategy(strategies.ModelParallelStrategy):
    """Lightning's ``ModelParallelStrategy`` whose sharded saves replace the previous folder in one step.

    Every rank creates one hidden temp folder beside the target and the ranks agree that all of them could before
    the save's first collective (a rank failing alone inside it would leave the others waiting there); each then
    writes its shards (and rank 0 ``meta.pt``) into it, the ranks agree that all of them succeeded, and rank 0
    publishes the folder (module docstring). When any
    rank fails (a full disk, a read-only folder) the temp folder is removed on every rank's word, the previous
    checkpoint stays as it was, and each rank raises the same one-line :class:`CheckpointError`, the first
    rank's ``OSError`` chained to it (so the CLI names the run directory and its free space). Single-file saves
    (``save_distributed_checkpoint: false``) are Lightning's, through the suite's atomic checkpoint IO.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any | None = None) -> None:
        if not self._save_distributed_checkpoint:
            return super().save_checkpoint(checkpoint, filepath, storage_options)
        path = Path(self.broadcast(str(filepath)))
        partial = Path(self.broadcast(str(temp_dir(path, tag="save"))))  # one folder for every rank
        failure: BaseException | None = None
        try:  # before any collective: a rank that cannot make the folder must not leave the others waiting in DCP's
            partial.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            failure = err
        if self.reduce_boolean_decision(failure is None, all=True):
            try:
                super().save_checkpoint(checkpoint, partial, storage_options)
            except (Exception, CheckpointException) as err:  # every rank must reach the vote below, or the rest wait
                failure = err
        cause, why = None, "another rank failed"
        if failure is not None:  # read before the partial folder goes: removing it gives back what a full disk lacked
            cause = _os_error(failure) or _full_disk(path.parent)
            why = f"{cause.strerror or cause}{free_space_note(path.parent)}" if cause else _first_failure(failure)
        if not self.reduce_boolean_decision(failure is None, all=True):
            if self.global_rank == 0:
                shutil.rmtree(partial, ignore_errors=True)
            raise CheckpointError(
                f"could not write sharded checkpoint {path}: {why}; the previous checkpoint is untouched"
            ) from (cause or failure)
        if self.global_rank == 0:
            publish_dir(partial, path)
        self.barrier("sharded checkpoint published")


def _full_disk(folder: Path) -> OSError | None:
    """ENOSPC when ``folder``'s file system has (next to) no space left: torch's shard writer reports a write that
    ran out of space as a ``RuntimeError`` of its zip writer ("unexpected pos ..."), the space left tells."""
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return None
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(folder)) if free < 1 << 20 else None


def _first_failure(err: BaseException) -> str:
    """The first line of the failure (a rank's own, for torch's ``CheckpointException``)."""
    for rank, failure in sorted(getattr(err, "failures", {}).items()):
        inner = failure[0] if isinstance(failure, tuple) else failure
        return f"rank {rank}: {_line(inner)}"
    return _line(err)


def _line(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0]}" if text else type(err).__name__


def _os_error(err: BaseException | None) -> OSError | None:
    """The ``OSError`` behind a failed save (torch's ``CheckpointException`` holds each rank's failure)."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError):
            return err
        for failure in getattr(err, "failures", {}).values():  # {rank: exception or (exception, traceback)}
            found = _os_error(failure[0] if isinstance(failure, tuple) else failure)
            if found is not None:
                return found
        err = err.__cause__ or err.__context__
    return None
