"""timm ``VisionTransformer`` (DeiT layout) -> our ``ViTClassifier(pre)``; see :mod:`models.loaders`."""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor, nn

from models.config import TrunkConfig
from models.loaders.common import (
    Source,
    _eps_problems,
    _every_block,
    _explain,
    _load_strict,
    _refuse,
    _rename,
    _split,
    _trunk_problems,
)
from models.vit import ViTClassifier

_VIT_SUPPORTED = (
    "timm VisionTransformer in the DeiT layout: Block (pre-norm), class token, learned pos_embed added to "
    "the class token too, global_pool='token', final norm, LayerNorm, GELU Mlp, qkv_bias == proj_bias, "
    "optional qk_norm; no register tokens, layer scale, pre/fc norm, attention pool or extra norms/gates"
)

_VIT_RENAMES = (
    (r"^blocks\.(\d+)\.norm1\.(weight|bias)$", r"trunk.blocks.\1.attn_res.norm.\2"),
    (r"^blocks\.(\d+)\.norm2\.(weight|bias)$", r"trunk.blocks.\1.mlp_res.norm.\2"),
    (r"^blocks\.(\d+)\.attn\.(qkv|proj|q_norm|k_norm)\.(weight|bias)$", r"trunk.blocks.\1.attn.\2.\3"),
    (r"^blocks\.(\d+)\.mlp\.(fc1|fc2)\.(weight|bias)$", r"trunk.blocks.\1.mlp.\2.\3"),
    (r"^norm\.(weight|bias)$", r"trunk.readout.norm_f.\1"),
    (r"^(patch_embed\.proj|head)\.(weight|bias)$", r"\1.\2"),
    (r"^(cls_token|pos_embed)$", r"\1"),
)

_VIT_FEATURES = (  # unconsumed timm tensors -> the option that created them
    (r"^reg_token$", "register tokens (reg_tokens > 0)"),
    (r"\.ls[12]\.gamma$", "layer scale (init_values set: ls1/ls2 are LayerScale, not Identity)"),
    (r"^norm_pre\.", "a norm before the blocks (pre_norm=True)"),
    (r"^fc_norm\.", "a norm after pooling (fc_norm / global_pool='avg')"),
    (r"^attn_pool\.", "attention pooling (global_pool='map' or 'prr')"),
    (r"\.attn\.norm\.", "a norm inside attention (scale_attn_norm=True)"),
    (r"\.mlp\.norm\.", "a norm inside the MLP (scale_mlp_norm=True)"),
    (r"\.attn\.gate\.", "gated attention"),
    (r"^patch_embed\.norm\.", "a norm in the patch embedding (embed_norm_layer)"),
    (r"\.mlp\.(fc1_g|fc1_x|w12|w3)\.", "a gated MLP (SwiGLU / GluMlp)"),
)


def _timm_activation(act: nn.Module) -> str | None:
    """Our ``mlp`` kind for timm's MLP activation, or None when we have no equivalent."""
    from timm.layers.activations import GELU, GELUTanh

    if isinstance(act, nn.GELU):
        return "gelu" if act.approximate == "none" else "gelu_tanh"
    return {GELU: "gelu", GELUTanh: "gelu_tanh"}.get(type(act))


def _timm_module_problems(vit: nn.Module) -> list[str]:
    """Structure a state dict cannot show: block/attention/MLP classes, pooling, identity slots."""
    from timm.layers import Attention, Mlp, PatchEmbed
    from timm.models.vision_transformer import Block, VisionTransformer

    if not isinstance(vit, VisionTransformer):
        return [f"the source is a {type(vit).__name__}, not a timm VisionTransformer"]
    problems = []
    if vit.global_pool != "token":
        problems.append(f"global_pool={vit.global_pool!r}; ours reads out the class token ('token')")
    if not vit.has_class_token:
        problems.append("no class token (class_token=False)")
    if vit.num_reg_tokens:
        problems.append(f"register tokens (reg_tokens={vit.num_reg_tokens})")
    if vit.no_embed_class:
        problems.append("no_embed_class=True: positions skip the class token; ours adds them to it too")
    if vit.pos_embed is None:
        problems.append("no position embedding (pos_embed='none')")
    for name in ("norm_pre", "fc_norm"):
        if not isinstance(getattr(vit, name), nn.Identity):
            problems.append(f"{name} is {type(getattr(vit, name)).__name__}, ours has no such step")
    if vit.attn_pool is not None:
        problems.append(f"attention pooling ({type(vit.attn_pool).__name__})")
    if not isinstance(vit.norm, nn.LayerNorm):
        problems.append(f"final norm is {type(vit.norm).__name__}; ours needs a LayerNorm (final_norm=True)")
    if type(vit.patch_embed) is not PatchEmbed or not isinstance(vit.patch_embed.norm, nn.Identity):
        problems.append("patch embedding is not a plain timm PatchEmbed (custom embed_layer or embed_norm_layer)")
    for i, block in enumerate(vit.blocks):
        where = f"blocks.{i}"
        if type(block) is not Block:
            problems.append(f"{where} is {type(block).__name__}; only the pre-norm Block maps onto 'pre'")
            continue
        for ls in ("ls1", "ls2"):
            if not isinstance(getattr(block, ls), nn.Identity):
                problems.append(f"{where}.{ls} is {type(getattr(block, ls)).__name__}: layer scale (init_values)")
        attn, mlp = block.attn, block.mlp
        if type(attn) is not Attention:
            problems.append(f"{where}.attn is {type(attn).__name__}; only timm's Attention is supported")
        elif not isinstance(attn.norm, nn.Identity):
            problems.append(
                f"{where}.attn.norm is {type(attn.norm).__name__}: a norm inside attention (scale_attn_norm)"
            )
        elif attn.gate is not None:
            problems.append(f"{where}.attn.gate is set: gated attention")
        if type(mlp) is not Mlp:
            problems.append(f"{where}.mlp is {type(mlp).__name__}; only timm's GELU Mlp is supported")
        elif not isinstance(mlp.norm, nn.Identity):
            problems.append(f"{where}.mlp.norm is {type(mlp.norm).__name__}: a norm inside the MLP (scale_mlp_norm)")
        elif _timm_activation(mlp.act) is None:
            problems.append(f"{where}.mlp.act is {type(mlp.act).__name__}; supported: GELU (exact or tanh)")
        for norm in ("norm1", "norm2"):
            m = getattr(block, norm)
            if not isinstance(m, nn.LayerNorm) or not m.elementwise_affine:
                problems.append(f"{where}.{norm} is {type(m).__name__}; supported: affine LayerNorm")
    return _every_block(problems)


def _timm_norm_eps(vit: nn.Module) -> dict[str, float]:
    return {name: m.eps for name, m in vit.named_modules() if isinstance(m, nn.LayerNorm)}


def _timm_bias_qk(sd: Mapping[str, Tensor]) -> tuple[bool, bool, list[str]]:
    """``(qkv_bias, qk_norm, problems)`` read off the state dict."""
    qkv_bias, proj_bias = "blocks.0.attn.qkv.bias" in sd, "blocks.0.attn.proj.bias" in sd
    qk_norm = "blocks.0.attn.q_norm.weight" in sd
    problems = []
    if qkv_bias != proj_bias:
        problems.append(
            f"qkv_bias={qkv_bias} with proj_bias={proj_bias}: our Attention has one bias switch "
            "(TrunkConfig.bias) for the QKV and output projections"
        )
    if "blocks.0.norm1.weight" in sd and "blocks.0.norm1.bias" not in sd:
        problems.append("bias-free block norms (RmsNorm?); supported: LayerNorm with bias")
    if "cls_token" not in sd:
        problems.append("no class token")
    return qkv_bias, qk_norm, problems


def load_timm_vit(model: ViTClassifier, state_dict_or_module: Source) -> ViTClassifier:
    """Loads a timm ``VisionTransformer`` (DeiT layout) into our ``ViTClassifier(pre)``, in place.

    Args:
        model: our classifier; its trunk must use ``norm_scheme="pre"``, layernorm, a GELU MLP and
            the source's sizes, qkv bias and qk_norm.
        state_dict_or_module: the timm model (preferred: enables structural checks) or its state dict.

    Returns:
        ``model``, with every tensor replaced.

    Raises:
        ValueError: listing everything that does not map, and what is supported.
    """
    vit, sd = _split(state_dict_or_module)
    cfg = model.cfg
    problems = _trunk_problems(cfg, ("gelu", "gelu_tanh"))
    qkv_bias, qk_norm, layout = _timm_bias_qk(sd)
    problems += layout
    if qkv_bias != cfg.bias:
        problems.append(f"source qkv_bias={qkv_bias}, our TrunkConfig.bias={cfg.bias}")
    if qk_norm != cfg.qk_norm:
        problems.append(f"source qk_norm={qk_norm}, our TrunkConfig.qk_norm={cfg.qk_norm}")
    if vit is not None:
        structure = _timm_module_problems(vit)
        problems += structure
        if not structure:  # sizes and eps are only readable from a sane structure
            problems += _every_block(_eps_problems(_timm_norm_eps(vit), cfg, r"^blocks\.\d+\.norm2$"))
            act = _timm_activation(vit.blocks[0].mlp.act)
            if act != cfg.mlp:
                problems.append(f"source activation gives mlp={act!r}, ours is {cfg.mlp!r}")
            if vit.blocks[0].attn.num_heads != cfg.num_heads:
                problems.append(f"source has {vit.blocks[0].attn.num_heads} heads, ours {cfg.num_heads}")
    mapped = _rename(sd, _VIT_RENAMES)
    problems += _explain(sorted(sd), _VIT_FEATURES)
    _load_strict(model, mapped, problems, "the timm VisionTransformer into ViTClassifier", _VIT_SUPPORTED)
    return model


def vit_from_timm(timm_model: nn.Module) -> ViTClassifier:
    """A ``ViTClassifier(pre)`` with the timm model's shape, loaded with its weights.

    Carries head dropout, drop-path and attention dropout; refuses position, patch and projection
    dropout, which our network does not have.
    """
    vit, what = timm_model, "the timm VisionTransformer"
    _refuse(what, _timm_module_problems(vit), _VIT_SUPPORTED)
    block, patch = vit.blocks[0], vit.patch_embed
    qkv_bias, qk_norm, problems = _timm_bias_qk(vit.state_dict())
    eps = set(_timm_norm_eps(vit).values())
    if len(eps) > 1:
        problems.append(f"its norms use several eps {sorted(eps)}; our trunk has one norm_eps")
    drops = {"pos_drop": vit.pos_drop.p, "proj_drop": block.attn.proj_drop.p}
    drops["patch_drop"] = getattr(vit.patch_drop, "prob", 0.0)
    problems += [f"{name}={p}: our network has no such dropout; set it to 0" for name, p in drops.items() if p]
    if len(set(patch.img_size)) > 1 or len(set(patch.patch_size)) > 1:
        problems.append(f"non-square img_size {patch.img_size} or patch_size {patch.patch_size}")
    if not vit.num_classes:
        problems.append("no classifier head (num_classes=0)")
    _refuse(what, problems, _VIT_SUPPORTED)
    drop_path = vit.blocks[-1].drop_path1
    trunk = TrunkConfig(
        dim=vit.embed_dim,
        depth=len(vit.blocks),
        num_heads=block.attn.num_heads,
        mlp=_timm_activation(block.mlp.act),
        mlp_hidden=block.mlp.fc1.out_features,
        norm_scheme="pre",
        norm_layer="layernorm",
        norm_eps=eps.pop(),
        qk_norm=qk_norm,
        bias=qkv_bias,
        drop_path=getattr(drop_path, "drop_prob", 0.0),
        attn_drop=block.attn.attn_drop.p,
    )
    model = ViTClassifier(
        trunk,
        img_size=patch.img_size[0],
        patch_size=patch.patch_size[0],
        in_chans=patch.proj.in_channels,
        num_classes=vit.num_classes,
        drop_rate=vit.head_drop.p,
    )
    return load_timm_vit(model, vit)
