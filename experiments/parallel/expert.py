"""Expert parallelism: the MoE's experts split over a group of data-parallel ranks, tokens exchanged with all-to-all.

The model is torchtitan's ``ExpertParallel``, on the suite's :class:`models.layers.moe.GroupedExperts` boundary
``forward(sorted copies, copies per expert)``. With P ranks in an expert-parallel group and E experts, rank r of
the group holds experts ``r E/P .. (r+1) E/P - 1`` (the stacked weights cut on their first axis)::

    this rank's copies, sorted by expert ──all-to-all──▶ every copy routed to my experts, from every rank
      (grouped by destination rank)                       reordered: expert-major, then source rank
                                                          GroupedExperts on them (grouped matmul)
    outputs, in this rank's sorted order ◀──all-to-all── back to the ranks the copies came from

The data-parallel ranks D are cut into D / P groups of P consecutive ranks (:func:`expert_mesh`: the 2-D mesh
``(expert_shard, expert_parallel)``), P at most the GPUs of one node, so the all-to-alls stay inside a node. Each
group holds every expert once; across the D / P groups each expert's shard is FSDP2-sharded again (torchtitan's
``dp_mod_ep`` mesh). The split sizes are counts the router just produced, so each layer reads them on the host once
(inherent to expert parallelism; the dense path reads none). The experts' gradients sum the P ranks' tokens and
FSDP2 averages them over the D / P groups; :func:`scale_expert_grads` divides by P, so they are the same average
over D ranks FSDP2 gives every other parameter. Routing statistics and the load-balancing loss stay each rank's
own, as under DDP.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed._functional_collectives import all_to_all_single_autograd
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard, distribute_module, distribute_tensor
from torch.distributed.tensor.parallel import ParallelStyle

from models.layers.moe import GroupedExperts
from models.trunk import Trunk


class ExpertParallel(ParallelStyle):
    """Shards a :class:`GroupedExperts` over a 1-D mesh and routes its inputs to the ranks that hold their experts.

    What the dispatch learns (split sizes, the reordering) is kept on this style object between the module's
    input and output hooks of one forward, as torchtitan does; an activation-checkpointing recompute runs both
    hooks again, in the same order.
    """

    def __init__(self) -> None:
        super().__init__()
        self._plan: tuple[list[int], list[int], Tensor] | None = None

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        if not isinstance(module, GroupedExperts):
            raise TypeError(f"ExpertParallel shards GroupedExperts, not {type(module).__name__}")
        if module.num_experts % device_mesh.size():
            raise ValueError(
                f"trunk moe_experts {module.num_experts} is not divisible by the {device_mesh.size()} "
                "ranks expert parallelism splits them over (parallel.expert_parallel_size)"
            )
        return distribute_module(module, device_mesh, self._partition, self._dispatch, self._combine)

    @staticmethod
    def _partition(name: str, module: nn.Module, mesh: DeviceMesh) -> None:
        for pname, param in list(module.named_parameters(recurse=False)):
            module.register_parameter(pname, nn.Parameter(distribute_tensor(param, mesh, [Shard(0)])))

    @torch.compiler.disable  # data-dependent split sizes (host read): eager between compiled regions
    def _dispatch(self, module: nn.Module, inputs: tuple, mesh: DeviceMesh) -> tuple[Tensor, Tensor]:
        x, counts = inputs
        ranks, group = mesh.size(), mesh.get_group()
        local = module.num_experts // ranks
        sent = counts.view(ranks, local)  # (P, E/P): my copies for each rank's experts
        received = torch.empty_like(sent)
        dist.all_to_all_single(received, sent, group=group)  # (P, E/P): each rank's copies for my experts
        send_splits, recv_splits = sent.sum(1).tolist(), received.sum(1).tolist()  # the host read
        x = all_to_all_single_autograd(x, recv_splits, send_splits, group)  # source-rank major
        # reorder to expert-major (the grouped matmul's layout): copy j of (source s, expert e) goes after all
        # copies of experts < e, and after those of expert e from sources < s
        flat = received.flatten()  # (P * E/P,), source-major
        starts = torch.cumsum(flat, 0) - flat
        by_expert = received.t().flatten()  # (E/P * P,), expert-major
        source_start = starts.view(ranks, local).t().flatten()
        order = torch.repeat_interleave(source_start, by_expert, output_size=x.shape[0])
        offset = torch.arange(x.shape[0], device=x.device) - torch.repeat_interleave(
            torch.cumsum(by_expert, 0) - by_expert, by_expert, output_size=x.shape[0]
        )
        order = order + offset  # position in x (source-major) of each expert-major row
        self._plan = (send_splits, recv_splits, order)
        return x[order], received.sum(0)

    @torch.compiler.disable
    def _combine(self, module: nn.Module, outputs: Tensor, mesh: DeviceMesh) -> Tensor:
        send_splits, recv_splits, order = self._plan
        self._plan = None
        back = torch.empty_like(outputs).index_copy(0, order, outputs)  # source-major again
        return all_to_all_single_autograd(back, send_splits, recv_splits, mesh.get_group())


def expert_modules(trunk: Trunk) -> list[GroupedExperts]:
    """The trunk's GroupedExperts, one per MoE block."""
    return [m for m in trunk.modules() if isinstance(m, GroupedExperts)]


EP, EP_SHARD = "expert_parallel", "expert_shard"  # the dimensions of expert_mesh


def expert_mesh(dp_mesh: DeviceMesh, degree: int) -> DeviceMesh:
    """The 1-D data-parallel mesh cut into ``(expert_shard, expert_parallel)`` = ``(D / degree, degree)``: groups of
    ``degree`` consecutive ranks (one node's, when ``degree`` divides its devices), sliced from the same root mesh
    so FSDP2 accepts the experts' expert-parallel DTensors on the other dimension.

    Raises:
        ValueError: ``degree`` does not divide the data-parallel size (one line; checked before launch by
            :func:`experiments.parallel.config.check_parallel_layout`).
    """
    ranks = dp_mesh.size()
    if degree < 1 or ranks % degree:
        raise ValueError(
            f"parallel.expert_parallel_size {degree} does not divide data_parallel_size {ranks}; valid: a divisor of "
            f"{ranks} (at most one node's devices)"
        )
    return dp_mesh._unflatten(0, (ranks // degree, degree), (EP_SHARD, EP))


def apply_expert_parallel(trunk: Trunk, mesh: DeviceMesh) -> None:
    """Shards every MoE block's experts over the 1-D ``mesh`` (in place)."""
    if not expert_modules(trunk):
        raise ValueError("parallel.expert_parallel / expert_parallel_size needs an MoE trunk (trunk.moe_experts > 0)")
    for experts in expert_modules(trunk):
        ExpertParallel()._apply(experts, mesh)


@torch.no_grad()
def scale_expert_grads(trunk: Trunk, ranks: int) -> None:
    """Divides the experts' gradients by the number of ranks: the data-parallel average of a summed gradient."""
    for experts in expert_modules(trunk):
        for p in experts.parameters():
            if p.grad is not None:
                (p.grad._local_tensor if isinstance(p.grad, DTensor) else p.grad).div_(ranks)
