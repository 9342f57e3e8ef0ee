"""Sharded (distributed) checkpoints: a folder per save, as ``ModelParallelStrategy`` writes it, written
atomically and read safely.

    <name>.ckpt/                    ModelParallelStrategy(save_distributed_checkpoint=True)
      __<rank>_0.distcp             each rank's shards of the weights and the optimizer state
      .metadata                     where each entry's bytes are (torch.distributed.checkpoint; a pickle)
      meta.pt                       the rest of the Lightning checkpoint (hparams, loops, callbacks), rank 0
      shards.json                   the suite's manifest: every file of this save with its size and sha256

A save is complete when both ``.metadata`` and ``meta.pt`` exist (Lightning writes ``meta.pt`` after every
rank's shards). Lightning writes them into the folder in place, over the previous save's files, so a kill or a
full disk in the middle would leave one folder mixing two saves. The suite's :class:`ModelParallelStrategy`
(``configs/trainer/fsdp2.yaml``) has every rank write into a hidden ``.<name>.save.<random>.partial`` folder
beside it instead; when every rank has written, the ranks hash their share of the files, rank 0 writes the
manifest and swaps the folder in with one rename (:func:`fileio.publish_dir`). ``--ckpt_path last`` never sees a
partial folder (it is not a ``*.ckpt``), and the next save removes it.

A folder is a file a user hands in, so nothing in it is trusted (:func:`sharded_problem`, :func:`verify_shards`):

- ``.metadata`` is a pickle, which torch reads with plain ``pickle.load``: the suite unpickles it first with an
  allow-list of the checkpoint format's own classes, so a hostile folder is refused before torch (or Lightning,
  when it resumes) unpickles anything;
- its non-tensor entries (the optimizer's hyperparameters) are pickles too, which torch's load planner reads with
  ``torch.load(weights_only=False)``: each must load with ``weights_only=True`` first, or the folder is refused,
  and the suite's own reader loads them that way;
- every file ``.metadata`` names is a plain name inside the folder, and every entry lies inside its file (a
  shard cut short is named, not an EOFError);
- the manifest ties every file to one save: a shard copied in from another save, or a changed ``meta.pt``, does
  not match its size or hash (a folder without a manifest, saved by plain Lightning, is read without this check).

Consolidation gathers the weights, and only the weights, into one checkpoint in memory in the single-process
layout (``experiments.parallel.packed``): every command that reads checkpoints (test, evaluate, lm-eval, export,
prune, logit-lens) then reads it like any other. Nothing is written into the folder (it may be read-only, and a
cache found there could have been planted), so each read consolidates again.
"""

from __future__ import annotations

import errno
import hashlib
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
from fileio import atomic_write_json, publish_dir, temp_dir

METADATA, META, MANIFEST = ".metadata", "meta.pt", "shards.json"
CACHE = "consolidated.ckpt"  # what earlier versions cached inside the folder: never read, never written now

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
_HASH_BLOCK = 1 << 24


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


def _entry_problem(path: Path, metadata: Any) -> str | None:
    """Why an entry of ``.metadata`` points outside the folder or its file, or holds an unsafe pickle; or None."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    storage = getattr(metadata, "storage_data", None)
    entries = getattr(metadata, "state_dict_metadata", None)
    if not isinstance(storage, dict) or not isinstance(entries, dict):
        return f"has a {METADATA} without the format's entries (not a torch.distributed.checkpoint folder)"
    sizes: dict[str, int] = {}
    for index, info in storage.items():
        name = getattr(info, "relative_path", None)
        if not isinstance(name, str) or not name or name != Path(name).name or name in (".", ".."):
            return f"has a {METADATA} naming the shard {name!r}, which is not a file name inside the folder"
        if getattr(info, "transform_descriptors", None):
            return (
                f"has a {METADATA} asking for shard transforms {info.transform_descriptors!r} (the suite writes none)"
            )
        if name not in sizes:
            shard = path / name
            if shard.is_symlink() or not shard.is_file():
                return f"is an incomplete sharded checkpoint (missing {name})"
            sizes[name] = shard.stat().st_size
        offset, length = getattr(info, "offset", None), getattr(info, "length", None)
        if not all(isinstance(v, int) and v >= 0 for v in (offset, length)) or offset + length > sizes[name]:
            return (
                f"has a shard {name} of {sizes[name]} bytes, shorter than its {METADATA} says "
                f"({getattr(index, 'fqn', index)} at {offset}+{length}): it was cut short"
            )
        if isinstance(entries.get(getattr(index, "fqn", None)), BytesStorageMetadata):
            with open(path / name, "rb") as f:
                f.seek(offset)
                raw = f.read(length)
            try:  # torch's load planner unpickles these without weights_only: plain data only, checked first
                torch.load(io.BytesIO(raw), weights_only=True)
            except Exception:  # noqa: BLE001 - refused globals, garbage: the entry is not plain data
                return (
                    f"has an entry {index.fqn} in {name} that is not plain data (only an unsafe unpickle would read "
                    "it), so the suite refuses the folder (valid: a folder ModelParallelStrategy saved)"
                )
    return None


def _manifest(path: Path) -> dict[str, list] | None:
    """The folder's manifest ``{file: [size, sha256]}``, None when it has none; CheckpointError when garbled."""
    file = path / MANIFEST
    if not file.exists():
        return None
    try:
        files = json.loads(file.read_text())["files"]
        if isinstance(files, dict) and all(
            isinstance(v, list) and len(v) == 2 and isinstance(v[0], int) and isinstance(v[1], str)
            for v in files.values()
        ):
            return files
    except (OSError, ValueError, KeyError, TypeError):
        pass
    raise CheckpointError(f"sharded checkpoint {path}: its {MANIFEST} is not a manifest the suite wrote")


def _save_files(path: Path, metadata: Any) -> list[str]:
    """Every file of the save: the shards ``.metadata`` names, ``.metadata`` and ``meta.pt``."""
    return sorted({info.relative_path for info in metadata.storage_data.values()} | {METADATA, META})


def sharded_problem(path: str | Path) -> str | None:
    """Why the folder ``path`` is not a complete, safe sharded checkpoint of one save, or None.

    Reads ``.metadata``, the non-tensor entries and the sizes, never the shards' tensors (cheap); the hashes are
    :func:`verify_shards`'s.
    """
    path = Path(path)
    missing = [name for name in (METADATA, META) if not (path / name).is_file()]
    if missing:
        return (
            f"is an incomplete sharded checkpoint (no {' or '.join(missing)}: its save did not finish, or the "
            "folder is not a checkpoint)"
        )
    try:
        metadata = read_metadata(path)
        manifest = _manifest(path)
    except CheckpointError as err:
        return str(err).split(": ", 1)[1]
    if problem := _entry_problem(path, metadata):
        return problem
    if manifest is not None:
        for name in _save_files(path, metadata):
            if name not in manifest:
                return f"has {name}, which its {MANIFEST} does not list: files of two saves are mixed in it"
            size = (path / name).stat().st_size
            if size != manifest[name][0]:
                return (
                    f"has {name} of {size} bytes where its save wrote {manifest[name][0]}: files of two saves are "
                    "mixed in it, or one was cut short"
                )
    return None


def _sha256(file: Path) -> str:
    digest = hashlib.sha256()
    with open(file, "rb") as f:
        while block := f.read(_HASH_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def verify_shards(path: str | Path, rank: int = 0, world: int = 1) -> None:
    """Raises a one-line :class:`CheckpointError` unless ``path`` passes :func:`sharded_problem` and this rank's
    share of its files (every ``world``-th, from ``rank``) has the sha256 its manifest records."""
    path = Path(path)
    if problem := sharded_problem(path):
        raise CheckpointError(f"checkpoint {path} {problem}")
    manifest = _manifest(path)
    if manifest is None:
        return
    for name in _save_files(path, read_metadata(path))[rank::world]:
        if _sha256(path / name) != manifest[name][1]:
            raise CheckpointError(
                f"checkpoint {path} has {name} whose content is not what its save wrote (sha256 differs from "
                f"{MANIFEST}): files of two saves are mixed in it, or one was changed"
            )


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


def _load_meta(path: Path) -> dict[str, Any]:
    try:
        meta = torch.load(path / META, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - refused globals, truncation: one line
        raise CheckpointError(f"sharded checkpoint {path}: its {META} is not a plain checkpoint ({err})") from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"sharded checkpoint {path}: its {META} holds {type(meta).__name__}, not a dict")
    return meta


def _plain_data_planner(keys: set[str]) -> Any:
    """torch's planner for loading into an empty state dict, its non-tensor entries read with weights_only."""
    from torch.distributed.checkpoint.format_utils import _EmptyStateDictLoadPlanner

    class PlainDataPlanner(_EmptyStateDictLoadPlanner):
        def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
            fqn = read_item.dest_index.fqn
            loaded = torch.load(value, weights_only=True)
            if self.flatten_state_dict:
                from torch.distributed.checkpoint._traverse import set_element

                set_element(self.original_state_dict, self.mappings[fqn], loaded)
            else:
                self.state_dict[fqn] = loaded

    return PlainDataPlanner(keys=keys)


def consolidate(path: str | Path) -> dict[str, Any]:
    """The sharded checkpoint ``path`` as one Lightning checkpoint, in memory (weights, no optimizer state).

    Raises:
        CheckpointError: the folder is incomplete, unsafe, mixes saves or is not a checkpoint (one line).
    """
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    path = Path(path)
    verify_shards(path)
    meta = _load_meta(path)
    weights: dict[str, Any] = {}
    try:
        reader = FileSystemReader(path)
        _load_state_dict(weights, storage_reader=reader, planner=_plain_data_planner({"state_dict"}), no_dist=True)
    except (Exception, CheckpointException) as err:  # noqa: BLE001 - damage the checks above cannot see: one line
        raise CheckpointError(f"sharded checkpoint {path} cannot be read: {type(err).__name__}") from None
    state = weights.get("state_dict")
    if not isinstance(state, dict):
        raise CheckpointError(f"sharded checkpoint {path} holds no model weights ('state_dict')")
    return {**meta, "state_dict": unpack_state_dict(state), "consolidated_from": str(path)}


class ModelParallelStrategy(strategies.ModelParallelStrategy):
    """Lightning's ``ModelParallelStrategy`` whose sharded saves replace the previous folder in one step.

    Every rank creates one hidden temp folder beside the target and the ranks agree that all of them could before
    the save's first collective (a rank failing alone inside it would leave the others waiting there); each then
    writes its shards (and rank 0 ``meta.pt``) into it, the ranks agree that all of them succeeded, hash their share
    of the files, and rank 0 writes the manifest and publishes the folder (module docstring). When any
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
        digests: dict[str, list] = {}
        if self.reduce_boolean_decision(failure is None, all=True):
            try:
                super().save_checkpoint(checkpoint, partial, storage_options)
            except (Exception, CheckpointException) as err:  # every rank must reach the vote below, or the rest wait
                failure = err
        if self.reduce_boolean_decision(failure is None, all=True):  # every rank's files exist before any is hashed
            try:
                digests = self._digests(partial)
            except OSError as err:
                failure = err
        if self.reduce_boolean_decision(failure is None, all=True):
            files = self._gathered(digests)
            try:  # the manifest ties every file to this save (module docstring)
                if self.global_rank == 0:
                    atomic_write_json(partial / MANIFEST, {"files": dict(sorted(files.items()))})
            except OSError as err:
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

    def _digests(self, folder: Path) -> dict[str, list]:
        """This rank's share of the save's files (every world-th, sorted by name) as ``{name: [size, sha256]}``."""
        names = sorted(p.name for p in folder.iterdir() if p.is_file() and p.name != MANIFEST)
        return {
            name: [(folder / name).stat().st_size, _sha256(folder / name)]
            for name in names[self.global_rank :: self.world_size]
        }

    def _gathered(self, digests: dict[str, list]) -> dict[str, list]:
        """Every rank's digests, on every rank."""
        if not (torch.distributed.is_available() and torch.distributed.is_initialized()) or self.world_size == 1:
            return dict(digests)
        everyone: list[Any] = [None] * self.world_size
        torch.distributed.all_gather_object(everyone, digests)
        return {name: entry for part in everyone for name, entry in part.items()}

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        """Lightning's sharded load (resume, validate, test), after each rank has checked its share of the folder:
        nothing in it is read before it passed :func:`verify_shards`, and ``meta.pt`` loads with weights_only."""
        path = Path(self.broadcast(str(checkpoint_path)))
        if path.is_dir():
            problem = None
            try:
                verify_shards(path, self.global_rank, self.world_size)
            except CheckpointError as err:
                problem = err
            if not self.reduce_boolean_decision(problem is None, all=True):
                raise problem or CheckpointError(f"checkpoint {path}: another rank found it damaged or mixed")
        return super().load_checkpoint(path, weights_only=True)


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
