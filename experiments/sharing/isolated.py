"""Runs :mod:`experiments.sharing.reload` in a fresh interpreter that cannot import the suite.

    python -I -B reload.py JOB.json -I: no PYTHONPATH, no user site, no script directory on sys.path;
                                    -B: no __pycache__ written into an export whose code it imports
    cwd, HOME, HF_HOME              a scratch directory: transformers / diffusers copy the exported code into
                                    their module caches there, so nothing is written elsewhere
    HF_HUB_OFFLINE=1                nothing is downloaded; CUDA hidden: outputs are compared in float32 on CPU

Each item gets an ``io`` directory under the scratch directory; :func:`reload_exports` writes the inputs,
runs the interpreter once for all items (start-up is paid once) and returns the outputs and results.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

from experiments.reliability.errors import SuiteError

RELOAD_SCRIPT = Path(__file__).with_name("reload.py")
PASSED_ENV = ("PATH", "LANG", "LC_ALL", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "TMPDIR")


class ReloadFailed(SuiteError):
    """Loading an export with the ecosystem's own calls failed, or gave other outputs than the suite's network."""


@dataclass
class Reloaded:
    """What the fresh interpreter computed for one export."""

    outputs: dict[str, Tensor]
    result: dict


def reload_exports(
    kind: str, items: list[tuple[Path, dict[str, Tensor], dict]], scratch: Path, timeout_s: float = 900
) -> list[Reloaded]:
    """Loads each ``(folder, inputs, request)`` of format ``kind`` in one fresh interpreter; returns its outputs.

    Each result says whether the suite was importable there (``suite_importable``; it should not be: an
    installed copy of the suite would let a folder that is not self-contained pass).

    Raises:
        ReloadFailed: the interpreter failed (its last error line is in the message).
    """
    scratch.mkdir(parents=True, exist_ok=True)
    # The same intra-op thread count as here: a float reduction split another way can move a decoded pixel by
    # one level, and the check compares decoded images exactly.
    job = {"format": kind, "items": [], "threads": torch.get_num_threads()}
    for i, (folder, inputs, request) in enumerate(items):
        io = scratch / f"item{i}"
        io.mkdir(exist_ok=True)
        save_file({k: v.contiguous() for k, v in inputs.items()}, io / "inputs.safetensors")
        (io / "request.json").write_text(json.dumps(request))
        job["items"].append({"folder": str(folder.resolve()), "io": str(io.resolve())})
    (scratch / "job.json").write_text(json.dumps(job))
    env = {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
    home = str(scratch.resolve())
    env |= {"HOME": home, "HF_HOME": f"{home}/hf", "XDG_CACHE_HOME": f"{home}/cache", "HF_HUB_OFFLINE": "1"}
    env |= {"HF_DATASETS_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": "", "TOKENIZERS_PARALLELISM": "false"}
    command = [sys.executable, "-I", "-B", str(RELOAD_SCRIPT), str((scratch / "job.json").resolve())]
    try:
        done = subprocess.run(command, cwd=scratch, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise ReloadFailed(f"reloading the export did not finish within {timeout_s:.0f} s") from None
    if done.returncode != 0:
        lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
        raise ReloadFailed(
            f"reloading the export in a fresh interpreter failed: {lines[-1] if lines else done.returncode}"
        )
    reloaded = []
    for item in job["items"]:
        io = Path(item["io"])
        result = json.loads((io / "result.json").read_text())
        reloaded.append(Reloaded(load_file(io / "outputs.safetensors"), result))
    return reloaded
