"""Our ``pre`` networks loaded from randomly initialized timm / diffusers references give their outputs.

Every reference tensor is randomized (norm scales and shifts included, diffusers' zero-inits too), so
an unmapped or misordered tensor shows up in the outputs; ``test_*_comparison_is_sensitive`` proves
the comparison would catch one.
"""

from __future__ import annotations

import pytest
import torch
from diffusers import DiTTransformer2DModel
from timm.models.vision_transformer import ResPostBlock, VisionTransformer

from models import DiT, NormScheme, TrunkConfig, ViTClassifier
from models.loaders import dit_from_diffusers, load_diffusers_dit, load_timm_vit, vit_from_timm

TOL = 1e-5
NON_PRE = [s.value for s in NormScheme if s != NormScheme.PRE]


@torch.no_grad()
def randomize(module: torch.nn.Module, seed: int, std: float = 0.1) -> torch.nn.Module:
    """Every parameter random: 1-D weights (norm scales) around 1, everything else around 0."""
    g = torch.Generator().manual_seed(seed)
    for name, p in module.named_parameters():
        noise = torch.randn(p.shape, generator=g) * std
        p.copy_(noise + 1.0 if p.ndim == 1 and name.endswith("weight") else noise)
    return module.eval()


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


#################################################################################
#                                    ViT                                        #
#################################################################################

VIT_CONFIGS = {
    "img32-p4-d64x2-h4": dict(img_size=32, patch_size=4, embed_dim=64, depth=2, num_heads=4, num_classes=10),
    "img48-p8-d96x3-h3-mlp2": dict(
        img_size=48, patch_size=8, embed_dim=96, depth=3, num_heads=3, mlp_ratio=2, num_classes=7
    ),
    "qk_norm-gelu_tanh": dict(
        img_size=32,
        patch_size=4,
        embed_dim=64,
        depth=2,
        num_heads=4,
        num_classes=5,
        qk_norm=True,
        act_layer="gelu_tanh",
    ),
}


def timm_vit(seed: int = 0, **kwargs) -> VisionTransformer:
    return randomize(VisionTransformer(**kwargs), seed)


def images(kw: dict, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(3, 3, kw["img_size"], kw["img_size"], generator=g)


@pytest.mark.parametrize("kw", VIT_CONFIGS.values(), ids=VIT_CONFIGS.keys())
def test_vit_logits_match_timm(kw):
    ref = timm_vit(**kw)
    ours = vit_from_timm(ref).eval()
    assert ours.cfg.norm_scheme == "pre" and ours.cfg.norm_eps == 1e-6
    x = images(kw)
    with torch.no_grad():
        expected = ref(x)
        assert max_diff(ours(x), expected) <= TOL
        # the state-dict path fills a separately built model identically
        again = load_timm_vit(
            ViTClassifier(ours.cfg, kw["img_size"], kw["patch_size"], num_classes=kw["num_classes"]), ref.state_dict()
        )
        assert max_diff(again.eval()(x), expected) <= TOL


@pytest.mark.parametrize("tensor", ["trunk.readout.norm_f.bias", "trunk.blocks.1.mlp_res.norm.weight", "cls_token"])
def test_vit_comparison_is_sensitive(tensor):
    kw = VIT_CONFIGS["img32-p4-d64x2-h4"]
    ref = timm_vit(**kw)
    ours = vit_from_timm(ref).eval()
    with torch.no_grad():
        ours.get_parameter(tensor).copy_(torch.ones(()) if tensor.endswith("weight") else torch.zeros(()))
        assert max_diff(ours(images(kw)), ref(images(kw))) > 100 * TOL  # as if that tensor were left unmapped


TINY_VIT = dict(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2, num_classes=3)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (dict(reg_tokens=2), "register tokens"),
        (dict(init_values=1e-5), "layer scale"),
        (dict(qkv_bias=False), "qkv_bias=False with proj_bias=True"),
        (dict(global_pool="avg"), "global_pool='avg'"),
        (dict(no_embed_class=True), "no_embed_class"),
        (dict(pre_norm=True), "norm_pre"),
        (dict(block_fn=ResPostBlock), "ResPostBlock"),
        (dict(scale_mlp_norm=True), "mlp"),
        (dict(act_layer="silu"), "act is SiLU"),
    ],
)
def test_vit_refuses_unsupported_timm_features(extra, message):
    with pytest.raises(ValueError, match=message) as info:
        vit_from_timm(timm_vit(**TINY_VIT, **extra))
    assert "supported: timm VisionTransformer in the DeiT layout" in str(info.value)


@pytest.mark.parametrize(
    ("extra", "message"), [(dict(reg_tokens=2), "register tokens"), (dict(init_values=1e-5), "layer scale")]
)
def test_vit_refuses_unsupported_features_from_a_state_dict(extra, message):
    ours = ViTClassifier(TrunkConfig(dim=32, depth=2, num_heads=2), 16, 4, num_classes=3)
    with pytest.raises(ValueError, match=message):
        load_timm_vit(ours, timm_vit(**TINY_VIT, **extra).state_dict())


def test_vit_refuses_qk_norm_mismatch():
    ours = ViTClassifier(TrunkConfig(dim=32, depth=2, num_heads=2), 16, 4, num_classes=3)
    with pytest.raises(ValueError, match="source qk_norm=True, our TrunkConfig.qk_norm=False"):
        load_timm_vit(ours, timm_vit(**TINY_VIT, qk_norm=True))
    full = ViTClassifier(TrunkConfig(dim=32, depth=2, num_heads=2, qk_norm=True, qk_norm_scope="full"), 16, 4, 3)
    with pytest.raises(ValueError, match="our qk_norm_scope is 'full'; the reference normalizes q and k per head"):
        load_timm_vit(full, timm_vit(**TINY_VIT, qk_norm=True))


@pytest.mark.parametrize("scheme", NON_PRE)
def test_vit_refuses_non_pre_schemes(scheme):
    ours = ViTClassifier(TrunkConfig(dim=32, depth=2, num_heads=2, norm_scheme=scheme), 16, 4, num_classes=3)
    with pytest.raises(ValueError, match=f"our norm_scheme is '{scheme}'; only 'pre'"):
        load_timm_vit(ours, timm_vit(**TINY_VIT))


def test_vit_loading_is_strict_both_ways():
    ours = ViTClassifier(TrunkConfig(dim=32, depth=2, num_heads=2), 16, 4, num_classes=3)
    sd = timm_vit(**TINY_VIT).state_dict()
    with pytest.raises(ValueError, match="no counterpart in our network: blocks.0.attn.extra"):
        load_timm_vit(ours, {**sd, "blocks.0.attn.extra": torch.zeros(1)})
    with pytest.raises(ValueError, match="the source does not fill: head.bias"):
        load_timm_vit(ours, {k: v for k, v in sd.items() if k != "head.bias"})
    with pytest.raises(ValueError, match="shape mismatches"):
        load_timm_vit(ViTClassifier(TrunkConfig(dim=32, depth=2, num_heads=2, mlp_hidden=64), 16, 4, num_classes=3), sd)


#################################################################################
#                                    DiT                                        #
#################################################################################

DIT_CONFIGS = {
    "s8-p2-c4-L2-h2x32-cls10": dict(
        sample_size=8, patch_size=2, in_channels=4, num_layers=2, num_attention_heads=2, attention_head_dim=32,
        num_embeds_ada_norm=10,
    ),
    "s8-p4-c4-learn_sigma-L3-h3x16-cls5": dict(
        sample_size=8, patch_size=4, in_channels=4, out_channels=8, num_layers=3, num_attention_heads=3,
        attention_head_dim=16, num_embeds_ada_norm=5,
    ),
}  # fmt: skip


def diffusers_dit(seed: int = 0, tie: bool = True, norm_eps: float = 1e-6, **kwargs) -> DiTTransformer2DModel:
    """A random diffusers DiT; ``tie`` copies block 0's embedder into every block, as converted checkpoints hold."""
    dit = randomize(DiTTransformer2DModel(norm_eps=norm_eps, **kwargs), seed)
    if tie:
        emb = dit.transformer_blocks[0].norm1.emb.state_dict()
        for block in dit.transformer_blocks[1:]:
            block.norm1.emb.load_state_dict(emb)
    return dit


def dit_inputs(kw: dict, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(4, kw["in_channels"], kw["sample_size"], kw["sample_size"], generator=g)
    return x, torch.tensor([0, 17, 500, 999]), torch.tensor([0, 1, kw["num_embeds_ada_norm"] - 1, 2])


def reference(dit: DiTTransformer2DModel, x, t, y) -> torch.Tensor:
    with torch.no_grad():
        return dit(x, timestep=t, class_labels=y).sample


@pytest.mark.parametrize("kw", DIT_CONFIGS.values(), ids=DIT_CONFIGS.keys())
def test_dit_output_matches_diffusers(kw):
    ref = diffusers_dit(**kw)
    ours = dit_from_diffusers(ref).eval()
    assert ours.t_embedder.freq_shift == 1 and ours.out_channels == ref.out_channels
    x, t, y = dit_inputs(kw)
    expected = reference(ref, x, t, y)
    with torch.no_grad():
        assert max_diff(ours(x, t, y), expected) <= TOL
        # diffusers' fixed sin-cos table is ours
        assert max_diff(ours.pos_embed, ref.pos_embed.pos_embed) <= 1e-6
        size = (kw["sample_size"], kw["patch_size"], kw["in_channels"], kw["num_embeds_ada_norm"])
        fresh = DiT(ours.cfg, *size, learn_sigma="out_channels" in kw, timestep_freq_shift=1)
        again = load_diffusers_dit(fresh, ref.state_dict())
        assert max_diff(again.eval()(x, t, y), expected) <= TOL


def _swap_halves(w: torch.Tensor) -> None:
    """(shift, scale) -> (scale, shift) along the output rows."""
    w.copy_(torch.cat(w.chunk(2)[::-1]))


@pytest.mark.parametrize("mutation", ["freq_shift_0", "final_shift_scale_swapped", "block_gate_zeroed"])
def test_dit_comparison_is_sensitive(mutation):
    kw = DIT_CONFIGS["s8-p2-c4-L2-h2x32-cls10"]
    ref = diffusers_dit(**kw)
    ours = dit_from_diffusers(ref).eval()
    with torch.no_grad():
        if mutation == "freq_shift_0":
            ours.t_embedder.freq_shift = 0
        elif mutation == "final_shift_scale_swapped":
            _swap_halves(ours.final_adaLN.net[1].weight)
            _swap_halves(ours.final_adaLN.net[1].bias)
        else:
            d = ours.cfg.dim
            ours.trunk.blocks[1].adaLN.net[1].bias[2 * d : 3 * d] = 0  # the attention gate's bias
        assert max_diff(ours(*dit_inputs(kw)), reference(ref, *dit_inputs(kw))) > 100 * TOL


def test_dit_refuses_untied_embedder_copies():
    kw = DIT_CONFIGS["s8-p2-c4-L2-h2x32-cls10"]
    ref = diffusers_dit(**kw, tie=False)
    with pytest.raises(ValueError, match=r"transformer_blocks.1.norm1.emb differs from block 0's copy"):
        dit_from_diffusers(ref)
    ours = DiT(
        TrunkConfig(dim=64, depth=2, num_heads=2, mlp="gelu_tanh"),
        8,
        2,
        4,
        10,
        learn_sigma=False,
        timestep_freq_shift=1,
    )
    with pytest.raises(ValueError, match="differs from block 0's copy"):
        load_diffusers_dit(ours, ref.state_dict())


def _tiny_dit(**trunk) -> DiT:
    cfg = TrunkConfig(**{"dim": 64, "depth": 2, "num_heads": 2, "mlp": "gelu_tanh", **trunk})
    return DiT(cfg, 8, 2, 4, 10, learn_sigma=False, timestep_freq_shift=1)


@pytest.mark.parametrize("scheme", NON_PRE)
def test_dit_refuses_non_pre_schemes(scheme):
    with pytest.raises(ValueError, match=f"our norm_scheme is '{scheme}'; only 'pre'"):
        load_diffusers_dit(_tiny_dit(norm_scheme=scheme), diffusers_dit(**DIT_CONFIGS["s8-p2-c4-L2-h2x32-cls10"]))


def test_dit_requires_diffusers_timestep_features():
    ours = DiT(TrunkConfig(dim=64, depth=2, num_heads=2, mlp="gelu_tanh"), 8, 2, 4, 10, learn_sigma=False)
    with pytest.raises(ValueError, match="build ours with timestep_freq_shift=1"):
        load_diffusers_dit(ours, diffusers_dit(**DIT_CONFIGS["s8-p2-c4-L2-h2x32-cls10"]))


def test_dit_refuses_config_mismatches():
    ref = diffusers_dit(**DIT_CONFIGS["s8-p2-c4-L2-h2x32-cls10"])
    with pytest.raises(ValueError, match="source has 2 heads, ours 4"):
        load_diffusers_dit(_tiny_dit(num_heads=4), ref)
    with pytest.raises(ValueError, match="activation_fn='gelu-approximate' does not give our mlp='gelu'"):
        load_diffusers_dit(_tiny_dit(mlp="gelu"), ref)
    with pytest.raises(ValueError, match="position table .* vs ours"):  # a 16 x 16 latent, same conv kernel
        load_diffusers_dit(DiT(_tiny_dit().cfg, 16, 2, 4, 10, learn_sigma=False, timestep_freq_shift=1), ref)
    with pytest.raises(ValueError, match="out_channels=5"):
        dit_from_diffusers(diffusers_dit(**{**DIT_CONFIGS["s8-p2-c4-L2-h2x32-cls10"], "out_channels": 5}))


def test_dit_default_norm_eps_matches_diffusers():
    """diffusers' default ``norm_eps=1e-5`` reaches only ``norm3`` (the MLP-branch norm); its other
    norms are hard-coded 1e-6. ``mlp_norm_eps`` carries the former, so the default model matches."""
    kw = DIT_CONFIGS["s8-p2-c4-L2-h2x32-cls10"]
    assert DiTTransformer2DModel(**kw).config.norm_eps == 1e-5  # diffusers' default
    ref = diffusers_dit(**kw, norm_eps=1e-5)
    ours = dit_from_diffusers(ref).eval()
    assert ours.cfg.norm_eps == 1e-6 and ours.cfg.mlp_norm_eps == 1e-5
    with torch.no_grad():
        assert max_diff(ours(*dit_inputs(kw)), reference(ref, *dit_inputs(kw))) <= TOL


def test_dit_refuses_mlp_norm_eps_mismatch():
    kw = DIT_CONFIGS["s8-p2-c4-L2-h2x32-cls10"]
    with pytest.raises(ValueError, match=r"transformer_blocks\.\*\.norm3 has eps 1e-05, our trunk uses norm_eps 1e-06"):
        load_diffusers_dit(_tiny_dit(), diffusers_dit(**kw, norm_eps=1e-5))  # mlp_norm_eps unset
    with pytest.raises(ValueError, match=r"norm3 has eps 1e-06, our trunk uses mlp_norm_eps 1e-05") as info:
        load_diffusers_dit(_tiny_dit(mlp_norm_eps=1e-5), diffusers_dit(**kw, norm_eps=1e-6))
    assert "norm_out has eps" not in str(info.value) and "norm1.norm has eps" not in str(info.value)


#################################################################################
#                                   Llama                                       #
#################################################################################

LLAMA_CONFIGS = {
    "d32x2-h2": dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2),
    "d48x3-h4-tied-theta500": dict(
        hidden_size=48,
        intermediate_size=80,
        num_hidden_layers=3,
        num_attention_heads=4,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 500.0},
        rms_norm_eps=1e-5,
    ),
    "d48x2-h4-kv2": dict(  # grouped-query attention: our num_kv_heads
        hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2
    ),
}
LLAMA_VOCAB, LLAMA_SEQ = 61, 24


def hf_llama(seed: int = 0, **kwargs):
    from transformers import LlamaConfig, LlamaForCausalLM

    kw = dict(vocab_size=LLAMA_VOCAB, max_position_embeddings=LLAMA_SEQ, num_key_value_heads=None)
    kw = {**kw, **kwargs}
    kw["num_key_value_heads"] = kw["num_key_value_heads"] or kw.get("num_attention_heads", 2)
    config = LlamaConfig(**kw, attn_implementation="sdpa")
    torch.manual_seed(seed)
    return randomize(LlamaForCausalLM(config), seed)


def llama_ids(seed: int = 1) -> torch.Tensor:
    return torch.randint(0, LLAMA_VOCAB, (3, LLAMA_SEQ), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("kw", LLAMA_CONFIGS.values(), ids=LLAMA_CONFIGS.keys())
def test_lm_logits_match_llama(kw):
    from models.loaders import lm_from_llama

    llama = hf_llama(**kw)
    ours = lm_from_llama(llama).eval()
    assert ours.cfg.norm_scheme == "pre" and not ours.cfg.qk_norm
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in llama.parameters())
    ids = llama_ids()
    with torch.no_grad():
        theirs, mine = llama(input_ids=ids).logits, ours(ids)
    torch.testing.assert_close(mine, theirs, rtol=0, atol=TOL)
    print(f"\nmax |logits ours - Llama| = {max_diff(mine, theirs):.1e}")


@pytest.mark.parametrize("tensor", ["trunk.readout.norm_f.weight", "trunk.blocks.1.mlp.fc1.weight", "head.weight"])
def test_lm_comparison_is_sensitive(tensor):
    """Swapping two halves of one loaded tensor (Q and K rows, gate and up, ...) changes the logits."""
    from models.loaders import lm_from_llama

    llama = hf_llama(**LLAMA_CONFIGS["d32x2-h2"])
    ours = lm_from_llama(llama).eval()
    with torch.no_grad():
        w = dict(ours.named_parameters())[tensor]
        w.copy_(torch.cat(w.chunk(2, dim=0)[::-1]))
        assert max_diff(ours(llama_ids()), llama(input_ids=llama_ids()).logits) > 1e-3


def test_lm_loads_a_llama_state_dict_into_a_built_model():
    from models import LanguageModel
    from models.loaders import load_hf_llama

    llama = hf_llama(**LLAMA_CONFIGS["d32x2-h2"])
    cfg = TrunkConfig(dim=32, depth=2, num_heads=2, mlp="swiglu", mlp_hidden=48, norm_layer="rmsnorm",
                      norm_eps=1e-6, qk_norm=False, bias=False)  # fmt: skip
    ours = load_hf_llama(LanguageModel(cfg, vocab_size=LLAMA_VOCAB, max_seq_len=LLAMA_SEQ), llama.state_dict()).eval()
    with torch.no_grad():
        torch.testing.assert_close(ours(llama_ids()), llama(input_ids=llama_ids()).logits, rtol=0, atol=TOL)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (dict(head_dim=8), "head_dim=8 is not hidden_size / num_attention_heads"),
        (dict(attention_bias=True), "biases"),
        (dict(hidden_act="gelu"), "hidden_act='gelu'"),
        (dict(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}), "rope_type='linear'"),
    ],
)
def test_lm_refuses_what_our_network_cannot_express(change, message):
    from models.loaders import lm_from_llama

    with pytest.raises(ValueError, match=message):
        lm_from_llama(hf_llama(**{**LLAMA_CONFIGS["d32x2-h2"], **change}))


@pytest.mark.parametrize(
    ("trunk", "message"),
    [
        (dict(norm_scheme="siamese"), "norm_scheme is 'siamese'"),
        (dict(qk_norm=True), "qk_norm is True"),
        (dict(norm_eps=1e-5), "rms_norm_eps=1e-06, ours 1e-05"),
        (dict(mlp_hidden=64), "intermediate_size=48, ours 64"),
    ],
)
def test_lm_refuses_a_mismatched_model(trunk, message):
    from models import LanguageModel
    from models.loaders import load_hf_llama

    base = dict(dim=32, depth=2, num_heads=2, mlp="swiglu", mlp_hidden=48, norm_layer="rmsnorm", norm_eps=1e-6,
                qk_norm=False, bias=False)  # fmt: skip
    model = LanguageModel(TrunkConfig(**{**base, **trunk}), vocab_size=LLAMA_VOCAB, max_seq_len=LLAMA_SEQ)
    with pytest.raises(ValueError, match=message):
        load_hf_llama(model, hf_llama(**LLAMA_CONFIGS["d32x2-h2"]))
