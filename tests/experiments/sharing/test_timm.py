"""ViT -> timm: every scheme's export loads with ``timm.create_model("local-dir:...")`` in an interpreter that cannot
import the suite, gives the suite's logits (the EMA weights where the run evaluates them), and timm's own
``resolve_data_config`` / ``create_transform`` rebuild the run's eval transform."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from experiments.sharing import timm_export
from experiments.sharing.checkpoint import read_run_checkpoint
from experiments.sharing.isolated import Reloaded, reload_exports
from experiments.sharing.report import ExportOptions
from tests.experiments.sharing.conftest import IMAGE_DATA, SCHEMES, save_run, vit_module

CLASS_PATH = "experiments.tasks.ImageClassification"


@pytest.fixture(scope="module")
def vit_exports(tmp_path_factory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("vit")
    exports = {}
    for seed, name in enumerate(SCHEMES):
        module = vit_module(name, seed)
        run = read_run_checkpoint(save_run(root, name, module, CLASS_PATH, IMAGE_DATA))
        folder = root / "exports" / name
        folder.mkdir(parents=True)
        timm_export.export(run, folder, root / "scratch" / name, ExportOptions(check=False))
        exports[name] = (module, run, folder)
    return root, exports


@pytest.fixture(scope="module")
def vit_reloaded(vit_exports) -> dict[str, tuple[dict, Reloaded]]:
    """All exports loaded in ONE fresh interpreter without the suite; each also transforms one 16x16 PNG."""
    root, exports = vit_exports
    image = root / "probe.png"
    Image.fromarray(np.random.default_rng(1).integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(image)
    inputs = {"images": torch.randn(3, 3, 16, 16)}
    items = [(folder, inputs, {"code": "suite_vit", "image": str(image)}) for _, _, folder in exports.values()]
    reloaded = reload_exports("timm", items, root / "reload")
    return {name: (inputs, r) for name, r in zip(exports, reloaded, strict=True)}


def test_the_folder_is_timms_hub_layout_and_needs_nothing_of_the_suite(vit_exports, vit_reloaded):
    _, exports = vit_exports
    for name, (module, _, folder) in exports.items():
        config = json.loads((folder / "config.json").read_text())
        assert config["architecture"] == f"suite_vit_{module.trunk_cfg.norm_scheme}"
        assert config["num_classes"] == 10 and config["model_args"]["trunk"] == module.hparams.trunk.__dict__
        assert config["pretrained_cfg"]["input_size"] == [3, 16, 16]
        assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors", "suite_vit.py"]
        result = vit_reloaded[name][1].result
        assert result["suite_importable"] is False and result["model_class"] == "SuiteViT", name


@pytest.mark.parametrize("name", SCHEMES)
def test_logits_equal_the_evaluated_networks(name, vit_exports, vit_reloaded):
    module, _, folder = vit_exports[1][name]
    inputs, reloaded = vit_reloaded[name]
    evaluated = module.ema.module if module.ema is not None else module.net  # what the run's val/test used
    with torch.no_grad():
        want = evaluated(inputs["images"])
    torch.testing.assert_close(reloaded.outputs["logits"], want, atol=1e-5, rtol=0)
    if module.ema is not None:  # the EMA copy, not the trained weights, went into the file
        stored = load_file(folder / "model.safetensors")["head.weight"]
        assert torch.equal(stored, module.ema.module.head.weight) and not torch.equal(stored, module.net.head.weight)


def test_timms_transform_is_the_runs_eval_transform(vit_exports, vit_reloaded):
    root, exports = vit_exports
    _, run, _ = exports["pre"]
    datamodule = timm_export.run_datamodule(run)
    pixels = torch.from_numpy(np.array(Image.open(root / "probe.png"))).permute(2, 0, 1)  # uint8 (3, 16, 16)
    mean = torch.tensor([0.485, 0.456, 0.406])[:, None, None]  # timm's ImageNet constants, written out
    std = torch.tensor([0.229, 0.224, 0.225])[:, None, None]
    want = (pixels.double() / 255 - mean) / std  # what the embedded data's eval transform computes
    for _, reloaded in vit_reloaded.values():
        torch.testing.assert_close(reloaded.outputs["transformed"].double(), want, atol=1e-6, rtol=0)
    torch.testing.assert_close(datamodule.eval_transform(pixels).double(), want, atol=1e-6, rtol=0)


def test_an_image_folder_runs_resize_and_crop_become_timms_data_config(tmp_path):
    from timm.data import create_transform

    from datamodules.images.folder import ImageFolderDataModule

    datamodule = ImageFolderDataModule(root=str(tmp_path), image_size=32, interpolation="bicubic", eval_crop_pct=0.8)
    config = timm_export.eval_data_config(datamodule)
    assert config["crop_pct"] == pytest.approx(0.8) and config["interpolation"] == "bicubic"
    assert config["input_size"] == (3, 32, 32) and config["mean"] == pytest.approx((0.485, 0.456, 0.406))
    image = timm_export.probe_image(config, tmp_path / "probe.png")
    assert image.size == (43, 69)  # larger than the input and not square: resize and crop both act
    got = create_transform(**config)(image.convert("RGB"))
    torch.testing.assert_close(got, timm_export.suite_transform(datamodule, image), atol=1e-6, rtol=0)
    assert got.shape == (3, 32, 32)


def test_the_check_compares_with_the_network(vit_exports, vit_reloaded):
    from experiments.sharing.isolated import ReloadFailed

    root, exports = vit_exports
    module, run, _ = exports["hyper"]
    inputs, reloaded = vit_reloaded["hyper"]
    datamodule = timm_export.run_datamodule(run)
    image = Image.open(root / "probe.png")
    assert len(timm_export.compare(module.net, datamodule, image, inputs, reloaded)) == 2
    shifted = Reloaded({**reloaded.outputs, "logits": reloaded.outputs["logits"] + 1e-4}, reloaded.result)
    with pytest.raises(ReloadFailed, match="logits differ"):
        timm_export.compare(module.net, datamodule, image, inputs, shifted)


def test_the_plain_weights_file_route_loads_the_head_or_refuses(vit_exports):
    """``create_model(..., pretrained=True, pretrained_cfg_overlay=dict(file=...))``: timm would drop the head
    whenever the registered default config's class count (1000) differs from the model's, leaving a random one
    with only an INFO log. With the export's sizes the head loads; without a class count the load is refused
    with the one to pass; an explicit other count gets timm's fresh head, as asked."""
    import timm

    import models.wrappers.timm_vit  # noqa: F401 - registers suite_vit_<scheme> here

    _, exports = vit_exports
    module, run, folder = exports["pre"]
    args = json.loads((folder / "config.json").read_text())["model_args"]
    file = {"file": str(folder / "model.safetensors")}
    loaded = timm.create_model("suite_vit_pre", pretrained=True, pretrained_cfg_overlay=file, **args).eval()
    images = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(loaded(images), module.net(images), atol=1e-5, rtol=0)  # the trained head
    without = {k: v for k, v in args.items() if k != "num_classes"}
    with pytest.raises(ValueError, match=r"the weights' classifier has 10 classes .* pass num_classes=10"):
        timm.create_model("suite_vit_pre", pretrained=True, pretrained_cfg_overlay=file, **without)
    new_head = timm.create_model(
        "suite_vit_pre", pretrained=True, pretrained_cfg_overlay=file, **{**args, "num_classes": 3}
    )
    assert new_head.head.out_features == 3  # fine-tuning to 3 classes: asked for, so timm's fresh head
