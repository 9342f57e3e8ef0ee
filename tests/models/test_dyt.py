"""DyT's reference ports beyond the layer swap: the LLaMA port's per-site alpha, its shift-less form and its
learnable embedding scale; the options that belong to one task are refused by the others.

The layer itself (``weight * tanh(alpha x) + bias``) is checked in test_layers.py, and every scheme with DyT
norms, with and without adaLN, against the float64 reference in test_schemes.py; the DiT port's init in
test_init.py.
"""

from __future__ import annotations

import re

import pytest
import torch

from models import DiT, LanguageModel, Trunk, TrunkConfig, ViTClassifier
from models.norms import DyT
from models.schemes import NormScheme

D, HEADS = 16, 2
# DyT's LLaMA port for LLaMA-2 7B (other_tasks/LLaMA/README.md): attn_alpha_init_value 0.8,
# ffn_alpha_init_value 0.2, dec_alpha_init_value 0.2; its DyT has no shift (LayerNormParameterized).
LLAMA_PORT = dict(norm_layer="dyt", dyt_alpha_init_attn=0.8, dyt_alpha_init_mlp=0.2, dyt_alpha_init_final=0.2,
                  dyt_bias=False)  # fmt: skip


def site_alpha(name: str) -> float:
    """What the LLaMA port's values give the DyT at module path ``name``."""
    if re.match(r"(blocks\.\d+\.)?attn\.[qkv]_norm$", name):
        return 0.5  # QK(V)-norm: the base value (the port has no QK-norm)
    if re.match(r"blocks\.\d+\.attn_res\.", name):
        return 0.8
    if re.match(r"blocks\.\d+\.mlp_res\.", name):
        return 0.2
    assert name.startswith("readout."), name
    return 0.2


@pytest.mark.parametrize("conditioned", [False, True], ids=["plain", "adaln"])
@pytest.mark.parametrize("scheme", list(NormScheme))
def test_llama_port_alpha_per_site_in_every_scheme(scheme, conditioned):
    """Every DyT of attention sublayers starts at 0.8, of MLP sublayers at 0.2, of the readout at 0.2, the
    QK-norm's at 0.5; none has a shift; every scale is 1."""
    cfg = TrunkConfig(dim=D, depth=2, num_heads=HEADS, norm_scheme=scheme, qk_norm=True, **LLAMA_PORT)
    trunk = Trunk(cfg, conditioned=conditioned)
    dyts = {name: m for name, m in trunk.named_modules() if isinstance(m, DyT)}
    assert any(".mlp_res." in n for n in dyts)  # (a readout may have no norm: post, deepnorm without adaLN)
    assert not any(isinstance(m, torch.nn.LayerNorm | torch.nn.RMSNorm) for m in trunk.modules())
    for name, m in dyts.items():
        assert m.alpha.item() == pytest.approx(site_alpha(name), rel=1e-7), name
        assert m.bias is None, name
        assert m.weight is None or bool((m.weight == 1).all()), name


def test_default_dyt_alpha_is_half_everywhere():
    trunk = Trunk(TrunkConfig(dim=D, depth=2, num_heads=HEADS, norm_scheme="siamese", norm_layer="dyt", qk_norm=True))
    alphas = {m.alpha.item() for m in trunk.modules() if isinstance(m, DyT)}
    assert alphas == {0.5}
    assert all(m.bias is not None for m in trunk.modules() if isinstance(m, DyT) and m.weight is not None)


def test_llama_port_embedding_scale_starts_at_sqrt_d_and_scales_the_trunk_input():
    """``x = shared(ids) * shared_scale``, ``shared_scale`` a learnable (1,) parameter filled with sqrt(emb_dim)."""
    cfg = TrunkConfig(dim=D, depth=1, num_heads=HEADS, learned_embed_scale=True, **LLAMA_PORT)
    lm = LanguageModel(cfg, vocab_size=11, max_seq_len=8).double()
    assert lm.embed_scale.shape == (1,) and lm.embed_scale.requires_grad
    assert lm.embed_scale.item() == 4.0  # sqrt(16)
    assert LanguageModel(TrunkConfig(dim=128, depth=1, num_heads=2, learned_embed_scale=True), 11).embed_scale.item() \
        == pytest.approx(11.313708498984761)  # fmt: skip
    with torch.no_grad():
        lm.embed_scale.fill_(2.5)
    seen = []
    lm.trunk.register_forward_pre_hook(lambda mod, args: seen.append(args[0]))
    ids = torch.tensor([[1, 4, 9, 2]])
    with torch.no_grad():
        lm(ids)
    torch.testing.assert_close(seen[0], 2.5 * lm.embed.weight[ids], rtol=0, atol=0)
    assert LanguageModel(TrunkConfig(dim=D, depth=1, num_heads=HEADS), 11).embed_scale is None


def test_task_specific_port_options_are_refused_where_they_mean_nothing():
    cfg = TrunkConfig(dim=D, depth=1, num_heads=HEADS, learned_embed_scale=True)
    with pytest.raises(ValueError, match="learned_embed_scale is a language-model option"):
        ViTClassifier(cfg, img_size=8, patch_size=4, num_classes=3)
    with pytest.raises(ValueError, match="learned_embed_scale is a language-model option"):
        DiT(cfg, input_size=4, patch_size=2, num_classes=3)
    with pytest.raises(ValueError, match="adaln_zero_init=false needs a conditioned"):
        Trunk(TrunkConfig(dim=D, depth=1, num_heads=HEADS, adaln_zero_init=False))


#################################################################################
#                        The paper's width rule for alpha                       #
#################################################################################


#: Every row of the width rule with where it comes from: (width, attention alpha, other alpha, sources). "port" is
#: jiachenzhu/DyT at aab5dde: other_tasks/LLaMA/README.md's training commands (--attn_alpha_init_value,
#: --ffn_alpha_init_value = --dec_alpha_init_value) for the model variants whose emb_dim
#: fms_fsdp/utils/config_utils.py gives; "Table 11" / "Table 12": the paper (arXiv 2503.10622), width x depth sweep
#: and LLaMA models.
WIDTH_ROWS = [
    (1024, 1.0, 1.0, "Table 11"),
    (2048, 1.0, 0.5, "Table 11"),
    (4096, 0.8, 0.2, "Table 11; Table 12 and port: llama2_7b, emb_dim 4096, 0.8 / 0.2 / 0.2"),
    (5120, 0.6, 0.15, "Table 12 and port: llama2_13b, emb_dim 5120, 0.6 / 0.15 / 0.15"),
    (8192, 0.2, 0.05, "Table 11; Table 12 and port: llama2_34b and llama2_70b, emb_dim 8192, 0.2 / 0.05 / 0.05"),
]


def test_the_width_table_is_the_sourced_rows():
    from models.config import DYT_WIDTH_TABLE

    assert tuple((w, a, o) for w, a, o, _ in WIDTH_ROWS) == DYT_WIDTH_TABLE


@pytest.mark.parametrize(
    ("dim", "attn", "other"),
    [(64, 1.0, 1.0), (128, 1.0, 1.0), (1024, 1.0, 1.0), (1536, 1.0, 1.0), (2048, 1.0, 0.5), (4096, 0.8, 0.2),
     (5120, 0.6, 0.15), (6144, 0.6, 0.15), (8192, 0.2, 0.05), (16384, 0.2, 0.05)],
)  # fmt: skip
def test_width_rule_gives_the_tables_alpha_by_width(dim: int, attn: float, other: float):
    """The rows of WIDTH_ROWS (5120: LLaMA-2 13B's 0.6 / 0.15, which the rule used to answer with the 4096 row's
    0.8 / 0.2); between rows the smaller width's row, below the table its first row."""
    cfg = TrunkConfig(dim=dim, depth=1, num_heads=1, norm_layer="dyt", dyt_alpha_rule="width")
    assert (cfg.dyt_init("attn").alpha, cfg.dyt_init("mlp").alpha, cfg.dyt_init("readout").alpha) == (
        attn,
        other,
        other,
    )
    assert cfg.dyt_init("qk").alpha == 0.5  # anything else: the base value


def test_width_rule_builds_the_trunk_and_explicit_values_win():
    cfg = TrunkConfig(dim=2048, depth=1, num_heads=16, norm_layer="dyt", dyt_alpha_rule="width", dyt_alpha_init_mlp=0.3)
    with torch.device("meta"):
        trunk = Trunk(cfg)
    assert trunk.blocks[0].attn_res.norm.alpha_init == 1.0 and trunk.blocks[0].mlp_res.norm.alpha_init == 0.3
    assert trunk.readout.norm_f.alpha_init == 0.5
    assert TrunkConfig().dyt_alpha_rule == "fixed"
    with pytest.raises(ValueError, match="dyt_alpha_rule"):
        TrunkConfig(dyt_alpha_rule="depth")
