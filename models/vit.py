"""ViT classifier (DeiT layout): patch embed + cls token + learned positions -> trunk -> head."""

from __future__ import annotations

import math

import torch
from timm.layers import PatchEmbed
from torch import Tensor, nn

from models.config import TrunkConfig
from models.init_values import Fill, Init, Plan, draw_seed, initialize, prefixed, rng_unchanged, trunc_normal_
from models.trunk import Trunk, zeros


class ViTClassifier(nn.Module):
    """Vision Transformer with the class token read out by a linear head.

    Args:
        trunk: trunk shape and norm scheme.
        img_size: input resolution (square).
        patch_size: patch side.
        in_chans: input channels.
        num_classes: classifier outputs.
        drop_rate: dropout before the head.
        init_seed: the seed of every initial value (models/init_values.py); None draws it from the global
            generator (one draw; what the constructors draw besides is discarded).
    """

    def __init__(
        self,
        trunk: TrunkConfig,
        img_size: int = 224,
        patch_size: int = 16,
        in_chans: int = 3,
        num_classes: int = 1000,
        drop_rate: float = 0.0,
        init_seed: int | None = None,
    ) -> None:
        super().__init__()
        if trunk.learned_embed_scale:
            raise ValueError("trunk learned_embed_scale is a language-model option; a ViT has no token embedding")
        if img_size % patch_size:
            raise ValueError(f"img_size {img_size} is not divisible by patch_size {patch_size}")
        self.cfg, self.num_classes = trunk, num_classes
        self.init_seed = draw_seed() if init_seed is None else init_seed
        with rng_unchanged():  # the constructors' draws are discarded: init_plan gives every random value
            self.patch_embed = PatchEmbed(img_size, patch_size, in_chans, trunk.dim)
            self.cls_token = nn.Parameter(torch.zeros(1, 1, trunk.dim))
            self.pos_embed = nn.Parameter(torch.zeros(1, self.patch_embed.num_patches + 1, trunk.dim))
            self.trunk = Trunk(trunk, initialize=False)
            self.head_drop = nn.Dropout(drop_rate)
            self.head = nn.Linear(trunk.dim, num_classes)
        self.initialize_weights()

    def initialize_weights(self) -> None:
        """Gives every parameter of :meth:`init_plan` its value at ``self.init_seed`` (models/init_values.py)."""
        initialize(self, self.init_plan(), self.init_seed)

    def init_plan(self) -> Plan:
        """The DeiT training code's init: timm 0.3.2's ``VisionTransformer`` (DeiT's requirements.txt), each
        parameter from its own generator (models/init_values.py).

        ``pos_embed`` and ``cls_token``: trunc-normal, std 0.02 (recent timm draws the class token
        with std 1e-6 instead; DeiT trained with 0.02). Every Linear, the head included: trunc-normal
        std 0.02 and zero bias (the trunk's plan with ``init="trunc_normal"``, ``init_std=0.02``);
        LayerNorms: weight 1, bias 0 (their defaults); the patch-embedding conv at PyTorch's default
        (``Conv2d.reset_parameters``: kaiming-uniform with ``a = sqrt(5)``, bias uniform ``+- 1 / sqrt(fan_in)``).
        """
        conv = self.patch_embed.proj
        bound = 1 / math.sqrt(conv.weight[0].numel())  # fan_in = in_chans * patch * patch

        def shape(p: Tensor) -> tuple[int, ...]:
            return tuple(p.shape)

        def normal(std: float) -> Fill:
            return lambda t, generator: trunc_normal_(t, std, -2.0, 2.0, generator)  # timm's absolute +-2

        plan = {
            "patch_embed.proj.weight": Init(
                shape(conv.weight), lambda t, g: nn.init.kaiming_uniform_(t, a=math.sqrt(5), generator=g)
            ),
            "cls_token": Init(shape(self.cls_token), normal(0.02)),
            "pos_embed": Init(shape(self.pos_embed), normal(0.02)),
            **prefixed("trunk", self.trunk.init_plan()),
            "head.weight": Init(shape(self.head.weight), normal(self.cfg.init_std)),
            "head.bias": Init(shape(self.head.bias), zeros),
        }
        if conv.bias is not None:
            plan["patch_embed.proj.bias"] = Init(shape(conv.bias), lambda t, g: nn.init.uniform_(t, -bound, bound, g))
        return plan

    def forward_features(self, x: Tensor, skip_blocks: frozenset[int] = frozenset()) -> Tensor:
        """Images ``(B, C, H, W)`` -> trunk output ``(B, 1 + num_patches, D)``."""
        x = self.patch_embed(x)  # (B, P, D)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        return self.trunk(x, skip_blocks=skip_blocks)

    def forward_head(self, features: Tensor) -> Tensor:
        return self.head(self.head_drop(features[:, 0]))  # the class token

    def forward(self, x: Tensor, skip_blocks: frozenset[int] = frozenset()) -> Tensor:
        return self.forward_head(self.forward_features(x, skip_blocks))
