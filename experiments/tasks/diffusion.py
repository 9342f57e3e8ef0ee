"""The diffusion math that is ours: the CFG sampling loop and the learned-variance VLB term.

Noise schedules and the per-step updates come from diffusers (``DDPMScheduler``, ``DDIMScheduler``);
diffusers' DiTPipeline hard-codes 1000 classes, so the loop over timesteps lives here.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from diffusers import DDIMScheduler, DDPMScheduler
from diffusers.utils.torch_utils import randn_tensor
from torch import Tensor

from models.dit import DiT

SAMPLERS = ("ddpm", "ddim")


def make_scheduler(kind: str, num_train_timesteps: int, beta_schedule: str, learn_sigma: bool):
    """A diffusers scheduler with DiT's training schedule (linear betas 1e-4..2e-2 over 1000 steps)."""
    common = dict(num_train_timesteps=num_train_timesteps, beta_schedule=beta_schedule, clip_sample=False)
    if kind == "ddpm":
        return DDPMScheduler(**common, variance_type="learned_range" if learn_sigma else "fixed_small")
    if kind == "ddim":
        return DDIMScheduler(**common, set_alpha_to_one=False)
    raise ValueError(f"unknown sampler {kind!r}; valid: {', '.join(SAMPLERS)}")


def guided_prediction(
    net: DiT, x: Tensor, t: Tensor, labels: Tensor, guidance: float, cfg_channels: int | None = None
) -> Tensor:
    """The model output used for one sampling step; classifier-free guidance when ``guidance != 1``.

    The guided branch runs ``[x, x]`` with ``[labels, null]`` through :meth:`DiT.forward_with_cfg`;
    ``cfg_channels`` is passed on (None: every latent channel; 3: the official DiT sampling code).
    """
    if guidance == 1.0:
        return net(x, t, labels)
    null = torch.full_like(labels, net.num_classes)
    out = net.forward_with_cfg(torch.cat([x, x]), torch.cat([t, t]), torch.cat([labels, null]), guidance, cfg_channels)
    return out[: len(x)]


@torch.no_grad()
def sample_latents(
    net: DiT,
    scheduler,
    labels: Tensor,
    latent_shape: tuple[int, int, int],
    steps: int,
    guidance: float = 1.0,
    generator: torch.Generator | list[torch.Generator] | None = None,
    cfg_channels: int | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> Tensor:
    """Ancestral (DDPM) or deterministic (DDIM) sampling from pure noise: ``(B, C, h, w)`` latents.

    Args:
        generator: one for the batch, or one per sample (then each sample's starting noise and DDPM
            noise depend on its own generator only, whatever else is in the batch).
        should_stop: checked before every denoising step; True raises ``InterruptedError``.
    """
    scheduler.set_timesteps(steps)
    x = randn_tensor((len(labels), *latent_shape), generator=generator, device=labels.device)
    learned = getattr(scheduler.config, "variance_type", None) == "learned_range"
    for t in scheduler.timesteps:
        if should_stop is not None and should_stop():
            raise InterruptedError(f"sampling stopped before step {int(t)}")
        out = guided_prediction(net, x, t.expand(len(x)).to(labels.device), labels, guidance, cfg_channels)
        out = out if learned else out[:, : latent_shape[0]]  # drop predicted variance where unused
        x = scheduler.step(out, t, x, generator=generator).prev_sample
    return x


def decode_latents(vae, latents: Tensor) -> Tensor:
    """Latents -> uint8 images ``(B, 3, H, W)`` through the VAE decoder (latents scaled back by its factor)."""
    images = vae.decode(latents / vae.config.scaling_factor).sample
    return ((images.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)


def _normal_kl(mean1: Tensor, logvar1: Tensor, mean2: Tensor, logvar2: Tensor) -> Tensor:
    return 0.5 * (-1.0 + logvar2 - logvar1 + torch.exp(logvar1 - logvar2) + (mean1 - mean2) ** 2 * torch.exp(-logvar2))


def vlb_term(scheduler: DDPMScheduler, x0: Tensor, xt: Tensor, t: Tensor, eps: Tensor, var_out: Tensor) -> Tensor:
    """Improved-DDPM's variational bound for the learned variance (per sample, in bits per dim).

    The mean comes from the (detached) epsilon prediction, so this term trains only the variance,
    as in ADM/DiT; ``var_out`` in [-1, 1] interpolates log-variance between the posterior's and beta_t.
    """
    ac = scheduler.alphas_cumprod.to(x0.device)
    betas = scheduler.betas.to(x0.device)
    a_t = ac[t].view(-1, 1, 1, 1)
    a_prev = torch.where(t > 0, ac[(t - 1).clamp(min=0)], torch.ones_like(t, dtype=ac.dtype)).view(-1, 1, 1, 1)
    beta_t = betas[t].view(-1, 1, 1, 1)
    post_var = beta_t * (1 - a_prev) / (1 - a_t)
    # ADM clips the log posterior variance at t = 0 (where it is 0) to its value at t = 1.
    var_1 = betas[1] * (1 - ac[0]) / (1 - ac[1])
    post_logvar = torch.log(torch.where(t.view(-1, 1, 1, 1) == 0, var_1, post_var))
    coef_x0, coef_xt = a_prev.sqrt() * beta_t / (1 - a_t), (1 - beta_t).sqrt() * (1 - a_prev) / (1 - a_t)
    true_mean = coef_x0 * x0 + coef_xt * xt  # mean of q(x_{t-1} | x_t, x_0)
    frac = (var_out + 1) / 2
    model_logvar = frac * torch.log(beta_t) + (1 - frac) * post_logvar
    pred_x0 = (xt - (1 - a_t).sqrt() * eps.detach()) / a_t.sqrt()
    model_mean = coef_x0 * pred_x0 + coef_xt * xt  # the same posterior, with the predicted x_0
    kl = _normal_kl(true_mean, post_logvar, model_mean, model_logvar).mean(dim=(1, 2, 3)) / math.log(2.0)
    # t = 0: Gaussian negative log-likelihood of x0 under the decoder (continuous data: latents).
    nll = 0.5 * (model_logvar + (x0 - model_mean) ** 2 / model_logvar.exp() + math.log(2 * math.pi))
    nll = nll.mean(dim=(1, 2, 3)) / math.log(2.0)
    return torch.where(t == 0, nll, kl)


def check_sampling_settings(
    sampler: str,
    steps: int,
    guidance: float,
    cfg_channels: int | None,
    latent_channels: int,
    ema_decay: float,
    class_dropout_prob: float,
) -> None:
    """Range checks of the sampling hyperparameters, each naming its field."""
    if sampler not in SAMPLERS:
        raise ValueError(f"model.init_args.sampler={sampler!r}; valid: {', '.join(SAMPLERS)}")
    checks = [
        ("sample_steps", steps, steps >= 1, ">= 1"),
        ("guidance_scale", guidance, guidance >= 0, ">= 0 (1.0: no guidance)"),
        ("ema_decay", ema_decay, 0 <= ema_decay < 1, "in [0, 1)"),
        ("class_dropout_prob", class_dropout_prob, 0 <= class_dropout_prob < 1, "in [0, 1)"),
    ]
    if cfg_channels is not None:
        ok = 1 <= cfg_channels <= latent_channels
        checks.append(("cfg_channels", cfg_channels, ok, f"null (all) or 1..{latent_channels}"))
    for name, value, ok, valid in checks:
        if not ok:
            raise ValueError(f"model.init_args.{name}={value}; valid: {valid}")
