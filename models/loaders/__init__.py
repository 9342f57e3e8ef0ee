"""Weight loaders: trusted timm / diffusers / transformers networks into the suite's ``pre`` networks.

Under ``norm_scheme="pre"`` our trunk computes exactly timm's ViT block, diffusers' DiT block and
transformers' Llama decoder layer, so
their tensors load one-to-one and the outputs agree to float rounding. Each loader renames every
tensor, refuses (``ValueError``, naming what is wrong and what is supported) anything our network
cannot express, and is strict both ways: every source tensor is consumed, every one of ours filled::

    timm VisionTransformer (DeiT layout)            ViTClassifier(pre)
    blocks.i.norm1 / norm2                      ->  trunk.blocks.i.attn_res.norm / mlp_res.norm
    blocks.i.attn.qkv / proj (/ q_norm, k_norm) ->  trunk.blocks.i.attn.qkv / proj (/ q_norm, k_norm)
    blocks.i.mlp.fc1 / fc2                      ->  trunk.blocks.i.mlp.fc1 / fc2
    norm                                        ->  trunk.readout.norm_f
    patch_embed.proj, cls_token, pos_embed, head -> same names

    diffusers DiTTransformer2DModel                 DiT(pre, timestep_freq_shift=1)
    pos_embed.proj                              ->  x_embedder.proj
    transformer_blocks.0.norm1.emb.timestep_embedder.linear_1 / 2 -> t_embedder.mlp.0 / mlp.2
    transformer_blocks.0.norm1.emb.class_embedder.embedding_table -> y_embedder.table
    transformer_blocks.i.norm1.linear           ->  trunk.blocks.i.adaLN.net.1   (same 6-chunk order)
    transformer_blocks.i.attn1.to_q|to_k|to_v   ->  trunk.blocks.i.attn.qkv      (concatenated)
    transformer_blocks.i.attn1.to_out.0         ->  trunk.blocks.i.attn.proj
    transformer_blocks.i.ff.net.0.proj / net.2  ->  trunk.blocks.i.mlp.fc1 / fc2
    proj_out_1 / proj_out_2                     ->  final_adaLN.net.1 / final_linear

    transformers LlamaForCausalLM                   LanguageModel(pre, rmsnorm, swiglu, no QK-norm)
    model.embed_tokens / lm_head                ->  embed / head
    model.layers.i.input_layernorm / post_attention_layernorm -> trunk.blocks.i.attn_res.norm / mlp_res.norm
    model.layers.i.self_attn.q_proj|k_proj|v_proj -> trunk.blocks.i.attn.qkv   (concatenated)
    model.layers.i.self_attn.o_proj             ->  trunk.blocks.i.attn.proj
    model.layers.i.mlp.gate_proj|up_proj / down_proj -> trunk.blocks.i.mlp.fc1 (concatenated) / fc2
    model.norm                                  ->  trunk.readout.norm_f
    (num_key_value_heads < num_attention_heads: grouped-query attention, our num_kv_heads; llama_from_lm: back)

diffusers' DiT hard-codes eps 1e-6 for norm1 and norm_out but uses ``config.norm_eps`` (default 1e-5)
for norm3, the MLP branch's norm: ours match them with ``norm_eps`` and ``mlp_norm_eps``.

Pass the module rather than its state dict when you have it: a state dict cannot tell the head
count, the norm epsilons or the block type, so those checks only run on modules.

Layout: ``common`` (strict renaming, loading and refusals), ``timm_vit``, ``diffusers_dit``, ``hf_llama``;
``suite_export`` reads a folder the suite exported itself (``python -m experiments export``) back into a
``LanguageModel`` of any scheme (same names, no renaming), e.g. to fine-tune it.
"""

from models.loaders.diffusers_dit import dit_from_diffusers, load_diffusers_dit
from models.loaders.hf_llama import llama_from_lm, lm_from_llama, load_hf_llama
from models.loaders.suite_export import lm_from_export, load_suite_export
from models.loaders.timm_vit import load_timm_vit, vit_from_timm

__all__ = [
    "dit_from_diffusers",
    "llama_from_lm",
    "lm_from_export",
    "lm_from_llama",
    "load_diffusers_dit",
    "load_hf_llama",
    "load_suite_export",
    "load_timm_vit",
    "vit_from_timm",
]
