"""The GPU's dtypes, on CPU: every task x every scheme x every norm layer takes a training step (forward, loss,
backward) and an evaluation step with bfloat16 parameters under FSDP2's real ``MixedPrecisionPolicy``
(``fully_shard`` through the suite's :func:`parallelize`, on a one-rank gloo group), and under ``bf16-mixed``
autocast with DDP on the same group; the VAE (which FSDP2 does not take) under autocast.

Where CUDA takes fewer dtypes than CPU, a recorder checks what the GPU would be handed: every ``_grouped_mm``
call is replayed on meta tensors of the same shapes, strides and dtypes (the meta kernel is torch's copy of the
CUDA kernel's checks: bfloat16 / float16 operands, 16-byte aligned rows); SDPA gets one dtype for q, k and v, in
bfloat16 (what CUDA's fused kernels take); mHC's Sinkhorn runs in float32 inside bfloat16. What only a GPU shows
(speed, the kernels' own numerics, NCCL) is left to scripts/gpu_check.py.

Under FSDP2 the dense LM runs the full product (17 schemes x 4 norm layers); every other (task, mode) runs every
scheme and every norm layer, each scheme with one norm layer in turn (17 cells: every norm layer 4 or 5 times),
since the full product of all five trunk tasks in both modes (680 networks) took 4 min of CPU. Each test is one
task in one mode, one process group.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils._python_dispatch import TorchDispatchMode

import models.schemes.mhc as mhc
from experiments.parallel.config import ParallelConfig
from experiments.parallel.memory import workload_for
from experiments.parallel.shard import DP, TP, parallelize
from models.norms import NormLayer
from models.schemes import NormScheme
from models.vae import build_vae

SCHEMES = [s.value for s in NormScheme]
NORMS = [n.value for n in NormLayer]
TASKS = ("lm", "moe", "gqa", "vit", "dit")
MODES = ("fsdp2-bf16", "ddp-bf16-mixed")
HALF = (torch.bfloat16, torch.float16)


def cells(task: str, mode: str) -> list[tuple[str, str]]:
    """(scheme, norm layer) pairs a task runs in a mode: the full product for the dense LM under FSDP2, else each
    scheme once, the norm layers in turn."""
    if task == "lm" and mode == "fsdp2-bf16":
        return [(scheme, norm) for scheme in SCHEMES for norm in NORMS]
    return [(scheme, NORMS[i % len(NORMS)]) for i, scheme in enumerate(SCHEMES)]


def network(task: str, scheme: str, norm: str) -> tuple[str, dict]:
    """(workload kind, network arguments) of a tiny network of ``task`` with this scheme and norm layer."""
    trunk = dict(dim=32, depth=2, num_heads=2, mlp_hidden=64, norm_scheme=scheme, norm_layer=norm, bias=False)
    lm = dict(vocab_size=64, max_seq_len=16)
    if task == "lm":
        return "lm", dict(trunk={**trunk, "mlp": "swiglu", "qk_norm": True}, **lm)
    if task == "moe":  # rows of 32 and 64 bf16 values: 16-byte aligned, so the grouped kernel runs
        moe = dict(mlp="swiglu", moe_experts=4, moe_top_k=2, moe_hidden=32)
        return "lm", dict(trunk={**trunk, **moe}, **lm)
    if task == "gqa":
        return "lm", dict(trunk={**trunk, "mlp": "swiglu", "num_heads": 4, "num_kv_heads": 2, "qk_norm": True}, **lm)
    if task == "vit":
        return "vit", dict(trunk=trunk, img_size=8, patch_size=4, num_classes=5)
    return "dit", dict(trunk={**trunk, "mlp": "gelu_tanh"}, input_size=4, patch_size=2, in_channels=4, num_classes=5)


class GpuDtypes(TorchDispatchMode):
    """Records the dtypes reaching the ops whose CUDA kernels are pickier than CPU's, and replays each grouped
    matmul on meta tensors (torch's copy of the CUDA kernel's checks raises what a GPU would)."""

    def __init__(self, replay: bool = True) -> None:
        super().__init__()
        self.replay = replay
        self.grouped: list[tuple[torch.dtype, torch.dtype]] = []
        self.attention: list[tuple[torch.dtype, ...]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204 - torch's protocol
        kwargs = kwargs or {}
        name = func.name()
        if name.startswith("aten::_grouped_mm"):
            a, b = args[0], args[1]
            self.grouped.append((a.dtype, b.dtype))
            if not self.replay:
                return func(*args, **kwargs)
            meta = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta") for t in (a, b)]
            offs = kwargs.get("offs", args[2] if len(args) > 2 else None)
            func(*meta, offs=torch.empty_strided(offs.shape, offs.stride(), dtype=offs.dtype, device="meta"))
        elif "scaled_dot_product" in name and "backward" not in name:
            self.attention.append(tuple(t.dtype for t in args[:3]))
        return func(*args, **kwargs)


class SinkhornDtypes:
    """Stands in for mHC's Sinkhorn rounds and records the dtype they run in."""

    seen: list[torch.dtype] = []
    real = mhc.SinkhornRounds

    @classmethod
    def apply(cls, m: torch.Tensor, *args):  # noqa: ANN206 - an autograd.Function's apply
        cls.seen.append(m.dtype)
        return cls.real.apply(m, *args)


@contextlib.contextmanager
def one_rank_group(tmp_path: Path) -> Iterator[object]:
    """A one-rank gloo group and the 1 x 1 mesh ModelParallelStrategy would build on it."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1, 1), mesh_dim_names=(DP, TP))
    finally:
        dist.destroy_process_group()


class ThroughDDP:
    """Calls go through the DDP wrapper (its hooks and buckets), attributes come from the network (the loss reads
    ``net.trunk.cfg``)."""

    def __init__(self, ddp: DDP) -> None:
        self.ddp = ddp

    def __call__(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN204
        return self.ddp(*args, **kwargs)

    def __getattr__(self, name: str):  # noqa: ANN204
        return getattr(self.ddp.module, name)


def step(task: str, scheme: str, norm: str, mode: str, mesh, recorder: GpuDtypes) -> tuple[float, float]:
    """One training step and one evaluation step; returns (training loss, evaluation loss)."""
    kind, args = network(task, scheme, norm)
    work = workload_for(kind, args, batch_size=2)
    torch.manual_seed(0)
    net = work.build(False)
    batch = work.batch()
    if mode == "fsdp2-bf16":
        parallelize(net, mesh, ParallelConfig(param_dtype="bfloat16"), work.seq_len)
        model, autocast = net, contextlib.nullcontext()
    else:
        model, autocast = ThroughDDP(DDP(net)), torch.autocast("cpu", torch.bfloat16)
    with recorder, autocast:
        loss = work.loss(model, batch)
    loss.backward()
    grads = [p.grad for p in net.parameters() if p.grad is not None]
    assert grads and all(g.dtype == torch.float32 for g in grads)  # what the optimizer steps on stays float32
    net.eval()
    with recorder, autocast, torch.no_grad():
        evaluated = work.loss(model, batch)
    return float(loss.detach()), float(evaluated)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("task", TASKS)
def test_every_scheme_and_norm_layer_steps_in_the_gpus_dtypes(task: str, mode: str, tmp_path: Path, monkeypatch):
    monkeypatch.setattr(mhc, "SinkhornRounds", SinkhornDtypes)
    SinkhornDtypes.seen = []
    failed, start = {}, time.perf_counter()
    with one_rank_group(tmp_path) as mesh:
        for scheme, norm in cells(task, mode):
            recorder = GpuDtypes()
            try:
                losses = step(task, scheme, norm, mode, mesh, recorder)
            except Exception as exc:  # every cell is tried: the message lists all that fail
                failed[f"{scheme}/{norm}"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
                continue
            if not all(math.isfinite(v) for v in losses):
                failed[f"{scheme}/{norm}"] = f"losses {losses}"
            if bad := [d for d in recorder.attention if len(set(d)) != 1 or d[0] not in HALF]:
                failed[f"{scheme}/{norm}"] = f"SDPA q, k, v dtypes {bad[0]} (CUDA's fused kernels: one of {HALF})"
            if task == "moe" and not recorder.grouped:
                failed[f"{scheme}/{norm}"] = "the experts never reached the grouped kernel"
    assert not failed, f"{len(failed)} of {len(cells(task, mode))} cells: {failed}"
    assert SinkhornDtypes.seen and set(SinkhornDtypes.seen) == {torch.float32}
    assert {n for _, n in cells(task, mode)} == set(NORMS) and {s for s, _ in cells(task, mode)} == set(SCHEMES)
    print(f"{task} {mode}: {len(cells(task, mode))} cells in {time.perf_counter() - start:.1f} s")


def test_the_grouped_matmul_gets_the_gpus_dtype_under_autocast():
    """The experts' matmuls under bf16-mixed autocast: ``_grouped_mm`` is on no autocast list, so it would get the
    float32 stream (CPU's kernel takes it, CUDA's refuses it); it gets bfloat16, and the result equals the float32
    matmul of the bfloat16-rounded operands."""
    from models.layers.moe import grouped_matmul

    x, w = torch.randn(12, 32), torch.randn(3, 32, 16)
    counts = torch.tensor([5, 0, 7])
    recorder = GpuDtypes()
    with recorder, torch.autocast("cpu", torch.bfloat16):
        out = grouped_matmul(x, w, counts)
    assert recorder.grouped == [(torch.bfloat16, torch.bfloat16)] and out.dtype == torch.bfloat16
    xb, wb = x.bfloat16().float(), w.bfloat16().float()
    expected = torch.cat([xb[:5] @ wb[0], xb[5:] @ wb[2]])
    torch.testing.assert_close(out.float(), expected, rtol=1e-2, atol=1e-2)
    plain_recorder = GpuDtypes(replay=False)  # CPU's own float32 kernel: CUDA's is never asked for float32
    with plain_recorder:
        plain = grouped_matmul(x, w, counts)  # no autocast: float32 on CPU, as before
    assert plain.dtype == torch.float32 and plain_recorder.grouped == [(torch.float32, torch.float32)]
    torch.testing.assert_close(plain, torch.cat([x[:5] @ w[0], x[5:] @ w[2]]), rtol=1e-5, atol=1e-5)


def test_the_vae_steps_under_bf16_mixed_autocast(tmp_path: Path):
    """The VAE task refuses FSDP2 (no trunk to shard); under DDP and bf16-mixed autocast it trains and evaluates."""
    torch.manual_seed(0)
    vae = build_vae([32, 32], layers_per_block=1, latent_channels=4, norm_num_groups=32, sample_size=16)
    images = torch.rand(2, 3, 16, 16) * 2 - 1
    with one_rank_group(tmp_path):
        ddp = DDP(vae)
        opt = torch.optim.AdamW(vae.parameters(), lr=1e-4, foreach=False)
        with torch.autocast("cpu", torch.bfloat16):
            out = ddp(images, sample_posterior=True).sample
            loss = nn.functional.mse_loss(out.float(), images)
        loss.backward()
        opt.step()
        vae.eval()
        with torch.autocast("cpu", torch.bfloat16), torch.no_grad():
            evaluated = nn.functional.mse_loss(ddp(images).sample.float(), images)
    assert math.isfinite(loss.item()) and math.isfinite(evaluated.item())
    trained = [p for p in vae.parameters() if p.grad is not None]
    assert trained and all(p.dtype == p.grad.dtype == torch.float32 for p in trained)


ROOT = Path(__file__).resolve().parents[2]


def fit(tmp_path: Path, corpus: tuple[Path, Path], name: str, *extra: str) -> dict:
    """A two-step fit of the tiny LM through the real command line on the tests' small shared corpus (its
    validation split is ~40 of these batches where the embedded corpus's is ~800: a fit's whole-split
    validation stays cheap); returns its summary.json."""
    from experiments.__main__ import main
    from tests.experiments.tiny import tiny_lm

    text, shards = corpus
    main(["fit", "-c", str(ROOT / "configs/lm/tiny.yaml"), *extra, *tiny_lm(), f"--runs_root={tmp_path}",
          f"--trainer.default_root_dir={tmp_path}", f"--data.init_args.source={text}",
          f"--data.init_args.data_dir={shards}", f"--run_name={name}", "--trainer.max_steps=2",
          "--trainer.val_check_interval=2", "--trainer.limit_val_batches=1",
          "--model.init_args.optim.warmup_steps=1"])  # fmt: skip
    return json.loads((tmp_path / "lm" / "tiny" / name / "summary.json").read_text())


@pytest.mark.slow  # two real fits (seconds each)
def test_the_real_trainer_steps_in_the_gpus_dtypes(tmp_path: Path, corpus, monkeypatch):
    """Through the command line: Hyper-Connections under FSDP2 with bfloat16 parameters (the issue's command: it
    ended in ``expected scalar type Float but found BFloat16``), and the MoE under bf16-mixed autocast with every
    grouped matmul replayed against CUDA's checks."""
    for name in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK"):
        monkeypatch.setenv(name, "")  # what Lightning sets for its one-process group: put back after the test
        monkeypatch.delenv(name)
    hyper = fit(tmp_path, corpus, "hyper-bf16", "-c", str(ROOT / "configs/trainer/fsdp2.yaml"),
                "-c", str(ROOT / "configs/norm/hyper.yaml"), "--trainer.devices=1",
                "--trainer.strategy.init_args.data_parallel_size=1",
                "--model.init_args.parallel.param_dtype=bfloat16")  # fmt: skip
    if dist.is_initialized():  # ModelParallelStrategy leaves its group to the process
        dist.destroy_process_group()
    assert hyper["status"] == "finished" and hyper["steps"] == 2 and math.isfinite(hyper["final_val"]["val/loss"])
    recorder = GpuDtypes()
    with recorder:
        moe = fit(tmp_path, corpus, "moe-bf16-mixed", "--trainer.precision=bf16-mixed",
                  "--model.init_args.trunk.moe_experts=4", "--model.init_args.trunk.moe_hidden=32")  # fmt: skip
    assert moe["status"] == "finished" and math.isfinite(moe["final_val"]["val/loss"])
    assert recorder.grouped and set(recorder.grouped) == {(torch.bfloat16, torch.bfloat16)}
