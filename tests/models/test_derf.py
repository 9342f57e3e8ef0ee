"""Derf (``norm_layer: derf``) against its reference ``Dynamic_erf`` (zlab-princeton/Derf at 8dd9ea3): the layer's
equation in float64 with the reference's parameter names and init values, its ports' recipes (ViT / DiT alpha 0.5,
GPT-2 alpha 1.0 with the learnable sqrt(d) embedding scale, the DiT port's init: the blocks' adaLN zeroed for DiT-B,
the final layer xavier-uniform with Derf), and Keel's facts.

Every scheme with Derf norms, plain and adaLN, is checked against the float64 trunk reference in test_schemes.py.
"""

from __future__ import annotations

import math

import pytest
import torch

from models import DiT, LanguageModel, Trunk, TrunkConfig
from models.init_values import param_seed
from models.norms import Derf, build_norm
from models.schemes import NormScheme

D, HEADS = 16, 2


def hand_derf(x, alpha, shift, weight=None, bias=None):
    """``Dynamic_erf.forward``: ``x = alpha * x + shift; erf(x) * weight + bias`` (erf as its series-free
    definition through torch.special.erf, in float64)."""
    y = torch.special.erf(alpha * x + shift)
    if weight is not None:
        y = y * weight
    return y if bias is None else y + bias


def test_layer_is_the_reference_equation_with_its_names_and_init():
    """alpha (1,) = alpha_init_value, shift (1,) = shift_init_value 0, weight 1, bias 0; a reference state dict
    (its names) loads, and the output is erf(alpha x + s) * w + b, not erf(alpha (x + s)) or tanh."""
    m = Derf(D, alpha_init=0.5).double()
    assert m.alpha.shape == m.shift.shape == (1,)
    assert m.alpha.item() == 0.5 and m.shift.item() == 0.0
    assert torch.equal(m.weight, torch.ones(D, dtype=torch.float64)) and torch.equal(m.bias, torch.zeros(D).double())
    state = {
        "alpha": torch.tensor([0.7], dtype=torch.float64),
        "shift": torch.tensor([0.3], dtype=torch.float64),
        "weight": 1 + torch.randn(D, dtype=torch.float64),
        "bias": torch.randn(D, dtype=torch.float64),
    }
    m.load_state_dict(state)
    x = 2 * torch.randn(3, 5, D, dtype=torch.float64)
    expected = hand_derf(x, 0.7, 0.3, state["weight"], state["bias"])
    torch.testing.assert_close(m(x), expected, atol=1e-14, rtol=0)
    assert (m(x) - hand_derf(x, 0.7, 0.7 * 0.3, state["weight"], state["bias"])).abs().max() > 1e-3
    assert (m(x) - (torch.tanh(0.7 * x + 0.3) * m.weight + m.bias)).abs().max() > 1e-3


def test_non_affine_form_keeps_alpha_and_shift_learned():
    """The DiT port converts adaLN's non-affine LayerNorms: erf(alpha x + s), alpha and s still parameters."""
    m = build_norm("derf", D, 1e-6, affine=False)
    assert isinstance(m, Derf) and m.weight is None and m.bias is None
    assert {n for n, _ in m.named_parameters()} == {"alpha", "shift"}
    x = torch.randn(4, D)
    torch.testing.assert_close(m(x), torch.special.erf(0.5 * x), rtol=0, atol=0)


def test_gpt2_port_recipe_alpha_one_everywhere_and_sqrt_d_embedding_scale():
    """language model/model_derf.patch: attn / ffn / dec alpha_init_value 1.0; shared_scale = sqrt(n_embd)."""
    cfg = TrunkConfig(dim=D, depth=2, num_heads=HEADS, mlp="swiglu", norm_layer="derf", dyt_alpha_init=1.0,
                      learned_embed_scale=True, qk_norm=False)  # fmt: skip
    lm = LanguageModel(cfg, vocab_size=11, max_seq_len=8)
    derfs = [m for m in lm.modules() if isinstance(m, Derf)]
    assert len(derfs) == 2 * 2 + 1 and {m.alpha.item() for m in derfs} == {1.0}
    assert {m.shift.item() for m in derfs} == {0.0}
    assert lm.embed_scale.item() == pytest.approx(math.sqrt(D))


def source_zeroes(normtype: str, model_name: str) -> tuple[bool, bool]:
    """zlab-princeton/Derf ``DiT/models.py`` ``initialize_weights`` (8dd9ea3): whether it zeroes the blocks' adaLN
    (``normtype == 'layernorm' or 'B' in self.model_name``) and the final adaLN + final linear
    (``normtype == 'layernorm'``); what it does not zero keeps ``_basic_init``: xavier-uniform weight, zero bias."""
    return normtype == "layernorm" or "B" in model_name, normtype == "layernorm"


@pytest.mark.parametrize(
    ("normtype", "model_name", "option"),
    [("layernorm", "DiT-B/4", True), ("derf", "DiT-B/4", "blocks"), ("derf", "DiT-XL/2", False),
     ("derf", "DiT-L/4", False)],
)  # fmt: skip
def test_dit_port_zeroes_what_its_initialize_weights_zeroes(normtype: str, model_name: str, option):
    """The source's rule, case by case, against the option that reproduces it; the shipped Derf overlay is its
    DiT-B case (the final layer used to start at zero: the official DiT's, which the Derf port keeps only for
    LayerNorm)."""
    blocks_zero, final_zero = source_zeroes(normtype, model_name)
    cfg = TrunkConfig(dim=D, depth=2, num_heads=HEADS, norm_layer=normtype, init="xavier", adaln_zero_init=option)
    dit = DiT(cfg, input_size=4, patch_size=2, num_classes=3)
    for blk in dit.trunk.blocks:
        assert (torch.count_nonzero(blk.adaLN.net[1].weight) == 0) == blocks_zero
        assert torch.count_nonzero(blk.adaLN.net[1].bias) == 0
    for linear in (dit.final_adaLN.net[1], dit.final_linear):
        assert (torch.count_nonzero(linear.weight) == 0) == final_zero
        assert torch.count_nonzero(linear.bias) == 0
    if normtype == "derf" and "B" in model_name:
        from models.presets import RECIPES

        assert RECIPES["derf"].trunk["adaln_zero_init"] == option


def test_dit_port_final_layer_values_in_float64():
    """Init values, not only zeros: ``initialize_weights`` draws what the source's ``_basic_init`` + redraws would:
    patch embed xavier (as a Linear), label table normal(0.02), the timestep MLP normal(0.02), then the final adaLN
    and the final linear xavier-uniform with zero biases; each from its own generator seeded by the network seed
    and the parameter's name (models/init_values.py: so a rank can draw one parameter without the others), drawn
    in float32 and cast to the network's float64."""
    cfg = TrunkConfig(dim=D, depth=1, num_heads=HEADS, norm_layer="derf", init="xavier", adaln_zero_init="blocks")
    dit = DiT(cfg, input_size=4, patch_size=2, num_classes=3).double()
    dit.initialize_weights()

    def drawn(name: str, shape: tuple[int, ...], init, **kwargs) -> torch.Tensor:
        generator = torch.Generator().manual_seed(param_seed(dit.init_seed, name))
        return init(torch.empty(shape), generator=generator, **kwargs).double()

    patch = drawn("x_embedder.proj.weight", (D, 4 * 2 * 2), torch.nn.init.xavier_uniform_)
    table = drawn("y_embedder.table.weight", tuple(dit.y_embedder.table.weight.shape), torch.nn.init.normal_, std=0.02)
    t0 = drawn("t_embedder.mlp.0.weight", tuple(dit.t_embedder.mlp[0].weight.shape), torch.nn.init.normal_, std=0.02)
    t2 = drawn("t_embedder.mlp.2.weight", tuple(dit.t_embedder.mlp[2].weight.shape), torch.nn.init.normal_, std=0.02)
    ada = drawn("final_adaLN.net.1.weight", (2 * D, D), torch.nn.init.xavier_uniform_)
    final = drawn("final_linear.weight", (2 * 2 * 8, D), torch.nn.init.xavier_uniform_)
    assert torch.equal(dit.x_embedder.proj.weight.flatten(1), patch)
    assert torch.equal(dit.y_embedder.table.weight, table)
    assert torch.equal(dit.t_embedder.mlp[0].weight, t0) and torch.equal(dit.t_embedder.mlp[2].weight, t2)
    assert torch.equal(dit.final_adaLN.net[1].weight, ada) and torch.equal(dit.final_linear.weight, final)
    bound = math.sqrt(6 / (D + 2 * D))  # xavier-uniform's limit for the (2D, D) final adaLN
    assert 0.8 * bound < ada.abs().max() <= bound
    assert dit.final_adaLN.net[1].bias.abs().sum() == 0 and dit.final_linear.bias.abs().sum() == 0
    assert dit.final_linear.weight.dtype == torch.float64
    with pytest.raises(ValueError, match="trunk adaln_zero_init must be true, false or 'blocks', got 'final'"):
        TrunkConfig(adaln_zero_init="final")


#################################################################################
#                                  Keel's facts                                 #
#################################################################################


@pytest.mark.parametrize("depth", [1, 3, 8])
def test_keel_alpha_is_the_number_of_sublayers_and_the_readout_passes_through(depth: int):
    trunk = Trunk(TrunkConfig(dim=D, depth=depth, num_heads=HEADS, norm_scheme="keel")).double()
    for blk in trunk.blocks:
        for site in (blk.attn_res, blk.mlp_res):
            assert site.alpha == 2 * depth
    x, out = torch.randn(2, 3, D, dtype=torch.float64), torch.randn(2, 3, D, dtype=torch.float64)
    site = trunk.blocks[0].mlp_res
    inp, state = site.prepare(x)
    assert state is x
    torch.testing.assert_close(
        inp, torch.nn.functional.layer_norm(x, (D,), site.norm_in.weight, site.norm_in.bias, 1e-6)
    )
    by_hand = torch.nn.functional.layer_norm(2 * depth * x + out, (D,), site.norm.weight, site.norm.bias, 1e-6)
    torch.testing.assert_close(site.update(x, out), by_hand)
    assert torch.equal(trunk.readout(x), x)  # Post-Norm-like: the last update ends on N_1


def test_keel_is_registered_with_one_extra_norm_per_sublayer_over_post():
    keel = Trunk(TrunkConfig(dim=D, depth=2, num_heads=HEADS, norm_scheme=NormScheme.KEEL))
    post = Trunk(TrunkConfig(dim=D, depth=2, num_heads=HEADS, norm_scheme=NormScheme.POST))
    extra = sum(p.numel() for p in keel.parameters()) - sum(p.numel() for p in post.parameters())
    assert extra == 4 * 2 * D  # N_2 at each of the 4 sublayers: weight and bias
