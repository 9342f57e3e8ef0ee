"""One training step on fake CUDA tensors (experiments.parallel.fake_step), without a GPU.

The backward is walked in Python (torch's engine needs a CUDA context), so the walk is first checked against the
engine on real CPU tensors, gradient for gradient (bitwise), for every scheme, with and without activation
checkpointing and under autocast. Then every scheme takes a fake CUDA step in FSDP2's bfloat16 dtypes; a tensor
made on the CPU in forward, a gradient returned on the CPU in backward and a float32 grouped matmul each end it in
one line, while the same code runs on CPU tensors. ``estimate`` and ``sweep --dry-run`` run it (in-process CLI).
All shapes are tiny: a fake step costs its op count, not its sizes.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from experiments.__main__ import main
from experiments.parallel.fake_backward import BackwardDeviceError, backward
from experiments.parallel.fake_step import FakeStepError, GpuDtypes, StepOptions, fake_cuda_step, step_options
from experiments.parallel.memory import MemorySetup, Workload, workload_for
from experiments.sweeps.estimate import resolve_config
from models.layers import moe
from models.schemes import NormScheme

ROOT = Path(__file__).resolve().parents[2]
SCHEMES = [s.value for s in NormScheme]
TRUNK = {"dim": 16, "depth": 2, "num_heads": 2, "mlp": "swiglu", "mlp_hidden": 32, "bias": False}
FSDP2_BF16 = MemorySetup(
    "fsdp2", world_size=8, data_parallel=8, precision="32-true", param_dtype="bfloat16", checkpointing=True
)
DDP_BF16_MIXED = MemorySetup("ddp", world_size=8, precision="bf16-mixed", checkpointing=True)


def lm(scheme: str = "pre", **trunk) -> dict:
    return {"trunk": {**TRUNK, "norm_scheme": scheme, **trunk}, "vocab_size": 64, "max_seq_len": 8,
            "tie_embeddings": False}  # fmt: skip


def grads_two_ways(workload: Workload, checkpointing: bool, autocast: bool) -> tuple[dict, dict]:
    """The gradients of one loss by the engine and by the walk, on CPU tensors (same network, same batch)."""
    torch.manual_seed(0)
    net = workload.build(checkpointing)
    batch = workload.batch()
    out = []
    for run in (lambda loss: loss.backward(), backward):
        net.zero_grad(set_to_none=True)
        with torch.autocast("cpu", torch.bfloat16, enabled=autocast):
            loss = workload.loss(net, batch)
        run(loss)
        out.append({n: p.grad.clone() for n, p in net.named_parameters() if p.grad is not None})
    return out[0], out[1]


def test_the_walked_backward_is_the_engines_for_every_scheme():
    """Bitwise the engine's gradients: every scheme, activation checkpointing on every other one (its recompute runs
    inside the walk), bfloat16 autocast on every third (gradients cast back to the float32 parameters)."""
    for i, scheme in enumerate(SCHEMES):
        workload = workload_for("lm", lm(scheme), 2)
        engine, walked = grads_two_ways(workload, checkpointing=i % 2 == 1, autocast=i % 3 == 0)
        assert engine.keys() == walked.keys() and len(engine) == sum(1 for _ in workload.build(False).parameters())
        for name, grad in engine.items():
            assert walked[name].dtype == grad.dtype and torch.equal(walked[name], grad), (scheme, name)


def test_every_scheme_takes_a_fake_cuda_step_in_fsdp2s_dtypes():
    """bfloat16 compute (FSDP2's all-gather dtype), float32 master weights and loss, SDPA in bfloat16, every
    parameter on ``cuda:0``, over a fake group of 8, with activation checkpointing."""
    options = StepOptions(clip=1.0)
    for scheme in SCHEMES:
        result = fake_cuda_step(workload_for("lm", lm(scheme), 2), FSDP2_BF16, options)
        assert (result.device, result.world_size, result.compute_dtype, result.master_dtype, result.loss_dtype) == (
            "cuda:0", 8, torch.bfloat16, torch.float32, torch.float32,
        ), scheme  # fmt: skip
        assert result.attention == (torch.bfloat16,) and result.autocast is None, scheme
        assert result.nodes > 50, scheme


class CpuArange(nn.Module):
    """Adds ``arange`` made without ``device=``: on the CPU it runs, on a GPU it is a device error."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x) + torch.arange(x.shape[-1])


class CpuGrad(torch.autograd.Function):
    """Identity whose backward returns its gradient on the CPU (a backward that forgot the device)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return torch.ones(grad.shape)


class CpuGradNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return CpuGrad.apply(self.proj(x))


@pytest.mark.parametrize(
    ("module", "message"),
    [
        (CpuArange, r"^FakeTensorDeviceMismatchError: Expected all tensors to be on the same device, but found at "
                    r"least two devices, cuda:0 and cpu!$"),
        (CpuGradNet, r"BackwardDeviceError: the backward of CpuGradBackward returned a gradient on cpu for an input "
                     r"of AddmmBackward0 that was on cuda:0 in forward"),
    ],
)  # fmt: skip
def test_a_tensor_left_on_the_cpu_ends_the_step_in_one_line(module, message):
    def loss(net: nn.Module, batch: tuple) -> torch.Tensor:
        return net(*batch).float().pow(2).mean()

    x = torch.randn(2, 4)
    loss(module(), (x,)).backward()  # on the CPU nothing is wrong
    workload = Workload("lm", lambda ac: module(), lambda: (torch.randn(2, 4),), loss)
    with pytest.raises(FakeStepError, match=message) as err:
        fake_cuda_step(workload, MemorySetup(), StepOptions())
    assert "\n" not in str(err.value)
    if module is CpuGradNet:
        assert isinstance(err.value.__cause__, BackwardDeviceError)


def test_the_experts_grouped_matmul_gets_bfloat16_under_autocast():
    """The MoE under DDP's bf16-mixed: CUDA's autocast, float32 parameters, and the experts' grouped matmul in
    bfloat16. A float32 ``_grouped_mm`` on fake CUDA tensors is refused in one line (CPU's kernel takes it)."""
    network = lm("siamese", moe_experts=4, moe_top_k=2, moe_hidden=32)
    result = fake_cuda_step(workload_for("lm", network, 2), DDP_BF16_MIXED, StepOptions(clip=1.0))
    assert (result.compute_dtype, result.master_dtype, result.autocast) == (
        torch.float32, torch.float32, torch.bfloat16,
    )  # fmt: skip
    assert result.grouped_mm == (torch.bfloat16,) and result.attention == (torch.bfloat16,)
    with FakeTensorMode(), GpuDtypes(), pytest.raises(FakeStepError, match="grouped matmul .* float32 x float32"):
        x, w = torch.randn(8, 16, device="cuda"), torch.randn(2, 16, 16, device="cuda")
        torch._grouped_mm(x, w, offs=torch.tensor([4, 8], dtype=torch.int32, device="cuda"))


def test_vit_and_dit_take_a_fake_cuda_step_with_their_ema():
    """The image tasks under DDP's bf16-mixed, EMA copy updated: a ViT on 16 px images, a DiT on 8 x 8 latents."""
    trunk = {**TRUNK, "norm_scheme": "siamese"}
    vit = {"trunk": trunk, "img_size": 16, "patch_size": 8, "num_classes": 10}
    dit = {"trunk": trunk, "input_size": 8, "patch_size": 4, "in_channels": 4, "num_classes": 10, "learn_sigma": True}
    for task, network in (("vit", vit), ("dit", dit)):
        result = fake_cuda_step(workload_for(task, network, 2, ema=True), DDP_BF16_MIXED, StepOptions(clip=1.0))
        assert (result.autocast, result.loss_dtype, result.attention) == (
            torch.bfloat16, torch.float32, (torch.bfloat16,),
        ), task  # fmt: skip


def test_step_options_follow_the_config():
    config = resolve_config(["-c", str(ROOT / "configs/lm/olmo-1b.yaml")])
    options = step_options(config)
    assert (options.clip, options.lr, options.betas, options.weight_decay) == (1.0, 1e-3, (0.9, 0.95), 0.1)
    assert step_options({}).clip is None


def test_estimate_prints_the_fake_cuda_step(capsys):
    small = ["--model.init_args.trunk.depth=1", "--model.init_args.trunk.dim=32", "--data.init_args.batch_size=2",
             "--data.init_args.seq_len=16"]  # fmt: skip
    main(["estimate", "-c", str(ROOT / "configs/lm/tiny.yaml"), "-c", str(ROOT / "configs/trainer/fsdp2.yaml"),
          "--trainer.accelerator=gpu", "--trainer.devices=8", *small])  # fmt: skip
    out = capsys.readouterr().out
    assert re.search(
        r"^  fake CUDA step \(forward, loss, backward, clip, AdamW\): ok on cuda:0 over a fake group of 8: bfloat16 "
        r"compute, float32 master, loss float32, attention bfloat16, [\d,]+ autograd nodes  \[[\d.]+ s\]$",
        out,
        re.MULTILINE,
    ), out


def test_a_failed_fake_step_is_one_error_line(monkeypatch, capsys, tmp_path: Path):
    """``estimate``: the memory lines, then one ``error:`` line, exit 2. ``sweep --dry-run``: the failing runs are one
    ``error:`` line naming them, the others listed with their peak and "fake CUDA step ok"."""
    real = moe.MoE.forward

    def leaky(self, x):  # an MoE that adds a tensor made on the CPU: the GPU would refuse it
        out, routing = real(self, x)
        return out + torch.zeros(out.shape[-1]), routing

    monkeypatch.setattr(moe.MoE, "forward", leaky)
    small = ["--model.init_args.trunk.depth=1", "--model.init_args.trunk.dim=32", "--data.init_args.batch_size=2",
             "--data.init_args.seq_len=16"]  # fmt: skip
    with pytest.raises(SystemExit) as stop:
        main(["estimate", "-c", str(ROOT / "configs/lm/tiny.yaml"), "-c", str(ROOT / "configs/lm/moe-tiny.yaml"),
              "-c", str(ROOT / "configs/trainer/gpu-bf16.yaml"), *small])  # fmt: skip
    captured = capsys.readouterr()
    assert stop.value.code == 2 and "fake CUDA step: FAILED" in captured.out
    (line,) = captured.err.strip().splitlines()
    assert line == (
        "error: fake CUDA step of this config failed: FakeTensorDeviceMismatchError: Expected all tensors to be on "
        "the same device, but found at least two devices, cuda:0 and cpu!"
    )
    spec = tmp_path / "mixed.yaml"
    spec.write_text(
        f"name: mixed\nconfigs: [{ROOT / 'configs/lm/tiny.yaml'}]\n"
        f"overlays: [{ROOT / 'configs/lm/moe-tiny.yaml'}, {ROOT / 'configs/lm/gqa-tiny.yaml'}]\n"
        f"schemes: [pre]\nlrs: [1.0e-3]\nruns_root: {tmp_path / 'runs'}\n"
        f"args: [--trainer.accelerator=gpu, --trainer.precision=bf16-mixed, {', '.join(small)}]\n"
    )
    with pytest.raises(SystemExit) as stop:
        main(["sweep", str(spec), "--dry-run"])
    captured = capsys.readouterr()
    (line,) = captured.err.strip().splitlines()
    assert stop.value.code == 2 and re.match(
        r"error: estimate of 1 run\(s\) failed \(mixed/pre-moe-tiny\): fake CUDA step failed: "
        r"FakeTensorDeviceMismatchError: Expected all tensors to be on the same device",
        line,
    ), line
    assert re.search(r"^\s+2\s+\S*gqa-tiny\S*\s.*\s[\d.]+ [kM]B ok  .*fake CUDA step ok \(float32 \+ autocast\)",
                     captured.out, re.MULTILINE), captured.out  # fmt: skip
    assert "Traceback" not in captured.out + captured.err
