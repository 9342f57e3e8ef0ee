"""Every model size of the paper (docs/architecture.md, "Sizes") and the laptop-sized ones, as data; build any on the meta
device to count.

python -m models            # prints the parameter count of every preset
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import nn

from models.config import TrunkConfig
from models.dit import DiT
from models.lm import LanguageModel
from models.vit import ViTClassifier

Task = Literal["lm", "vit", "dit"]

# LM: SwiGLU, RMSNorm eps 1e-5, QK-norm, no biases, untied embeddings, vocab 50304 (OLMo-style).
_LM = dict(mlp="swiglu", norm_layer="rmsnorm", norm_eps=1e-5, qk_norm=True, bias=False, init="normal",
           scaled_output_init=True)  # fmt: skip
_OLMO = {**_LM, "init": "mitchell"}  # the paper-scale configs: OLMo's Mitchell init (models/olmo_init.py)
_VIT = dict(mlp="gelu", norm_layer="layernorm", norm_eps=1e-6, init="trunc_normal")
_DIT = dict(mlp="gelu_tanh", norm_layer="layernorm", norm_eps=1e-6, init="xavier")


@dataclass(frozen=True)
class Preset:
    """A named size: the task network, its trunk shape and the network's own arguments."""

    task: Task
    trunk: dict
    net: dict = field(default_factory=dict)
    paper_params: float | None = None  # what the paper reports, in parameters


# fmt: off
PRESETS: dict[str, Preset] = {
    # --- language modeling ----------------------------------------------------------------------------------
    "lm-1.3b":      Preset("lm", dict(dim=2048, depth=16, num_heads=16, mlp_hidden=8192, **_OLMO), dict(vocab_size=50304, max_seq_len=4096), 1.28e9),
    "lm-390m-d10":  Preset("lm", dict(dim=1280, depth=10, num_heads=10, mlp_hidden=5120, **_OLMO), dict(vocab_size=50304), 3.9e8),
    "lm-390m-d17":  Preset("lm", dict(dim=1024, depth=17, num_heads=8, mlp_hidden=4096, **_OLMO), dict(vocab_size=50304), 3.9e8),
    "lm-390m-d33":  Preset("lm", dict(dim=768, depth=33, num_heads=6, mlp_hidden=3072, **_OLMO), dict(vocab_size=50304), 3.9e8),
    "lm-390m-d80":  Preset("lm", dict(dim=512, depth=80, num_heads=4, mlp_hidden=2048, **_OLMO), dict(vocab_size=50304), 3.9e8),
    "lm-moe-15a2b": Preset("lm", dict(dim=2048, depth=16, num_heads=16, moe_experts=64, moe_top_k=8, moe_hidden=2304, **_OLMO), dict(vocab_size=50304, max_seq_len=4096), 15e9),
    # the tiny presets are what configs/{lm,vit,dit}/tiny.yaml (and their overlays) train: tests/models/test_presets.py
    "lm-tiny":      Preset("lm", dict(dim=128, depth=4, num_heads=4, mlp_hidden=512, **_LM), dict(vocab_size=256, max_seq_len=128)),
    "lm-deep":      Preset("lm", dict(dim=64, depth=16, num_heads=4, mlp_hidden=256, **_LM), dict(vocab_size=256, max_seq_len=128)),
    "lm-moe-tiny":  Preset("lm", dict(dim=128, depth=4, num_heads=4, mlp_hidden=512, moe_experts=8, moe_top_k=2, moe_hidden=256, **_LM), dict(vocab_size=256, max_seq_len=128)),
    # --- ViT classification (DeiT) --------------------------------------------------------------------------
    "deit-tiny":    Preset("vit", dict(dim=192, depth=12, num_heads=3, **_VIT), dict(img_size=224, patch_size=16, num_classes=1000), 5.7e6),
    "deit-small":   Preset("vit", dict(dim=384, depth=12, num_heads=6, **_VIT), dict(img_size=224, patch_size=16, num_classes=1000), 22e6),
    "vit-tiny":     Preset("vit", dict(dim=128, depth=4, num_heads=4, **_VIT), dict(img_size=28, patch_size=7, num_classes=10)),
    # --- latent DiT -----------------------------------------------------------------------------------------
    "dit-b2":       Preset("dit", dict(dim=768, depth=12, num_heads=12, **_DIT), dict(input_size=32, patch_size=2, num_classes=1000), 130e6),
    "dit-l4":       Preset("dit", dict(dim=1024, depth=24, num_heads=16, **_DIT), dict(input_size=32, patch_size=4, num_classes=1000), 458e6),
    "dit-tiny":     Preset("dit", dict(dim=128, depth=4, num_heads=4, **_DIT), dict(input_size=8, patch_size=2, num_classes=10, learn_sigma=False)),
}
# fmt: on


@dataclass(frozen=True)
class Recipe:
    """The trunk options a method's authors train it with, beyond the placement or the layer itself.

    Attributes:
        source: whose code or paper the options come from.
        trunk: the options (``TrunkConfig`` fields) the overlay of the same name sets; what it does not name is
            the task's trunk (the task config's own recipe: SwiGLU, RMSNorm, QK-norm per head, ... for the LM).
        tasks: the tasks the recipe applies to (a port trains one task).
    """

    source: str
    trunk: dict = field(default_factory=dict)
    tasks: tuple[Task, ...] = ("lm", "vit", "dit")


_ALL: tuple[Task, ...] = ("lm", "vit", "dit")
_PLAIN = "the task's trunk: the authors' method changes the placement only"
#: The trunk DyT's LLaMA port and Derf's GPT-2 port share beyond the norm layer: no QK-norm, the token embedding
#: times a learnable scalar starting at sqrt(d) (``pre-port-trunk`` is it under RMSNorm Pre-Norm: their baseline).
_PORT_TRUNK = dict(learned_embed_scale=True, qk_norm=False)
_DYT_LLAMA = dict(norm_layer="dyt", dyt_alpha_rule="width", dyt_bias=False, **_PORT_TRUNK)
_DERF_GPT2 = dict(norm_layer="derf", dyt_alpha_init=1.0, **_PORT_TRUNK)
#: The same two ports with every alpha tuned for the tiny LM (width 128, below the width rule's table): an alpha sweep at
#: lr 1e-2 (docs/schemes.md) finds both stalling at their authors' alpha and training from 4 up.
_DYT_LLAMA_A8 = {**{k: v for k, v in _DYT_LLAMA.items() if k != "dyt_alpha_rule"}, "dyt_alpha_init": 8.0}
_DERF_GPT2_A4 = {**_DERF_GPT2, "dyt_alpha_init": 4.0}
#: The alphas that train the tiny LM on every seed (sweeps on seeds 1-3): the -a8 / -a4 picks stall on seed 2.
_DYT_LLAMA_A16 = {**_DYT_LLAMA_A8, "dyt_alpha_init": 16.0}
_DERF_GPT2_A8 = {**_DERF_GPT2, "dyt_alpha_init": 8.0}
_OLMO2_QK = dict(qk_norm=True, qk_norm_scope="full")

#: Every shipped ``configs/norm/<name>.yaml`` and the recipe it carries (tests/models/test_recipes.py checks each
#: overlay's resolved trunk against it). A scheme overlay of a recipe that changes a trunk option has a Pre-Norm
#: twin with the same option (``pre-qk-full``, ``pre-plain-init``), and a norm-layer port's trunk options have an RMSNorm
#: Pre-Norm twin (``pre-port-trunk``), so a table isolates the placement or the layer.
# fmt: off
RECIPES: dict[str, Recipe] = {
    **{name: Recipe(_PLAIN) for name in ("pre", "post", "peri", "deepnorm", "mixln", "hybrid", "resi_dual",
                                          "resi_dual_hybrid", "hyper", "siamese", "siamese_hybrid", "mhc", "keel",
                                          "attn_res", "block_attn_res")},
    "hybrid-depth-scaling": Recipe("SiameseNorm paper, Table 3 ablation: a scheme switch",
                                   dict(norm_scheme="hybrid", hybrid_depth_scaling=True)),
    "siamese_hybrid-no-depth-scaling": Recipe("SiameseNorm paper, Table 3 ablation: a scheme switch",
                                              dict(norm_scheme="siamese_hybrid", siamese_depth_scaling=False)),
    "siamese_hybrid-no-input-norm": Recipe("SiameseNorm paper, Table 3 ablation: a scheme switch",
                                           dict(norm_scheme="siamese_hybrid", siamese_input_norm=False)),
    "lns": Recipe("lmsdss/LayerNorm-Scaling: the plain normal init (a depth-scaled output init diminishes the "
                  "effect)", dict(scaled_output_init=False)),
    "mhc-v2": Recipe("lucidrains/hyper-connections mHCv2.py: the other form of mHC",
                     dict(norm_scheme="mhc", mhc_variant="mhcv2")),
    "pre-plain-init": Recipe("LayerNorm Scaling's trunk under Pre-Norm: lns.yaml's baseline",
                             dict(norm_scheme="pre", scaled_output_init=False), ("lm",)),
    "reordered": Recipe("OLMo 2 (allenai/OLMo-core, transformers' Olmo2Attention): QK-norm over the whole q and k "
                        "projections", _OLMO2_QK),
    "pre-qk-full": Recipe("OLMo 2's QK-norm under Pre-Norm: reordered.yaml's baseline",
                          dict(norm_scheme="pre", **_OLMO2_QK)),
    "dyt": Recipe("jiachenzhu/DyT (ViT / ConvNeXt): every norm DyT, alpha 0.5", dict(norm_layer="dyt")),
    "dyt-dit": Recipe("jiachenzhu/DyT other_tasks/DiT: adaLN-Zero's zeroing removed",
                      dict(norm_layer="dyt", adaln_zero_init=False), ("dit",)),
    "dyt-llama": Recipe("jiachenzhu/DyT other_tasks/LLaMA and the paper's width rule (Tables 11-12): no shift, "
                        "shared_scale sqrt(d), no QK-norm", _DYT_LLAMA, ("lm",)),
    "pre-dyt": Recipe("jiachenzhu/DyT (ViT): Pre-Norm with every norm DyT", dict(norm_scheme="pre", norm_layer="dyt")),
    "siamese-dyt": Recipe("SiameseNorm with DyT's ViT recipe", dict(norm_scheme="siamese", norm_layer="dyt")),
    "pre-dyt-llama": Recipe("the DyT paper's LM: Pre-Norm with the LLaMA port's recipe",
                            dict(norm_scheme="pre", **_DYT_LLAMA), ("lm",)),
    "siamese-dyt-llama": Recipe("SiameseNorm with the DyT LLaMA port's recipe",
                                dict(norm_scheme="siamese", **_DYT_LLAMA), ("lm",)),
    "dyt-llama-a8": Recipe("the DyT LLaMA port's recipe with every alpha 8: the tiny LM's tuned value, not the authors'",
                           _DYT_LLAMA_A8, ("lm",)),
    "pre-dyt-llama-a8": Recipe("the DyT paper's LM with alpha tuned for the tiny LM (8)",
                               dict(norm_scheme="pre", **_DYT_LLAMA_A8), ("lm",)),
    "siamese-dyt-llama-a8": Recipe("SiameseNorm with the DyT LLaMA port's recipe, alpha tuned for the tiny LM (8)",
                                   dict(norm_scheme="siamese", **_DYT_LLAMA_A8), ("lm",)),
    "dyt-llama-a16": Recipe("the DyT LLaMA port's recipe with every alpha 16: trains the tiny LM on every seed, not the "
                            "authors' value", _DYT_LLAMA_A16, ("lm",)),
    "pre-dyt-llama-a16": Recipe("the DyT paper's LM with the alpha that trains the tiny LM on every seed (16)",
                                dict(norm_scheme="pre", **_DYT_LLAMA_A16), ("lm",)),
    "pre-no-qk-norm": Recipe("the DyT / Derf LM ports' attention (no QK-norm) under RMSNorm Pre-Norm",
                             dict(norm_scheme="pre", qk_norm=False), ("lm",)),
    "pre-port-trunk": Recipe("the DyT / Derf LM ports' trunk (no QK-norm, learnable sqrt(d) embedding scale) under "
                             "RMSNorm Pre-Norm: their baseline", dict(norm_scheme="pre", **_PORT_TRUNK), ("lm",)),
    "siamese-port-trunk": Recipe("the DyT LLaMA port's trunk under RMSNorm SiameseNorm: siamese-dyt-llama's baseline",
                                 dict(norm_scheme="siamese", **_PORT_TRUNK), ("lm",)),
    "derf": Recipe("zlab-princeton/Derf (ViT, DiT-B): every norm Derf, alpha 0.5, s 0; DiT-B zeroes the blocks' "
                   "adaLN only (the final layer keeps xavier, zero bias)", dict(norm_layer="derf", adaln_zero_init="blocks")),
    "derf-gpt2": Recipe("zlab-princeton/Derf language model/ (nanoGPT): alpha 1.0, shared_scale sqrt(d), no QK-norm",
                        _DERF_GPT2, ("lm",)),
    "pre-derf-gpt2": Recipe("the Derf paper's LM: Pre-Norm with its GPT-2 port's recipe",
                            dict(norm_scheme="pre", **_DERF_GPT2), ("lm",)),
    "derf-gpt2-a4": Recipe("the Derf GPT-2 port's recipe with every alpha 4: the tiny LM's tuned value, not the authors'",
                           _DERF_GPT2_A4, ("lm",)),
    "pre-derf-gpt2-a4": Recipe("the Derf paper's LM with alpha tuned for the tiny LM (4)",
                               dict(norm_scheme="pre", **_DERF_GPT2_A4), ("lm",)),
    "derf-gpt2-a8": Recipe("the Derf GPT-2 port's recipe with every alpha 8: trains the tiny LM on every seed, not the "
                           "authors' value", _DERF_GPT2_A8, ("lm",)),
    "pre-derf-gpt2-a8": Recipe("the Derf paper's LM with the alpha that trains the tiny LM on every seed (8)",
                               dict(norm_scheme="pre", **_DERF_GPT2_A8), ("lm",)),
}
# fmt: on

_NETWORKS: dict[Task, type[nn.Module]] = {"lm": LanguageModel, "vit": ViTClassifier, "dit": DiT}


def build_preset(
    name: str, norm_scheme: str = "pre", device: str | torch.device = "meta", **trunk_overrides
) -> nn.Module:
    """Builds preset ``name`` under ``norm_scheme`` (on the meta device by default: no memory).

    Raises:
        ValueError: for an unknown preset, listing the valid ones.
    """
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; valid: {', '.join(PRESETS)}")
    preset = PRESETS[name]
    cfg = TrunkConfig(**{**preset.trunk, "norm_scheme": norm_scheme, **trunk_overrides})
    with torch.device(device):
        return _NETWORKS[preset.task](cfg, **preset.net)


def count_params(model: nn.Module, active: bool = False) -> int:
    """Parameter count; ``active=True`` counts only the top-k experts of each MoE layer."""
    total = sum(p.numel() for p in model.parameters())
    if active:
        from models.layers import MoE

        for m in model.modules():
            if isinstance(m, MoE):
                total -= (m.w_in.numel() + m.w_out.numel()) * (m.num_experts - m.top_k) // m.num_experts
    return total


def main() -> None:
    print(f"{'preset':<14} {'task':<4} {'params':>14} {'active':>14} {'paper':>10}")
    for name, preset in PRESETS.items():
        model = build_preset(name)
        paper = f"{preset.paper_params / 1e6:,.1f}M" if preset.paper_params else "-"
        total, active = count_params(model), count_params(model, active=True)
        print(f"{name:<14} {preset.task:<4} {total:>14,} {active:>14,} {paper:>10}")
