"""The MoE LM's routing statistics: logged per step from the training forward, per layer by Diagnostics, as
split means into summary.json, and the dropless router's record; values against hand-written formulas."""

from __future__ import annotations

import json
import math
from pathlib import Path

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from experiments.cli import main
from experiments.monitoring.diagnostics import Diagnostics
from experiments.tasks.lm import ROUTING_STATS, USAGE_STATS, LanguageModeling
from experiments.tasks.optim import OptimConfig
from models import LanguageModel, TrunkConfig
from models.layers import MoE
from tests.experiments.test_diagnostics import Recorder
from tests.experiments.tiny import tiny_lm

ROOT = Path(__file__).resolve().parents[2]
EXPERTS, TOP_K, DEPTH = 4, 2, 2


def moe_trunk(scheme: str = "siamese") -> TrunkConfig:
    return TrunkConfig(dim=16, depth=DEPTH, num_heads=2, mlp="swiglu", mlp_hidden=32, norm_layer="rmsnorm",
                       norm_scheme=scheme, moe_experts=EXPERTS, moe_top_k=TOP_K, moe_hidden=8)  # fmt: skip


def hand_usage(counts: list[float]) -> dict[str, float]:
    """The routing statistics of one layer's assignment counts, written out from their definitions."""
    total, e = sum(counts), len(counts)
    shares = [c / total for c in counts]
    return {
        "entropy": -sum(f * math.log(f) for f in shares if f > 0) / math.log(e),
        "load_max": e * max(shares),
        "load_min": e * min(shares),
        "load_ratio": max(counts) / max(min(counts), 1),
    }


def capture_loads(net: LanguageModel) -> list[list[list[float]]]:
    """Forward hooks on every MoE layer: the assignment counts of each forward, ``[forward][layer][expert]``."""
    seen: list[list[list[float]]] = []
    layers = [m for m in net.modules() if isinstance(m, MoE)]

    def hook(module, args, output) -> None:
        if module is layers[0]:
            seen.append([])
        seen[-1].append(output[1].load.tolist())

    for layer in layers:
        layer.register_forward_hook(hook)
    return seen


def test_diagnostics_log_each_moe_block_routing():
    torch.manual_seed(0)
    net = LanguageModel(moe_trunk(), vocab_size=64, max_seq_len=12)
    seen = capture_loads(net)
    diag = Diagnostics()
    diag.attach(net.trunk)
    with torch.no_grad():
        net(torch.randint(0, 64, (3, 12)))
    diag.detach()
    (loads,) = seen
    for b, counts in enumerate(loads):
        assert sum(counts) == 3 * 12 * TOP_K  # every token reached its k experts: nothing dropped
        for name, value in hand_usage(counts).items():
            assert diag.captured()[f"diag/moe/{name}/block_{b}"] == pytest.approx(value, rel=1e-5), name


def test_dense_trunk_logs_no_routing():
    net = LanguageModel(TrunkConfig(dim=16, depth=DEPTH, num_heads=2, mlp="swiglu"), vocab_size=64, max_seq_len=8)
    diag = Diagnostics(residual_rms=False, max_activation=False)
    diag.attach(net.trunk)
    assert diag._handles == []  # routing on, but a dense trunk has nothing to report: no hook
    assert LanguageModeling(net.cfg, OptimConfig(), vocab_size=64, seq_len=8).routing_record is None


def test_training_logs_routing_of_the_step_forward(tmp_path: Path):
    """``train/moe_*`` every step, equal to the statistics of that step's own forward (no extra forward)."""
    torch.manual_seed(0)
    module = LanguageModeling(moe_trunk(), OptimConfig(lr=1e-2), vocab_size=64, seq_len=12)
    seen = capture_loads(module.net)
    logger = Recorder()
    trainer = L.Trainer(max_steps=2, logger=logger, log_every_n_steps=1, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)  # fmt: skip
    trainer.fit(module, DataLoader(torch.randint(0, 64, (8, 13)), batch_size=4))
    assert len(seen) == 2  # one forward per step: the statistics came out of the training forward
    logged = [m for _, m in logger.calls if "train/moe_entropy" in m]
    assert len(logged) == 2
    for metrics, loads in zip(logged, seen, strict=True):
        per_layer = [hand_usage(counts) for counts in loads]
        for name in USAGE_STATS:
            stat = name.removeprefix("moe_")
            expected = sum(layer[stat] for layer in per_layer) / DEPTH  # the mean over layers
            assert metrics[f"train/{name}"] == pytest.approx(expected, rel=1e-5), name
        assert 0.99 <= metrics["train/moe_aux"] < 1.5  # Switch loss, mean over layers: about 1 near uniform routing
        assert metrics["train/moe_z"] > 0


def test_tiny_moe_fit_writes_routing_to_summary(tmp_path: Path):
    main(
        ["fit", "-c", str(ROOT / "configs/lm/tiny.yaml"), "-c", str(ROOT / "configs/lm/moe-tiny.yaml"),
         f"--runs_root={tmp_path}", f"--data.init_args.data_dir={tmp_path / 'text'}", *tiny_lm(),
         "--model.init_args.trunk.moe_hidden=16", "--trainer.max_steps=2", "--trainer.val_check_interval=2",
         "--trainer.limit_val_batches=2"]
    )  # fmt: skip
    summary = json.loads((tmp_path / "lm" / "tiny" / "pre" / "summary.json").read_text())
    final = summary["final_val"]
    for name in ROUTING_STATS:
        assert math.isfinite(final[f"val/{name}"]), name
    assert 0 < final["val/moe_entropy"] <= 1 and final["val/moe_load_min"] <= 1 <= final["val/moe_load_max"]
    assert final["val/moe_load_ratio"] >= 1 and final["val/moe_aux"] > 0
    assert summary["moe"] == {
        "experts": 8, "top_k": 2, "expert_hidden": 16, "aux_weight": 0.04,
        "aux_normalization": "mean over the MoE layers (Megablocks / OLMoE)", "router_z_weight": 0.0, "capacity": None,
        "dropped_tokens": "none: the router is dropless (no expert capacity); every token reaches its k experts",
    }  # fmt: skip


def test_training_loss_adds_olmoe_router_losses_and_olmo_logit_z_loss():
    """CE + 0.01 * load balancing + 1e-3 * router z + 1e-4 * logit z, each a mean over layers / tokens written out
    from Megablocks' / OLMo's formulas on the captured router logits and LM logits; each term logged."""
    torch.manual_seed(0)
    module = LanguageModeling(moe_trunk(), OptimConfig(), vocab_size=64, seq_len=12, moe_aux_weight=0.01,
                              moe_z_weight=1e-3, z_loss_weight=1e-4)  # fmt: skip
    routers: list[torch.Tensor] = []
    for layer in (m for m in module.net.modules() if isinstance(m, MoE)):
        layer.router.register_forward_hook(lambda mod, args, out: routers.append(out.detach().double()))
    heads: list[torch.Tensor] = []
    module.net.head.register_forward_hook(lambda mod, args, out: heads.append(out.detach().double()))
    logged: dict[str, float] = {}
    module.log = lambda name, value, **kw: logged.__setitem__(name, float(value))  # no trainer needed
    batch = torch.randint(0, 64, (3, 13))
    total = module.model_step(batch, "train")
    (logits,) = heads
    ce = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
    lb_sum, lse2 = 0.0, []
    for z in routers:  # per layer: E * sum_e f_e P_e, and logsumexp^2 per token
        probs = z.softmax(-1)
        counts = torch.bincount(probs.topk(TOP_K, -1).indices.flatten(), minlength=EXPERTS).double()
        lb_sum += EXPERTS * (counts / counts.sum() * probs.mean(0)).sum()
        lse2.append(z.logsumexp(-1) ** 2)
    lb, router_z = lb_sum / DEPTH, torch.cat(lse2).mean()
    logit_z = (logits.logsumexp(-1) ** 2).mean()
    expected = ce + 0.01 * lb + 1e-3 * router_z + 1e-4 * logit_z
    torch.testing.assert_close(total.double(), expected, rtol=1e-5, atol=0)
    assert logged["train/moe_aux"] == pytest.approx(lb.item(), rel=1e-5)
    assert logged["train/moe_z"] == pytest.approx(router_z.item(), rel=1e-5)
    assert logged["train/z_loss"] == pytest.approx(logit_z.item(), rel=1e-5)
    assert logged["train/loss"] == pytest.approx(ce.item(), rel=1e-5)


def test_validation_logs_router_z_mean():
    torch.manual_seed(0)
    module = LanguageModeling(moe_trunk(), OptimConfig(), vocab_size=64, seq_len=12)
    logged: dict[str, object] = {}
    module.log = lambda name, value, **kw: logged.__setitem__(name, value)
    module.model_step(torch.randint(0, 64, (2, 13)), "val")
    assert "val/moe_z" in logged and float(logged["val/moe_z"].compute()) > 0
    assert "train/z_loss" not in logged  # weight 0: the logit z-loss is neither computed nor logged
