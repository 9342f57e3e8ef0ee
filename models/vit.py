"""ViT classifier (DeiT layout): patch embed + cls token + learned positions -> trunk -> head."""

from __future__ import annotations

import torch
from timm.layers import PatchEmbed
from torch import Tensor, nn

from models.config import TrunkConfig
from models.trunk import Trunk


class ViTClassifier(nn.Module):
    """Vision Transformer with the class token read out by a linear head.

    Args:
        trunk: trunk shape and norm scheme.
        img_size: input resolution (square).
        patch_size: patch side.
        in_chans: input channels.
        num_classes: classifier outputs.
        drop_rate: dropout before the head.
    """

    def __init__(
        self,
        trunk: TrunkConfig,
        img_size: int = 224,
        patch_size: int = 16,
        in_chans: int = 3,
        num_classes: int = 1000,
        drop_rate: float = 0.0,
    ) -> None:
        super().__init__()
        if trunk.learned_embed_scale:
            raise ValueError("trunk learned_embed_scale is a language-model option; a ViT has no token embedding")
        if img_size % patch_size:
            raise ValueError(f"img_size {img_size} is not divisible by patch_size {patch_size}")
        self.cfg, self.num_classes = trunk, num_classes
        self.patch_embed = PatchEmbed(img_size, patch_size, in_chans, trunk.dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, trunk.dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, self.patch_embed.num_patches + 1, trunk.dim))
        self.trunk = Trunk(trunk)
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(trunk.dim, num_classes)
        self.initialize_weights()

    @torch.no_grad()
    def initialize_weights(self) -> None:
        """The DeiT training code's init: timm 0.3.2's ``VisionTransformer`` (DeiT's requirements.txt).

        ``pos_embed`` and ``cls_token``: trunc-normal, std 0.02 (recent timm draws the class token
        with std 1e-6 instead; DeiT trained with 0.02). Every Linear, the head included: trunc-normal
        std 0.02 and zero bias (the trunk does its own with ``init="trunc_normal"``, ``init_std=0.02``);
        LayerNorms: weight 1, bias 0 (their defaults); the patch-embedding conv keeps PyTorch's default.
        """
        nn.init.trunc_normal_(self.cls_token, std=0.02)
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        nn.init.trunc_normal_(self.head.weight, std=self.cfg.init_std)
        nn.init.zeros_(self.head.bias)

    def forward_features(self, x: Tensor, skip_blocks: frozenset[int] = frozenset()) -> Tensor:
        """Images ``(B, C, H, W)`` -> trunk output ``(B, 1 + num_patches, D)``."""
        x = self.patch_embed(x)  # (B, P, D)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        return self.trunk(x, skip_blocks=skip_blocks)

    def forward_head(self, features: Tensor) -> Tensor:
        return self.head(self.head_drop(features[:, 0]))  # the class token

    def forward(self, x: Tensor, skip_blocks: frozenset[int] = frozenset()) -> Tensor:
        return self.forward_head(self.forward_features(x, skip_blocks))
