"""One training step on fake CUDA tensors, in the GPU's dtypes, before a job is submitted: no GPU needed.

    config ──memory_inputs / step_options──> Workload, MemorySetup, StepOptions
    fake_cuda_step(workload, setup, options)
      1. a fake process group of the run's world size (torch's "fake" backend: collectives accept and do nothing)
      2. the network built on the meta device with the run's activation checkpointing, given its compute dtype
         (FSDP2: ``param_dtype``, what the all-gather hands forward and backward; otherwise the precision's),
         then materialized as fake ``cuda`` tensors (``FakeTensorMode``: shapes, dtypes and devices, no bytes)
      3. the batch made on ``cuda``; forward and the task's loss under ``torch.autocast("cuda")`` for
         ``bf16-mixed`` (CUDA's autocast lists, not CPU's; :func:`autocast_without_a_device` answers the two
         device queries with which it would switch itself off)
      4. backward walked node by node (:mod:`experiments.parallel.fake_backward`: torch's engine needs a CUDA
         context), each gradient checked for device against what forward recorded
      5. the gradients cast to ``reduce_dtype`` and all-reduced over the fake group (DDP's all-reduce;
         FSDP2's reduce-scatter moves the same dtype), then into the float32 master parameters
      6. ``clip_grad_norm_`` at the config's ``gradient_clip_val``, the suite's AdamW (its parameter groups,
         ``fused`` as a GPU run picks it), and for DiT / EMA runs the EMA update
      7. every dtype a CUDA kernel insists on where CPU's does not, checked as the step runs (:class:`GpuDtypes`)

It catches what the fake tensors' CUDA semantics catch: a tensor made on the CPU meeting a CUDA one (``arange``
without ``device=``, a CPU buffer), a CUDA kernel's dtype checks as torch's meta kernels copy them
(``_grouped_mm`` takes bfloat16 / float16 only), CUDA's autocast lists (not CPU's), a gradient whose dtype or
device is not its parameter's, an optimizer that cannot take the parameters (fused AdamW on CUDA). It does not
run: CUDA streams and events, NCCL, FSDP2's own hooks (``fully_shard`` asks the CUDA driver for the current
device and makes streams at construction: the sharded layout is the memory estimate's, on fake CPU tensors),
expert parallelism's all-to-all (the MoE's data-dependent reads are answered with the balanced load), kernels'
numerics, speed or memory (docs/parallelism.md).
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from experiments.parallel.config import DTYPES
from experiments.parallel.fake_backward import backward
from experiments.parallel.memory import PRECISIONS, AnswerDataReads, MemorySetup, Workload, fake_process_group
from fileio.checks import InputError, number

DEVICE = torch.device("cuda", 0)
LOW_PRECISION = (torch.bfloat16, torch.float16)


class FakeStepError(RuntimeError):
    """The step failed on fake CUDA tensors: what a GPU job would have failed on (one line)."""


@dataclass(frozen=True)
class StepOptions:
    """What the step does after backward, from the config's trainer and ``model.init_args.optim``.

    Attributes:
        clip: ``trainer.gradient_clip_val`` (None: no clipping).
        clip_algorithm: ``trainer.gradient_clip_algorithm``: "norm" or "value".
        lr, betas, eps, weight_decay: the task's AdamW settings (one parameter group: which parameters decay
            changes no dtype or device).
        fused: the fused AdamW kernel (None: what a GPU run picks, fused).
        ema_decay: the EMA's decay when the task keeps one.
    """

    clip: float | None = None
    clip_algorithm: str = "norm"
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.1
    fused: bool | None = None
    ema_decay: float = 0.9999


@dataclass(frozen=True)
class FakeStepResult:
    """What one fake CUDA step ran in.

    Attributes:
        device: where every parameter, gradient and optimizer state lay ("cuda:0").
        compute_dtype: the parameters' dtype in forward and backward.
        master_dtype: the parameters' dtype in the optimizer.
        autocast: CUDA autocast's dtype, or None.
        loss_dtype: the loss's dtype.
        attention: the dtypes SDPA was called with (one entry per distinct call signature).
        grouped_mm: the operand dtypes of the MoE's grouped matmuls.
        nodes: autograd nodes the backward ran.
        world_size: ranks of the fake process group.
        seconds: wall time of the step.
        notes: what the step assumed.
    """

    device: str
    compute_dtype: torch.dtype
    master_dtype: torch.dtype
    autocast: torch.dtype | None
    loss_dtype: torch.dtype
    attention: tuple[torch.dtype, ...]
    grouped_mm: tuple[torch.dtype, ...]
    nodes: int
    world_size: int
    seconds: float
    notes: tuple[str, ...] = ()

    def describe(self) -> str:
        """``ok on cuda:0: bfloat16 compute, float32 master (AdamW fused), loss float32, 1,234 autograd nodes``."""
        dtype = str(self.compute_dtype).removeprefix("torch.")
        master = str(self.master_dtype).removeprefix("torch.")
        amp = f", {str(self.autocast).removeprefix('torch.')} autocast" if self.autocast else ""
        attn = "/".join(sorted({str(d).removeprefix("torch.") for d in self.attention})) or "none"
        return (
            f"ok on {self.device} over a fake group of {self.world_size}: {dtype} compute{amp}, {master} master, "
            f"loss {str(self.loss_dtype).removeprefix('torch.')}, attention {attn}, {self.nodes:,} autograd nodes"
        )


@contextlib.contextmanager
def autocast_without_a_device() -> Iterator[None]:
    """Lets ``torch.autocast("cuda", ...)`` switch on without a CUDA device, for the block: it asks
    ``amp_definitely_not_available()`` (no device: it warns and stays off) and ``is_bf16_supported()`` (which
    queries the device); both answer as an Ampere-or-later GPU would. Forward's autocast and activation
    checkpointing's replay of it in backward (it re-enters ``torch.autocast`` with forward's state) both need it.
    """
    common = torch.cuda.amp.common
    saved = common.amp_definitely_not_available, torch.cuda.is_bf16_supported
    common.amp_definitely_not_available = lambda: False
    torch.cuda.is_bf16_supported = lambda including_emulation=True: True
    try:
        yield
    finally:
        common.amp_definitely_not_available, torch.cuda.is_bf16_supported = saved


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


class GpuDtypes(TorchDispatchMode):
    """Checks the dtypes CUDA's kernels take where CPU's take more: the experts' ``_grouped_mm`` gets bfloat16 /
    float16 operands (CPU's kernel takes float32), and a norm's statistics (``native_layer_norm``'s mean and
    rstd, ``_fused_rms_norm``'s rstd) come out in float32 from a bfloat16 input (CUDA's kernels accumulate in
    float32). Records each grouped matmul's dtype."""

    def __init__(self) -> None:
        super().__init__()
        self.grouped: list[torch.dtype] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204 - torch's protocol
        kwargs = kwargs or {}
        name = func.name()
        if name.startswith("aten::_grouped_mm"):
            a, b = args[0], args[1]
            if a.dtype not in LOW_PRECISION or b.dtype != a.dtype:
                raise FakeStepError(
                    f"the experts' grouped matmul (_grouped_mm) gets {_name(a.dtype)} x {_name(b.dtype)} operands; "
                    "CUDA's kernel takes bfloat16 or float16, both alike (CPU's also takes float32)"
                )
            self.grouped.append(a.dtype)
        out = func(*args, **kwargs)
        if name in ("aten::native_layer_norm", "aten::_fused_rms_norm") and args[0].dtype in LOW_PRECISION:
            stats = out[1:] if isinstance(out, tuple) else ()
            bad = [_name(s.dtype) for s in stats if isinstance(s, Tensor) and s.dtype != torch.float32]
            if bad:
                raise FakeStepError(f"{name} on {_name(args[0].dtype)} input keeps its statistics in {bad[0]}")
        return out


class AttentionDtypes(TorchFunctionMode):
    """Checks SDPA's inputs as CUDA's kernels take them (SDPA is composite: the fake CUDA tensors run its math
    path, whose checks are looser): query, key and value in one dtype on one device, a mask boolean or in the
    query's dtype. Under CUDA autocast SDPA is on the lower-precision list (autocast casts all three below
    this mode): the autocast dtype is recorded. Records each call's dtype."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[torch.dtype] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204 - torch's protocol
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            q, k, v = args[:3]
            mask = kwargs.get("attn_mask", args[3] if len(args) > 3 else None)
            if q.device.type == "cuda" and torch.is_autocast_enabled("cuda"):  # on autocast's list: cast below here
                self.seen.append(torch.get_autocast_dtype("cuda"))
                return func(*args, **kwargs)
            dtypes = {_name(t.dtype) for t in (q, k, v)}
            devices = {str(t.device) for t in (q, k, v)}
            if len(dtypes) > 1 or len(devices) > 1:
                raise FakeStepError(
                    f"scaled_dot_product_attention gets query/key/value in {sorted(dtypes)} on {sorted(devices)}; "
                    "CUDA's kernels take one dtype on one device"
                )
            if mask is not None and mask.dtype not in (torch.bool, q.dtype):
                raise FakeStepError(
                    f"scaled_dot_product_attention gets a {_name(mask.dtype)} mask for {_name(q.dtype)} queries; "
                    "valid: a boolean mask or one in the queries' dtype"
                )
            self.seen.append(q.dtype)
        return func(*args, **kwargs)


def _dtypes(setup: MemorySetup) -> tuple[torch.dtype, torch.dtype, torch.dtype | None, torch.dtype]:
    """(compute, master, autocast, reduce) dtypes of a GPU run of ``setup``."""
    master, autocast = PRECISIONS[setup.precision]
    compute = DTYPES[setup.param_dtype] if setup.strategy == "fsdp2" else master
    reduce = DTYPES[setup.reduce_dtype] if setup.strategy == "fsdp2" else master
    return compute, master, autocast, reduce


def _check_on_device(what: str, tensors: dict[str, Tensor], dtype: torch.dtype | None = None) -> None:
    for name, t in tensors.items():
        if t.device != DEVICE:
            raise FakeStepError(f"{what} {name} is on {t.device}, not {DEVICE}")
        if dtype is not None and t.is_floating_point() and t.dtype != dtype:
            raise FakeStepError(f"{what} {name} is {_name(t.dtype)}, the step expects {_name(dtype)}")


def _step(net: nn.Module, workload: Workload, setup: MemorySetup, options: StepOptions, checkers: tuple) -> dict:
    compute, master_dtype, autocast, reduce = _dtypes(setup)
    net = net.to_empty(device=DEVICE).train()
    _check_on_device("buffer", dict(net.named_buffers()))
    with torch.device(DEVICE):
        batch = workload.batch()  # the data loader's batch, moved to the device by Lightning
    masters = {name: nn.Parameter(torch.empty_like(p, dtype=master_dtype)) for name, p in net.named_parameters()}
    fused = options.fused if options.fused is not None else True  # what the task's optimizer picks on CUDA
    opt = torch.optim.AdamW(
        list(masters.values()), lr=options.lr, betas=options.betas, eps=options.eps,
        weight_decay=options.weight_decay, fused=fused or None,
    )  # fmt: skip
    amp = torch.autocast("cuda", dtype=autocast) if autocast is not None else contextlib.nullcontext()
    with contextlib.ExitStack() as stack:
        for mode in (amp, *checkers):
            stack.enter_context(mode)
        loss = workload.loss(net, batch)
    if loss.device != DEVICE or loss.dtype != torch.float32:
        raise FakeStepError(f"the loss is {_name(loss.dtype)} on {loss.device}; the step expects float32 on {DEVICE}")
    nodes = backward(loss)
    for name, p in net.named_parameters():
        if p.grad is None:
            continue
        if p.grad.dtype != p.dtype or p.grad.device != p.device:
            raise FakeStepError(f"parameter {name} ({_name(p.dtype)}) got a {_name(p.grad.dtype)} gradient")
        grad = p.grad.to(reduce)
        if dist.get_world_size() > 1:
            dist.all_reduce(grad)  # DDP's all-reduce (FSDP2 reduce-scatters the same dtype); the fake group: no-op
        masters[name].grad = grad.to(master_dtype)
    params = [m for m in masters.values() if m.grad is not None]
    if options.clip is not None and options.clip_algorithm == "value":
        torch.nn.utils.clip_grad_value_(params, options.clip)
    elif options.clip is not None:
        torch.nn.utils.clip_grad_norm_(params, options.clip)
    opt.step()
    _check_on_device("optimizer state", {f"{i}.{k}": v for i, s in enumerate(opt.state.values()) for k, v in s.items()})
    with torch.no_grad():
        for name, p in net.named_parameters():  # the next step's all-gather: master cast to the compute dtype
            p.copy_(masters[name])
        if workload.ema:
            ema = {name: m.detach().clone() for name, m in masters.items()}
            torch._foreach_lerp_(list(ema.values()), list(masters.values()), 1.0 - options.ema_decay)
    return {"compute": compute, "master": master_dtype, "autocast": autocast, "loss": loss.dtype, "nodes": nodes}


def fake_cuda_step(workload: Workload, setup: MemorySetup, options: StepOptions) -> FakeStepResult:
    """One training step of ``workload`` as a GPU run of ``setup`` takes it, on fake CUDA tensors (module docstring).

    Raises:
        FakeStepError: the step failed (a device or dtype a GPU would refuse, or any error of the step), one line.
    """
    start = time.perf_counter()
    world = setup.world_size
    attention, gpu = AttentionDtypes(), GpuDtypes()
    answer = AnswerDataReads(workload.capacity) if workload.capacity else contextlib.nullcontext()
    notes = []
    if workload.capacity:
        notes.append("MoE load answered as balanced; no expert-parallel all-to-all")
    if setup.strategy == "fsdp2":
        notes.append("FSDP2's dtypes on one device (no fully_shard: it needs a CUDA driver)")
    try:
        with torch.device("meta"):  # outside the fake mode: the network draws its init seed on the host
            net = workload.build(setup.checkpointing).to(_dtypes(setup)[0])
        fake = FakeTensorMode(allow_non_fake_inputs=True)
        with fake_process_group(world), fake, answer, autocast_without_a_device(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            facts = _step(net, workload, setup, options, (attention, gpu))
    except FakeStepError:
        raise
    except Exception as exc:  # noqa: BLE001 - the step's own error, as one line naming its type
        line = (str(exc).strip().splitlines() or [""])[0]
        raise FakeStepError(f"{type(exc).__name__}: {line}") from exc
    return FakeStepResult(
        device=str(DEVICE), compute_dtype=facts["compute"], master_dtype=facts["master"], autocast=facts["autocast"],
        loss_dtype=facts["loss"], attention=tuple(dict.fromkeys(attention.seen)),
        grouped_mm=tuple(dict.fromkeys(gpu.grouped)), nodes=facts["nodes"], world_size=world,
        seconds=time.perf_counter() - start, notes=tuple(notes),
    )  # fmt: skip


def step_options(config: dict) -> StepOptions:
    """The clipping, optimizer and EMA settings of a resolved ``fit`` config (the task's defaults where unset).

    Raises:
        InputError: a setting that is not a number (one line naming it).
    """
    trainer = config.get("trainer") or {}
    model = (config.get("model") or {}).get("init_args") or {}
    optim = model.get("optim") or {}
    defaults = StepOptions()

    def value(key: str, default: float) -> float:
        return float(number(optim.get(key, default), f"model.init_args.optim.{key}", where="config"))

    betas = optim.get("betas", defaults.betas)
    if not isinstance(betas, list | tuple) or len(betas) != 2:
        raise InputError(f"model.init_args.optim.betas={betas!r} (config) is not two numbers; valid: [0.9, 0.95]")
    clip = trainer.get("gradient_clip_val")
    fused = optim.get("fused")
    return StepOptions(
        clip=None if clip in (None, 0) else float(number(clip, "trainer.gradient_clip_val", where="config")),
        clip_algorithm=str(trainer.get("gradient_clip_algorithm") or "norm"),
        lr=value("lr", defaults.lr),
        betas=tuple(float(number(b, "model.init_args.optim.betas", where="config")) for b in betas),
        eps=value("eps", defaults.eps),
        weight_decay=value("weight_decay", defaults.weight_decay),
        fused=None if fused is None else bool(fused),
        ema_decay=float(number(model.get("ema_decay") or defaults.ema_decay, "ema_decay", where="config")),
    )
