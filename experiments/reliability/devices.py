"""``--device`` of the tools (fid, evaluate, lm-eval, prune, logit-lens): checked when the command line is read.

    "cpu"            always
    "cuda", "cuda:N" when torch sees a CUDA device (N below the device count)
    "mps"            when the Apple GPU backend is available

Anything else (``gpu``, ``cuda:7`` on a one-GPU machine, ``tpu``) is a one-line error naming the option, the
value and what this machine offers, before a checkpoint is read or an image is decoded.
"""

from __future__ import annotations

import torch

from experiments.reliability.errors import SuiteError


def available_devices() -> list[str]:
    """The device names this machine accepts: ``cpu``, then ``cuda`` / ``cuda:N`` and ``mps`` when present."""
    names = ["cpu"]
    if torch.cuda.is_available():
        names += ["cuda", *(f"cuda:{i}" for i in range(torch.cuda.device_count()))]
    if torch.backends.mps.is_available():
        names.append("mps")
    return names


def check_device(value: str, option: str = "--device") -> torch.device:
    """The ``torch.device`` named by ``value`` if this machine has it.

    Raises:
        SuiteError: ``"--device 'gpu' is not a device this machine has; valid: cpu, cuda, cuda:0"``.
    """
    valid = ", ".join(available_devices())
    try:
        device = torch.device(value)
    except (RuntimeError, TypeError, ValueError):
        raise SuiteError(f"{option} {value!r} is not a device name; valid: {valid}") from None
    if device.type == "cpu":
        return device
    usable = (device.type == "cuda" and torch.cuda.is_available()) or (
        device.type == "mps" and torch.backends.mps.is_available()
    )
    if device.type == "cuda" and usable and device.index is not None and device.index >= torch.cuda.device_count():
        usable = False
    if not usable:
        raise SuiteError(f"{option} {value!r} is not a device this machine has; valid: {valid}")
    return device
