"""DiT -> diffusers: the layout ``DiffusionPipeline.from_pretrained(DIR, trust_remote_code=True)`` reads.

    DIR/model_index.json                        _class_name ["pipeline_suite_dit", "SuiteDiTPipeline"], the
                                                components, the run's sample_steps / guidance_scale / cfg_channels
    DIR/pipeline_suite_dit.py                   generated from experiments/sharing/dit_pipeline.py (the suite's
                                                sampling loop included)
    DIR/transformer/config.json, diffusion_pytorch_model.safetensors
                                                SuiteDiTTransformer with the EMA weights
    DIR/transformer/modeling_suite_dit.py       generated from models/wrappers/diffusers_dit.py and models/
    DIR/scheduler/scheduler_config.json         the run's sampling scheduler (DDPM with learned variance, or DDIM)
    DIR/vae/                                    the run's AutoencoderKL (absent for runs on latents without one)

diffusers' ``save_pretrained`` writes the folder from the suite's classes; ``model_index.json`` then names
the code files instead of the suite's modules, which is how diffusers finds custom components and pipelines
in a folder. The check samples, in a fresh interpreter without the suite, a few labels with per-sample
generators and compares with the suite's sampler on the same weights: latents to 1e-5, decoded images exactly.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from experiments.sharing.checkpoint import RunCheckpoint
from experiments.sharing.isolated import Reloaded, ReloadFailed, reload_exports
from experiments.sharing.report import ExportOptions, ExportReport
from experiments.sharing.source import bundle
from experiments.sharing.vae import vae_directory
from experiments.tasks.diffusion import decode_latents, make_scheduler, sample_latents
from models import count_params

PIPELINE_MODULE, PIPELINE_STEM = "experiments.sharing.dit_pipeline", "pipeline_suite_dit"
MODEL_MODULE, MODEL_STEM = "models.wrappers.diffusers_dit", "modeling_suite_dit"
CHECK_STEPS, CHECK_SEEDS = 3, (0, 1)  # a short chain: the per-step math is what is compared
TOLERANCE = 1e-5


def write(run: RunCheckpoint, net, vae_path: Path | None, folder: Path) -> None:
    """Saves the pipeline (transformer, scheduler, VAE, sampling settings) and its generated code into ``folder``."""
    from experiments.sharing.dit_pipeline import SuiteDiTPipeline
    from models.vae import load_vae
    from models.wrappers.diffusers_dit import SuiteDiTTransformer

    hp = run.hparams
    transformer = SuiteDiTTransformer(
        trunk=hp["trunk"],
        sample_size=int(hp["latent_size"]),
        patch_size=int(hp["patch_size"]),
        in_channels=int(hp["latent_channels"]),
        num_classes=int(hp["num_classes"]),
        class_dropout_prob=float(hp["class_dropout_prob"]),
        learn_sigma=bool(hp["learn_sigma"]),
    )
    transformer.dit.load_state_dict(net.state_dict())
    scheduler = make_scheduler(
        hp["sampler"], int(hp["num_train_timesteps"]), hp["beta_schedule"], bool(hp["learn_sigma"])
    )
    pipe = SuiteDiTPipeline(
        transformer.eval(),
        scheduler,
        load_vae(str(vae_path)) if vae_path is not None else None,
        sample_steps=int(hp["sample_steps"]),
        guidance_scale=float(hp["guidance_scale"]),
        cfg_channels=hp.get("cfg_channels"),
    )
    pipe.save_pretrained(folder, safe_serialization=True)
    index_path = folder / "model_index.json"
    index = json.loads(index_path.read_text())
    index["_class_name"] = [PIPELINE_STEM, "SuiteDiTPipeline"]  # diffusers loads a pipeline class from the folder
    index["transformer"] = [MODEL_STEM, "SuiteDiTTransformer"]  # ... and a component from its subfolder
    index_path.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    title = "The SiameseNorm suite's {} for diffusers"
    (folder / f"{PIPELINE_STEM}.py").write_text(bundle([PIPELINE_MODULE], title=title.format("DiT sampler")))
    (folder / "transformer" / f"{MODEL_STEM}.py").write_text(bundle([MODEL_MODULE], title=title.format("DiT")))


def check_inputs(run: RunCheckpoint, vae_path: Path | None) -> tuple[dict[str, torch.Tensor], dict]:
    """A few labels and per-sample seeds, sampled for ``CHECK_STEPS`` steps (decoded when there is a VAE)."""
    labels = [i % int(run.hparams["num_classes"]) for i in range(len(CHECK_SEEDS))]
    output = "pt" if vae_path is not None else "latent"
    request = {"labels": labels, "seeds": list(CHECK_SEEDS), "steps": CHECK_STEPS, "output_type": output}
    return {"labels": torch.tensor(labels)}, request


def reference_samples(run: RunCheckpoint, net, vae_path: Path | None, request: dict) -> torch.Tensor:
    """What the suite's own sampler (``LatentDiffusion.generate``'s steps) gives for ``request``."""
    from models.vae import load_vae

    hp = run.hparams
    scheduler = make_scheduler(
        hp["sampler"], int(hp["num_train_timesteps"]), hp["beta_schedule"], bool(hp["learn_sigma"])
    )
    generators = [torch.Generator().manual_seed(s) for s in request["seeds"]]
    shape = (int(hp["latent_channels"]), int(hp["latent_size"]), int(hp["latent_size"]))
    latents = sample_latents(
        net, scheduler, torch.tensor(request["labels"]), shape, request["steps"] or int(hp["sample_steps"]),
        float(hp["guidance_scale"]), generators, hp.get("cfg_channels"),
    )  # fmt: skip
    return latents if vae_path is None else decode_latents(load_vae(str(vae_path)).eval(), latents)


def compare(run: RunCheckpoint, net, vae_path: Path | None, request: dict, reloaded: Reloaded) -> list[str]:
    """The check line; :class:`ReloadFailed` when the pipeline's samples are not the suite sampler's."""
    want = reference_samples(run, net, vae_path, request)
    got = reloaded.outputs["samples"]
    diff = float((got.double() - want.double()).abs().max()) if got.shape == want.shape else float("inf")
    if diff > (0 if vae_path is not None else TOLERANCE):
        raise ReloadFailed(f"the pipeline's samples differ from the suite's sampler by {diff:.2e}")
    what = "decoded uint8 images identical" if vae_path is not None else f"latents max |diff| {diff:.1e}"
    hp = run.hparams
    return [
        f"{len(request['labels'])} samples ({hp['sampler']}, {request['steps'] or hp['sample_steps']} steps, guidance "
        f"{hp['guidance_scale']}, per-sample seeds): {what} to the suite's sampler"
    ]


def export(run: RunCheckpoint, folder: Path, scratch: Path, options: ExportOptions) -> ExportReport:
    """Writes the diffusers folder for a DiT run (and checks it unless ``options.check`` is off)."""
    vae_path = vae_directory(run, options)
    net = run.network()
    write(run, net, vae_path, folder)
    usage = (
        "import torch\nfrom diffusers import DiffusionPipeline\n\n"
        'pipe = DiffusionPipeline.from_pretrained("DIR", trust_remote_code=True)\n'
        "generators = [torch.Generator().manual_seed(s) for s in (0, 1)]\n"
        f'samples = pipe([0, 1], generator=generators, output_type="{"pil" if vae_path else "latent"}").images'
    )
    report = ExportReport("diffusers", "SuiteDiTPipeline (transformer: SuiteDiTTransformer)", count_params(net), usage)
    if vae_path is None:
        report.notes.append("no VAE: the run trained on latents without one, so the pipeline returns latents only")
    report.notes.append(
        "diffusers' DiTPipeline is not a substitute: it assumes 1000 classes (null label 1000), guides every latent "
        "channel and drops the learned variance; FID stays on the suite's sampler (this pipeline runs it)"
    )
    if options.check:
        inputs, request = check_inputs(run, vae_path)
        (reloaded,) = reload_exports("diffusers", [(folder, inputs, request)], scratch / "reload")
        report.checks = compare(run, net, vae_path, request, reloaded)
        report.load_s = float(reloaded.result["load_s"])
    return report
