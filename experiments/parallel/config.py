"""What a config says about sharding: FSDP2's mixed precision and resharding (the mesh itself is the strategy's)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class ParallelConfig:
    """FSDP2 settings a task applies under ``ModelParallelStrategy`` (ignored by every other strategy).

    Attributes:
        param_dtype: the dtype FSDP2 all-gathers parameters in for forward and backward (the sharded master
            copy and the optimizer state stay float32). "auto": bfloat16 on GPUs, float32 on CPU processes.
        reduce_dtype: the dtype gradients are reduce-scattered in.
        reshard_after_forward: free each Block's gathered parameters after its forward and gather them again in
            backward (ZeRO-3); False keeps them (ZeRO-2: more memory, one all-gather fewer per Block).
        expert_parallel: split an MoE trunk's experts over the data-parallel ranks and send each token copy to
            the rank of its expert (all-to-all; experiments.parallel.expert) instead of FSDP-sharding them.
    """

    param_dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    reduce_dtype: Literal["float32", "bfloat16"] = "float32"
    reshard_after_forward: bool = True
    expert_parallel: bool = False

    def param_torch_dtype(self, device_type: str) -> torch.dtype:
        """The all-gather dtype on ``device_type`` ("cpu", "cuda")."""
        if self.param_dtype == "auto":
            return torch.float32 if device_type == "cpu" else torch.bfloat16
        return DTYPES[self.param_dtype]
