"""A global batch: samples per optimizer step whatever the world size, reached by gradient accumulation.

A recipe states its batch per optimizer step (OLMo-1B: 2,048 sequences; DeiT: 1,024 images); the cluster it
runs on should not change it. The LM and latent DataModules keep ``batch_size`` as the per-device micro-batch and
derive the number of micro-batches accumulated before each step:

    accumulate = global_batch_size / (batch_size x data-parallel replicas)

which must be a whole number. The replicas are the ranks that read different data (under tensor parallelism a
group of ranks reads one batch). The result is set on the Trainer (``accumulate_grad_batches``) in the
DataModule's ``setup``, before the optimizer, its schedule (``estimated_stepping_batches``) and the first step.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.utilities import rank_zero_info

__all__ = ["check_global_batch", "data_parallel_replicas", "set_accumulation"]


def check_global_batch(global_batch_size: int | None, batch_size: int) -> None:
    """Refuses, at construction, a global batch the micro-batch cannot add up to on any number of replicas."""
    if global_batch_size is None:
        return
    if global_batch_size <= 0:
        raise ValueError(f"global_batch_size={global_batch_size} must be a positive integer (or null)")
    if global_batch_size % batch_size:
        raise ValueError(
            f"global_batch_size={global_batch_size} is not a multiple of the per-device micro-batch "
            f"batch_size={batch_size}; use a batch_size that divides it"
        )


def data_parallel_replicas(trainer: Any | None) -> int:
    """Ranks that read different batches: Lightning's sampler split (data-parallel size), 1 outside a trainer."""
    shard = trainer.distributed_sampler_kwargs if trainer is not None else None
    return int(shard["num_replicas"]) if shard else 1


def set_accumulation(global_batch_size: int | None, batch_size: int, trainer: Any | None) -> int:
    """Sets ``trainer.accumulate_grad_batches`` so each optimizer step sees ``global_batch_size`` samples.

    Returns:
        The accumulation steps (the trainer's own value when ``global_batch_size`` is None).

    Raises:
        ValueError: the global batch does not split over the micro-batch and replicas, or the trainer was given
            another ``accumulate_grad_batches`` (one line naming the values).
    """
    if trainer is None:
        return 1
    if global_batch_size is None:
        return int(trainer.accumulate_grad_batches)
    replicas = data_parallel_replicas(trainer)
    accumulate, rest = divmod(global_batch_size, batch_size * replicas)
    if rest or accumulate == 0:
        raise ValueError(
            f"global_batch_size={global_batch_size} does not split into micro-batches of batch_size={batch_size} "
            f"on {replicas} data-parallel replicas; use a multiple of {batch_size * replicas} (or another "
            "batch_size or device count)"
        )
    given = int(trainer.accumulate_grad_batches)
    if given not in (1, accumulate):
        raise ValueError(
            f"trainer.accumulate_grad_batches={given} conflicts with global_batch_size={global_batch_size}, which "
            f"needs {accumulate} (= {global_batch_size} / ({batch_size} x {replicas} replicas)); leave it at 1"
        )
    trainer.accumulate_grad_batches = accumulate
    rank_zero_info(
        f"global batch {global_batch_size} = micro-batch {batch_size} x {replicas} data-parallel replicas x "
        f"{accumulate} accumulation steps"
    )
    return accumulate
