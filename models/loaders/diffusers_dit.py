"""diffusers ``DiTTransformer2DModel`` -> our ``DiT(pre, timestep_freq_shift=1)``; see :mod:`models.loaders`."""

from __future__ import annotations

import re

import torch
from torch import Tensor, nn

from models.config import TrunkConfig
from models.dit import DiT
from models.loaders.common import (
    Source,
    _eps_problems,
    _every_block,
    _explain,
    _load_strict,
    _refuse,
    _rename,
    _short,
    _split,
    _trunk_problems,
)

_DIT_SUPPORTED = (
    "diffusers DiTTransformer2DModel with norm_type='ada_norm_zero', activation 'gelu-approximate' (or "
    "'gelu'), attention_bias=True, non-affine norms, identical per-block timestep/label embedders, "
    "out_channels = in or 2 x in; our DiT under norm_scheme='pre' with timestep_freq_shift=1, norm_eps equal "
    "to its norm1/norm_out eps (hard-coded 1e-6) and mlp_norm_eps to its norm3 eps (config.norm_eps)"
)

_DIT_RENAMES = (
    (r"^pos_embed\.proj\.(weight|bias)$", r"x_embedder.proj.\1"),
    (r"^transformer_blocks\.(\d+)\.norm1\.linear\.(weight|bias)$", r"trunk.blocks.\1.adaLN.net.1.\2"),
    (r"^transformer_blocks\.(\d+)\.attn1\.to_out\.0\.(weight|bias)$", r"trunk.blocks.\1.attn.proj.\2"),
    (r"^transformer_blocks\.(\d+)\.ff\.net\.0\.proj\.(weight|bias)$", r"trunk.blocks.\1.mlp.fc1.\2"),
    (r"^transformer_blocks\.(\d+)\.ff\.net\.2\.(weight|bias)$", r"trunk.blocks.\1.mlp.fc2.\2"),
    (r"^proj_out_1\.(weight|bias)$", r"final_adaLN.net.1.\1"),
    (r"^proj_out_2\.(weight|bias)$", r"final_linear.\1"),
)

_DIT_EMBEDDER = {  # block 0's CombinedTimestepLabelEmbeddings -> our embedders
    "timestep_embedder.linear_1.weight": "t_embedder.mlp.0.weight",
    "timestep_embedder.linear_1.bias": "t_embedder.mlp.0.bias",
    "timestep_embedder.linear_2.weight": "t_embedder.mlp.2.weight",
    "timestep_embedder.linear_2.bias": "t_embedder.mlp.2.bias",
    "class_embedder.embedding_table.weight": "y_embedder.table.weight",
}

_DIT_FEATURES = (
    (r"^pos_embed\.pos_embed$", "a stored, croppable position table (pos_embed_max_size); ours is fixed sin-cos"),
    (r"^pos_embed\.norm\.", "a norm in the patch embedding"),
    (r"\.(norm2|norm3|norm1\.norm)\.(weight|bias)$", "affine block norms (norm_elementwise_affine=True)"),
    (r"\.attn1\.(norm_q|norm_k|norm_added_q|norm_added_k)\.", "QK-norm in attention"),
    (r"\.attn2\.", "cross-attention"),
    (r"\.norm1\.emb\.", "embedder tensors our DiT has no slot for"),
)

_MLP_OF_DIFFUSERS = {"gelu-approximate": "gelu_tanh", "gelu": "gelu"}


def _dit_embedders(sd: dict[str, Tensor], depth: int) -> tuple[dict[str, Tensor], list[str]]:
    """Pops every block's ``norm1.emb`` copy, checks they are identical, maps block 0's onto ours."""
    copies = []
    for i in range(depth):
        prefix = f"transformer_blocks.{i}.norm1.emb."
        copies.append({k[len(prefix) :]: sd.pop(k) for k in [k for k in sd if k.startswith(prefix)]})
    problems = []
    first = copies[0]
    for i, copy in enumerate(copies[1:], start=1):
        if copy.keys() != first.keys():
            problems.append(f"transformer_blocks.{i}.norm1.emb holds {sorted(copy)}, block 0's {sorted(first)}")
            continue
        untied = [k for k in first if not torch.equal(copy[k], first[k])]
        if untied:
            problems.append(
                f"transformer_blocks.{i}.norm1.emb differs from block 0's copy ({_short(untied, 3)}): diffusers "
                "evaluates every block with its own timestep/label embedder, our DiT has one shared embedder "
                "(converted official DiT checkpoints hold identical copies; tie them only if that is intended)"
            )
    mapped = {ours: first.pop(theirs) for theirs, ours in _DIT_EMBEDDER.items() if theirs in first}
    sd.update({f"transformer_blocks.0.norm1.emb.{k}": v for k, v in first.items()})  # unknown: left over
    return mapped, problems


def _dit_module_problems(dit: nn.Module, model: DiT) -> list[str]:
    """Config and structure a state dict cannot show: heads, eps, activation, attention variant."""
    from diffusers import DiTTransformer2DModel

    if not isinstance(dit, DiTTransformer2DModel):
        return [f"the source is a {type(dit).__name__}, not a diffusers DiTTransformer2DModel"]
    c, cfg, problems = dit.config, model.cfg, []
    if c.norm_type != "ada_norm_zero":
        problems.append(f"norm_type={c.norm_type!r}")
    if _MLP_OF_DIFFUSERS.get(c.activation_fn) != cfg.mlp:
        problems.append(f"activation_fn={c.activation_fn!r} does not give our mlp={cfg.mlp!r}")
    if not c.attention_bias or not cfg.bias:
        problems.append(f"attention_bias={c.attention_bias}, our bias={cfg.bias}: to_out and ff always have biases")
    if c.norm_elementwise_affine:
        problems.append("norm_elementwise_affine=True; conditioned 'pre' uses non-affine norms")
    if c.num_attention_heads != cfg.num_heads:
        problems.append(f"source has {c.num_attention_heads} heads, ours {cfg.num_heads}")
    if dit.out_channels != model.out_channels:
        problems.append(f"source out_channels={dit.out_channels}, ours {model.out_channels} (learn_sigma)")
    for i, block in enumerate(dit.transformer_blocks):
        attn = block.attn1
        if (
            attn.norm_q is not None
            or attn.residual_connection
            or attn.rescale_output_factor != 1.0
            or abs(attn.scale - c.attention_head_dim**-0.5) > 1e-12
        ):
            problems.append(f"transformer_blocks.{i}.attn1 is not plain scaled dot-product self-attention")
    eps = {f"transformer_blocks.{i}.norm1.norm": b.norm1.norm.eps for i, b in enumerate(dit.transformer_blocks)}
    eps |= {f"transformer_blocks.{i}.norm3": b.norm3.eps for i, b in enumerate(dit.transformer_blocks)}
    eps["norm_out"] = dit.norm_out.eps
    problems += _eps_problems(eps, cfg, r"\.norm3$")  # norm3 is the MLP branch's norm
    pos = dit.pos_embed.pos_embed  # the conv kernel does not tell the latent size; this table does
    if pos is None or pos.shape != model.pos_embed.shape:
        shape = None if pos is None else tuple(pos.shape)
        problems.append(f"position table {shape} vs ours {tuple(model.pos_embed.shape)} (sample_size/patch_size)")
    elif (gap := (pos.double() - model.pos_embed.double()).abs().max().item()) > 1e-5:
        problems.append(f"its sin-cos position table differs from ours by {gap:.2g} (interpolation_scale?)")
    return _every_block(problems)


def load_diffusers_dit(model: DiT, module_or_state_dict: Source) -> DiT:
    """Loads a diffusers ``DiTTransformer2DModel`` into our ``DiT(pre)``, in place.

    diffusers keeps a timestep + label embedder inside every block's ``norm1.emb`` (its final layer
    reads block 0's); all copies must be identical and block 0's becomes our ``t_embedder`` /
    ``y_embedder``. Its timestep features use ``downscale_freq_shift=1``, so ``model`` must be
    built with ``timestep_freq_shift=1`` (:func:`dit_from_diffusers` does that).

    Args:
        model: our DiT; trunk ``norm_scheme="pre"``, layernorm, the source's sizes and activation.
        module_or_state_dict: the diffusers model (preferred: enables config checks) or its state dict.
            A module's norm eps must equal ours: ``norm3`` (MLP branch) ``mlp_norm_eps`` (diffusers'
            ``config.norm_eps``, default 1e-5), ``norm1`` and ``norm_out`` ``norm_eps`` (hard-coded 1e-6).

    Returns:
        ``model``, with every tensor replaced.

    Raises:
        ValueError: untied embedder copies, a non-pre model, or anything else that does not map.
    """
    dit, sd = _split(module_or_state_dict)
    problems = _trunk_problems(model.cfg, tuple(_MLP_OF_DIFFUSERS.values()))
    if model.t_embedder.freq_shift != 1:
        problems.append(
            f"our DiT has timestep_freq_shift={model.t_embedder.freq_shift}; diffusers' Timesteps use "
            "downscale_freq_shift=1, build ours with timestep_freq_shift=1"
        )
    if model.cfg.qk_norm:
        problems.append("our trunk has qk_norm=True; diffusers' DiT attention has no QK-norm")
    if dit is not None:
        problems += _dit_module_problems(dit, model)
    blocks = {int(m.group(1)) for k in sd if (m := re.match(r"^transformer_blocks\.(\d+)\.", k))}
    depth = max(blocks) + 1 if blocks else 0
    if depth != model.cfg.depth:
        problems.append(f"source has {depth} blocks, ours {model.cfg.depth}")
    mapped, emb_problems = _dit_embedders(sd, depth) if depth else ({}, ["no transformer_blocks"])
    problems += emb_problems
    for i in range(depth):  # separate Q, K, V -> our fused [q; k; v] projection (partial sets stay left over)
        for kind in ("weight", "bias"):
            names = [f"transformer_blocks.{i}.attn1.to_{n}.{kind}" for n in "qkv"]
            if all(n in sd for n in names):
                mapped[f"trunk.blocks.{i}.attn.qkv.{kind}"] = torch.cat([sd.pop(n) for n in names], dim=0)
    mapped |= _rename(sd, _DIT_RENAMES)
    mapped["pos_embed"] = model.pos_embed.detach().clone()  # fixed sin-cos table: ours (checked above)
    problems += _explain(sorted(sd), _DIT_FEATURES)
    _load_strict(model, mapped, problems, "the diffusers DiTTransformer2DModel into DiT", _DIT_SUPPORTED)
    return model


def dit_from_diffusers(module: nn.Module) -> DiT:
    """A ``DiT(pre, timestep_freq_shift=1)`` with the diffusers model's shape, loaded with its weights.

    ``norm_eps`` is 1e-6 (diffusers' hard-coded value for ``norm1`` and ``norm_out``) and
    ``mlp_norm_eps`` is ``config.norm_eps`` (``norm3``, the MLP branch's norm; default 1e-5), so a
    default-config model matches exactly.
    """
    from diffusers import DiTTransformer2DModel

    if not isinstance(module, DiTTransformer2DModel):
        _refuse("the diffusers model", [f"{type(module).__name__} is not a DiTTransformer2DModel"], _DIT_SUPPORTED)
    c, problems = module.config, []
    if c.activation_fn not in _MLP_OF_DIFFUSERS:
        problems.append(f"activation_fn={c.activation_fn!r}")
    if c.dropout:
        problems.append(f"dropout={c.dropout}: our DiT has no output/feed-forward dropout; set it to 0")
    if module.out_channels not in (c.in_channels, 2 * c.in_channels):
        problems.append(f"out_channels={module.out_channels} is neither in_channels nor 2 x in_channels")
    if not isinstance(c.sample_size, int):
        problems.append(f"sample_size={c.sample_size!r}; ours takes a square latent")
    _refuse("the diffusers DiTTransformer2DModel", problems, _DIT_SUPPORTED)
    emb = module.transformer_blocks[0].norm1.emb
    trunk = TrunkConfig(
        dim=c.num_attention_heads * c.attention_head_dim,
        depth=c.num_layers,
        num_heads=c.num_attention_heads,
        mlp=_MLP_OF_DIFFUSERS[c.activation_fn],
        mlp_hidden=module.transformer_blocks[0].ff.net[0].proj.out_features,
        norm_scheme="pre",
        norm_layer="layernorm",
        norm_eps=1e-6,
        mlp_norm_eps=c.norm_eps,
        init="xavier",
    )
    model = DiT(
        trunk,
        input_size=c.sample_size,
        patch_size=c.patch_size,
        in_channels=c.in_channels,
        num_classes=c.num_embeds_ada_norm,
        class_dropout_prob=emb.class_embedder.dropout_prob,
        learn_sigma=module.out_channels == 2 * c.in_channels,
        timestep_freq_shift=1,
    )
    return load_diffusers_dit(model, module)
