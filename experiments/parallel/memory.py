"""Will it fit: the per-device peak memory of one training step, measured without allocating it.

    config ──setup_from_config──> MemorySetup   strategy (ddp / FSDP2 + TP), world size, mesh, precision
    network args ──workload_for──> Workload      the real ``models`` network, a fake batch, the task's loss
    measure(workload, setup, activation_checkpointing)
      1. a fake process group of the run's world size (torch's "fake" backend: collectives do nothing)
      2. the network built on the meta device, then the suite's real :func:`parallelize` (FSDP2 per Block and
         the root, tensor parallelism when the mesh has it) for ModelParallelStrategy
      3. its storage materialized as fake tensors (``FakeTensorMode``: shapes and dtypes, no bytes)
      4. two training steps in Lightning's order (forward, zero_grad, backward, AdamW step), under the run's
         autocast, watched by ``FSDPMemTracker`` (FSDP2) or ``MemTracker`` (one device / DDP); the second
         step's peak is the steady state (optimizer moments and last step's gradients alive in forward)

What the numbers cover: every tensor the step allocates on one device, by kind, at the moment of the peak.
They leave out the CUDA context and cuBLAS / NCCL workspaces (about 0.5 to 1 GB per GPU), the caching
allocator's fragmentation, and the data loader. DDP's gradient buckets (``gradient_as_bucket_view`` is off
in Lightning's default: one more copy of the gradients) are added by count, since the fake step runs
without the DDP wrapper. Autocast runs as CPU autocast to bfloat16, whose op lists match CUDA's for the
matmuls and attention that hold most activations (CPU's runs an RMSNorm on a bf16 input in bf16).

An MoE's expert capacity (the busiest expert's load) is read from data, which fake tensors do not have: the
estimate answers that read with the balanced load ``tokens x top_k / experts`` and says so. Expert
parallelism is not estimated (every rank holds its FSDP shard of all experts).
"""

from __future__ import annotations

import contextlib
import copy
import math
import sys
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
from torch.distributed._tools.mem_tracker import MemTracker
from torch.distributed.device_mesh import init_device_mesh
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch.utils._python_dispatch import TorchDispatchMode

from experiments.parallel.config import ParallelConfig
from experiments.parallel.shard import DP, TP, parallelize
from fileio.checks import InputError, number
from models import DiT, LanguageModel, TrunkConfig, ViTClassifier

GB = 1e9
PRECISIONS = {  # Lightning's spellings -> (parameter dtype, autocast dtype or None)
    "32-true": (torch.float32, None),
    "32": (torch.float32, None),
    "bf16-mixed": (torch.float32, torch.bfloat16),
    "16-mixed": (torch.float32, torch.float16),
    "bf16-true": (torch.bfloat16, None),
    "bf16": (torch.bfloat16, None),
    "16-true": (torch.float16, None),
}
GPU_ACCELERATORS = ("gpu", "cuda", "auto")
MODEL_PARALLEL = "ModelParallelStrategy"
FSDP1 = "FSDPStrategy"


@dataclass(frozen=True)
class MemorySetup:
    """How one run lays its network over its devices, as far as memory goes.

    Attributes:
        strategy: "single" (one device), "ddp" (a full replica per device) or "fsdp2" (ModelParallelStrategy).
        world_size: devices x nodes.
        data_parallel: FSDP2's sharding degree (the mesh's data_parallel size); 1 for single / ddp.
        tensor_parallel: the mesh's tensor_parallel size; 1 for single / ddp.
        precision: Lightning's precision string ("bf16-mixed", "32-true", ...).
        param_dtype: the dtype FSDP2 all-gathers in ("float32", "bfloat16"): the config's, "auto" resolved
            for the run's accelerator.
        reduce_dtype: the dtype FSDP2 reduce-scatters gradients in.
        reshard_after_forward: FSDP2's ZeRO-3 (True) or ZeRO-2 (False).
        checkpointing: the run's own activation checkpointing (the trunk's switch or the strategy's policy).
        notes: what the setup assumed (e.g. an FSDP1 strategy estimated as FSDP2).
    """

    strategy: str = "single"
    world_size: int = 1
    data_parallel: int = 1
    tensor_parallel: int = 1
    precision: str = "32-true"
    param_dtype: str = "float32"
    reduce_dtype: str = "float32"
    reshard_after_forward: bool = True
    checkpointing: bool = False
    notes: tuple[str, ...] = ()

    def describe(self) -> str:
        """``fsdp2 dp=8 tp=1 on 8 devices, bf16-mixed`` and the like."""
        if self.strategy == "fsdp2":
            where = f"fsdp2 dp={self.data_parallel} tp={self.tensor_parallel} ({self.param_dtype} all-gathers)"
        else:
            where = self.strategy
        return f"{where} on {self.world_size} device(s), {self.precision}"


@dataclass
class Workload:
    """One task's training step, as the estimate runs it.

    Attributes:
        task: "lm", "vit" or "dit".
        build: the network for an activation-checkpointing setting (called on the meta device).
        batch: the per-device batch (called under fake tensors).
        loss: the task's training loss of the network on a batch (what ``model_step`` computes for "train").
        seq_len: the trunk's tokens per sample (tensor parallelism checks it divides).
        ema: whether the task keeps an EMA copy of the network (DiT; ViT with ``ema_decay``).
        capacity: the answer to the MoE's data-dependent read of its busiest expert's load (None: dense).
    """

    task: str
    build: Callable[[bool], nn.Module]
    batch: Callable[[], tuple[Tensor, ...]]
    loss: Callable[[nn.Module, tuple[Tensor, ...]], Tensor]
    seq_len: int | None = None
    ema: bool = False
    capacity: int | None = None


@dataclass
class MemoryEstimate:
    """Bytes on one device at the peak of a training step, by kind (they add up to ``peak``).

    Attributes:
        params: parameters and buffers (FSDP2: the sharded fp32 copy plus the gathered ones live at the peak;
            the EMA copy included).
        grads: gradients (DDP: plus its buckets' copy).
        optimizer: AdamW's moments (``exp_avg``, ``exp_avg_sq``, step counts).
        activations: what forward saved for backward, inputs included.
        transient: temporaries, all-gather and reduce-scatter buffers alive at the peak.
        peak: the step's peak.
        steady: params + grads + optimizer after the step (what stays between steps).
        activation_checkpointing: the setting measured.
        notes: what the estimate assumed.
    """

    params: int
    grads: int
    optimizer: int
    activations: int
    transient: int
    peak: int
    steady: int
    activation_checkpointing: bool
    notes: tuple[str, ...] = field(default_factory=tuple)


def parse_memory(text: str, what: str = "--gpu-memory", where: str = "command line") -> int:
    """Bytes from ``80GB``, ``141GB``, ``96GiB``, ``80`` (GB); GB = 1e9 bytes, GiB = 2**30.

    Raises:
        InputError: not a positive size (one line naming the value and what is valid).
    """
    raw = str(text).strip()
    units = {"tib": 2**40, "tb": 1e12, "gib": 2**30, "gb": 1e9, "mib": 2**20, "mb": 1e6}
    lower, scale = raw.lower(), GB
    for unit, factor in units.items():
        if lower.endswith(unit):
            lower, scale = lower[: -len(unit)].strip(), factor
            break
    valid = "a positive size such as 80GB, 141GB, 96GiB or 80 (GB)"
    try:
        value = number(lower, what, low=0, low_open=True, where=where)
    except InputError:
        raise InputError(f"{what}={raw!r} is not a memory size ({where}); valid: {valid}") from None
    return int(value * scale)


def _int_setting(value: object, what: str, low: int = 1) -> int:
    return int(number(value, what, kind=int, low=low, where="config"))


def _devices(trainer: dict) -> int:
    devices = trainer.get("devices", 1)
    if isinstance(devices, list | tuple):
        count = len(devices)
    elif isinstance(devices, str) and "," in devices:
        count = len([d for d in devices.split(",") if d.strip()])
    elif devices in ("auto", -1, "-1", None):
        count = 1
    else:
        count = _int_setting(devices, "trainer.devices", low=0)
    nodes = _int_setting(trainer.get("num_nodes", 1) or 1, "trainer.num_nodes", low=0)
    if count * nodes < 1:
        raise InputError(
            f"world size trainer.devices x trainer.num_nodes = {count} x {nodes} = 0 (config); valid: >= 1 device"
        )
    return count * nodes


def _mesh_size(value: object, what: str, auto: int) -> int:
    return auto if value in (None, "auto") else _int_setting(value, what)


def setup_from_config(config: dict) -> MemorySetup:
    """The :class:`MemorySetup` a resolved ``fit`` config amounts to (its trainer and ``model.init_args.parallel``).

    Raises:
        InputError: a world size of 0, a mesh that does not multiply to it, an unknown precision or strategy.
    """
    trainer = config.get("trainer") or {}
    model = (config.get("model") or {}).get("init_args") or {}
    world = _devices(trainer)
    precision = str(trainer.get("precision", "32-true"))
    if precision not in PRECISIONS:
        raise InputError(f"trainer.precision={precision!r} (config) is not estimated; valid: {', '.join(PRECISIONS)}")
    accelerator = str(trainer.get("accelerator", "auto"))
    parallel = ParallelConfig(**(model.get("parallel") or {}))
    device_type = "cuda" if accelerator in GPU_ACCELERATORS else "cpu"
    param_dtype = str(parallel.param_torch_dtype(device_type)).removeprefix("torch.")
    checkpointing = bool((model.get("trunk") or {}).get("activation_checkpointing", False))
    strategy = trainer.get("strategy", "auto")
    if isinstance(strategy, dict):
        name, init = str(strategy.get("class_path", "")), strategy.get("init_args") or {}
    else:
        name, init = str(strategy), {}
    name = name.rsplit(".", 1)[-1]  # a class path or Lightning's short name
    common = {"world_size": world, "precision": precision, "checkpointing": checkpointing}
    if getattr(parallel, "expert_parallel", False):
        common["notes"] = (
            "model.init_args.parallel.expert_parallel not estimated (its all-to-all splits are data): the experts "
            "are FSDP2-sharded instead, the same expert bytes per rank",
        )
    if name == MODEL_PARALLEL:
        nodes = _int_setting(trainer.get("num_nodes", 1) or 1, "trainer.num_nodes")
        dp = _mesh_size(init.get("data_parallel_size"), "data_parallel_size", nodes)
        tp = _mesh_size(init.get("tensor_parallel_size"), "tensor_parallel_size", world // nodes)
        if dp * tp != world:
            raise InputError(
                f"ModelParallelStrategy data_parallel_size x tensor_parallel_size = {dp} x {tp} = {dp * tp} (config) "
                f"is not the world size trainer.devices x trainer.num_nodes = {world}; valid: sizes whose product is it"
            )
        return MemorySetup(
            "fsdp2", data_parallel=dp, tensor_parallel=tp, param_dtype=param_dtype,
            reduce_dtype=parallel.reduce_dtype, reshard_after_forward=parallel.reshard_after_forward, **common,
        )  # fmt: skip
    if name in (FSDP1, "fsdp"):
        policy = bool(init.get("activation_checkpointing_policy") or init.get("activation_checkpointing"))
        note = f"{FSDP1} (FSDP1) estimated as FSDP2 full sharding over all {world} devices"
        common["checkpointing"] = checkpointing or policy
        common["notes"] = (note, *common.get("notes", ()))
        return MemorySetup(
            "fsdp2", data_parallel=world, param_dtype=param_dtype, reduce_dtype=parallel.reduce_dtype, **common
        )
    if name in ("ddp", "ddp_spawn", "ddp_find_unused_parameters_true", "DDPStrategy") or (name == "auto" and world > 1):
        return MemorySetup("ddp", **common)
    if name in ("auto", "single_device", "SingleDeviceStrategy"):
        return MemorySetup("single", **common)
    raise InputError(
        f"trainer.strategy={name!r} (config) is not estimated; valid: auto, ddp, "
        f"lightning.pytorch.strategies.{MODEL_PARALLEL}, {FSDP1} (estimated as FSDP2)"
    )


# ----------------------------------------------------------------------------------------------- workloads


def _lm_loss(net: nn.Module, batch: tuple[Tensor, ...]) -> Tensor:
    (tokens,) = batch
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    logits, routing = net(inputs, return_aux=True)
    loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
    return loss + 0.01 * routing.loss if routing is not None and net.trunk.cfg.moe_experts else loss


def _vit_loss(net: nn.Module, batch: tuple[Tensor, ...]) -> Tensor:
    images, soft_targets = batch  # mixup / cutmix targets: (B, classes) probabilities
    logits = net(images)
    return torch.sum(-soft_targets * F.log_softmax(logits, dim=-1), dim=-1).mean()


def _dit_loss(net: nn.Module, batch: tuple[Tensor, ...]) -> Tensor:
    latents, labels, t = batch
    noise = torch.randn_like(latents)
    out = net(latents + noise, t, labels)
    eps, rest = out[:, : latents.shape[1]], out[:, latents.shape[1] :]
    loss = F.mse_loss(eps.float(), noise.float())
    if rest.numel():  # learned sigma: the VLB term's fp32 read of it stands in as a second MSE
        loss = loss + F.mse_loss(rest.float(), noise.float())
    return loss


#: The largest shapes the estimate takes: fake tensors hold any size for free, but a step is traced op by op (its
#: time grows with depth and experts) and sizes past these overflow torch's index arithmetic. Each is several
#: times the largest published model's (width 16384 and depth 126 for Llama 3 405B; DeepNet's 1000 layers).
TRUNK_LIMITS = {"dim": 1 << 16, "depth": 1024, "num_heads": 1024, "mlp_hidden": 1 << 20, "moe_experts": 4096,
                "moe_hidden": 1 << 20, "mhc_streams": 64}  # fmt: skip
NETWORK_LIMITS = {"vocab_size": 1 << 22, "max_seq_len": 1 << 20, "img_size": 8192, "input_size": 4096,
                  "num_classes": 1 << 20, "in_channels": 1024}  # fmt: skip
BATCH_LIMIT = 1 << 20


def check_shape(network: dict, batch_size: object = None) -> None:
    """Refuses a network or batch beyond what the estimate takes (:data:`TRUNK_LIMITS`), before anything is built.

    Raises:
        InputError: one line naming the setting, its value and the valid range.
    """
    trunk = network.get("trunk") or {}
    settings = [(f"model.init_args.trunk.{k}", trunk.get(k), high) for k, high in TRUNK_LIMITS.items()]
    settings += [(f"network {k}", network.get(k), high) for k, high in NETWORK_LIMITS.items()]
    settings.append(("per-device batch size", batch_size, BATCH_LIMIT))
    for what, value, high in settings:
        if value is not None:
            number(value, what, kind=int, low=0, high=high, where="config; the memory estimate's limit")


def workload_for(task: str, network: dict, batch_size: int, ema: bool = False) -> Workload:
    """The training step of a ``models`` network given the same arguments as the sweep's estimate
    (:func:`experiments.sweeps.estimate.network_args`), on a per-device batch of ``batch_size``.

    Raises:
        InputError: an unknown task, a batch size below 1, a shape beyond :func:`check_shape`'s limits.
    """
    check_shape(network, batch_size)
    batch_size = _int_setting(batch_size, "per-device batch size")
    args = copy.deepcopy(network)
    trunk_args = args.pop("trunk")

    def trunk(checkpointing: bool) -> TrunkConfig:
        return TrunkConfig(**{**trunk_args, "activation_checkpointing": checkpointing})

    if task == "lm":
        seq, vocab = int(args["max_seq_len"]), int(args["vocab_size"])
        cfg = trunk(False)
        capacity = math.ceil(batch_size * seq * cfg.moe_top_k / cfg.moe_experts) if cfg.moe_experts else None
        return Workload(
            task, lambda ac: LanguageModel(trunk(ac), **args),
            lambda: (torch.randint(0, vocab, (batch_size, seq + 1)),), _lm_loss, seq, ema, capacity,
        )  # fmt: skip
    if task == "vit":
        size, classes = int(args["img_size"]), int(args["num_classes"])
        tokens = (size // int(args["patch_size"])) ** 2 + 1
        return Workload(
            task, lambda ac: ViTClassifier(trunk(ac), **args),
            lambda: (torch.randn(batch_size, 3, size, size), torch.rand(batch_size, classes)), _vit_loss, tokens, ema,
        )  # fmt: skip
    if task == "dit":
        size, ch = int(args["input_size"]), int(args["in_channels"])
        tokens = (size // int(args["patch_size"])) ** 2
        return Workload(
            task, lambda ac: DiT(trunk(ac), **args),
            lambda: (
                torch.randn(batch_size, ch, size, size),
                torch.randint(0, int(args["num_classes"]), (batch_size,)),
                torch.randint(0, 1000, (batch_size,)),
            ),
            _dit_loss, tokens, ema,
        )  # fmt: skip
    raise InputError(f"no memory estimate for task {task!r}; valid: lm, vit, dit")


# ------------------------------------------------------------------------------------------------ measuring


class AnswerDataReads(TorchDispatchMode):
    """Answers what fake tensors cannot: a count over expert ids (``bincount`` with ``minlength`` E, whose size
    is E since every id is below it) and an integer read into Python (``int(counts.max())``), with ``value``."""

    def __init__(self, value: int) -> None:
        super().__init__()
        self.value = value

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204 - torch's protocol
        kwargs = kwargs or {}
        if func is torch.ops.aten._local_scalar_dense.default and not args[0].is_floating_point():
            return self.value
        if func is torch.ops.aten.bincount.default:
            minlength = kwargs.get("minlength", args[2] if len(args) > 2 else 0)
            weights = kwargs.get("weights", args[1] if len(args) > 1 else None)
            if minlength > 0:
                dtype = torch.int64 if weights is None else weights.dtype
                return torch.zeros(minlength, dtype=dtype, device=args[0].device)
        return func(*args, **kwargs)


@contextlib.contextmanager
def fake_process_group(world_size: int) -> Iterator[None]:
    """A process group of ``world_size`` ranks on torch's "fake" backend (this process is rank 0), for the block.

    Raises:
        RuntimeError: a real process group is already initialized in this process.
    """
    if dist.is_initialized():
        raise RuntimeError("a process group is already initialized; the memory estimate needs its own fake one")
    hook = sys.excepthook  # init_process_group wraps it in a "[rankN]: " prefixer, and never unwraps it
    dist.init_process_group("fake", rank=0, world_size=world_size, store=FakeStore())
    try:
        yield
    finally:
        dist.destroy_process_group()
        sys.excepthook = hook


def _sum(snapshot: dict, *kinds: str) -> int:
    return int(sum(v for k, v in snapshot.items() if str(getattr(k, "value", k)) in kinds))


def _grad_bytes(net: nn.Module) -> int:
    total = 0
    for p in net.parameters():
        g = p.grad
        if g is not None:
            g = g.to_local() if hasattr(g, "to_local") else g
            total += g.numel() * g.element_size()
    return total


def measure(workload: Workload, setup: MemorySetup, activation_checkpointing: bool) -> MemoryEstimate:
    """The per-device memory of one steady training step of ``workload`` under ``setup`` (fake tensors only).

    Raises:
        ValueError: a trunk the mesh cannot shard (from :func:`parallelize`, one line).
    """
    param_dtype, autocast_dtype = PRECISIONS[setup.precision]
    notes = list(setup.notes)
    with torch.device("meta"):
        net = workload.build(activation_checkpointing)
    net = net.to(param_dtype)
    ema = copy.deepcopy(net).requires_grad_(False) if workload.ema else None
    world = setup.world_size if setup.strategy == "fsdp2" else 1
    with fake_process_group(world):
        if setup.strategy == "fsdp2":
            mesh = init_device_mesh("cpu", (setup.data_parallel, setup.tensor_parallel), mesh_dim_names=(DP, TP))
            config = ParallelConfig(param_dtype=setup.param_dtype, reshard_after_forward=setup.reshard_after_forward)
            parallelize(net, mesh, config, workload.seq_len)
            if ema is not None:
                parallelize(ema, mesh, config, workload.seq_len)
        with FakeTensorMode(allow_non_fake_inputs=True):
            net.to_empty(device="cpu")
            if ema is not None:
                ema.to_empty(device="cpu")
            net.train()
            opt = torch.optim.AdamW(net.parameters(), lr=1e-4, foreach=False)
            batch = workload.batch()
            if setup.strategy == "fsdp2":
                tracker: MemTracker = FSDPMemTracker(net, opt)
                tracker.track_inputs(batch)
            else:
                tracker = MemTracker()
                tracker.track_external(net, opt, *batch)
            if ema is not None:
                tracker.track_external(ema)
            answer = AnswerDataReads(workload.capacity) if workload.capacity else contextlib.nullcontext()
            if workload.capacity:
                notes.append(
                    f"MoE capacity assumed balanced ({workload.capacity:,} tokens per expert), no expert parallelism"
                )
            autocast = torch.autocast("cpu", dtype=autocast_dtype) if autocast_dtype else contextlib.nullcontext()
            grads = 0
            quiet = warnings.catch_warnings()  # CPU autocast's rms_norm on bf16 input warns once per shape
            with tracker, answer, quiet:
                warnings.filterwarnings("ignore", message="Mismatch dtype between input and weight")
                for _ in range(2):  # Lightning's order: the last step's gradients are alive in forward
                    with autocast:
                        loss = workload.loss(net, batch)
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    grads = _grad_bytes(net)
                    opt.step()
                    del loss
                    tracker.reset_mod_stats()  # per-module stats only; the peak is kept
            peak_snapshot = next(iter(tracker.get_tracker_snapshot("peak").values()))
            now = next(iter(tracker.get_tracker_snapshot("current").values()))
    params = _sum(peak_snapshot, "Parameter", "Buffer", "Sharded Param", "Unsharded Param")
    grad_bytes = _sum(peak_snapshot, "Gradient", "Sharded Grad", "Unsharded Grad")
    optimizer = _sum(peak_snapshot, "Optstate", "OptState")
    activations = _sum(peak_snapshot, "Activation", "Inputs")
    peak = int(peak_snapshot["Total"])
    steady = _sum(now, "Parameter", "Buffer", "Sharded Param", "Optstate", "OptState") + grads
    if setup.strategy == "ddp":
        grad_bytes += grads  # DDP's buckets: a second copy of every gradient (gradient_as_bucket_view=False)
        peak += grads
        steady += grads
        notes.append("DDP buckets counted as one more copy of the gradients")
    return MemoryEstimate(
        params=params, grads=grad_bytes, optimizer=optimizer, activations=activations,
        transient=peak - params - grad_bytes - optimizer - activations, peak=peak, steady=steady,
        activation_checkpointing=activation_checkpointing, notes=tuple(dict.fromkeys(notes)),
    )  # fmt: skip


def measure_both(workload: Workload, setup: MemorySetup) -> dict[bool, MemoryEstimate]:
    """:func:`measure` without and with activation checkpointing (keys: the setting)."""
    return {ac: measure(workload, setup, ac) for ac in (False, True)}


def size(n: float) -> str:
    """``12.34 GB``, ``176.3 MB``, ``12.0 kB``: bytes in decimal units."""
    for factor, unit in ((GB, "GB"), (1e6, "MB"), (1e3, "kB")):
        if abs(n) >= factor:
            return f"{n / factor:.2f} {unit}" if unit == "GB" else f"{n / factor:.1f} {unit}"
    return f"{n:.0f} B"


def fits_line(est: MemoryEstimate, capacity: int) -> str:
    """``fits 80 GB (12.30 GB margin)`` or ``does NOT fit 80 GB (4.10 GB over)``."""
    margin = capacity - est.peak
    if margin >= 0:
        return f"fits {capacity / GB:g} GB ({size(margin)} margin)"
    return f"does NOT fit {capacity / GB:g} GB ({size(-margin)} over)"


def format_estimate(est: MemoryEstimate) -> str:
    """One line: the peak and its parts."""
    parts = (
        f"params {size(est.params)} + grads {size(est.grads)} + optimizer {size(est.optimizer)} + "
        f"activations {size(est.activations)} + transient {size(est.transient)}"
    )
    return f"peak {size(est.peak)} = {parts}"
