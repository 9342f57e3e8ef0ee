"""Reference implementations at our shapes: timm's VisionTransformer, diffusers' DiTTransformer2DModel and
transformers' LlamaForCausalLM, each paired with our ``pre`` network (loaded with the reference's weights
where ``models.loaders`` has a loader, so both compute the same function) as two timing candidates."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from experiments.bench.measure import Candidate, Options
from experiments.bench.workloads import OUR_LOSS, Batch, LossFn, Workload, dit_loss, lm_loss, vit_loss
from models import TrunkConfig


@dataclass
class Reference:
    """A reference network at our shapes, and our ``pre`` network (with its weights when a loader exists)."""

    name: str
    theirs: nn.Module
    ours: nn.Module
    loss: LossFn
    same_weights: bool


def reference(w: Workload, checkpointing: bool = False) -> Reference | str:
    """timm (ViT), diffusers (DiT) or transformers (LM) at the workload's shapes, or why not."""
    if w.task == "moe":
        return "skipped: no reference MoE LM here (models.loaders has no loader for an MoE such as OLMoE)"
    cfg = TrunkConfig(**{**w.trunk, "norm_scheme": "pre", "activation_checkpointing": checkpointing})
    n = w.net
    if w.task == "vit":
        from timm.models.vision_transformer import VisionTransformer

        from models.loaders import vit_from_timm

        theirs = VisionTransformer(
            img_size=n["img_size"], patch_size=n["patch_size"], in_chans=n["in_chans"], num_classes=n["num_classes"],
            embed_dim=cfg.dim, depth=cfg.depth, num_heads=cfg.num_heads, mlp_ratio=cfg.hidden / cfg.dim,
            qkv_bias=cfg.bias,
        )  # fmt: skip
        theirs.set_grad_checkpointing(checkpointing)
        ours = vit_from_timm(theirs)
        ours.trunk.cfg.activation_checkpointing = checkpointing  # the loader's config: a fresh object
        return Reference("timm VisionTransformer", theirs, ours, vit_loss, True)
    if w.task == "dit":
        from diffusers import DiTTransformer2DModel

        from models.loaders import dit_from_diffusers

        theirs = DiTTransformer2DModel(
            num_attention_heads=cfg.num_heads, attention_head_dim=cfg.dim // cfg.num_heads,
            in_channels=n["in_channels"], out_channels=n["in_channels"] * (2 if n["learn_sigma"] else 1),
            num_layers=cfg.depth, sample_size=n["input_size"], patch_size=n["patch_size"],
            num_embeds_ada_norm=n["num_classes"],
        )  # fmt: skip
        emb = theirs.transformer_blocks[0].norm1.emb.state_dict()
        for block in theirs.transformer_blocks[1:]:  # one embedder in every block, tied as in converted checkpoints
            block.norm1.emb.load_state_dict(emb)
        if checkpointing:
            theirs.enable_gradient_checkpointing()
        ours = dit_from_diffusers(theirs)
        ours.trunk.cfg.activation_checkpointing = checkpointing
        loss = dit_loss(lambda m, x, t, y: m(x, timestep=t, class_labels=y).sample)
        return Reference("diffusers DiTTransformer2DModel", theirs, ours, loss, True)
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError:
        return "skipped: transformers is not installed, so there is no LlamaForCausalLM to compare against"
    from models.loaders import lm_from_llama

    llama = LlamaConfig(
        vocab_size=n["vocab_size"], hidden_size=cfg.dim, intermediate_size=cfg.hidden, num_hidden_layers=cfg.depth,
        num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.kv_heads, max_position_embeddings=n["max_seq_len"],
        rms_norm_eps=cfg.norm_eps, tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
        attn_implementation="sdpa", use_cache=False,
    )  # fmt: skip
    theirs = LlamaForCausalLM(llama)
    if checkpointing:
        theirs.gradient_checkpointing_enable()
    # Llama has no QK-norm: ours is loaded without it, so both compute the same function. A workload with
    # num_kv_heads is compared with Llama's grouped-query attention (num_key_value_heads).
    ours = lm_from_llama(theirs, activation_checkpointing=checkpointing)
    return Reference(
        "transformers LlamaForCausalLM", theirs, ours, lm_loss(lambda m, ids: m(input_ids=ids).logits), True
    )


def reference_candidates(ref: Reference, w: Workload, batch: Batch, opts: Options) -> list[Candidate]:
    """``[theirs, ours]``; with shared weights the loss gap at init shows both compute the same function."""
    note = "independent init (no loader)"
    if ref.same_weights:
        ref.theirs.eval()
        ref.ours.eval()
        with torch.no_grad():
            gap = (OUR_LOSS[w.task](ref.ours, batch) - ref.loss(ref.theirs, batch)).abs()
        note = f"same weights: |loss ours - theirs| = {gap.item():.1e} at init"
    return [
        Candidate(ref.name, ref.theirs, ref.loss, batch, opts),
        Candidate(OURS, ref.ours, OUR_LOSS[w.task], batch, opts, note),
    ]


OURS = "ours (pre)"
