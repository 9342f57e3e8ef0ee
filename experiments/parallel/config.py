"""What a config says about sharding: FSDP2's mixed precision and resharding (the mesh itself is the strategy's),
and the check of the whole parallel layout (world size, mesh sizes, what tensor parallelism must divide) that
``fit`` runs before anything is launched or written (:func:`check_parallel_layout`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch

from experiments.parallel.tensor import check_tensor_parallel
from experiments.reliability.errors import SuiteError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class ParallelConfig:
    """FSDP2 and expert-parallel settings a task applies under ``ModelParallelStrategy`` (ignored by every other
    strategy), and compiled training (every strategy).

    Attributes:
        param_dtype: the dtype FSDP2 all-gathers parameters in for forward and backward (the sharded master
            copy and the optimizer state stay float32). "auto": bfloat16 on GPUs, float32 on CPU processes.
        reduce_dtype: the dtype gradients are reduce-scattered in.
        reshard_after_forward: free each Block's gathered parameters after its forward and gather them again in
            backward (ZeRO-3); False keeps them (ZeRO-2: more memory, one all-gather fewer per Block).
        expert_parallel: split an MoE trunk's experts over all the data-parallel ranks and send each token copy
            to the rank of its expert (all-to-all; experiments.parallel.expert) instead of FSDP-sharding them:
            ``expert_parallel_size`` = data_parallel_size.
        expert_parallel_size: split the experts over groups of this many consecutive data-parallel ranks (the
            GPUs of one node at most, so the all-to-alls stay inside a node), each expert FSDP2-sharded over the
            data_parallel_size / expert_parallel_size groups. 0 or 1: decided by ``expert_parallel`` alone; above
            1 it turns expert parallelism on whatever ``expert_parallel`` says.
        compile: compile each trunk Block (``torch.compile`` per Block, after tensor / expert parallelism and
            before FSDP2, activation checkpointing around it: torchtitan's order; experiments.parallel.compile),
            under every strategy.
        compile_backend: torch.compile's backend: "inductor" (fused kernels), "aot_eager" (the traced forward and
            backward on torch's own kernels: what the CPU tests run), "eager" (graph capture only).
    """

    param_dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    reduce_dtype: Literal["float32", "bfloat16"] = "float32"
    reshard_after_forward: bool = True
    expert_parallel: bool = False
    expert_parallel_size: int = 0
    compile: bool = False
    compile_backend: Literal["inductor", "aot_eager", "eager"] = "inductor"

    def param_torch_dtype(self, device_type: str) -> torch.dtype:
        """The all-gather dtype on ``device_type`` ("cpu", "cuda")."""
        if self.param_dtype == "auto":
            return torch.float32 if device_type == "cpu" else torch.bfloat16
        return DTYPES[self.param_dtype]

    def expert_degree(self, data_parallel: int) -> int:
        """The ranks each MoE layer's experts are split over out of ``data_parallel``: 0 when expert parallelism
        is off, ``data_parallel`` for ``expert_parallel: true`` alone, else ``expert_parallel_size``."""
        if self.expert_parallel_size > 1:
            return self.expert_parallel_size
        return data_parallel if self.expert_parallel else 0


#################################################################################
#             The parallel layout, checked before anything is launched          #
#################################################################################

MAX_PARALLEL = 1 << 16  # processes: no mesh axis of a real job is larger
_SIZES = ("data_parallel_size", "tensor_parallel_size")


def _count_devices(devices: Any) -> int | None:
    """How many devices per node ``trainer.devices`` names (an int, a list of ids, "0,1"), or None for "auto" / -1
    (Lightning decides from the hardware)."""
    if isinstance(devices, bool):
        return None
    if isinstance(devices, int):
        return devices if devices > 0 else None
    if isinstance(devices, list | tuple):
        return len(devices)
    if isinstance(devices, str) and devices.strip() not in ("auto", "-1", ""):
        parts = [p for p in devices.split(",") if p.strip()]
        if len(parts) == 1 and parts[0].strip().isdigit() and "," not in devices:
            return int(parts[0])
        return len(parts)
    return None


def _whole(value: Any) -> Any:
    """``"2"`` -> 2 (``--trainer.devices=2`` parses as a string); anything else as it is."""
    return int(value) if isinstance(value, str) and value.strip().lstrip("-").isdigit() else value


def _get(section: Any, key: str, default: Any = None) -> Any:
    if section is None:
        return default
    if isinstance(section, Mapping):
        return section.get(key, default)
    return getattr(section, key, default)


def check_parallel_layout(
    trainer: Any,
    trunk: Any,
    seq_len: int | None,
    origin: Callable[[str], str],
    expert_parallel: bool = False,
    expert_parallel_size: int = 0,
) -> None:
    """Refuses a parallel layout that cannot run, before any process is launched or any file written.

    Args:
        trainer: the trainer section of the parsed config (``devices``, ``num_nodes``, ``strategy`` with its
            ``init_args``), as given: nothing instantiated.
        trunk: the task's trunk module (tensor parallelism checks its head counts), or None (the VAE).
        seq_len: the tokens per sample the trunk sees, when the task knows it (tensor parallelism splits it).
        origin: where a dotted key was set ("command line", a config file, "default").
        expert_parallel: ``model.init_args.parallel.expert_parallel``: the MoE experts are split over the
            data-parallel ranks, which must divide their number.
        expert_parallel_size: ``model.init_args.parallel.expert_parallel_size``: the experts are split over groups
            of this many data-parallel ranks, which must divide data_parallel_size, the devices of a node and the
            experts.

    Raises:
        SuiteError: one line naming the option, its value, where it came from and what is valid: a size that is
            not "auto" or 1 to :data:`MAX_PARALLEL`, ``data_parallel_size x tensor_parallel_size`` other than the
            world size (``devices x num_nodes``), a tensor-parallel size the trunk's heads (query and key/value),
            hidden width or sequence length do not divide, tensor parallelism of a trunk it cannot split, expert
            parallelism over a data-parallel size that does not divide the experts, an expert-parallel size that
            does not divide the data-parallel size, one node's devices or the experts.
    """
    devices, nodes = (_whole(_get(trainer, key, default)) for key, default in (("devices", "auto"), ("num_nodes", 1)))
    for key, value in (("devices", devices), ("num_nodes", nodes)):
        whole = isinstance(value, int) and not isinstance(value, bool) and not (value == -1 and key == "devices")
        if whole and not 1 <= value <= MAX_PARALLEL:
            valid = f"1 to {MAX_PARALLEL}" + (", or -1 / 'auto' (every device)" if key == "devices" else "")
            raise SuiteError(f"trainer.{key}={value} ({origin(f'trainer.{key}')}); valid: {valid}")
    strategy = _get(trainer, "strategy")
    init_args = _get(strategy, "init_args") if not isinstance(strategy, str) else None
    if init_args is None:
        return
    per_node = _count_devices(devices)
    world = per_node * nodes if per_node is not None and isinstance(nodes, int) else None
    sizes: dict[str, int | None] = {}
    for name in _SIZES:
        value = _get(init_args, name, "auto")
        key = f"trainer.strategy.init_args.{name}"
        if value == "auto":
            sizes[name] = None
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_PARALLEL:
            raise SuiteError(
                f"{key}={value!r} ({origin(key)}); valid: 'auto' or a whole number from 1 to {MAX_PARALLEL}"
                + (f" whose product with the other size is the world size {world}" if world else "")
            )
        sizes[name] = value
    dp, tp = sizes["data_parallel_size"], sizes["tensor_parallel_size"]
    if dp is None:  # Lightning's "auto": data parallel over the nodes, tensor parallel over one node's devices
        dp = nodes if isinstance(nodes, int) else None
    if tp is None:
        tp = per_node
    if world is not None and (dp is None or tp is None or dp * tp != world):
        given = {n: _get(init_args, n, "auto") for n in _SIZES}
        where = sorted({origin(f"trainer.strategy.init_args.{n}") for n in _SIZES if given[n] != "auto"})
        raise SuiteError(
            f"trainer.strategy.init_args.data_parallel_size={given['data_parallel_size']} x tensor_parallel_size="
            f"{given['tensor_parallel_size']} ({', '.join(where) or 'default'}) is not the world size {world} "
            f"(trainer.devices={devices} x trainer.num_nodes={nodes}); valid: sizes whose product is {world}"
        )
    experts = getattr(getattr(trunk, "cfg", None), "moe_experts", 0) or 0
    _check_expert_parallel_size(expert_parallel_size, dp, per_node, experts, origin)
    if expert_parallel and expert_parallel_size <= 1 and dp is not None and dp > 1 and experts % dp:
        key = "trainer.strategy.init_args.data_parallel_size"
        raise SuiteError(
            f"{key}={dp} ({origin(key)}) does not divide the trunk's moe_experts {experts}, which expert parallelism "
            f"(model.init_args.parallel.expert_parallel) splits over the data-parallel ranks; valid: a "
            f"data_parallel_size that divides {experts}, or expert_parallel: false"
        )
    if tp is not None and tp > 1 and trunk is not None:
        key = "trainer.strategy.init_args.tensor_parallel_size"
        try:
            check_tensor_parallel(trunk, tp, seq_len)
        except ValueError as err:
            raise SuiteError(f"{key}={tp} ({origin(key)}): {err}") from None


def _check_expert_parallel_size(size: Any, dp: int | None, per_node: int | None, experts: int, origin) -> None:
    """Refuses an ``expert_parallel_size`` that is not a whole number from 0 to :data:`MAX_PARALLEL`, or above 1 and
    not dividing the data-parallel size (the groups of consecutive data-parallel ranks it splits the experts over),
    one node's devices (a group must not straddle nodes: its all-to-alls stay on the node's links) or the experts."""
    key = "model.init_args.parallel.expert_parallel_size"
    if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= MAX_PARALLEL:
        raise SuiteError(f"{key}={size!r} ({origin(key)}); valid: a whole number from 0 to {MAX_PARALLEL} (0, 1: off)")
    if size <= 1:
        return
    if not experts:
        raise SuiteError(f"{key}={size} ({origin(key)}) needs an MoE trunk (moe_experts > 0); valid: 0 for this one")
    for what, whole in (("data_parallel_size", dp), ("the devices of one node (trainer.devices)", per_node)):
        if whole is not None and whole % size:
            raise SuiteError(
                f"{key}={size} ({origin(key)}) does not divide {what} {whole}; valid: an expert_parallel_size that "
                f"divides both the data-parallel size and one node's devices (at most a node: its all-to-alls stay "
                f"inside it)"
            )
    if experts % size:
        raise SuiteError(
            f"{key}={size} ({origin(key)}) does not divide the trunk's moe_experts {experts}; valid: a divisor of "
            f"{experts} that divides the data-parallel size and one node's devices"
        )
