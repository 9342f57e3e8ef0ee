"""mHC (``norm_scheme: mhc``) in both forms against hand-written float64 references: ``mhc_variant: mhcv2``
against ``mHCv2.py``'s equations, its init values and its float32 Sinkhorn; ``mhc_variant: paper`` against
DeepSeek-V4's ``hc_pre`` / ``hc_post`` / ``hc_split_sinkhorn`` and Megatron-LM's init; the recomputing
Sinkhorn's gradient; and the machinery around them (stream count, readout per stream, recomputation).

Every parameter the scheme owns (static and dynamic weights, scales, norms) and the adaLN weights are
randomized before comparing, so agreement is not only at init.
"""

from __future__ import annotations

import math

import pytest
import torch

from models import Trunk, TrunkConfig
from models.schemes.mhc import (
    HC_EPS,
    SINKHORN_ITERS,
    ManifoldHyperConnections,
    PaperMHC,
    sinkhorn_eps,
    sinkhorn_knopp,
)
from tests.models import reference as ref
from tests.models.reference_mhc import init_h_res, sinkhorn
from tests.models.reference_mhc import sinkhorn_eps as paper_sinkhorn
from tests.models.test_recompute import assert_same, pair, run
from tests.models.test_schemes import BATCH, HEADS, TOKENS, D, L, build, check_against_reference, randomize

H_RES_PARAMS = ("depth_0", "w_depth", "s_res")
V2_ONE_BLOCK = TrunkConfig(dim=D, depth=1, num_heads=HEADS, norm_scheme="mhc", mhc_variant="mhcv2")
SIGMOID_1 = 0.7310585786300049  # sigmoid(1): H_pre's init on stream k mod n; 2 * sigmoid(1) is H_post's


@torch.no_grad()
def randomize_mhc(trunk: Trunk) -> Trunk:
    """test_schemes' randomization (norms, W_*, adaLN) plus mHC's static weights and scales."""
    randomize(trunk)
    for name, p in trunk.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        if leaf in ("read_0", "depth_0", "write_0"):
            p.add_(0.5 * torch.randn_like(p))
        elif leaf in ("s_pre", "s_res", "s_post"):
            p.copy_(0.2 + 0.5 * torch.rand_like(p))
        elif leaf == "hc_fn":  # the paper form's Phi (xavier at init)
            p.copy_(0.3 * torch.randn_like(p))
    return trunk


def mhc_trunk(norm_layer: str = "layernorm", conditioned: bool = False, streams: int = 4) -> Trunk:
    return randomize_mhc(build("mhc", norm_layer, conditioned, mhc_streams=streams, mhc_variant="mhcv2"))


def init_sites(streams: int = 4, depth: int = L) -> tuple[Trunk, list]:
    cfg = TrunkConfig(dim=D, depth=depth, num_heads=HEADS, norm_scheme="mhc", mhc_streams=streams, mhc_variant="mhcv2")
    trunk = Trunk(cfg)
    return trunk, [site for blk in trunk.blocks for site in (blk.attn_res, blk.mlp_res)]


#################################################################################
#                         The trunk against the reference                        #
#################################################################################


@pytest.mark.parametrize("streams", [4, 3])
@pytest.mark.parametrize("conditioned", [False, True], ids=["plain", "adaln"])
@pytest.mark.parametrize("norm_layer", ["layernorm", "rmsnorm"])
def test_trunk_matches_reference(norm_layer, conditioned, streams):
    """Attention and MLP sites, every weight random; adaLN: N(H_pre^T x) non-affine, modulated, gated output."""
    check_against_reference(mhc_trunk(norm_layer, conditioned, streams), conditioned)


#################################################################################
#                                  Init values                                  #
#################################################################################


def test_init_parameters_are_the_references():
    """mHCv2.py __init__: static_alpha = [e_(k mod n) | I], static_beta = 1, dynamic fns 0, scales 1e-2."""
    n = 4
    _, sites = init_sites(n)
    for k, site in enumerate(sites):
        assert torch.equal(site.read_0, torch.eye(n)[k % n]), k
        assert torch.equal(site.depth_0, torch.eye(n))
        assert torch.equal(site.write_0, torch.ones(n))
        for w in (site.w_read, site.w_depth, site.w_write):
            assert torch.count_nonzero(w) == 0
        assert site.w_depth.shape == (D, n)
        for s in (site.s_pre, site.s_res, site.s_post):
            assert s.item() == pytest.approx(0.01)
        assert site.norm_h.weight.shape == (D,)  # one norm over D, applied to each stream
        assert all(p.requires_grad for p in site.parameters())  # the static parts are learned too


def test_hand_constants():
    """Sinkhorn(I) for n = 4: e / (e + 3) on the diagonal, 1 / (e + 3) elsewhere (worked out by hand)."""
    diag, off = init_h_res(4)
    assert diag == pytest.approx(0.47536688641867, abs=1e-12)
    assert off == pytest.approx(0.17487770452711, abs=1e-12)
    assert diag + 3 * off == pytest.approx(1.0, abs=1e-15)
    assert pytest.approx(1 / (1 + math.exp(-1)), abs=1e-15) == SIGMOID_1


@pytest.mark.parametrize("streams", [4, 3, 2])
@torch.no_grad()
def test_init_weights_of_every_site(streams):
    """In float32 at init, for every token: H_res = Sinkhorn(I) (not I) with rows and columns summing to 1,
    H_pre = sigmoid(1) on stream k mod n and 1/2 elsewhere, H_post = 2 sigmoid(1) everywhere."""
    trunk, sites = init_sites(streams)
    diag, off = init_h_res(streams)
    expected_res = torch.full((streams, streams), off) + (diag - off) * torch.eye(streams)
    x = trunk.init_state(torch.randn(BATCH, TOKENS, D)) + torch.randn(BATCH, TOKENS, streams, D)
    for k, site in enumerate(sites):
        _, pending = site.prepare(x)
        h_res, h_post = pending.depth_conn, pending.write_conn
        assert h_res.dtype == torch.float32 and h_res.shape == (BATCH, TOKENS, streams, streams)
        torch.testing.assert_close(h_res, expected_res.expand_as(h_res), atol=1e-7, rtol=0)
        assert not torch.allclose(h_res, torch.eye(streams).expand_as(h_res), atol=0.1)
        ones = torch.ones(BATCH, TOKENS, streams)
        torch.testing.assert_close(h_res.sum(-1), ones, atol=1e-6, rtol=0)  # rows
        torch.testing.assert_close(h_res.sum(-2), ones, atol=1e-6, rtol=0)  # columns
        torch.testing.assert_close(h_post, torch.full_like(h_post, 2 * SIGMOID_1), atol=1e-7, rtol=0)
        h_pre = torch.full((streams,), 0.5)
        h_pre[k % streams] = SIGMOID_1
        # H_pre through its only output, the branch input: N(sum_i H_pre[i] x_i)
        by_hand = ref.norm(torch.einsum("i,bnid->bnd", h_pre, x), "layernorm", trunk.cfg.norm_eps)
        torch.testing.assert_close(site.prepare(x)[0], by_hand, atol=1e-5, rtol=0)


#################################################################################
#                                   Sinkhorn                                    #
#################################################################################


@pytest.mark.parametrize("n", [4, 3])
def test_sinkhorn_is_the_hand_loop_with_20_rounds(n):
    """Columns first, then rows, 20 rounds: equal to the hand loop in float64; 19 or 21 rounds differ."""
    z = 3 * torch.randn(BATCH, TOKENS, n, n, dtype=torch.float64)  # spread out: slow to converge
    cells = [[z[..., i, j] for j in range(n)] for i in range(n)]

    def hand(iters: int) -> torch.Tensor:
        m = sinkhorn(cells, iters)
        return torch.stack([torch.stack(row, -1) for row in m], -2)

    assert SINKHORN_ITERS == 20
    got = sinkhorn_knopp(z)
    torch.testing.assert_close(got, hand(20), atol=1e-13, rtol=0)
    for other in (19, 21):
        assert (got - hand(other)).abs().max() > 1e-8, other
    torch.testing.assert_close(got.sum(-1), torch.ones(BATCH, TOKENS, n, dtype=z.dtype), atol=1e-13, rtol=0)
    # rows are exact (normalized last), columns only as converged as 20 rounds get them (logits this spread: ~1e-2)
    assert (got.sum(-2) - 1).abs().max() < 5e-2
    torch.testing.assert_close(sinkhorn_knopp(z.float()), hand(20).float(), atol=1e-6, rtol=0)


def test_sinkhorn_runs_in_float32_under_bf16_autocast():
    """A float32 matrix stays float32 and bit-identical under bf16 autocast; bf16 logits are lifted to float32
    inside and only the result is rounded back."""
    z = torch.randn(BATCH, TOKENS, 4, 4)
    plain = sinkhorn_knopp(z)
    with torch.autocast("cpu", torch.bfloat16):
        auto = sinkhorn_knopp(z)
    assert auto.dtype == torch.float32 and torch.equal(auto, plain)
    low = sinkhorn_knopp(z.bfloat16())
    assert low.dtype == torch.bfloat16
    assert torch.equal(low, sinkhorn_knopp(z.bfloat16().float()).bfloat16())


@torch.no_grad()
def test_site_weights_are_float32_under_bf16_autocast():
    """float32 streams (an LM's) under bf16 autocast: H_res and H_post equal the float64 hand computation to
    float32 precision; a bf16 matmul for the logits would put them off by ~1e-3."""
    trunk = randomize_mhc(Trunk(V2_ONE_BLOCK).double()).float()
    site = trunk.blocks[0].mlp_res
    x = 2 * torch.randn(BATCH, TOKENS, 4, D)
    with torch.autocast("cpu", torch.bfloat16):
        _, pending = site.prepare(x)
    assert pending.depth_conn.dtype == pending.write_conn.dtype == torch.float32
    w = {name: p.double() for name, p in site.named_parameters()}
    xn = ref.norm(x.double(), "layernorm", trunk.cfg.norm_eps, w["norm_h.weight"], w["norm_h.bias"])
    b_res, s_res, w_res = w["depth_0"], w["s_res"], w["w_depth"]
    logits = [[b_res[i, j] + s_res * (xn[..., i, :] @ w_res[:, j]) for j in range(4)] for i in range(4)]
    by_hand = torch.stack([torch.stack(row, -1) for row in sinkhorn(logits)], -2)
    torch.testing.assert_close(pending.depth_conn.double(), by_hand, atol=2e-6, rtol=0)
    post = 2 / (1 + torch.exp(-(w["write_0"] + w["s_post"] * (xn @ w["w_write"]))))
    torch.testing.assert_close(pending.write_conn.double(), post, atol=2e-6, rtol=0)


@torch.no_grad()
def test_bf16_streams_get_float32_weights_and_stay_bf16():
    """bf16 streams (a DiT's under autocast): the weights are float32 (H_res rows sum to 1 to float32 precision,
    which bf16's 8 bits could not hold), the new streams bf16."""
    trunk = randomize_mhc(Trunk(V2_ONE_BLOCK).double()).float()
    site = trunk.blocks[0].attn_res
    x = (2 * torch.randn(BATCH, TOKENS, 4, D)).bfloat16()
    with torch.autocast("cpu", torch.bfloat16):
        inp, pending = site.prepare(x)
        new = site.update(pending, torch.randn(BATCH, TOKENS, D).bfloat16())
    assert pending.depth_conn.dtype == pending.write_conn.dtype == torch.float32
    assert inp.shape == (BATCH, TOKENS, D) and new.dtype == torch.bfloat16
    torch.testing.assert_close(pending.depth_conn.sum(-1), torch.ones(BATCH, TOKENS, 4), atol=1e-6, rtol=0)
    assert (pending.depth_conn.sum(-2) - 1).abs().max() < 1e-2
    assert not torch.equal(pending.depth_conn, pending.depth_conn.bfloat16().float())  # more than bf16 bits


#################################################################################
#                       Stream count, readout, recomputation                    #
#################################################################################


def test_stream_count_is_a_trunk_option():
    assert TrunkConfig().mhc_streams == 4
    trunk, sites = init_sites(streams=3, depth=1)
    state = trunk.init_state(torch.randn(BATCH, TOKENS, D))
    assert state.shape == (BATCH, TOKENS, 3, D)
    assert sites[0].depth_0.shape == (3, 3)
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="mhc_streams"):
            TrunkConfig(norm_scheme="mhc", mhc_streams=bad)


@torch.no_grad()
def test_readout_sums_streams_and_names_each_for_the_logit_lens():
    trunk = mhc_trunk()
    x = torch.randn(BATCH, TOKENS, 4, D, dtype=torch.float64)
    norm_f = trunk.readout.norm_f
    by_hand = ref.norm(
        x[..., 0, :] + x[..., 1, :] + x[..., 2, :] + x[..., 3, :], "layernorm", 1e-5, norm_f.weight, norm_f.bias
    )
    torch.testing.assert_close(trunk.readout(x), by_hand, atol=1e-12, rtol=0)
    streams = trunk.readout.streams(x)
    assert list(streams) == ["h0", "h1", "h2", "h3"]
    for i, name in enumerate(streams):
        expected = ref.norm(x[..., i, :], "layernorm", 1e-5, norm_f.weight, norm_f.bias)
        torch.testing.assert_close(streams[name], expected, atol=1e-12, rtol=0)


def test_every_parameter_learns_once_streams_differ():
    """With random weights every parameter gets a gradient except H_res's at the first and the last site. At the
    first the streams are n copies of the embedding, and a doubly stochastic mix of copies is that copy whatever
    the matrix; after the last the readout sums the streams, and the rows of H_res sum to 1, so
    ``sum_j (H_res^T x)_j = sum_i x_i`` whatever the matrix. (At init the streams stay copies everywhere, so no
    site's H_res learns in the first step: see test_trunk.)"""
    trunk = mhc_trunk()
    h = torch.randn(BATCH, TOKENS, D, dtype=torch.float64)
    (trunk(h) * torch.randn(BATCH, TOKENS, D, dtype=torch.float64)).sum().backward()
    dead = [f"{site}.{leaf}" for site in ("blocks.0.attn_res", f"blocks.{L - 1}.mlp_res") for leaf in H_RES_PARAMS]
    for name, p in trunk.named_parameters():
        if name in dead:
            assert p.grad.abs().max() < 1e-10, name
        else:
            assert p.grad is not None and p.grad.abs().max() > 1e-10, name


def test_recompute_wins_and_nests_inside_activation_checkpointing():
    """recompute_norms and activation checkpointing together: same output bits and gradients as neither."""
    plain, recomputing = pair("mhc", "rmsnorm", False, drop_path=0.2)
    assert all(blk.attn_res.recompute_wins and blk.mlp_res.recompute_wins for blk in recomputing.blocks)
    recomputing.cfg.activation_checkpointing = True
    assert_same(run(plain, False), run(recomputing, False))


def test_torch_compile_matches_eager(monkeypatch):
    """dynamo + AOTAutograd in one graph (autocast-off regions and the Sinkhorn loop included), with the
    prologues recomputed. Three Sinkhorn rounds instead of 20 in both runs: dynamo unrolls the loop, and 20
    copies of its body cost this test about a third more CPU time."""
    from models.schemes import mhc

    monkeypatch.setattr(mhc.sinkhorn_knopp, "__defaults__", (3,))
    monkeypatch.setattr(mhc.sinkhorn_eps, "__defaults__", (3, mhc.HC_EPS))
    plain, recomputing = pair("mhc", "rmsnorm", False, depth=1)
    compiled = run(torch.compile(recomputing, backend="aot_eager_decomp_partition", fullgraph=True), False)
    eager = run(plain, False)
    torch.testing.assert_close(compiled[0], eager[0], rtol=1e-6, atol=1e-6)
    for name, grad in eager[2].items():  # absolute floor: the first site's H_pre only scales copies of h (~1e-9)
        torch.testing.assert_close(compiled[2][f"_orig_mod.{name}"], grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("variant", ["paper", "mhcv2"])
def test_randomize_touches_every_mhc_parameter(variant):
    """The reference comparison is only as strong as the randomization: no scheme parameter keeps its init."""
    trunk = build("mhc", mhc_variant=variant)
    sites = [*(site for blk in trunk.blocks for site in (blk.attn_res, blk.mlp_res)), trunk.readout]
    before = [{n: p.detach().clone() for n, p in site.named_parameters()} for site in sites]
    randomize_mhc(trunk)
    for site, init in zip(sites, before, strict=True):
        assert len(init) >= 2
        for name, p in site.named_parameters():
            assert not torch.equal(p, init[name]), name


#################################################################################
#       The paper form: DeepSeek-V4's equations, Megatron-LM's init              #
#################################################################################


def paper_trunk(norm_layer: str = "layernorm", conditioned: bool = False, streams: int = 4) -> Trunk:
    return randomize_mhc(build("mhc", norm_layer, conditioned, mhc_streams=streams, mhc_variant="paper"))


def test_paper_is_the_default_variant():
    assert TrunkConfig().mhc_variant == "paper"
    trunk = Trunk(TrunkConfig(dim=D, depth=1, num_heads=HEADS, norm_scheme="mhc"))
    assert isinstance(trunk.blocks[0].attn_res, PaperMHC)
    assert isinstance(trunk.blocks[0].attn_res, ManifoldHyperConnections)
    with pytest.raises(ValueError, match="mhc_variant"):
        TrunkConfig(norm_scheme="mhc", mhc_variant="v3")


@pytest.mark.parametrize("streams", [4, 3])
@pytest.mark.parametrize("conditioned", [False, True], ids=["plain", "adaln"])
@pytest.mark.parametrize("norm_layer", ["layernorm", "rmsnorm", "dyt"])
def test_paper_trunk_matches_reference(norm_layer, conditioned, streams):
    """One projection of the flattened streams, rescaled after the matmul, the eps Sinkhorn, every weight random."""
    check_against_reference(paper_trunk(norm_layer, conditioned, streams), conditioned)


def test_paper_init_is_megatrons():
    """Phi xavier-uniform over (n^2 + 2n) x nD, b = 0, a_pre = a_post = a_res = 0.01; no per-stream norm."""
    n = 4
    trunk = Trunk(TrunkConfig(dim=D, depth=L, num_heads=HEADS, norm_scheme="mhc"))
    bound = math.sqrt(6 / (n * n + 2 * n + n * D))  # xavier-uniform: sqrt(6 / (fan_in + fan_out))
    for blk in trunk.blocks:
        for site in (blk.attn_res, blk.mlp_res):
            assert site.hc_fn.shape == (n * n + 2 * n, n * D)
            assert site.hc_fn.abs().max() <= bound and site.hc_fn.abs().max() > 0.9 * bound
            assert torch.count_nonzero(site.hc_base) == 0
            torch.testing.assert_close(site.hc_scale, torch.full((3,), 0.01), rtol=0, atol=0)
            assert not hasattr(site, "norm_h")


@torch.no_grad()
def test_paper_weights_at_init_are_near_half_one_and_uniform():
    """b = 0 and a = 0.01: H_pre = 1/2 + eps, H_post = 1, H_res = J / n, each moved by at most ~0.01 |m|."""
    n = 4
    trunk = Trunk(TrunkConfig(dim=D, depth=1, num_heads=HEADS, norm_scheme="mhc"))
    site = trunk.blocks[0].mlp_res
    x = torch.randn(BATCH, TOKENS, n, D)
    _, pending = site.prepare(x)
    assert pending.depth_conn.shape == (BATCH, TOKENS, n, n) and pending.depth_conn.dtype == torch.float32
    torch.testing.assert_close(pending.depth_conn, torch.full_like(pending.depth_conn, 1 / n), atol=0.02, rtol=0)
    torch.testing.assert_close(pending.write_conn, torch.ones_like(pending.write_conn), atol=0.05, rtol=0)
    assert not torch.equal(pending.depth_conn, torch.full_like(pending.depth_conn, 1 / n))  # Phi is random


@pytest.mark.parametrize("n", [4, 3])
def test_paper_sinkhorn_is_deepseeks_with_eps_and_20_rounds(n):
    """softmax + eps, columns, then 19 x (rows, columns), each over (sum + eps): the float64 hand loop to 1e-13;
    19 or 21 rounds, or eps = 0, differ (the logits spread so convergence is slow)."""
    z = 3 * torch.randn(BATCH, TOKENS, n, n, dtype=torch.float64)
    cells = [[z[..., i, j] for j in range(n)] for i in range(n)]

    def hand(iters: int, eps: float = HC_EPS) -> torch.Tensor:
        m = paper_sinkhorn(cells, iters, eps)
        return torch.stack([torch.stack(row, -1) for row in m], -2)

    got = sinkhorn_eps(z)
    torch.testing.assert_close(got, hand(20), atol=1e-13, rtol=0)
    for other in (19, 21):
        assert (got - hand(other)).abs().max() > 1e-8, other
    assert (got - hand(20, 0.0)).abs().max() > 1e-9
    assert (got.sum(-2) - 1).abs().max() < 1e-5  # columns normalized last
    assert got.dtype == torch.float64 and sinkhorn_eps(z.float()).dtype == torch.float32


@pytest.mark.parametrize("form", ["mhcv2", "paper"])
def test_recomputing_sinkhorn_has_autograds_gradient_and_keeps_one_tensor(form):
    """SinkhornRounds' hand-written backward (rounds replayed, quotient rule) equals autograd through the plain
    loop in float64, and its forward saves only its input: one n x n tensor per token, not 40."""
    n = 4
    z = torch.randn(BATCH, TOKENS, n, n, dtype=torch.float64, requires_grad=True)
    g = torch.randn(BATCH, TOKENS, n, n, dtype=torch.float64)

    def plain(z: torch.Tensor) -> torch.Tensor:
        if form == "mhcv2":
            m = torch.exp(z - z.amax(dim=-2, keepdim=True).detach())
            for _ in range(SINKHORN_ITERS):
                m = m / m.sum(-2, keepdim=True)
                m = m / m.sum(-1, keepdim=True)
            return m
        m = torch.softmax(z, -1) + HC_EPS
        m = m / (m.sum(-2, keepdim=True) + HC_EPS)
        for _ in range(SINKHORN_ITERS - 1):
            m = m / (m.sum(-1, keepdim=True) + HC_EPS)
            m = m / (m.sum(-2, keepdim=True) + HC_EPS)
        return m

    fn = sinkhorn_knopp if form == "mhcv2" else sinkhorn_eps
    (expected,) = torch.autograd.grad(plain(z), z, g)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        out = fn(z)
    (got,) = torch.autograd.grad(out, z, g)
    torch.testing.assert_close(out, plain(z), atol=1e-14, rtol=0)
    torch.testing.assert_close(got, expected, atol=1e-12, rtol=0)
    plain_saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: plain_saved.append(t) or t, lambda t: t):
        plain(z)
    assert len(plain_saved) >= 2 * 2 * SINKHORN_ITERS - 1  # each of the ~40 rounds keeps its input and divisor
    assert len(saved) <= 4, len(saved)  # the logits, their max, the exp / softmax output and the rounds' input
    assert torch.autograd.gradcheck(lambda z: fn(z, 3), (z.detach()[:1, :2].clone().requires_grad_(),))


@torch.no_grad()
def test_paper_weights_are_float32_under_bf16_autocast():
    """float32 streams under bf16 autocast: the projection, rescale and Sinkhorn stay float32."""
    trunk = paper_trunk().float()
    site = trunk.blocks[0].mlp_res
    x = 2 * torch.randn(BATCH, TOKENS, 4, D)
    plain = site.prepare(x)[1]
    with torch.autocast("cpu", torch.bfloat16):
        auto = site.prepare(x)[1]
    assert auto.depth_conn.dtype == auto.write_conn.dtype == torch.float32
    assert torch.equal(auto.depth_conn, plain.depth_conn) and torch.equal(auto.write_conn, plain.write_conn)
