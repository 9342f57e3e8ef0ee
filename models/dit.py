"""Class-conditional latent DiT (Peebles & Xie, 2023) over the shared trunk, in adaLN-Zero mode."""

from __future__ import annotations

import torch
from timm.layers import PatchEmbed
from torch import Tensor, nn

from models.config import TrunkConfig
from models.embeddings import LabelEmbedder, TimestepEmbedder, sincos_2d
from models.init_values import Init, Plan, draw_seed, initialize, prefixed, rng_unchanged
from models.layers import AdaLNZero, modulate
from models.trunk import Trunk, xavier, zeros

#################################################################################
#                                 DiT                                           #
#################################################################################


class DiT(nn.Module):
    """Latents ``(B, C, H, W)``, timesteps ``(B,)`` and labels ``(B,)`` -> noise (and variance) prediction.

    ``c = t_embed(t) + y_embed(y)`` conditions every block through adaLN-Zero and the final layer.

    Args:
        trunk: trunk shape and norm scheme (run in conditioned mode).
        input_size: latent side (32 for 256 px images under an f8 VAE).
        patch_size: latent patch side p.
        in_channels: latent channels.
        num_classes: number of classes; index ``num_classes`` is the null class used by CFG.
        class_dropout_prob: label dropout during training (classifier-free guidance).
        learn_sigma: also predict the variance (output channels doubled).
        timestep_freq_shift: 0 for the official DiT timestep features, 1 for diffusers' variant.
        init_seed: the seed of every initial value (models/init_values.py); None draws it from the global
            generator (one draw; what the constructors draw besides is discarded).
    """

    def __init__(
        self,
        trunk: TrunkConfig,
        input_size: int = 32,
        patch_size: int = 2,
        in_channels: int = 4,
        num_classes: int = 1000,
        class_dropout_prob: float = 0.1,
        learn_sigma: bool = True,
        timestep_freq_shift: int = 0,
        init_seed: int | None = None,
    ) -> None:
        super().__init__()
        if trunk.learned_embed_scale:
            raise ValueError("trunk learned_embed_scale is a language-model option; a DiT has no token embedding")
        if input_size % patch_size:
            raise ValueError(f"input_size {input_size} is not divisible by patch_size {patch_size}")
        self.cfg, self.num_classes = trunk, num_classes
        self.in_channels, self.patch_size = in_channels, patch_size
        self.out_channels = 2 * in_channels if learn_sigma else in_channels
        dim = trunk.dim
        self.init_seed = draw_seed() if init_seed is None else init_seed
        with rng_unchanged():  # the constructors' draws are discarded: init_plan gives every random value
            self.x_embedder = PatchEmbed(input_size, patch_size, in_channels, dim, bias=True)
            self.t_embedder = TimestepEmbedder(dim, freq_shift=timestep_freq_shift)
            self.y_embedder = LabelEmbedder(num_classes, dim, class_dropout_prob)
            self.trunk = Trunk(trunk, conditioned=True, initialize=False)
            self.final_adaLN = AdaLNZero(dim, 2)  # shift, scale of the final layer
            self.final_linear = nn.Linear(dim, patch_size * patch_size * self.out_channels)
        self.register_buffer("pos_embed", sincos_2d(dim, input_size // patch_size).unsqueeze(0))  # fixed
        self.initialize_weights()

    def initialize_weights(self) -> None:
        """Gives every parameter of :meth:`init_plan` its value at ``self.init_seed`` (models/init_values.py)."""
        initialize(self, self.init_plan(), self.init_seed)

    def init_plan(self) -> Plan:
        """The official DiT ``initialize_weights``, line by line, with the trunk's plan; each parameter from its own
        generator (models/init_values.py), so the draws no longer depend on the official order.

        Official: every ``nn.Linear`` gets xavier-uniform weights and ZERO biases (``_basic_init``), then
        some weights are redrawn. So the timestep MLP keeps zero biases under its normal(0.02) weights;
        PyTorch's default bias init would leave them uniform(+-1/sqrt(fan_in)). The trunk's Linears
        (attention, MLP, adaLN) are initialized by the trunk (``init="xavier"`` in DiT configs, adaLN
        zeroed); the positional embedding is the fixed 2-D sin-cos table (a buffer).

        ``trunk.adaln_zero_init=False`` is DyT's DiT port, which deletes the official lines that zero the blocks'
        and the final layer's adaLN modulation and the final linear: those keep ``_basic_init``'s xavier-uniform
        weights and zero biases. ``"blocks"`` is the Derf port's DiT-B with Derf (zlab-princeton/Derf
        ``DiT/models.py``: the blocks' adaLN zeroed for ``'B' in model_name`` or LayerNorm, the final layer only
        for LayerNorm): the blocks start at zero (the trunk), the final adaLN and linear as under false.
        """

        def normal(t: Tensor, generator: torch.Generator) -> None:
            nn.init.normal_(t, std=0.02, generator=generator)

        def flat_xavier(t: Tensor, generator: torch.Generator) -> None:  # the patch embedding like a Linear
            nn.init.xavier_uniform_(t.view(t.shape[0], -1), generator=generator)

        plan = {
            "x_embedder.proj.weight": flat_xavier,
            "x_embedder.proj.bias": zeros,
            "y_embedder.table.weight": normal,
            "t_embedder.mlp.0.weight": normal,
            "t_embedder.mlp.0.bias": zeros,
            "t_embedder.mlp.2.weight": normal,
            "t_embedder.mlp.2.bias": zeros,
        }
        for name in ("final_adaLN.net.1", "final_linear"):
            # adaln_zero_init true: zero output at init, the model starts predicting zero noise
            plan[f"{name}.weight"] = zeros if self.cfg.adaln_zero_init is True else xavier
            plan[f"{name}.bias"] = zeros
        shapes = {name: tuple(p.shape) for name, p in self.named_parameters()}
        own = {name: Init(shapes[name], fill) for name, fill in plan.items()}
        return {**own, **prefixed("trunk", self.trunk.init_plan())}

    def unpatchify(self, x: Tensor) -> Tensor:
        """``(B, T, p*p*C) -> (B, C, H, W)``."""
        p, c = self.patch_size, self.out_channels
        g = int(x.shape[1] ** 0.5)
        x = x.reshape(x.shape[0], g, g, p, p, c)
        return torch.einsum("nhwpqc->nchpwq", x).reshape(x.shape[0], c, g * p, g * p)

    def forward(self, x: Tensor, t: Tensor, y: Tensor, skip_blocks: frozenset[int] = frozenset()) -> Tensor:
        """Noise prediction ``(B, out_channels, H, W)``."""
        h = self.x_embedder(x) + self.pos_embed  # (B, T, D), T = (H / p) * (W / p)
        c = self.t_embedder(t) + self.y_embedder(y)  # (B, D)
        h = self.trunk(h, cond=c, skip_blocks=skip_blocks)
        shift, scale = self.final_adaLN(c)
        return self.unpatchify(self.final_linear(modulate(h, shift, scale)))

    def forward_with_cfg(
        self, x: Tensor, t: Tensor, y: Tensor, cfg_scale: float, cfg_channels: int | None = None
    ) -> Tensor:
        """Classifier-free guidance on a batch whose second half repeats the first with null labels.

        ``eps = eps_uncond + cfg_scale * (eps_cond - eps_uncond)`` on the first ``cfg_channels``
        output channels (copied to both halves); the others, including the learned-variance channels,
        are left as each half predicted them.

        Args:
            cfg_channels: None guides every latent channel (``in_channels``: the standard approach);
                3 guides only the first three, which is what the official DiT ``forward_with_cfg``
                does "for exact reproducibility" of its published samples (the 4th latent channel
                then keeps the conditional prediction). Only these two differ in practice.
        """
        guided = self.in_channels if cfg_channels is None else cfg_channels
        if not 1 <= guided <= self.in_channels:
            raise ValueError(f"cfg_channels={cfg_channels}; valid: None (all) or 1..{self.in_channels}")
        half = x[: len(x) // 2]
        out = self(torch.cat([half, half]), t, y)
        eps, rest = out[:, :guided], out[:, guided:]
        cond_eps, uncond_eps = eps.chunk(2)
        guided = uncond_eps + cfg_scale * (cond_eps - uncond_eps)
        return torch.cat([torch.cat([guided, guided]), rest], dim=1)
