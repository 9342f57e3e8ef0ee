"""The trunk and the task networks on top of it: gradients, checkpointing, drop-path, LM, DiT, ViT."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from models import DiT, LanguageModel, Trunk, TrunkConfig, ViTClassifier
from models.schemes import NormScheme
from tests.models import reference as ref

ALL_SCHEMES = list(NormScheme)
D, HEADS = 16, 2


def trunk_cfg(scheme: str, **kw) -> TrunkConfig:
    return TrunkConfig(**{"dim": D, "depth": 3, "num_heads": HEADS, "mlp_hidden": 24, "norm_scheme": scheme, **kw})


@torch.no_grad()
def randomize_adaln(module: nn.Module) -> None:
    for name, p in module.named_parameters():
        if "adaLN" in name or name.startswith("final_linear"):
            p.normal_(std=0.3)


def legitimately_zero_at_init(name: str, scheme: str) -> bool:
    """Parameters whose gradient is exactly zero at init, by the math rather than by a bug.

    * ``k_norm.bias``: adding the same vector to every key adds ``q . b`` to every score of a row,
      and softmax is shift invariant.
    * Hyper-Connections: with ``W_* = 0``, ``tanh(Hn W) = 0`` so ``s_a``/``s_b`` multiply zero, and
      ``N(H)``'s scale and shift only reach the output through ``Hn W``.
    * Attention Residuals: the key norm ``N_k`` only reaches the depth-softmax logits ``w . N_k(v)``, and the
      pseudo-query ``w`` starts at zero.
    * mHC: the same for ``s_pre``/``s_res``/``s_post`` and ``N(x_i)``; and its n streams stay identical copies
      at init (every stream gets the same ``H_post o``, ``Sinkhorn(I)`` is symmetric), so ``H_res``, a doubly
      stochastic mix of copies, leaves them unchanged whatever it is: ``B_res`` and ``W_res`` get no gradient.
    """
    if name.endswith("k_norm.bias"):
        return True
    if scheme in ("attn_res", "block_attn_res") and ".key_norm." in name:
        return True  # AttnRes: the key norm reaches the logits only through the pseudo-query, zero at init
    leaf = name.rsplit(".", 1)[-1]
    if scheme == "mhc":
        return leaf in ("s_pre", "s_res", "s_post", "depth_0", "w_depth") or ".norm_h." in name
    return scheme == "hyper" and (leaf in ("s_a", "s_b") or ".norm_h." in name)


def backward_random_loss(trunk: Trunk, conditioned: bool) -> None:
    h = torch.randn(2, 5, D, dtype=torch.float64)
    cond = torch.randn(2, D, dtype=torch.float64) if conditioned else None
    out, routing = trunk(h, cond=cond, return_aux=True)
    ((out * torch.randn_like(out)).sum() + routing.loss).backward()


#################################################################################
#                                   Gradients                                   #
#################################################################################


@pytest.mark.parametrize("ffn", ["dense", "moe"])
@pytest.mark.parametrize("scheme", ALL_SCHEMES)
def test_gradients_reach_every_parameter(scheme, ffn):
    moe = dict(moe_experts=4, moe_top_k=2, mlp="swiglu") if ffn == "moe" else {}
    trunk = Trunk(trunk_cfg(scheme, qk_norm=True, **moe)).double()
    backward_random_loss(trunk, conditioned=False)
    for name, p in trunk.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all(), name
        if not legitimately_zero_at_init(name, scheme):
            assert p.grad.abs().max() > 1e-12, f"{name} has a zero gradient"


@pytest.mark.parametrize("scheme", ALL_SCHEMES)
def test_conditioned_gradients(scheme):
    """At init (adaLN-Zero) every parameter gets a finite gradient, the gate rows of each adaLN
    linear a nonzero one and its shift/scale rows exactly zero (gate = 0 cuts them off); once the
    adaLN weights are nonzero every parameter gets a nonzero gradient."""
    trunk = Trunk(trunk_cfg(scheme, qk_norm=True), conditioned=True).double()
    backward_random_loss(trunk, conditioned=True)
    for name, p in trunk.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all(), name
    for blk in trunk.blocks:
        g = blk.adaLN.net[1].weight.grad.reshape(6, D, D)  # shift, scale, gate for attn then MLP
        for chunk in (2, 5):
            assert g[chunk].abs().max() > 1e-12
        for chunk in (0, 1, 3, 4):
            assert torch.count_nonzero(g[chunk]) == 0

    trunk.zero_grad(set_to_none=True)
    randomize_adaln(trunk)
    backward_random_loss(trunk, conditioned=True)
    for name, p in trunk.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        if not legitimately_zero_at_init(name, scheme):
            assert p.grad.abs().max() > 1e-12, f"{name} has a zero gradient"


#################################################################################
#                     Activation checkpointing and drop-path                    #
#################################################################################


@pytest.mark.parametrize("conditioned", [False, True], ids=["plain", "adaln"])
@pytest.mark.parametrize("scheme", ALL_SCHEMES)
def test_activation_checkpointing_gives_identical_outputs_and_grads(scheme, conditioned):
    runs = {}
    for ckpt in (False, True):
        torch.manual_seed(5)
        trunk = Trunk(trunk_cfg(scheme, drop_path=0.3, activation_checkpointing=ckpt), conditioned=conditioned)
        randomize_adaln(trunk)
        trunk.train()
        calls = []
        for blk in trunk.blocks:
            blk.attn.register_forward_hook(lambda *_, calls=calls: calls.append(1))
        torch.manual_seed(6)
        h = torch.randn(4, 5, D, requires_grad=True)
        cond = torch.randn(4, D) if conditioned else None
        out = trunk(h, cond=cond)
        (out * torch.linspace(-1, 1, out.numel()).reshape(out.shape)).sum().backward()
        grads = {n: p.grad.clone() for n, p in trunk.named_parameters()}
        runs[ckpt] = out.detach(), h.grad.clone(), grads, len(calls)
    (out0, hg0, g0, calls0), (out1, hg1, g1, calls1) = runs[False], runs[True]
    assert calls0 == 3 and calls1 == 6  # checkpointing really recomputed each block in backward
    torch.testing.assert_close(out1, out0, rtol=0, atol=0)
    torch.testing.assert_close(hg1, hg0, rtol=0, atol=0)
    assert g0.keys() == g1.keys()
    for name in g0:
        torch.testing.assert_close(g1[name], g0[name], rtol=0, atol=0, msg=name)


@pytest.mark.parametrize("mode", ["checkpointed", "compiled"])
def test_moe_routing_comes_out_of_the_trunk_per_layer_unchanged_by_checkpointing_and_compile(mode):
    """The trunk stacks each MoE layer's expert loads (L, E) and sums the load-balancing losses; activation
    checkpointing (blocks recomputed in backward) and torch.compile return the same routing as eager."""
    torch.manual_seed(3)
    trunk = Trunk(trunk_cfg("siamese", moe_experts=4, moe_top_k=2, mlp="swiglu")).train()
    h = torch.randn(2, 5, D)
    _, eager = trunk(h, return_aux=True)
    assert eager.load.shape == (3, 4) and eager.load.sum(-1).tolist() == [2 * 5 * 2] * 3  # T * k per layer
    assert eager.loss.dtype == torch.float32 and eager.loss >= 0.99 * 3  # Switch loss >= ~1 per layer
    if mode == "checkpointed":
        trunk.cfg.activation_checkpointing = True
        out, other = trunk(h.requires_grad_(), return_aux=True)
        (out.sum() + other.loss).backward()  # the recomputation returns the routing again: it must not differ
    else:
        other = torch.compile(trunk, backend="aot_eager")(h, return_aux=True)[1]
    torch.testing.assert_close(other.load, eager.load, rtol=0, atol=0)
    torch.testing.assert_close(other.loss, eager.loss)


def test_dense_trunk_routing_is_empty():
    _, routing = Trunk(trunk_cfg("pre"))(torch.randn(2, 5, D), return_aux=True)
    assert routing.loss.item() == 0.0 and routing.load.shape == (0, 0)


def test_drop_path_rates_grow_linearly():
    trunk = Trunk(trunk_cfg("pre", depth=4, drop_path=0.3))
    assert isinstance(trunk.blocks[0].drop_path, nn.Identity)
    rates = [blk.drop_path.drop_prob for blk in trunk.blocks[1:]]
    assert rates == pytest.approx([0.1, 0.2, 0.3])


@pytest.mark.parametrize("scheme", ALL_SCHEMES)
def test_drop_path_is_identity_in_eval(scheme):
    torch.manual_seed(1)
    dropped = Trunk(trunk_cfg(scheme, drop_path=0.5)).eval()
    plain = Trunk(trunk_cfg(scheme)).eval()
    plain.load_state_dict(dropped.state_dict())
    h = torch.randn(2, 5, D)
    with torch.no_grad():
        torch.testing.assert_close(dropped(h), plain(h), rtol=0, atol=0)


def test_drop_path_drops_whole_branches_per_sample():
    """Pre-Norm, L = 2, rates (0, 0.5): with 64 copies of one input, the copies whose block-1
    attention and MLP branches were both dropped equal the trunk run without block 1; the others
    do not."""
    trunk = Trunk(trunk_cfg("pre", depth=2, drop_path=0.5)).double()
    h = torch.randn(1, 5, D, dtype=torch.float64).expand(64, -1, -1)
    with torch.no_grad():
        skipped = trunk.eval()(h[:1], skip_blocks=frozenset({1}))
        out = trunk.train()(h)
    same = torch.isclose(out, skipped, rtol=0, atol=1e-12).flatten(1).all(dim=1)
    assert 0 < same.sum() < 64
    assert len({tuple(o.flatten().tolist()) for o in out.round(decimals=9)}) <= 4  # kept/dropped per branch


#################################################################################
#                                 Language model                                #
#################################################################################

VOCAB, SEQ = 37, 16


def lm(scheme: str, ffn: str = "dense", tie: bool = False) -> LanguageModel:
    moe = dict(moe_experts=4, moe_top_k=2) if ffn == "moe" else {}
    cfg = TrunkConfig(
        dim=32,
        depth=2,
        num_heads=2,
        mlp="swiglu",
        mlp_hidden=48,
        norm_scheme=scheme,
        norm_layer="rmsnorm",
        norm_eps=1e-5,
        qk_norm=True,
        bias=False,
        init="normal",
        **moe,
    )
    return LanguageModel(cfg, vocab_size=VOCAB, max_seq_len=SEQ, tie_embeddings=tie).eval()


@pytest.mark.parametrize("ffn", ["dense", "moe"])
@pytest.mark.parametrize("scheme", ALL_SCHEMES)
def test_lm_is_causal(scheme, ffn):
    model = lm(scheme, ffn).double()
    idx = torch.randint(0, VOCAB, (2, 12))
    t = 6
    changed = idx.clone()
    changed[:, t + 1 :] = (idx[:, t + 1 :] + 1 + torch.randint(0, VOCAB - 1, (2, 12 - t - 1))) % VOCAB
    with torch.no_grad():
        a, b = model(idx), model(changed)
    assert a.shape == (2, 12, VOCAB)
    torch.testing.assert_close(a[:, : t + 1], b[:, : t + 1], atol=1e-10, rtol=1e-10)
    assert not torch.allclose(a[:, t + 1 :], b[:, t + 1 :])  # the later positions do see the change


@pytest.mark.parametrize("tie", [False, True])
def test_lm_tied_embeddings_share_storage(tie):
    model = lm("pre", tie=tie)
    shared = model.head.weight.data_ptr() == model.embed.weight.data_ptr()
    assert shared == tie
    assert (model.head.weight is model.embed.weight) == tie
    n_params = sum(p.numel() for p in model.parameters())
    untied = sum(p.numel() for p in lm("pre", tie=False).parameters())
    assert untied - n_params == (VOCAB * 32 if tie else 0)


def test_lm_generate_extends_by_the_requested_tokens():
    model = lm("siamese")
    prompt = torch.randint(0, VOCAB, (2, 3))
    out = model.generate(prompt, max_new_tokens=5, temperature=1.0, top_k=5)
    assert out.shape == (2, 8)
    assert torch.equal(out[:, :3], prompt)
    assert out.min() >= 0 and out.max() < VOCAB


@pytest.mark.parametrize("scheme", ["pre", "siamese_hybrid"])
def test_lm_greedy_generation_matches_argmax_loop(scheme):
    model = lm(scheme)
    prompt = torch.randint(0, VOCAB, (2, SEQ - 2))  # runs past max_seq_len: the context is cropped
    idx = prompt
    with torch.no_grad():
        for _ in range(5):
            nxt = model(idx[:, -SEQ:])[:, -1].argmax(-1, keepdim=True)
            idx = torch.cat([idx, nxt], dim=1)
    assert torch.equal(model.generate(prompt, 5, temperature=0), idx)
    assert torch.equal(model.generate(prompt, 5, temperature=0.7, top_k=1), idx)


def test_lm_rejects_too_long_sequences():
    with pytest.raises(ValueError, match=str(SEQ + 1)):
        lm("pre")(torch.zeros(1, SEQ + 1, dtype=torch.long))


#################################################################################
#                                       DiT                                     #
#################################################################################


def dit(scheme: str) -> DiT:
    cfg = TrunkConfig(dim=32, depth=2, num_heads=2, mlp="gelu_tanh", norm_scheme=scheme, init="xavier")
    return DiT(cfg, input_size=8, patch_size=2, in_channels=4, num_classes=10, learn_sigma=True).eval()


@pytest.mark.parametrize("scheme", ALL_SCHEMES)
def test_dit_output_is_exactly_zero_at_init(scheme):
    model = dit(scheme)
    x, t, y = torch.randn(3, 4, 8, 8), torch.tensor([1, 500, 999]), torch.tensor([0, 3, 10])
    with torch.no_grad():
        out = model(x, t, y)
        features = model.trunk(model.x_embedder(x) + model.pos_embed, cond=model.t_embedder(t) + model.y_embedder(y))
    assert out.shape == (3, 8, 8, 8)
    assert torch.count_nonzero(out) == 0
    assert features.abs().max() > 0.1  # zero comes from the zero-init final layer, not a dead trunk


@pytest.mark.parametrize("scheme", ["pre", "siamese"])
def test_dit_forward_with_cfg(scheme):
    model = dit(scheme).double()
    randomize_adaln(model)
    x = torch.randn(2, 4, 8, 8, dtype=torch.float64)
    t = torch.tensor([10, 700])
    y = torch.tensor([1, 7])
    null = torch.full_like(y, model.num_classes)
    xx, tt, yy = torch.cat([x, x]), torch.cat([t, t]), torch.cat([y, null])
    with torch.no_grad():
        cond, uncond = model(x, t, y), model(x, t, null)
        guided1 = model.forward_with_cfg(xx, tt, yy, cfg_scale=1.0)
        guided4 = model.forward_with_cfg(xx, tt, yy, cfg_scale=4.0)
    assert not torch.allclose(cond, uncond)
    torch.testing.assert_close(guided1[:2], cond, atol=1e-12, rtol=1e-12)
    eps = uncond[:, :4] + 4.0 * (cond[:, :4] - uncond[:, :4])
    torch.testing.assert_close(guided4[:2, :4], eps, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(guided4[2:, :4], eps, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(guided4[:2, 4:], cond[:, 4:], atol=1e-12, rtol=1e-12)  # variance: conditional


def test_dit_unpatchify_inverts_patchify():
    model = dit("pre")
    p, c = 2, model.out_channels
    imgs = torch.randn(2, c, 8, 8)
    g = 8 // p
    tokens = torch.empty(2, g * g, p * p * c)  # raster order of patches; (p, q, c) inside a patch
    for i in range(g):
        for j in range(g):
            patch = imgs[:, :, i * p : (i + 1) * p, j * p : (j + 1) * p]  # (B, C, p, q)
            tokens[:, i * g + j] = patch.permute(0, 2, 3, 1).reshape(2, -1)
    torch.testing.assert_close(model.unpatchify(tokens), imgs, rtol=0, atol=0)


def test_dit_pos_embed_is_fixed_sincos():
    model = dit("pre")
    expected = torch.from_numpy(ref.get_2d_sincos_pos_embed(32, 4)).float()
    torch.testing.assert_close(model.pos_embed[0], expected, atol=1e-6, rtol=0)
    assert "pos_embed" not in dict(model.named_parameters())


#################################################################################
#                                       ViT                                     #
#################################################################################


@pytest.mark.parametrize("scheme", ["pre", "siamese", "hyper"])
def test_vit_reads_out_the_class_token(scheme):
    cfg = TrunkConfig(dim=32, depth=2, num_heads=2, norm_scheme=scheme)
    model = ViTClassifier(cfg, img_size=16, patch_size=4, in_chans=3, num_classes=7).eval()
    with torch.no_grad():
        model.head.weight.normal_()
        model.head.bias.normal_()
    x = torch.randn(3, 3, 16, 16)
    with torch.no_grad():
        logits = model(x)
        features = model.forward_features(x)
    assert logits.shape == (3, 7)
    assert features.shape == (3, 1 + 16, 32)
    torch.testing.assert_close(logits, ref.linear(features[:, 0], model.head.weight, model.head.bias))
    assert not torch.allclose(logits, ref.linear(features.mean(1), model.head.weight, model.head.bias))
