"""DiT -> diffusers: every scheme's export loads with ``DiffusionPipeline.from_pretrained(trust_remote_code=True)`` in
an interpreter that cannot import the suite, and the pipeline, at the run's settings, returns the samples of the
suite's ``predict`` path (``LatentDiffusion.generate``: EMA weights, the run's sampler, guidance and guided
channels, per-sample seeds), decoded by the shipped VAE where the run has one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from experiments.sharing import diffusers_export
from experiments.sharing.checkpoint import read_run_checkpoint
from experiments.sharing.isolated import Reloaded, reload_exports
from experiments.sharing.report import ExportOptions
from experiments.tasks.sampling import SEED_STRIDE
from tests.experiments.sharing.conftest import DIT_SETTINGS, LATENT_DATA, SCHEMES, dit_module, save_run

CLASS_PATH = "experiments.tasks.LatentDiffusion"
LABELS, ROWS = [3, 7, 0], [0, 1, 2]  # predict's rows: sample r is seeded sample_seed * 2**32 + r


@pytest.fixture(scope="module")
def dit_exports(tmp_path_factory, tiny_vae) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("dit")
    exports = {}
    for seed, name in enumerate(SCHEMES):
        module = dit_module(name, seed, tiny_vae)
        run = read_run_checkpoint(save_run(root, name, module, CLASS_PATH, LATENT_DATA))
        folder = root / "exports" / name
        folder.mkdir(parents=True)
        diffusers_export.export(run, folder, root / "scratch" / name, ExportOptions(check=False))
        exports[name] = (module, folder)
    return root, exports


@pytest.fixture(scope="module")
def dit_reloaded(dit_exports) -> dict[str, Reloaded]:
    """Every pipeline run in ONE fresh interpreter without the suite, at its defaults (the run's settings)."""
    root, exports = dit_exports
    items = []
    for name, (module, folder) in exports.items():
        seeds = [module.hparams.sample_seed * SEED_STRIDE + r for r in ROWS]
        output = "pt" if DIT_SETTINGS[name][4] else "latent"
        request = {"labels": LABELS, "seeds": seeds, "steps": None, "output_type": output}
        items.append((folder, {"labels": torch.tensor(LABELS)}, request))
    reloaded = reload_exports("diffusers", items, root / "reload")
    return dict(zip(exports, reloaded, strict=True))


def test_the_folder_is_a_diffusers_pipeline_that_needs_nothing_of_the_suite(dit_exports, dit_reloaded):
    _, exports = dit_exports
    for name, (module, folder) in exports.items():
        index = json.loads((folder / "model_index.json").read_text())
        assert index["_class_name"] == ["pipeline_suite_dit", "SuiteDiTPipeline"]
        assert index["transformer"] == ["modeling_suite_dit", "SuiteDiTTransformer"]
        sampler = {"ddpm": "DDPMScheduler", "ddim": "DDIMScheduler"}[module.hparams.sampler]
        assert index["scheduler"] == ["diffusers", sampler]
        has_vae = DIT_SETTINGS[name][4]
        assert index["vae"] == (["diffusers", "AutoencoderKL"] if has_vae else [None, None])
        assert (index["sample_steps"], index["guidance_scale"], index["cfg_channels"]) == (
            module.hparams.sample_steps, module.hparams.guidance_scale, module.hparams.cfg_channels,
        )  # fmt: skip
        assert (folder / "transformer" / "diffusion_pytorch_model.safetensors").is_file()
        assert not [p for p in folder.rglob("*") if p.suffix in (".bin", ".pt", ".pth", ".ckpt", ".pkl")]  # no pickles
        assert (folder / "vae" / "diffusion_pytorch_model.safetensors").is_file() == has_vae
        result = dit_reloaded[name].result
        assert result["suite_importable"] is False and result["transformer_class"] == "SuiteDiTTransformer", name


@pytest.mark.parametrize("name", SCHEMES)
def test_the_pipeline_reproduces_predict(name, dit_exports, dit_reloaded):
    module, _ = dit_exports[1][name]
    decode = DIT_SETTINGS[name][4]
    seeds = [module.hparams.sample_seed * SEED_STRIDE + r for r in ROWS]
    want = module.generate(torch.tensor(LABELS), seeds, decode=decode)  # what predict_step computes and saves
    got = dit_reloaded[name].outputs["samples"]
    if decode:
        assert got.dtype == torch.uint8 and torch.equal(got, want)  # the PNGs predict writes, exactly
    else:
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    other = module.generate(torch.tensor(LABELS), [s + 1 for s in seeds], decode=decode)
    assert not torch.equal(other, want)  # the seeds matter: the agreement above is not trivial


def test_the_export_check_compares_with_the_suites_sampler(dit_exports, dit_reloaded, tiny_vae):
    """The command's own check on the reloaded samples: passes, and fails on a one-level difference."""
    from experiments.sharing.isolated import ReloadFailed

    root, exports = dit_exports
    run = read_run_checkpoint(root / "runs" / "dit" / "tiny" / "siamese" / "checkpoints" / "last.ckpt")
    module, _ = exports["siamese"]
    seeds = [module.hparams.sample_seed * SEED_STRIDE + r for r in ROWS]
    request = {"labels": LABELS, "seeds": seeds, "steps": None, "output_type": "pt"}
    reloaded = dit_reloaded["siamese"]
    (line,) = diffusers_export.compare(run, run.network(), tiny_vae, request, reloaded)
    assert "decoded uint8 images identical" in line and "ddpm, 4 steps, guidance 1.5" in line
    images = reloaded.outputs["samples"].clone()
    images[0, 0, 0, 0] ^= 1
    with pytest.raises(ReloadFailed, match="samples differ"):
        diffusers_export.compare(run, run.network(), tiny_vae, request, Reloaded({"samples": images}, {}))
