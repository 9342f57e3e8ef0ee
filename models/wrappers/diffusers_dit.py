"""``SuiteDiTTransformer``: the suite's ``DiT`` (any norm scheme) as a diffusers model.

    latents (B, C, H, W), timestep (B,), class_labels (B,) ──> dit: DiT ──> sample (B, C or 2C, H, W)

A ``ModelMixin`` / ``ConfigMixin`` around the unchanged network (parameters under ``dit.``), so
``save_pretrained`` writes ``config.json`` and safetensors and ``from_pretrained`` reads them back. The
forward takes diffusers' argument names and returns ``Transformer2DModelOutput``; the suite's sampler
(classifier-free guidance on the channels the run chose, learned variance kept) runs on ``.dit`` directly.

Diffusers' own ``DiTTransformer2DModel`` has the Pre-Norm block only, which is why the model travels as
code; its ``DiTPipeline`` also differs from the suite's protocol (it hard-codes the null class 1000,
guides every latent channel and drops the learned variance), so the export ships its own pipeline.
"""

from __future__ import annotations

from typing import Any

import torch
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.models.modeling_outputs import Transformer2DModelOutput
from diffusers.models.modeling_utils import ModelMixin
from torch import Tensor

from models.config import TrunkConfig
from models.dit import DiT


class SuiteDiTTransformer(ModelMixin, ConfigMixin):
    """A suite ``DiT`` behind diffusers' model interface.

    Args:
        trunk: the suite's ``TrunkConfig`` as a dict (norm scheme included).
        sample_size: latent side.
        patch_size: latent patch side.
        in_channels: latent channels.
        num_classes: class labels; label ``num_classes`` is the null class of classifier-free guidance.
        class_dropout_prob: label dropout it was trained with (> 0 gives the null class an embedding).
        learn_sigma: the output also carries the variance channels (``out_channels = 2 * in_channels``).
        timestep_freq_shift: 0 for the official DiT timestep features.
    """

    _supports_gradient_checkpointing = False

    @register_to_config
    def __init__(
        self,
        trunk: dict[str, Any],
        sample_size: int = 32,
        patch_size: int = 2,
        in_channels: int = 4,
        num_classes: int = 1000,
        class_dropout_prob: float = 0.1,
        learn_sigma: bool = True,
        timestep_freq_shift: int = 0,
    ) -> None:
        super().__init__()
        self.dit = DiT(
            TrunkConfig(**trunk),
            sample_size,
            patch_size,
            in_channels,
            num_classes,
            class_dropout_prob,
            learn_sigma,
            timestep_freq_shift,
        )

    @property
    def out_channels(self) -> int:
        return self.dit.out_channels

    def forward(
        self, hidden_states: Tensor, timestep: Tensor | int, class_labels: Tensor, return_dict: bool = True
    ) -> Transformer2DModelOutput | tuple[Tensor]:
        """The noise (and variance) prediction for noisy latents at ``timestep`` under ``class_labels``."""
        t = torch.as_tensor(timestep, device=hidden_states.device).expand(len(hidden_states))  # (B,)
        out = self.dit(hidden_states, t, class_labels)
        return Transformer2DModelOutput(sample=out) if return_dict else (out,)
