"""The Diagnostics callback: tags, values against hand-computed formulas, pre-clip gradient norms."""

from __future__ import annotations

import copy
import math

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import Logger
from torch import Tensor
from torch.utils.data import DataLoader

from experiments.monitoring.diagnostics import Diagnostics, stream_dict
from experiments.tasks.lm import LanguageModeling
from experiments.tasks.optim import OptimConfig
from models import DiT, LanguageModel, Trunk, TrunkConfig, ViTClassifier
from models.norms import DyT
from models.schemes import NormScheme

DEPTH = 2
STREAMS = {
    "siamese": ("post", "pre"),
    "siamese_hybrid": ("post", "pre"),
    "resi_dual": ("post", "delta"),
    "resi_dual_hybrid": ("hybrid", "delta"),
}
STREAMS["hyper"] = ("h0", "h1")
STREAMS["mhc"] = ("h0", "h1", "h2", "h3")


def tiny_trunk(scheme: str, **kw) -> TrunkConfig:
    kw = {"dim": 16, "depth": DEPTH, "num_heads": 2, "mlp": "swiglu", "mlp_hidden": 32, "norm_layer": "rmsnorm"} | kw
    return TrunkConfig(norm_scheme=scheme, **kw)


def hand_rms(t: Tensor) -> float:
    return math.sqrt(float((t.double() ** 2).sum()) / t.numel())


def hand_streams(state, scheme: str) -> dict[str, Tensor]:
    """The streams of a final state, picked by hand from the scheme's documented state layout."""
    names = STREAMS.get(scheme, ("x",))
    if scheme in ("hyper", "mhc"):
        return {n: state[:, :, i, :] for i, n in enumerate(names)}  # (B, N, n, D)
    if len(names) == 2:
        return {n: getattr(state, n) for n in names}
    if scheme in ("attn_res", "block_attn_res"):  # DepthSources: the open (latest) block's sum of outputs
        return {"x": state.partial}
    return {"x": state}


def states_after_each_block(net: LanguageModel, idx: Tensor) -> list:
    """The state after block b = the trunk run with every later block skipped (Trunk.forward_state)."""
    h = net.embed(idx)
    rope = (net.rope_cos, net.rope_sin)
    return [
        net.trunk.forward_state(h, rope=rope, is_causal=True, skip_blocks=frozenset(range(b + 1, DEPTH)))[0]
        for b in range(DEPTH)
    ]


@pytest.mark.parametrize("scheme", [s.value for s in NormScheme])
def test_rms_and_max_abs_per_stream_match_hand_computation(scheme: str):
    net = LanguageModel(tiny_trunk(scheme), vocab_size=64, max_seq_len=12)
    for p in net.trunk.parameters():  # move every scale off 1 so streams differ and scales are informative
        p.data.add_(0.1 * torch.randn_like(p))
    idx = torch.randint(0, 64, (3, 12))
    diag = Diagnostics()
    diag.attach(net.trunk)
    with torch.no_grad():
        net(idx)
    diag.detach()
    got = {k: v for k, v in diag.captured().items() if k != "diag/max_abs_activation"}
    with torch.no_grad():
        states = states_after_each_block(net, idx)
    expected = {}
    for b, state in enumerate(states):
        streams = hand_streams(state, scheme)
        assert sorted(stream_dict(state)) == sorted(streams)
        for name, t in streams.items():
            expected[f"diag/rms/{name}/block_{b}"] = hand_rms(t)
        expected[f"diag/max_abs/block_{b}"] = max(float(t.abs().max()) for t in streams.values())
    assert got.keys() == expected.keys()
    for tag, value in expected.items():
        assert got[tag] == pytest.approx(value, rel=1e-5), tag
    assert len({round(v, 6) for k, v in got.items() if k.startswith("diag/rms/")}) > 1  # not a constant


@pytest.mark.parametrize("scheme", ["siamese", "siamese_hybrid", "resi_dual", "pre"])
def test_norm_scales_are_mean_abs_weights(scheme: str):
    from experiments.monitoring.diagnostics import norm_scales

    net = LanguageModel(tiny_trunk(scheme), vocab_size=64, max_seq_len=8)
    for p in net.trunk.parameters():
        p.data.copy_(torch.randn_like(p))
    scales = {k: float(v) for k, v in norm_scales(net.trunk).items()}
    trunk = net.trunk
    if scheme.startswith("siamese"):
        for name in ("norm_a", "norm_b", "norm_o"):
            assert scales[f"diag/scale/{name}"] == pytest.approx(
                float(getattr(trunk.readout, name).weight.abs().mean())
            )
        for b, block in enumerate(trunk.blocks):
            attn, mlp = block.attn_res, block.mlp_res
            assert scales[f"diag/scale/norm_y/sublayer_{2 * b}"] == pytest.approx(
                float(attn.norm_y.weight.abs().mean())
            )
            assert scales[f"diag/scale/norm_x/sublayer_{2 * b + 1}"] == pytest.approx(
                float(mlp.norm_x.weight.abs().mean())
            )
            assert scales[f"diag/scale/norm_in/sublayer_{2 * b + 1}"] == pytest.approx(
                float(mlp.norm_in.weight.abs().mean())
            )
            if scheme == "siamese_hybrid":  # the attention site has g instead of N_X and N_in
                assert f"diag/scale/norm_x/sublayer_{2 * b}" not in scales
                assert scales[f"diag/scale/gain/sublayer_{2 * b}"] == pytest.approx(float(attn.gain.abs().mean()))
            else:
                assert scales[f"diag/scale/norm_x/sublayer_{2 * b}"] == pytest.approx(
                    float(attn.norm_x.weight.abs().mean())
                )
    elif scheme == "resi_dual":
        assert scales["diag/scale/norm_d"] == pytest.approx(float(trunk.readout.norm_d.weight.abs().mean()))
    else:
        assert scales["diag/scale/norm_f"] == pytest.approx(float(trunk.readout.norm_f.weight.abs().mean()))
        assert scales["diag/scale/norm/sublayer_3"] == pytest.approx(
            float(trunk.blocks[1].mlp_res.norm.weight.abs().mean())
        )
    assert len(scales) == len(set(scales))


@pytest.mark.parametrize("conditioned", [False, True], ids=["plain", "adaln"])
@pytest.mark.parametrize("scheme", ["pre", "siamese", "lns", "reordered"])
def test_dyt_norms_report_their_scale_and_alpha(scheme: str, conditioned: bool):
    """``norm_layer: dyt``: every DyT of the readout and the residual sites reports its learned alpha (adaLN's
    non-affine ones too), affine ones their mean |weight|, under the names the other norms use."""
    from experiments.monitoring.diagnostics import norm_scales

    trunk = Trunk(tiny_trunk(scheme, norm_layer="dyt"), conditioned=conditioned)
    for i, m in enumerate(trunk.modules()):
        if isinstance(m, DyT):
            m.alpha.data.fill_(0.1 + 0.01 * i)  # each its own value
            if m.weight is not None:
                m.weight.data.copy_(torch.randn_like(m.weight))
    stats = {k: float(v) for k, v in norm_scales(trunk).items()}
    outer, site_norm = ("norm_o", "norm_x") if scheme == "siamese" else ("norm_f", "norm")
    assert stats[f"diag/alpha/{outer}"] == pytest.approx(float(getattr(trunk.readout, outer).alpha))
    own = getattr(trunk.blocks[1].mlp_res, site_norm)
    assert stats[f"diag/alpha/{site_norm}/sublayer_3"] == pytest.approx(float(own.alpha))
    if own.weight is None:  # adaLN's non-affine branch-input norm: alpha only
        assert f"diag/scale/{site_norm}/sublayer_3" not in stats
    else:
        assert stats[f"diag/scale/{site_norm}/sublayer_3"] == pytest.approx(float(own.weight.abs().mean()))
    sites = [trunk.readout, *(s for blk in trunk.blocks for s in (blk.attn_res, blk.mlp_res))]
    n_dyt = sum(isinstance(m, DyT) for s in sites for m in s.modules())
    assert sum(k.startswith("diag/alpha/") for k in stats) == n_dyt


@pytest.mark.parametrize("task", ["vit", "dit"])
def test_image_trunks_vit_and_dit(task: str):
    if task == "vit":
        net = ViTClassifier(tiny_trunk("siamese", mlp="gelu"), img_size=8, patch_size=4, in_chans=3, num_classes=5)
        inputs = (torch.randn(2, 3, 8, 8),)
    else:
        net = DiT(tiny_trunk("siamese", mlp="gelu_tanh"), 8, 4, 4, 5, 0.1, True)
        inputs = (torch.randn(2, 4, 8, 8), torch.tensor([3, 700]), torch.tensor([0, 4]))
    module = torch.nn.Module()
    module.net = net
    from experiments.monitoring.diagnostics import find_trunk, norm_scales

    diag = Diagnostics()
    diag.attach(find_trunk(module))
    with torch.no_grad():
        net(*inputs)
    diag.detach()
    assert {f"diag/rms/{s}/block_{b}" for s in ("post", "pre") for b in range(DEPTH)} <= diag.captured().keys()
    scales = norm_scales(net.trunk)
    assert "diag/scale/norm_y/sublayer_0" in scales
    # adaLN (DiT) replaces N_in and N_o by non-affine norms: no scale to report for them
    assert ("diag/scale/norm_in/sublayer_0" in scales) == (task == "vit")
    assert ("diag/scale/norm_o" in scales) == (task == "vit")


##################################################################################
#                     Through a real Trainer: steps, pre-clip grads              #
##################################################################################


class Recorder(Logger):
    """A logger that keeps every ``log_metrics`` call."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[int, dict[str, float]]] = []

    name, version = "recorder", 0

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.calls.append((step, dict(metrics)))


class GradProbe(L.Callback):
    """Records hand-computed gradient norms before clipping (runs after Diagnostics) and after it."""

    def __init__(self) -> None:
        self.pre: dict[int, dict[str, float]] = {}  # step -> grad norms and N_a's scale, before the update
        self.post: dict[int, float] = {}

    @staticmethod
    def norm(params) -> float:
        return math.sqrt(sum(float((p.grad.double() ** 2).sum()) for p in params if p.grad is not None))

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        blocks = pl_module.net.trunk.blocks
        self.pre[trainer.global_step] = {"global": self.norm(pl_module.parameters())} | {
            f"block_{b}": self.norm(block.parameters()) for b, block in enumerate(blocks)
        }
        self.pre[trainer.global_step]["norm_a"] = float(pl_module.net.trunk.readout.norm_a.weight.abs().mean())

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        self.post[trainer.global_step - 1] = self.norm(pl_module.parameters())


def test_through_trainer_logs_every_n_steps_with_pre_clip_grad_norms(tmp_path):
    module = LanguageModeling(tiny_trunk("siamese"), OptimConfig(lr=1e-2), vocab_size=64, seq_len=12)
    initial = copy.deepcopy(module.net)
    tokens = torch.randint(0, 64, (12, 13))
    diag, probe, logger = Diagnostics(every_n_steps=2), GradProbe(), Recorder()
    trainer = L.Trainer(
        max_steps=3,
        logger=logger,
        callbacks=[diag, probe],
        gradient_clip_val=1e-3,  # tiny, so pre- and post-clip norms differ by orders of magnitude
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        limit_val_batches=0,
    )
    trainer.fit(module, DataLoader(tokens, batch_size=4))
    logged = {step: m for step, m in logger.calls if any(k.startswith("diag/") for k in m)}
    assert sorted(logged) == [0, 2]  # every_n_steps=2 over steps 0, 1, 2
    for step, metrics in logged.items():
        pre = probe.pre[step]
        assert metrics["diag/grad_norm/global"] == pytest.approx(pre["global"], rel=1e-5)
        for b in range(DEPTH):
            assert metrics[f"diag/grad_norm/block_{b}"] == pytest.approx(pre[f"block_{b}"], rel=1e-5)
        assert probe.post[step] == pytest.approx(1e-3, rel=1e-3)  # clipping came after: the norm is now 1e-3
        assert pre["global"] > 10 * probe.post[step]
    # step 0: the forward of the first batch under the initial weights
    with torch.no_grad():
        states = states_after_each_block(initial, tokens[:4, :-1])
    for b, state in enumerate(states):
        for name in ("post", "pre"):
            assert logged[0][f"diag/rms/{name}/block_{b}"] == pytest.approx(hand_rms(getattr(state, name)), rel=1e-5)
    expected_max = max(float(t.abs().max()) for s in states for t in (s.post, s.pre))
    assert logged[0]["diag/max_abs_activation"] == pytest.approx(expected_max, rel=1e-5)
    assert logged[2]["diag/scale/norm_a"] == pytest.approx(probe.pre[2]["norm_a"], rel=1e-6)
    assert probe.pre[2]["norm_a"] != 1.0  # two updates moved N_a off its init
    assert diag._handles == []  # no hook outlives a logging step


def test_off_switches_register_nothing():
    net = LanguageModel(tiny_trunk("pre"), vocab_size=64, max_seq_len=8)
    diag = Diagnostics(residual_rms=False, max_activation=False)
    diag.attach(net.trunk)
    assert diag._handles == [] and all(not b._forward_hooks for b in net.trunk.blocks)
    with pytest.raises(ValueError, match="every_n_steps"):
        Diagnostics(every_n_steps=0)
