"""Scale-out inside one job: how a task's network is laid over Lightning's device mesh.

Belongs here: what a task's ``configure_model`` applies under ``ModelParallelStrategy`` (tensor and sequence
parallelism per Block, then FSDP2 ``fully_shard`` per Block and the root, in that order, as torchtitan's
``parallelize`` does), the settings a config gives it (:class:`ParallelConfig`), and reading a sharded
(distributed) checkpoint back as one file. Not here: the network itself (``models/``, which knows nothing of
meshes), launching jobs across nodes (``experiments.sweeps``).

    mesh (data_parallel, tensor_parallel)         from ModelParallelStrategy(data_parallel_size, tensor_parallel_size)
      tensor_parallel > 1:  per Block             attention / MLP column- then row-parallel (Megatron); the
                                                  residual streams of every scheme sharded over the sequence
      expert_parallel(_size): per MoE Block       experts split over groups of data-parallel ranks (one node at
                                                  most), tokens sent by all-to-all; FSDP2 over the groups
      compile:              per Block             torch.compile (every strategy: compile_blocks)
      per Block, then root: fully_shard           parameters, gradients and optimizer state over data_parallel

Everything runs on CPU processes (gloo) as it does on GPUs (NCCL): the tests prove it there.

Also here: the checks before submission that run the network on fake tensors: the memory estimate (memory.py,
estimate_cli.py) and one training step on fake CUDA tensors (fake_step.py, with fake_backward.py walking the
backward graph, since torch's autograd engine needs a real CUDA context).
"""

from experiments.parallel.compile import compile_blocks
from experiments.parallel.config import ParallelConfig
from experiments.parallel.shard import is_parallelized, parallelize, sync_grads

__all__ = ["ParallelConfig", "compile_blocks", "is_parallelized", "parallelize", "sync_grads"]
