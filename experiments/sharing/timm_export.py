"""ViT -> timm: timm's hub layout plus the module that registers the suite's ViTs with timm.

    DIR/config.json          architecture "suite_vit_<scheme>", num_classes, model_args (the trunk, sizes),
                             pretrained_cfg (the run's eval preprocessing), label_names when the data has them
    DIR/model.safetensors    the evaluated weights (the EMA copy when the run kept one)
    DIR/suite_vit.py         generated from models/wrappers/timm_vit.py and the models/ code it uses

timm has no remote-code loader: a user imports the registration module, then names the folder the timm
way, ``sys.path.insert(0, DIR); import suite_vit; timm.create_model("local-dir:DIR", pretrained=True)``.
The folder is written by timm's own ``save_for_hf`` from a model built by timm's factory.

``pretrained_cfg`` is read off the run's eval transform, so ``resolve_data_config`` + ``create_transform``
rebuild it: Normalize's mean / std, Resize's interpolation and the crop fraction; the embedded datasets
resize whole arrays once (antialiased bilinear) and their eval transform only normalizes, which timm
expresses as a bilinear resize to the input size with ``crop_pct`` 1. The check compares, in a fresh
interpreter without the suite, the reloaded logits with the suite's network and timm's transform of a PNG
with the run's eval transform.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from timm.models import save_for_hf
from torch import Tensor
from torchvision.transforms import v2

from experiments.reliability.errors import SuiteError
from experiments.sharing.checkpoint import RunCheckpoint
from experiments.sharing.isolated import Reloaded, ReloadFailed, reload_exports
from experiments.sharing.report import ExportOptions, ExportReport
from experiments.sharing.source import bundle
from models import count_params

CODE_MODULE, CODE_STEM = "models.wrappers.timm_vit", "suite_vit"
TOLERANCE = 1e-5


def run_datamodule(run: RunCheckpoint) -> Any:
    """The run's DataModule, rebuilt from its saved hyperparameters (no data is read).

    The class path comes from a file the user hands in: only a LightningDataModule of the suite's
    ``datamodules`` package is built (a path naming any other callable is refused, never called).
    """
    import lightning as L

    hp = run.data_hparams
    path = str(hp.get("_class_path", ""))
    module, _, name = path.rpartition(".")
    cls = None
    if module == "datamodules" or module.startswith("datamodules."):
        try:
            cls = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError, ValueError):
            cls = None
    if not (isinstance(cls, type) and issubclass(cls, L.LightningDataModule)):
        raise SuiteError(
            f"checkpoint {run.path} records the DataModule {path!r}; valid: a LightningDataModule of the suite's "
            "datamodules package (its eval transform becomes timm's pretrained_cfg)"
        )
    return cls(**{k: v for k, v in hp.items() if not k.startswith("_")})


def _steps(transform: Any) -> list[Any]:
    return list(getattr(transform, "transforms", [transform]))


def eval_data_config(datamodule: Any) -> dict[str, Any]:
    """timm ``pretrained_cfg`` preprocessing keys that rebuild ``datamodule.eval_transform``.

    Raises:
        SuiteError: the eval transform has a step timm's eval transform cannot express.
    """
    size = int(datamodule.image_size)
    config: dict[str, Any] = {"input_size": (3, size, size), "interpolation": "bilinear", "crop_pct": 1.0}
    scale = size
    for step in _steps(datamodule.eval_transform):
        kind = type(step).__name__
        if kind == "Normalize":
            config["mean"], config["std"] = tuple(map(float, step.mean)), tuple(map(float, step.std))
        elif kind == "Resize":
            config["interpolation"] = step.interpolation.value
            scale = step.size if isinstance(step.size, int) else step.size[0]
        elif kind == "CenterCrop":
            crop = step.size if isinstance(step.size, int) else step.size[0]
            if crop != size:
                raise SuiteError(f"the eval transform crops to {crop} px but the model takes {size} px")
        elif kind not in ("ToDtype", "ToTensor", "MaybeToTensor", "ToImage", "PILToTensor", "Compose"):
            raise SuiteError(f"the run's eval transform has a {kind} step that timm's eval transform cannot express")
    if "mean" not in config:
        raise SuiteError("the run's eval transform does not normalize; valid: a transform ending in Normalize")
    config["crop_pct"] = size / scale
    return config


def suite_transform(datamodule: Any, image: Image.Image) -> Tensor:
    """The run's eval transform of a PIL image (torchvision v2 transforms get the uint8 tensor they are fed)."""
    transform = datamodule.eval_transform
    if isinstance(transform, v2.Transform):
        return transform(torch.from_numpy(np.array(image.convert("RGB"))).permute(2, 0, 1).contiguous())
    return transform(image)


def probe_image(config: dict[str, Any], path: Path) -> Image.Image:
    """A random RGB image, larger than the input when the transform resizes and crops, saved as PNG."""
    side = config["input_size"][-1]
    height, width = (side + 37, side + 11) if config["crop_pct"] < 1 else (side, side)
    pixels = np.random.default_rng(0).integers(0, 256, (height, width, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)
    return Image.open(path)


def compare(net, datamodule, image: Image.Image, inputs: dict[str, Tensor], reloaded: Reloaded) -> list[str]:
    """The check lines; :class:`ReloadFailed` on the first difference."""
    with torch.no_grad():
        want = net(inputs["images"])
    diff = float((reloaded.outputs["logits"] - want).abs().max())
    if diff > TOLERANCE:
        raise ReloadFailed(f"the reloaded model's logits differ from the suite's by {diff:.2e} (> {TOLERANCE:g})")
    ours, theirs = suite_transform(datamodule, image), reloaded.outputs["transformed"]
    if ours.shape != theirs.shape or float((ours - theirs).abs().max()) > TOLERANCE:
        raise ReloadFailed(f"timm's transform of a {image.size} image differs from the run's eval transform")
    return [
        f"logits on {inputs['images'].shape[0]} random images: max |diff| {diff:.1e} (tolerance {TOLERANCE:g})",
        f"resolve_data_config + create_transform of a {image.size[0]}x{image.size[1]} PNG equal the run's eval "
        f"transform ({reloaded.result['data_config']})",
    ]


def export(run: RunCheckpoint, folder: Path, scratch: Path, options: ExportOptions) -> ExportReport:
    """Writes timm's hub layout for a ViT run (and checks it unless ``options.check`` is off)."""
    import timm

    from models.wrappers.timm_vit import PREFIX  # registers suite_vit_<scheme> in this process

    datamodule = run_datamodule(run)
    config = eval_data_config(datamodule)
    net = run.network()
    hp = run.hparams
    model = timm.create_model(
        f"{PREFIX}{run.scheme}",
        trunk=run.hparams["trunk"],
        img_size=int(hp["img_size"]),
        patch_size=int(hp["patch_size"]),
        num_classes=int(hp["num_classes"]),
        pretrained_cfg_overlay={**config, "num_classes": int(hp["num_classes"])},
    )
    model.load_state_dict(net.state_dict())
    names = list(getattr(datamodule, "class_names", None) or [])
    save_for_hf(
        model.eval(), str(folder), model_config={"label_names": names} if names else None, safe_serialization=True
    )
    (folder / f"{CODE_STEM}.py").write_text(
        bundle([CODE_MODULE], title="The SiameseNorm suite's ViT, registered with timm")
    )
    usage = (
        "import sys, timm\n\n"
        'sys.path.insert(0, "DIR")\n'
        "import suite_vit  # registers the suite's ViTs with timm\n\n"
        'model = timm.create_model("local-dir:DIR", pretrained=True).eval()\n'
        "config = timm.data.resolve_data_config({}, model=model)\n"
        "transform = timm.data.create_transform(**config)"
    )
    report = ExportReport("timm", f"{PREFIX}{run.scheme} (SuiteViT)", count_params(net), usage)
    if options.check:
        image = probe_image(config, scratch / "probe.png")
        side = config["input_size"][-1]
        inputs = {"images": torch.randn(2, 3, side, side, generator=torch.Generator().manual_seed(0))}
        request = {"code": CODE_STEM, "image": str((scratch / "probe.png").resolve())}
        (reloaded,) = reload_exports("timm", [(folder, inputs, request)], scratch / "reload")
        report.checks = compare(net, datamodule, image, inputs, reloaded)
        report.load_s = float(reloaded.result["load_s"])
    return report
