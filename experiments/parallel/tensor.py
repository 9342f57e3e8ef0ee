"""Tensor and sequence parallelism of the trunk (Megatron-LM's layout, on ``torch.distributed.tensor.parallel``).

Per Block, over the ``tensor_parallel`` mesh dimension of size t::

    residual streams (every stream of every scheme)     (B, N/t, D)  this rank's share of the sequence
      scheme.prepare: norms, stream mixing              token-local: computed on the share, no communication
      attention  qkv   column-parallel                  all-gather the sequence in, this rank's heads out
                 proj  row-parallel                     reduce-scatter back onto the sequence share
      MLP        fc1   column-parallel, fc2 row-parallel
      scheme.update                                     token-local again

Every scheme's norms and stream arithmetic act on one token at a time, so they run unchanged on the sequence
share, for one stream or several, all with one placement; no scheme needs a plan of its own. Fused projections
(``qkv`` = [q; k; v], SwiGLU's ``fc1`` = [gate; up]) are sharded part by part (:mod:`experiments.parallel.packed`):
each rank holds its slice of q, of k and of v, and the block code reads the local widths from the tensors. Under
grouped-query attention the qkv is sharded by key/value head: each rank holds H_kv / t key/value heads and the
H / t query heads that read them.
What the sequence shares see differently on each rank, the parameters they touch (the schemes' norms and
mixers, per-head QK-norms, adaLN) get different gradients from each rank: :func:`sequence_parallel_params`
lists them and their gradients are summed over the group before the step. The trunk's input is cut into
shares on the way in and gathered on the way out, so embeddings, heads and the loss stay ordinary
(replicated) tensors.

Refused, with a reason: mixtures of experts (expert parallelism is their axis), QK-norm over the whole projection
(it needs every head), a sequence length, head count or key/value head count that t does not divide.
"""

from __future__ import annotations

from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_module, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel, parallelize_module

from experiments.parallel.packed import PackedLinear
from models.trunk import Trunk


class PackedColwiseParallel(ParallelStyle):
    """Column parallelism for a :class:`PackedLinear`: its ``(parts, rows, in)`` weight cut on the rows axis (a
    grouped-query qkv's ``(kv_heads, parts, Dh, in)`` on the key/value heads axis: ``shard_dim``).

    In: this rank's share of the sequence, gathered into the whole sequence (Megatron's "g": all-gather forward,
    reduce-scatter of the input gradient backward, since each rank's slice adds its part of it). Out: the local
    ``[part_0 slice; part_1 slice; ...]`` as a plain tensor, which the block splits as it would the fused output.
    """

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        if not isinstance(module, PackedLinear):
            raise TypeError(f"PackedColwiseParallel shards a PackedLinear, not {type(module).__name__}")

        def partition(name: str, mod: nn.Module, mesh: DeviceMesh) -> None:
            for pname, param in list(mod.named_parameters(recurse=False)):
                cut = [Shard(mod.shard_dim)]
                rows = nn.Parameter(distribute_tensor(param, mesh, cut), requires_grad=param.requires_grad)
                mod.register_parameter(pname, rows)

        def gather(mod: nn.Module, inputs: tuple, mesh: DeviceMesh) -> tuple:
            share = DTensor.from_local(inputs[0], mesh, [Shard(1)], run_check=False)
            return (share.redistribute(mesh, [Replicate()]).to_local(grad_placements=[Partial()]),)

        return distribute_module(module, device_mesh, partition, gather)


def check_tensor_parallel(trunk: Trunk, tp: int, seq_len: int | None) -> None:
    """Raises ValueError (one line) for what this plan cannot shard over ``tp`` ranks."""
    cfg = trunk.cfg
    if cfg.moe_experts:
        raise ValueError(
            "tensor_parallel_size > 1 with an MoE trunk: shard its experts with expert parallelism instead "
            "(model.init_args.parallel.expert_parallel), tensor_parallel_size 1"
        )
    for block in trunk.blocks:
        if block.attn.full_qk_norm:
            raise ValueError(
                "qk_norm_scope 'full' normalizes all heads' q as one vector, which tensor parallelism splits; "
                "valid with tensor_parallel_size > 1: qk_norm_scope 'per_head'"
            )
    for what, value in (("num_heads", cfg.num_heads), ("num_kv_heads", cfg.kv_heads), ("hidden", cfg.hidden)):
        if value % tp:
            raise ValueError(f"trunk {what} {value} is not divisible by tensor_parallel_size {tp}")
    if seq_len is not None and seq_len % tp:
        raise ValueError(f"sequence length {seq_len} is not divisible by tensor_parallel_size {tp}")


def _enter(mesh: DeviceMesh):
    """Trunk pre-hook: the embedded tokens (B, N, D), the same on every rank, cut to this rank's N/t share."""

    def hook(module: nn.Module, args: tuple, kwargs: dict):
        h = args[0]
        if h.shape[1] % mesh.size():
            raise ValueError(f"sequence length {h.shape[1]} is not divisible by tensor_parallel_size {mesh.size()}")
        share = DTensor.from_local(h, mesh, [Replicate()], run_check=False).redistribute(mesh, [Shard(1)])
        return (share.to_local(), *args[1:]), kwargs  # backward: the shares' gradients gathered again

    return hook


def _leave(mesh: DeviceMesh):
    """Trunk hook: the readout's share gathered back into the whole sequence, the same on every rank."""

    def gather(out: Tensor) -> Tensor:
        return DTensor.from_local(out, mesh, [Shard(1)], run_check=False).redistribute(mesh, [Replicate()]).to_local()

    def hook(module: nn.Module, args: tuple, output):
        if isinstance(output, tuple):  # (features, routing)
            return (gather(output[0]), *output[1:])
        return gather(output)

    return hook


def apply_tensor_parallel(trunk: Trunk, mesh: DeviceMesh) -> None:
    """Shards every Block of ``trunk`` over the 1-D ``mesh`` and puts the sequence split around it (in place)."""
    seq = Shard(1)
    for block in trunk.blocks:  # fused projections are PackedLinear already (experiments.parallel.packed)
        fc1 = block.mlp.fc1
        plan = {
            "attn.qkv": PackedColwiseParallel(),
            "mlp.fc1": PackedColwiseParallel() if isinstance(fc1, PackedLinear) else ColwiseParallel(input_layouts=seq),
            "attn.proj": RowwiseParallel(output_layouts=seq),
            "mlp.fc2": RowwiseParallel(output_layouts=seq),
        }
        parallelize_module(block, mesh, plan)
    trunk.register_forward_pre_hook(_enter(mesh), with_kwargs=True)
    trunk.register_forward_hook(_leave(mesh))


def sequence_parallel_params(trunk: Trunk) -> list[nn.Parameter]:
    """The parameters whose gradient each rank computes from its own tokens or heads only: everything in the
    blocks and the readout that tensor parallelism did not shard."""
    params = [p for p in trunk.readout.parameters()]
    for block in trunk.blocks:
        params += [p for p in block.parameters() if not isinstance(p, DTensor)]
    return params
