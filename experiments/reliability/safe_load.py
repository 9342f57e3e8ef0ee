"""The one way the suite reads a checkpoint, weights or array file a user hands in: nothing in it can run code.

    checkpoint (.ckpt)       load_checkpoint  torch.load(weights_only=True), SAFE_GLOBALS allowed; a
                                              truncated file is named before torch reads it
    weights (.pt / .pth)     load_weights     the same, and it must be a flat {name: tensor} state dict
    arrays (.npz / .npy)     load_arrays      np.load(allow_pickle=False)

Python's pickle runs whatever a file tells it to; ``weights_only=True`` restricts unpickling to tensors,
containers and plain scalars, plus the types allow-listed here. The suite's own checkpoints need none
beyond those: hyperparameters are saved as plain dicts (the config dataclasses are converted by
LightningCLI), RNG states as tensors and tuples (:func:`experiments.reliability.checkpointing.rng_states`).
``tests/experiments/test_untrusted_files.py`` checks both: a checkpoint of every task loads, and every
loader refuses a pickle that would create a file.

Other user-given files are safe by format: tokenizer directories hold JSON (``datamodules.text.tokenizers``),
VAE directories safetensors or a ``.bin`` that diffusers reads with ``weights_only=True`` (``models.vae``),
configs are read with ``yaml.safe_load`` / jsonargparse.
"""

from __future__ import annotations

import pickle
import re
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from experiments.reliability.errors import CheckpointError, SuiteError
from experiments.reliability.sharded import consolidate, sharded_problem, verify_shards

# Plain types beyond torch's defaults that a suite checkpoint may hold. Empty on purpose: everything the
# suite writes is tensors, dicts, lists, tuples, str, int, float, bool and None. Add a type here only if
# it is plain data (no __reduce__ that calls out) and the checkpoint cannot store it as a builtin.
SAFE_GLOBALS: tuple[type, ...] = ()
if SAFE_GLOBALS:
    torch.serialization.add_safe_globals(list(SAFE_GLOBALS))

_GLOBAL = re.compile(r"GLOBAL ([\w.]+)")


def checkpoint_problem(path: str | Path, verify: bool = False) -> str | None:
    """Why ``path`` is not a readable checkpoint ("does not exist", "is truncated ..."), or None.

    Cheap: reads the zip central directory torch.save writes at the end of the file, which a file cut
    short lacks. A sharded checkpoint (a folder) must be complete, of one save and safe to unpickle
    (:mod:`experiments.reliability.sharded`); ``verify`` also hashes its files against its manifest (it reads
    them all: for the one checkpoint a command is about to load).
    """
    path = Path(path)
    if not path.exists():
        return "does not exist"
    if path.is_dir():
        if not verify:
            return sharded_problem(path)
        try:
            verify_shards(path)
        except CheckpointError as err:
            return str(err).removeprefix(f"checkpoint {path} ")
        return None
    size = path.stat().st_size
    if size == 0:
        return "is empty (0 bytes)"
    try:
        with zipfile.ZipFile(path) as archive:
            infos = archive.infolist()
    except zipfile.BadZipFile:
        return f"is truncated or corrupt ({size} bytes, no zip directory at its end)"
    except OSError as err:
        return f"cannot be read ({err.strerror or err})"
    if not any(info.filename.endswith("data.pkl") for info in infos):
        return "is not a torch checkpoint (a zip file without data.pkl)"
    if any(info.header_offset + info.compress_size > size for info in infos):
        return f"is truncated ({size} bytes, shorter than its zip directory says)"
    return None


def _refused(what: str, path: Path, err: Exception) -> SuiteError:
    """The one-line error for a file whose unpickling needs more than plain data."""
    found = _GLOBAL.search(str(err))
    culprit = f" ({found[1]})" if found else ""
    return CheckpointError(
        f"{what} {path} holds a Python object{culprit} that only an unsafe unpickle would build; the suite reads "
        "such files with torch.load(weights_only=True) and refuses it (save tensors and plain data instead)"
    )


def load_checkpoint(path: str | Path, map_location: Any = "cpu", mmap: bool = False) -> dict[str, Any]:
    """Reads a checkpoint written by ``torch.save`` without running code from it.

    Args:
        path: the file, or a sharded checkpoint's folder (its weights consolidated in memory, after every file was
            checked: :func:`experiments.reliability.sharded.consolidate`).
        map_location: passed to ``torch.load`` (CPU by default).
        mmap: memory-map the tensors instead of reading them (cheap inspection of a large file).

    Raises:
        CheckpointError: missing, truncated or corrupt, or it needs unpickling beyond plain data (one line).
    """
    path = Path(path)
    if problem := checkpoint_problem(path):
        raise CheckpointError(f"checkpoint {path} {problem}")
    if path.is_dir():
        return consolidate(path)
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap or None)
    except pickle.UnpicklingError as err:
        if "weights_only" in str(err) or "Weights only load failed" in str(err):
            raise _refused("checkpoint", path, err) from None
        raise CheckpointError(f"checkpoint {path} cannot be read: {_first_line(err)}") from None
    except (EOFError, RuntimeError, zipfile.BadZipFile) as err:  # damage the zip check cannot see
        raise CheckpointError(f"checkpoint {path} cannot be read: {_first_line(err)}") from None
    if not isinstance(payload, dict):
        raise CheckpointError(f"checkpoint {path} holds a {type(payload).__name__}, not a checkpoint dict")
    return payload


def load_weights(path: str | Path, what: str = "weights file") -> dict[str, torch.Tensor]:
    """Reads a plain state dict ``{name: tensor}`` (e.g. InceptionV3 weights) without running code from it.

    Raises:
        CheckpointError: as :func:`load_checkpoint`, or the file is not a flat mapping of tensors.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{what} {path} does not exist")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        raise _refused(what, path, err) from None
    except (EOFError, RuntimeError, zipfile.BadZipFile) as err:
        raise CheckpointError(f"{what} {path} cannot be read: {_first_line(err)}") from None
    if not isinstance(payload, Mapping) or not all(isinstance(v, torch.Tensor) for v in payload.values()):
        raise CheckpointError(f"{what} {path} is not a state dict of tensors ({type(payload).__name__})")
    return dict(payload)


def load_arrays(path: str | Path, mmap_mode: str | None = None) -> dict[str, np.ndarray] | np.ndarray:
    """Reads a ``.npz`` (all its arrays, as a dict) or a ``.npy`` (the array) with ``allow_pickle=False``.

    Raises:
        SuiteError: the file is missing, not NumPy's format, or holds object arrays (pickles) (one line).
    """
    path = Path(path)
    if not path.is_file():
        raise SuiteError(f"array file {path} does not exist")
    try:
        loaded = np.load(path, mmap_mode=mmap_mode, allow_pickle=False)
        if isinstance(loaded, np.lib.npyio.NpzFile):
            with loaded:
                return {key: loaded[key] for key in loaded.files}
        return loaded
    except ValueError as err:
        if "allow_pickle" in str(err):
            raise SuiteError(
                f"array file {path} holds Python objects (a pickle); refused: only numeric arrays load"
            ) from None
        raise SuiteError(f"array file {path} cannot be read: {_first_line(err)}") from None
    except (OSError, EOFError, zipfile.BadZipFile) as err:
        raise SuiteError(f"array file {path} cannot be read: {_first_line(err)}") from None


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
