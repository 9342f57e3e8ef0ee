"""Layers against hand-written formulas: attention (+ RoPE, QK-norm), MLPs, MoE, adaLN, embeddings."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from models.embeddings import sincos_2d, timestep_frequencies
from models.layers import (
    AdaLNZero,
    Attention,
    Mlp,
    MoE,
    SwiGLU,
    apply_rope,
    expert_usage,
    load_balancing_loss,
    modulate,
    rope_tables,
)
from models.norms import DyT, DyTInit, build_norm, get_norm_layer
from tests.models import reference as ref

D, HEADS, B, N = 16, 4, 2, 7


@torch.no_grad()
def randomize_norms(module: nn.Module) -> None:
    for m in module.modules():
        if isinstance(m, (nn.LayerNorm, nn.RMSNorm, DyT)) and m.weight is not None:
            m.weight.copy_(1 + 0.3 * torch.randn_like(m.weight))
            if getattr(m, "bias", None) is not None:
                m.bias.copy_(0.3 * torch.randn_like(m.bias))
        if isinstance(m, DyT):
            m.alpha.copy_(0.3 + 0.6 * torch.rand_like(m.alpha))


#################################################################################
#                                    Norms                                      #
#################################################################################


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm", "dyt"])
@pytest.mark.parametrize("affine", [True, False])
def test_build_norm_matches_formula(kind, affine):
    norm = build_norm(kind, D, eps=1e-3, affine=affine).double()
    randomize_norms(norm)
    assert (norm.weight is not None) == affine
    x = torch.randn(B, N, D, dtype=torch.float64) * 3 + 1
    alpha = norm.alpha if kind == "dyt" else None
    expected = ref.norm(x, kind, 1e-3, norm.weight, getattr(norm, "bias", None), alpha)
    torch.testing.assert_close(norm(x), expected, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("affine", [True, False])
def test_dyt_is_the_reference_dynamic_tanh(affine):
    """jiachenzhu/DyT ``DynamicTanh``: alpha (1,) at 0.5, weight 1, bias 0 (its DiT port: no weight / bias when
    non-affine, alpha kept); the same parameter names; ``weight * tanh(alpha x) + bias`` by hand, float64."""
    norm = build_norm("dyt", D, eps=1e-6, affine=affine)
    assert norm.alpha.shape == (1,) and norm.alpha.item() == 0.5
    names = {"alpha", "weight", "bias"} if affine else {"alpha"}
    assert {n for n, _ in norm.named_parameters()} == names
    if affine:
        assert bool((norm.weight == 1).all()) and bool((norm.bias == 0).all())
    norm = norm.double()
    with torch.no_grad():
        norm.alpha.fill_(0.7)
        if affine:
            norm.weight.copy_(torch.linspace(0.5, 2.0, D, dtype=torch.float64))
            norm.bias.copy_(torch.linspace(-1.0, 1.0, D).double())
    x = torch.randn(B, N, D, dtype=torch.float64) * 3
    by_hand = [[math.tanh(0.7 * v) for v in row] for row in x[0].tolist()]
    expected = torch.tensor(by_hand, dtype=torch.float64)
    if affine:
        expected = expected * torch.linspace(0.5, 2.0, D, dtype=torch.float64) + torch.linspace(-1.0, 1.0, D).double()
    torch.testing.assert_close(norm(x)[0], expected, atol=1e-12, rtol=1e-12)


def test_dyt_init_sets_alpha_and_the_llama_ports_shiftless_form():
    norm = build_norm("dyt", D, eps=1e-6, dyt=DyTInit(alpha=0.8, bias=False))
    assert norm.alpha.item() == pytest.approx(0.8) and norm.bias is None and norm.weight is not None
    x = torch.randn(B, N, D)
    torch.testing.assert_close(norm(x), torch.tanh(0.8 * x), atol=1e-6, rtol=1e-6)  # weight 1, no shift
    assert build_norm("layernorm", D, eps=1e-6, dyt=DyTInit(alpha=0.8, bias=False)).bias is not None  # DyT-only


def test_unknown_norm_layer_raises_listing_valid_ones():
    with pytest.raises(ValueError, match=r"batchnorm.*layernorm.*rmsnorm.*dyt"):
        get_norm_layer("batchnorm")


#################################################################################
#                                  Attention                                    #
#################################################################################


def test_apply_rope_matches_complex_reference():
    x = torch.randn(B, HEADS, N, 8, dtype=torch.float64)
    for base in (10000.0, 500.0):
        cos, sin = rope_tables(N + 3, 8, base)  # longer tables are cut to the sequence
        torch.testing.assert_close(apply_rope(x, (cos, sin)), ref.rope_complex(x, base), atol=1e-6, rtol=1e-6)


def test_rope_is_relative():
    """<R_m q, R_n k> depends only on m - n."""
    q, k = torch.randn(8, dtype=torch.float64), torch.randn(8, dtype=torch.float64)
    seq = torch.zeros(1, 1, 6, 8, dtype=torch.float64)
    rq, rk = ref.rope_complex(seq + q), ref.rope_complex(seq + k)
    rope = rope_tables(6, 8)
    aq, ak = apply_rope(seq + q, rope), apply_rope(seq + k, rope)
    torch.testing.assert_close(aq[0, 0, 3] @ ak[0, 0, 1], aq[0, 0, 4] @ ak[0, 0, 2], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(rq[0, 0, 3] @ rk[0, 0, 1], rq[0, 0, 4] @ rk[0, 0, 2], atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("use_rope", [False, True], ids=["no_rope", "rope"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize(
    ("qk_norm", "qkv_norm", "norm_layer"),
    [(False, False, "layernorm"), (True, False, "rmsnorm"), (True, False, "layernorm"), (False, True, "layernorm")],
    ids=["plain", "qk_rms", "qk_ln", "qkv_ln"],
)
def test_attention_matches_naive_softmax(qk_norm, qkv_norm, norm_layer, causal, use_rope):
    attn = Attention(D, HEADS, bias=True, qk_norm=qk_norm, qkv_norm=qkv_norm, norm_layer=norm_layer, norm_eps=1e-5)
    attn = attn.double().eval()
    randomize_norms(attn)
    with torch.no_grad():
        attn.qkv.bias.normal_()
        attn.proj.bias.normal_()
    x = torch.randn(B, N, D, dtype=torch.float64)

    def per_head(m):
        if isinstance(m, nn.Identity):
            return None
        assert m.weight.shape == (D // HEADS,)  # per head
        return lambda t: ref.norm(t, norm_layer, 1e-5, m.weight, getattr(m, "bias", None))

    expected = ref.attention(
        x,
        HEADS,
        attn.qkv.weight,
        attn.qkv.bias,
        attn.proj.weight,
        attn.proj.bias,
        per_head(attn.q_norm),
        per_head(attn.k_norm),
        per_head(attn.v_norm),
        causal=causal,
        rope_base=10000.0 if use_rope else None,
    )
    assert (per_head(attn.q_norm) is not None) == (qk_norm or qkv_norm)
    assert (per_head(attn.v_norm) is not None) == qkv_norm
    rope = rope_tables(N, D // HEADS) if use_rope else None
    with torch.no_grad():
        out = attn(x, rope=rope, is_causal=causal)
    tol = 1e-6 if use_rope else 1e-10  # the rotary tables are float32
    torch.testing.assert_close(out, expected, atol=tol, rtol=tol)


@pytest.mark.parametrize("norm_layer", ["rmsnorm", "layernorm", "dyt"])
def test_full_qk_norm_normalizes_all_heads_q_and_k_as_one_vector(norm_layer):
    """OLMo 2 (``Olmo2Attention``): ``q_norm`` of width D over all heads' q, ``k_norm`` likewise, before the head
    split and RoPE; V untouched."""
    attn = Attention(D, HEADS, True, True, norm_layer=norm_layer, norm_eps=1e-5, qk_norm_scope="full").double()
    randomize_norms(attn)
    assert attn.q_norm.weight.shape == (D,) and attn.k_norm.weight.shape == (D,)
    assert isinstance(attn.v_norm, nn.Identity)
    x = torch.randn(B, N, D, dtype=torch.float64)

    def full(m):
        return lambda t: ref.norm(t, norm_layer, 1e-5, m.weight, getattr(m, "bias", None), getattr(m, "alpha", None))

    w = (attn.qkv.weight, attn.qkv.bias, attn.proj.weight, attn.proj.bias)
    expected = ref.attention(x, HEADS, *w, causal=True, rope_base=10000.0, q_full_norm=full(attn.q_norm),
                             k_full_norm=full(attn.k_norm))  # fmt: skip
    with torch.no_grad():
        out = attn(x, rope=rope_tables(N, D // HEADS), is_causal=True)
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("norm_layer", ["rmsnorm", "layernorm", "dyt"])
def test_full_and_per_head_qk_norm_differ_by_the_statistics_only(norm_layer):
    """Same weights, norm scales at 1: statistics over D and over D/H differ, so the outputs do; DyT has none
    (element-wise), so there the two scopes agree."""
    x = torch.randn(B, N, D, dtype=torch.float64)
    outs = []
    for scope in ("per_head", "full"):
        torch.manual_seed(0)
        attn = Attention(D, HEADS, True, True, norm_layer=norm_layer, qk_norm_scope=scope).double()
        with torch.no_grad():
            outs.append(attn(x))
    assert torch.allclose(outs[0], outs[1], atol=1e-12) == (norm_layer == "dyt")


def test_qkv_norm_keeps_its_per_head_norms_under_full_qk_norm():
    attn = Attention(D, HEADS, qk_norm=True, qkv_norm=True, qk_norm_scope="full")
    assert not attn.full_qk_norm and attn.q_norm.weight.shape == (D // HEADS,)


def test_attention_without_bias_and_bad_heads():
    attn = Attention(D, HEADS, bias=False)
    assert attn.qkv.bias is None and attn.proj.bias is None
    with pytest.raises(ValueError, match="18"):
        Attention(18, 4)


#################################################################################
#                                     MLPs                                      #
#################################################################################


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_mlp_matches_formula(approximate):
    mlp = Mlp(D, 24, bias=True, approximate=approximate).double()
    with torch.no_grad():
        mlp.fc1.bias.normal_()
        mlp.fc2.bias.normal_()
    x = torch.randn(B, N, D, dtype=torch.float64) * 2
    hidden = ref.gelu(ref.linear(x, mlp.fc1.weight, mlp.fc1.bias), approximate)
    expected = ref.linear(hidden, mlp.fc2.weight, mlp.fc2.bias)
    torch.testing.assert_close(mlp(x), expected, atol=1e-12, rtol=1e-12)


def test_swiglu_matches_formula():
    hidden = 24
    mlp = SwiGLU(D, hidden).double()
    assert mlp.fc1.bias is None  # LM default: no biases
    x = torch.randn(B, N, D, dtype=torch.float64)
    w_gate, w_up = mlp.fc1.weight[:hidden], mlp.fc1.weight[hidden:]
    expected = ref.linear(ref.silu(ref.linear(x, w_gate)) * ref.linear(x, w_up), mlp.fc2.weight)
    torch.testing.assert_close(mlp(x), expected, atol=1e-12, rtol=1e-12)


#################################################################################
#                                      MoE                                      #
#################################################################################

E, K, MOE_HIDDEN = 6, 2, 10


def moe_reference(moe: MoE, x: torch.Tensor) -> torch.Tensor:
    """Loop over tokens and their chosen experts: ``sum_j w_j * SwiGLU_{e_j}(x)``."""
    flat = x.reshape(-1, x.shape[-1])
    logits = ref.linear(flat.double(), moe.router.weight.double())
    probs = torch.exp(logits - logits.amax(-1, keepdim=True))
    probs = probs / probs.sum(-1, keepdim=True)
    out = torch.zeros_like(flat)
    for t in range(flat.shape[0]):
        top = sorted(range(E), key=lambda e, t=t: -probs[t, e].item())[:K]
        w = probs[t, top]
        if moe.normalize_topk:
            w = w / w.sum()
        for e, we in zip(top, w, strict=True):
            gate_up = flat[t] @ moe.w_in[e]
            gate, up = gate_up[:MOE_HIDDEN], gate_up[MOE_HIDDEN:]
            out[t] += we.to(flat.dtype) * ((ref.silu(gate) * up) @ moe.w_out[e])
    return out.reshape(x.shape)


@pytest.mark.parametrize("normalize_topk", [False, True])
def test_moe_matches_loop_over_experts(normalize_topk):
    moe = MoE(D, MOE_HIDDEN, E, K, normalize_topk).double()
    with torch.no_grad():
        moe.router.weight.normal_()  # a decisive router: no near-ties in the top-k
    x = torch.randn(B, N, D, dtype=torch.float64)
    out, routing = moe(x)
    assert out.shape == x.shape
    torch.testing.assert_close(out, moe_reference(moe, x), atol=1e-6, rtol=1e-6)  # router runs in float32
    assert torch.isfinite(routing.loss)


def test_grouped_matmul_both_paths_equal_a_loop_over_experts():
    from models.layers.moe import grouped_matmul

    counts = torch.tensor([3, 0, 5, 1])  # uneven loads and an idle expert
    x, w = torch.randn(9, 8), torch.randn(4, 8, 12)
    ends = torch.cumsum(counts, 0).tolist()
    spans = list(enumerate(zip([0, *ends[:-1]], ends, strict=True)))
    expected = torch.cat([x[a:b].double() @ w[e].double() for e, (a, b) in spans])
    torch.testing.assert_close(grouped_matmul(x, w, counts).double(), expected, rtol=1e-5, atol=1e-5)  # grouped
    torch.testing.assert_close(grouped_matmul(x.double(), w.double(), counts), expected)  # float64: the padded path
    odd = torch.randn(4, 8, 5)  # rows of 20 bytes: no grouped kernel, padded
    expected_odd = torch.cat([x[a:b] @ odd[e] for e, (a, b) in spans])
    torch.testing.assert_close(grouped_matmul(x, odd, counts), expected_odd)


def test_moe_grouped_experts_match_the_loop_in_float32():
    moe = MoE(16, 8, E, K)  # 16 / 8 wide in float32: torch._grouped_mm
    with torch.no_grad():
        moe.router.weight.normal_()
    x = torch.randn(B, N, 16)
    out, _ = moe(x)
    global MOE_HIDDEN
    hidden, MOE_HIDDEN = MOE_HIDDEN, 8
    try:
        expected = moe_reference(moe.double(), x.double())
    finally:
        MOE_HIDDEN = hidden
    torch.testing.assert_close(out.double(), expected, rtol=1e-4, atol=1e-5)


def test_moe_forward_needs_no_host_sync():
    # On the meta device nothing has a value: a layer that read a count on the host (padding to the busiest
    # expert) could not run there. bfloat16: the grouped kernel's meta function takes that dtype.
    with torch.device("meta"):
        moe = MoE(32, 64, 8, 2).to(torch.bfloat16)
        out, routing = moe(torch.randn(2, 16, 32, dtype=torch.bfloat16))
    assert out.shape == (2, 16, 32) and routing.load.shape == (8,)


def test_moe_loads_checkpoints_that_kept_the_experts_on_the_layer():
    moe = MoE(16, 8, E, K)
    old = {"router.weight": moe.router.weight, "w_in": torch.randn(E, 16, 16), "w_out": torch.randn(E, 8, 16)}
    moe.load_state_dict(old)
    assert torch.equal(moe.experts.w_in, old["w_in"]) and torch.equal(moe.w_out, old["w_out"])


@pytest.mark.parametrize("normalize_topk", [False, True])
def test_moe_router_probabilities_and_topk_weights(normalize_topk):
    moe = MoE(D, MOE_HIDDEN, E, K, normalize_topk)
    with torch.no_grad():
        moe.router.weight.normal_()
    x = torch.randn(B * N, D)
    probs, idx, weight = moe.route(x)
    assert probs.shape == (B * N, E) and idx.shape == weight.shape == (B * N, K)
    torch.testing.assert_close(probs.sum(-1), torch.ones(B * N))
    chosen = probs.gather(-1, idx)
    assert torch.all(chosen.min(-1).values >= probs.topk(K).values[:, -1] - 1e-7)  # the k largest
    if normalize_topk:
        torch.testing.assert_close(weight.sum(-1), torch.ones(B * N))
    else:
        torch.testing.assert_close(weight, chosen)
        assert torch.all(weight.sum(-1) < 1)


def test_load_balancing_loss_matches_formula():
    probs = torch.softmax(torch.randn(12, 4), -1)
    idx = probs.topk(2).indices
    counts = torch.zeros(4)
    for e in idx.flatten().tolist():
        counts[e] += 1
    f = counts / idx.numel()
    expected = 4 * sum(f[e] * probs[:, e].mean() for e in range(4))
    torch.testing.assert_close(load_balancing_loss(probs, idx, 4), expected)


def test_load_balancing_loss_is_one_for_a_uniform_router():
    moe = MoE(D, MOE_HIDDEN, E, K)
    with torch.no_grad():
        moe.router.weight.zero_()
    _, routing = moe(torch.randn(B, N, D))
    torch.testing.assert_close(routing.loss, torch.tensor(1.0), atol=1e-6, rtol=0)


def test_load_balancing_loss_grows_for_a_skewed_router():
    moe = MoE(D, MOE_HIDDEN, E, K)
    x = torch.randn(B, N, D)
    with torch.no_grad():
        moe.router.weight.zero_()
        moe.router.weight[0] = 5 * x.reshape(-1, D).mean(0)  # expert 0 wins for most tokens
        moe.router.weight[1] = 2.5 * x.reshape(-1, D).mean(0)
    _, routing = moe(x)
    assert torch.isfinite(routing.loss) and routing.loss > 1.5


def test_moe_top_k_out_of_range_raises():
    with pytest.raises(ValueError, match="top_k 7"):
        MoE(D, MOE_HIDDEN, E, 7)


#################################################################################
#                                 Conditioning                                  #
#################################################################################


def test_modulate_formula():
    x, shift, scale = torch.randn(B, N, D), torch.randn(B, 1, D), torch.randn(B, 1, D)
    expected = torch.stack([x[i] * (1 + scale[i]) + shift[i] for i in range(B)])
    torch.testing.assert_close(modulate(x, shift, scale), expected)


def test_adaln_zero_starts_at_zero_and_chunks_in_order():
    ada = AdaLNZero(D, 6)
    outs = ada(torch.randn(B, D))
    assert len(outs) == 6
    for o in outs:
        assert o.shape == (B, 1, D)
        assert torch.count_nonzero(o) == 0
    with torch.no_grad():
        ada.net[1].weight.normal_()
        ada.net[1].bias.normal_()
    c = torch.randn(B, D)
    full = ref.linear(ref.silu(c), ada.net[1].weight, ada.net[1].bias)
    for i, o in enumerate(ada(c)):
        torch.testing.assert_close(o[:, 0], full[:, i * D : (i + 1) * D])


#################################################################################
#                                  Embeddings                                   #
#################################################################################


@pytest.mark.parametrize(("dim", "grid"), [(16, 4), (64, 8), (768, 16)])
def test_sincos_2d_matches_dit_reference(dim, grid):
    expected = torch.from_numpy(ref.get_2d_sincos_pos_embed(dim, grid)).float()
    out = sincos_2d(dim, grid)
    assert out.shape == (grid * grid, dim)
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=0)


def test_sincos_2d_first_half_encodes_the_column():
    emb = sincos_2d(8, 3).reshape(3, 3, 8)  # (row, col, D)
    torch.testing.assert_close(emb[0, :, :4], emb[2, :, :4])  # same column -> same first half
    torch.testing.assert_close(emb[:, 0, 4:], emb[:, 2, 4:])  # same row -> same second half
    assert not torch.allclose(emb[0, 0, :4], emb[0, 1, :4])


@pytest.mark.parametrize("freq_shift", [0, 1])
def test_timestep_frequencies(freq_shift):
    t = torch.tensor([0.0, 1.0, 17.0, 999.0])
    dim, max_period = 16, 10000.0
    half = dim // 2
    freqs = np.array([math.exp(-math.log(max_period) * i / (half - freq_shift)) for i in range(half)])
    args = t.numpy()[:, None].astype(np.float64) * freqs[None]
    expected = torch.from_numpy(np.concatenate([np.cos(args), np.sin(args)], axis=1)).float()
    out = timestep_frequencies(t, dim, max_period, freq_shift)
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-5)
    lowest = 1 / max_period if freq_shift else max_period ** (-(half - 1) / half)  # diffusers ends on 1/max_period
    torch.testing.assert_close(out[:, half - 1], torch.cos(t * lowest), atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(out[:, 0], torch.cos(t))  # the first frequency is 1


#################################################################################
#                       Routing: what the router did, as tensors                #
#################################################################################

# Each token's (first, second) expert, set through the router below; E = 6 experts, top-2.
CHOICES = [(0, 1), (0, 2), (0, 1), (3, 0), (1, 0), (2, 3), (0, 4),
           (1, 2), (0, 3), (3, 1), (0, 1), (2, 0), (1, 3), (0, 2)]  # fmt: skip
# Assignments per expert, counted by hand from CHOICES: 0 appears 10 times, 1 seven, 2 five, 3 five, 4 once, 5 never.
HAND_LOAD = [10, 7, 5, 5, 1, 0]


def routed_moe() -> tuple[MoE, torch.Tensor]:
    """An MoE whose router logits are the first E coordinates of each token: token t picks CHOICES[t]."""
    moe = MoE(D, MOE_HIDDEN, E, K)
    x = torch.zeros(len(CHOICES), D)
    for t, (first, second) in enumerate(CHOICES):
        x[t, first], x[t, second] = 5.0, 3.0
    with torch.no_grad():
        moe.router.weight.zero_()
        moe.router.weight[:, :E] = torch.eye(E)  # logits = x[:, :E]
    return moe, x.reshape(2, 7, D)


def test_moe_routing_counts_the_assignments_the_router_chose():
    moe, x = routed_moe()
    _, routing = moe(x)
    assert routing.load.dtype == torch.float32 and routing.load.tolist() == HAND_LOAD
    # Switch loss E * sum_e f_e P_e, with P_e the mean softmax probability of expert e over the 14 tokens
    probs = torch.softmax(x.reshape(-1, D)[:, :E].double(), -1).mean(0)
    expected = E * sum(HAND_LOAD[e] / 28 * probs[e] for e in range(E))
    torch.testing.assert_close(routing.loss.double(), expected, rtol=1e-6, atol=0)


def test_expert_usage_of_hand_counted_loads():
    moe, x = routed_moe()
    usage = expert_usage(moe(x)[1].load)
    shares = [c / 28 for c in HAND_LOAD]
    entropy = -sum(f * math.log(f) for f in shares if f > 0) / math.log(6)  # 0 ln 0 = 0 for the idle expert 5
    assert usage.entropy.item() == pytest.approx(entropy, rel=1e-6)
    assert usage.load_max.item() == pytest.approx(6 * 10 / 28, rel=1e-6)  # expert 0 over the uniform share
    assert usage.load_min.item() == 0.0  # expert 5 got no token
    assert usage.load_ratio.item() == pytest.approx(10.0)  # 10 over the idle expert, counted as one assignment


def test_expert_usage_per_layer_of_stacked_loads():
    load = torch.tensor([[4.0, 4.0, 4.0, 4.0], [8.0, 4.0, 2.0, 2.0], [16.0, 0.0, 0.0, 0.0]])  # (L, E)
    usage = expert_usage(load)
    middle = -(0.5 * math.log(0.5) + 0.25 * math.log(0.25) + 2 * 0.125 * math.log(0.125)) / math.log(4)
    torch.testing.assert_close(usage.entropy.double(), torch.tensor([1.0, middle, 0.0], dtype=torch.float64))
    torch.testing.assert_close(usage.load_max, torch.tensor([1.0, 2.0, 4.0]))
    torch.testing.assert_close(usage.load_min, torch.tensor([1.0, 0.5, 0.0]))
    torch.testing.assert_close(usage.load_ratio, torch.tensor([1.0, 4.0, 16.0]))
