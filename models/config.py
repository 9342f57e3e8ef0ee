"""``TrunkConfig``: everything that shapes the shared transformer trunk, as strings and numbers."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Literal

from models.norms import DYT_ALPHA_INIT, DyTInit, get_norm_layer
from models.schemes import SchemeOptions, get_scheme
from models.schemes.mhc import MHC_VARIANTS

MLP_KINDS = ("gelu", "gelu_tanh", "swiglu")
INIT_KINDS = ("trunc_normal", "normal", "xavier", "mitchell", "olmo_normal")
QK_NORM_SCOPES = ("per_head", "full")
DYT_ALPHA_RULES = ("fixed", "width")

#: DyT's starting alpha by model width: ``(width, alpha of the attention sublayers' norms, alpha of the other norms)``
#: (MLP sublayers' and the final norm's). Each row's source (tests/models/test_dyt.py holds them row by row): Zhu et
#: al., arXiv 2503.10622, Table 11 (alpha by width x depth; depth barely matters) for 1024, 2048, 4096 and 8192;
#: Table 12 (the LLaMA models) and the LLaMA port's README (jiachenzhu/DyT ``other_tasks/LLaMA``, ``llama2_*``
#: commands; the widths from its ``config_utils.py``) for 4096 (LLaMA-2 7B: 0.8 / 0.2 / 0.2), 5120 (13B: 0.6 / 0.15 /
#: 0.15) and 8192 (34B and 70B: 0.2 / 0.05 / 0.05).
DYT_WIDTH_TABLE: tuple[tuple[int, float, float], ...] = (
    (1024, 1.0, 1.0),
    (2048, 1.0, 0.5),
    (4096, 0.8, 0.2),
    (5120, 0.6, 0.15),
    (8192, 0.2, 0.05),
)


def dyt_width_alphas(dim: int) -> tuple[float, float]:
    """``(attention alpha, other alpha)`` of the DyT width rule: the row of the largest tabulated width <= ``dim``;
    below the table (width < 1024) its first row, 1.0 / 1.0 (the table gives nothing smaller: no extrapolation)."""
    chosen = DYT_WIDTH_TABLE[0]
    for row in DYT_WIDTH_TABLE:
        if row[0] <= dim:
            chosen = row
    return chosen[1], chosen[2]


@dataclass(frozen=True)
class Bound:
    """The valid range of one numeric field: ``low <= x`` (``<`` when ``low_open``), likewise ``high``."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    integer: bool = False
    optional: bool = False  # None is valid too (it means a default derived from other fields)

    def describe(self) -> str:
        parts = []
        if self.low is not None and self.high is not None:
            parts.append(f"{'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}")
        elif self.low is not None:
            parts.append(f"{'>' if self.low_open else '>='} {self.low:g}")
        text = ("an integer " if self.integer else "a number ") + " ".join(parts)
        return text + (" or null" if self.optional else "")

    def holds(self, value: object) -> bool:
        if value is None:
            return self.optional
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            return False
        if self.integer and not isinstance(value, int):
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)


#: Every numeric field of :class:`TrunkConfig` and its valid range (checked at construction).
BOUNDS: dict[str, Bound] = {
    "dim": Bound(1, integer=True),
    "depth": Bound(1, integer=True),
    "num_heads": Bound(1, integer=True),
    "num_kv_heads": Bound(1, integer=True, optional=True),
    "mlp_hidden": Bound(1, integer=True, optional=True),
    "norm_eps": Bound(0, low_open=True),
    "mlp_norm_eps": Bound(0, low_open=True, optional=True),
    "drop_path": Bound(0, 1, high_open=True),
    "attn_drop": Bound(0, 1, high_open=True),
    "moe_experts": Bound(0, integer=True),
    "moe_top_k": Bound(1, integer=True),
    "moe_hidden": Bound(1, integer=True, optional=True),
    "mix_ratio": Bound(0, 1),
    "init_std": Bound(0, low_open=True),
    "mhc_streams": Bound(1, integer=True),
    "attn_res_block_size": Bound(1, integer=True),
    "dyt_alpha_init": Bound(0, low_open=True),
    "dyt_alpha_init_attn": Bound(0, low_open=True, optional=True),
    "dyt_alpha_init_mlp": Bound(0, low_open=True, optional=True),
    "dyt_alpha_init_final": Bound(0, low_open=True, optional=True),
}


@dataclass
class TrunkConfig:
    """The trunk's shape and its normalization placement.

    Attributes:
        dim: model width D.
        depth: number of transformer blocks L.
        num_heads: attention heads; must divide ``dim``.
        num_kv_heads: key/value heads of grouped-query attention (Llama 3, OLMo 2 32B): each serves
            ``num_heads / num_kv_heads`` consecutive query heads; must divide ``num_heads``. None means
            ``num_heads`` (multi-head attention: the parameters and the forward of a trunk without the field).
        mlp: "gelu" (ViT), "gelu_tanh" (DiT) or "swiglu" (LM).
        mlp_hidden: feed-forward hidden size; None means ``4 * dim``.
        norm_scheme: where the norms sit; one of :class:`models.schemes.NormScheme`.
        norm_layer: "layernorm", "rmsnorm", "dyt" (Dynamic Tanh, :class:`models.norms.DyT`: no epsilon) or "derf"
            (Dynamic erf, :class:`models.norms.Derf`).
        norm_eps: epsilon of every norm.
        mlp_norm_eps: epsilon of the MLP sublayer's norms only; None means ``norm_eps`` (diffusers' DiT
            uses 1e-5 there and 1e-6 elsewhere).
        qk_norm: QK-norm in attention (independent of the scheme).
        qk_norm_scope: "per_head" (a norm of width D/H on each head's q and k: the official SiameseNorm code) or
            "full" (OLMo 2: one norm of width D over all heads' q, one over all heads' k, before the head split).
            Schemes that normalize Q, K and V per head themselves (HybridNorm's) keep theirs either way.
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
        init: Linear-weight init: "trunc_normal" (timm ViT), "normal" (GPT), "xavier" (DiT), "mitchell" (OLMo's
            Mitchell init: normals truncated at 3 std, 1 / sqrt(d) for every weight, the embedding and the LM head;
            ``init_std`` unused) or "olmo_normal" (OLMo's normal init with cutoff 3, OLMoE's: ``init_std``
            truncated at 3 std everywhere, embedding and LM head included). Both: models/olmo_init.py.
        init_std: std of the normal inits.
        scaled_output_init: depth-scale the residual output projections: GPT-2's ``std / sqrt(2 L)``, or with
            "mitchell" OLMo's ``1 / sqrt(2 fan_in (l + 1))`` for block l (OLMo's Mitchell init is "mitchell" with
            this on; off, the plain-init baselines give every weight ``1 / sqrt(d)``).
        dyt_alpha_init: DyT's alpha at init (reference ``alpha_init_value`` 0.5), for every DyT the three below
            do not set, QK-norm included.
        dyt_alpha_init_attn: alpha at init of the attention sublayers' norms (DyT's LLaMA port:
            ``attn_alpha_init_value``); None means ``dyt_alpha_init``.
        dyt_alpha_init_mlp: the same for the MLP sublayers' norms (``ffn_alpha_init_value``).
        dyt_alpha_init_final: the same for the readout's norms (``dec_alpha_init_value``).
        dyt_alpha_rule: "fixed" (every alpha the four fields above give) or "width" (DyT's rule for language models,
            :data:`DYT_WIDTH_TABLE`: the attention sublayers' alpha and the MLP sublayers' and final norm's alpha
            from the model width; an explicit ``dyt_alpha_init_attn`` / ``_mlp`` / ``_final`` still wins).
        dyt_bias: DyT's shift; false is the LLaMA port's ``weight * tanh(alpha x)``. The alpha and shift options
            apply to Derf (``norm_layer: derf``) as well: its alpha starts where DyT's would, its scalar ``s`` at 0.
        learned_embed_scale: language models only: multiply the token embedding by a learnable scalar that
            starts at ``sqrt(dim)`` (DyT's LLaMA port, ``shared_scale``).
        adaln_zero_init: conditioned (DiT) trunks: true (the official DiT) starts every adaLN modulation, the
            final adaLN and the final linear at zero; false keeps all of them at the init every other Linear gets,
            zero biases (DyT's DiT port deletes those zeroing lines; the Derf port's DiT-L / XL with Derf);
            "blocks" zeroes the blocks' adaLN only, the final adaLN and final linear keeping xavier-uniform weights
            and zero biases (zlab-princeton/Derf ``DiT/models.py`` ``initialize_weights`` for DiT-B with Derf: it
            zeroes the final layer only under LayerNorm). Unconditioned trunks take true or "blocks".
        activation_checkpointing: recompute each block in backward to save memory.
        recompute_norms: recompute each sublayer's prologue (the scheme's norms and element-wise ops up to the
            branch input; the readout too) in backward instead of keeping it, as :mod:`models.recompute`
            describes: True, False, or "auto" (where it keeps fewer bytes: ``Scheme.recompute_wins``; off
            under ``activation_checkpointing``, which recomputes the whole block already).
        mhc_streams: mHC's number of residual streams n (the paper's and the reference's 4).
        mhc_variant: mHC's form (:mod:`models.schemes.mhc`): "paper" (the paper's equations as DeepSeek-V4 and
            Megatron-LM run them: one projection of the flattened streams, softmax-first Sinkhorn with eps) or
            "mhcv2" (lucidrains' mHCv2: each stream normalized and projected on its own).
        attn_res_block_size: Block AttnRes (``block_attn_res``): consecutive sublayers summed into one source
            (2: one transformer block; the paper's ~8 blocks are ``2 * depth / 8``).
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
    qk_norm_scope: str = "per_head"
    dyt_alpha_init: float = DYT_ALPHA_INIT
    dyt_alpha_init_attn: float | None = None
    dyt_alpha_init_mlp: float | None = None
    dyt_alpha_init_final: float | None = None
    dyt_alpha_rule: str = "fixed"
    dyt_bias: bool = True
    learned_embed_scale: bool = False
    adaln_zero_init: bool | Literal["blocks"] = True
    activation_checkpointing: bool = False
    recompute_norms: bool | Literal["auto"] = "auto"
    mhc_streams: int = 4
    mhc_variant: str = "paper"
    attn_res_block_size: int = 2
    num_kv_heads: int | None = None  # last: the fields before it keep their positions

    def __post_init__(self) -> None:
        """Refuses any out-of-range field in one line naming it (``BOUNDS``), then the names and cross-checks."""
        for name, bound in BOUNDS.items():
            value = getattr(self, name)
            if not bound.holds(value):
                raise ValueError(f"trunk {name} must be {bound.describe()}, got {value!r}")
        get_scheme(self.norm_scheme)  # raises with the valid names
        get_norm_layer(self.norm_layer)
        if self.dim % self.num_heads:
            raise ValueError(f"trunk dim {self.dim} is not divisible by num_heads {self.num_heads}")
        if self.num_kv_heads is not None and self.num_heads % self.num_kv_heads:
            heads = self.num_heads
            valid = ", ".join(str(d) for d in range(1, heads + 1) if heads % d == 0) if heads <= 1024 else None
            raise ValueError(
                f"trunk num_kv_heads {self.num_kv_heads} does not divide num_heads {heads}; "
                f"valid: {f'one of {valid}' if valid else 'a divisor of num_heads'}, or null (= num_heads)"
            )
        if self.mlp not in MLP_KINDS:
            raise ValueError(f"unknown mlp {self.mlp!r}; valid: {', '.join(MLP_KINDS)}")
        if self.init not in INIT_KINDS:
            raise ValueError(f"unknown init {self.init!r}; valid: {', '.join(INIT_KINDS)}")
        if self.qk_norm_scope not in QK_NORM_SCOPES:
            raise ValueError(f"unknown qk_norm_scope {self.qk_norm_scope!r}; valid: {', '.join(QK_NORM_SCOPES)}")
        if self.dyt_alpha_rule not in DYT_ALPHA_RULES:
            raise ValueError(f"unknown dyt_alpha_rule {self.dyt_alpha_rule!r}; valid: {', '.join(DYT_ALPHA_RULES)}")
        if self.mhc_variant not in MHC_VARIANTS:
            raise ValueError(f"unknown mhc_variant {self.mhc_variant!r}; valid: {', '.join(MHC_VARIANTS)}")
        if self.moe_experts and self.moe_top_k > self.moe_experts:
            raise ValueError(f"trunk moe_top_k {self.moe_top_k} must be in [1, moe_experts={self.moe_experts}]")
        if not (isinstance(self.adaln_zero_init, bool) or self.adaln_zero_init == "blocks"):
            raise ValueError(f"trunk adaln_zero_init must be true, false or 'blocks', got {self.adaln_zero_init!r}")
        if not (isinstance(self.recompute_norms, bool) or self.recompute_norms == "auto"):
            raise ValueError(f"trunk recompute_norms must be true, false or 'auto', got {self.recompute_norms!r}")
        for f in fields(self):
            if f.type == "bool" and not isinstance(getattr(self, f.name), bool):
                raise ValueError(f"trunk {f.name} must be true or false, got {getattr(self, f.name)!r}")

    @property
    def hidden(self) -> int:
        return self.mlp_hidden or 4 * self.dim

    @property
    def kv_heads(self) -> int:
        """Key/value heads: ``num_kv_heads``, or ``num_heads`` when it is None."""
        return self.num_kv_heads or self.num_heads

    @property
    def scheme_options(self) -> SchemeOptions:
        return SchemeOptions(
            self.mix_ratio,
            self.siamese_input_norm,
            self.siamese_depth_scaling,
            self.hybrid_depth_scaling,
            mhc_streams=self.mhc_streams,
            mhc_variant=self.mhc_variant,
            attn_res_block_size=self.attn_res_block_size,
        )

    def dyt_init(self, kind: str) -> DyTInit:
        """How a DyT norm at a site of ``kind`` ("attn", "mlp", "readout"; anything else, e.g. "qk": the base
        value) starts."""
        per_site = {
            "attn": self.dyt_alpha_init_attn,
            "mlp": self.dyt_alpha_init_mlp,
            "readout": self.dyt_alpha_init_final,
        }
        alpha = per_site.get(kind)
        if alpha is None and self.dyt_alpha_rule == "width" and kind in per_site:
            attn, other = dyt_width_alphas(self.dim)
            alpha = attn if kind == "attn" else other
        return DyTInit(self.dyt_alpha_init if alpha is None else alpha, self.dyt_bias)

    def to_dict(self) -> dict:
        return asdict(self)
