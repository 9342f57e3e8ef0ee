"""``TrunkConfig``: everything that shapes the shared transformer trunk, as strings and numbers."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from models.norms import get_norm_layer
from models.schemes import SchemeOptions, get_scheme

MLP_KINDS = ("gelu", "gelu_tanh", "swiglu")
INIT_KINDS = ("trunc_normal", "normal", "xavier")


@dataclass
class TrunkConfig:
    """The trunk's shape and its normalization placement.

    Attributes:
        dim: model width D.
        depth: number of transformer blocks L.
        num_heads: attention heads; must divide ``dim``.
        mlp: "gelu" (ViT), "gelu_tanh" (DiT) or "swiglu" (LM).
        mlp_hidden: feed-forward hidden size; None means ``4 * dim``.
        norm_scheme: where the norms sit; one of :class:`models.schemes.NormScheme`.
        norm_layer: "layernorm" or "rmsnorm".
        norm_eps: epsilon of every norm.
        mlp_norm_eps: epsilon of the MLP sublayer's norms only; None means ``norm_eps`` (diffusers' DiT
            uses 1e-5 there and 1e-6 elsewhere).
        qk_norm: per-head QK-norm in attention (independent of the scheme).
        bias: biases in attention and MLP projections.
        drop_path: stochastic-depth rate, linearly increasing over blocks up to this value.
        attn_drop: attention-weight dropout.
        moe_experts: 0 for a dense MLP, else the number of experts E (SwiGLU experts).
        moe_top_k: experts per token.
        moe_hidden: each expert's hidden size; None means ``mlp_hidden``.
        moe_normalize_topk: renormalize the chosen router probabilities.
        mix_ratio: Mix-LN's share of Post-Norm blocks.
        siamese_input_norm: SiameseNorm's ``N_in`` switch.
        siamese_depth_scaling: SiameseNorm's ``1/sqrt(2(b+1))`` switch.
        hybrid_depth_scaling: HybridNorm with its update scaled by ``1/sqrt(2(b+1))`` (paper Table 3).
        init: Linear-weight init: "trunc_normal" (timm ViT), "normal" (GPT) or "xavier" (DiT).
        init_std: std of the normal inits.
        scaled_output_init: divide the std of residual output projections by ``sqrt(2 L)`` (GPT-2).
        activation_checkpointing: recompute each block in backward to save memory.
    """

    dim: int = 256
    depth: int = 4
    num_heads: int = 4
    mlp: str = "gelu"
    mlp_hidden: int | None = None
    norm_scheme: str = "pre"
    norm_layer: str = "layernorm"
    norm_eps: float = 1e-6
    mlp_norm_eps: float | None = None
    qk_norm: bool = False
    bias: bool = True
    drop_path: float = 0.0
    attn_drop: float = 0.0
    moe_experts: int = 0
    moe_top_k: int = 2
    moe_hidden: int | None = None
    moe_normalize_topk: bool = False
    mix_ratio: float = 0.25
    siamese_input_norm: bool = True
    siamese_depth_scaling: bool = True
    hybrid_depth_scaling: bool = False
    init: str = "trunc_normal"
    init_std: float = 0.02
    scaled_output_init: bool = False
    activation_checkpointing: bool = False

    def __post_init__(self) -> None:
        get_scheme(self.norm_scheme)  # raises with the valid names
        get_norm_layer(self.norm_layer)
        for name in ("dim", "depth", "num_heads"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)}")
        if self.dim % self.num_heads:
            raise ValueError(f"dim {self.dim} is not divisible by num_heads {self.num_heads}")
        if self.mlp not in MLP_KINDS:
            raise ValueError(f"unknown mlp {self.mlp!r}; valid: {', '.join(MLP_KINDS)}")
        if self.init not in INIT_KINDS:
            raise ValueError(f"unknown init {self.init!r}; valid: {', '.join(INIT_KINDS)}")
        if not 0.0 <= self.drop_path < 1.0:
            raise ValueError(f"drop_path must be in [0, 1), got {self.drop_path}")
        if not 0.0 <= self.mix_ratio <= 1.0:
            raise ValueError(f"mix_ratio must be in [0, 1], got {self.mix_ratio}")
        if self.moe_experts < 0 or (self.moe_experts and not 1 <= self.moe_top_k <= self.moe_experts):
            raise ValueError(f"moe_top_k {self.moe_top_k} must be in [1, moe_experts] (moe_experts={self.moe_experts})")

    @property
    def hidden(self) -> int:
        return self.mlp_hidden or 4 * self.dim

    @property
    def scheme_options(self) -> SchemeOptions:
        return SchemeOptions(
            self.mix_ratio, self.siamese_input_norm, self.siamese_depth_scaling, self.hybrid_depth_scaling
        )

    def to_dict(self) -> dict:
        return asdict(self)
