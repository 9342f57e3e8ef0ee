"""``SuiteDiTPipeline``: the suite's DiT sampler as a diffusers pipeline, shipped inside a DiT export.

    class labels ──> sample_latents(transformer.dit, scheduler, ...) ──> latents ──> vae.decode ──> images

The loop is the suite's own (:func:`experiments.tasks.diffusion.sample_latents`, copied into the export
with the rest of the code it needs): classifier-free guidance against the null class ``num_classes`` on
the run's ``cfg_channels``, the learned variance used by a ``learned_range`` DDPM scheduler, the same
noise for the same generators. So a pipeline call with the run's settings and per-sample generators seeded
as ``predict`` seeds them returns ``predict``'s samples. Diffusers' ``DiTPipeline`` cannot stand in: it
assumes 1000 classes for the null label, guides every latent channel and discards the variance.

Settings default to the run's (``sample_steps``, ``guidance_scale``, ``cfg_channels``, stored in
``model_index.json``); the scheduler is the run's sampling scheduler (``scheduler/``). Without a VAE
(runs on synthetic latents) only ``output_type="latent"`` is available.
"""

from __future__ import annotations

import numpy as np
import PIL.Image
import torch
from diffusers import DiffusionPipeline, ImagePipelineOutput
from torch import Tensor

from experiments.tasks.diffusion import decode_latents, sample_latents

OUTPUT_TYPES = ("pil", "np", "pt", "latent")


class SuiteDiTPipeline(DiffusionPipeline):
    """Class-conditional sampling from an exported suite DiT.

    Args:
        transformer: the ``SuiteDiTTransformer`` (its ``.dit`` is the suite's network).
        scheduler: a diffusers ``DDPMScheduler`` / ``DDIMScheduler`` with the run's training schedule.
        vae: the ``AutoencoderKL`` the latents were encoded with, or None.
        sample_steps: denoising steps of the run's ``predict``.
        guidance_scale: classifier-free guidance scale (1.0: none).
        cfg_channels: latent channels guidance applies to (None: all; 3: the official DiT code's choice).
    """

    model_cpu_offload_seq = "transformer->vae"
    _optional_components = ["vae"]  # runs on synthetic latents have none

    def __init__(
        self,
        transformer,
        scheduler,
        vae=None,
        sample_steps: int = 250,
        guidance_scale: float = 1.0,
        cfg_channels: int | None = None,
    ) -> None:
        super().__init__()
        self.register_modules(transformer=transformer, scheduler=scheduler, vae=vae)
        self.register_to_config(sample_steps=sample_steps, guidance_scale=guidance_scale, cfg_channels=cfg_channels)

    @torch.no_grad()
    def __call__(
        self,
        class_labels: list[int] | Tensor,
        generator: torch.Generator | list[torch.Generator] | None = None,
        num_inference_steps: int | None = None,
        guidance_scale: float | None = None,
        cfg_channels: int | None = -1,
        output_type: str = "pil",
        return_dict: bool = True,
    ) -> ImagePipelineOutput | tuple:
        """Samples one image per label.

        Args:
            class_labels: labels in ``[0, num_classes)``.
            generator: one generator, or one per sample (sample-level noise, as the suite's ``predict``).
            num_inference_steps: defaults to the run's ``sample_steps``.
            guidance_scale: defaults to the run's.
            cfg_channels: defaults (-1) to the run's; None guides every latent channel.
            output_type: "pil" (PIL images), "np" (uint8 NHWC), "pt" (uint8 NCHW, the suite's samples) or
                "latent" (the latents, before the VAE).
        """
        if output_type not in OUTPUT_TYPES:
            raise ValueError(f"output_type={output_type!r}; valid: {', '.join(OUTPUT_TYPES)}")
        if output_type != "latent" and self.vae is None:
            raise ValueError(
                "this export has no VAE (its run trained on latents without one); use output_type='latent'"
            )
        config, dit = self.transformer.config, self.transformer.dit
        labels = torch.as_tensor(class_labels, dtype=torch.long, device=self._execution_device).reshape(-1)
        if bool(((labels < 0) | (labels >= dit.num_classes)).any()):
            raise ValueError(f"class labels must lie in [0, {dit.num_classes}), got {labels.tolist()}")
        latents = sample_latents(
            dit.eval(),
            self.scheduler,
            labels,
            (config.in_channels, config.sample_size, config.sample_size),
            num_inference_steps or self.config.sample_steps,
            self.config.guidance_scale if guidance_scale is None else guidance_scale,
            generator,
            self.config.cfg_channels if cfg_channels == -1 else cfg_channels,
        )
        if output_type == "latent":
            images = latents
        else:
            images = decode_latents(self.vae, latents)  # uint8 (B, 3, H, W)
            if output_type != "pt":
                images = images.permute(0, 2, 3, 1).cpu().numpy()  # (B, H, W, 3)
                images = (
                    [PIL.Image.fromarray(np.ascontiguousarray(a)) for a in images] if output_type == "pil" else images
                )
        return ImagePipelineOutput(images=images) if return_dict else (images,)
