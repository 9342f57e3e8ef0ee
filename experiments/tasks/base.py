"""What every task LightningModule shares: the trunk config, the optimizer, the TensorBoard HPARAMS row,
and the files a stage writes besides the run directory's own (checked by the CLI before it starts)."""

from __future__ import annotations

import os
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.trainer.states import TrainerFn
from timm.utils import ModelEmaV3
from torch.distributed.fsdp import FSDPModule

from experiments.monitoring.hparams import declare_hparams
from experiments.monitoring.step_mean import StepMean
from experiments.monitoring.throughput import Throughput
from experiments.parallel import ParallelConfig, compile_blocks, is_parallelized, parallelize, sync_grads
from experiments.parallel.clip import clip_grad_norm
from experiments.parallel.meta_init import materialize, on_meta, plan_of
from experiments.parallel.streams import RankStreams
from experiments.tasks.optim import OptimConfig, build_optimizer
from models import TrunkConfig
from models.init_values import meta_parameters


class TaskModule(L.LightningModule):
    """Base of the task modules. Subclasses build ``self.net`` and implement ``model_step``.

    Attributes:
        task: short task name ("lm", "vit", "dit", "vae"), used in run directories.
        key_metric: the validation metric runs are compared by (e.g. "val/ppl"), the first metric column of
            TensorBoard's HPARAMS tab; its test counterpart and ``test_metrics`` follow.
        test_metrics: further metric columns (what ``test`` logs, e.g. "test/acc5").
    """

    task: str = "task"
    key_metric: str = "val/loss"
    test_metrics: tuple[str, ...] = ()

    def __init__(
        self, trunk: TrunkConfig, optim: OptimConfig, parallel: ParallelConfig | None = None, meta_init: bool = False
    ) -> None:
        super().__init__()
        self.trunk_cfg, self.optim_cfg = trunk, optim
        self.parallel_cfg = parallel or ParallelConfig()
        self.meta_init = meta_init
        self.step_mean = StepMean()  # train/loss: the optimizer step's mean over its micro-batches

    def building(self) -> AbstractContextManager:
        """Where a subclass builds ``self.net``: with ``meta_init``, its large tensors on the meta device
        (:func:`models.init_values.meta_parameters`), given their values in :meth:`configure_model`."""
        return meta_parameters() if self.meta_init else nullcontext()

    def ema_of(self, net: torch.nn.Module, **kwargs: Any) -> ModelEmaV3:
        """timm's ``ModelEmaV3(net, **kwargs)``, also of a network built with ``meta_init``: timm makes the EMA's
        stochastic-rounding generator (bfloat16 EMA weights only) on the device of the first parameter, which then
        is a meta tensor; a CPU stand-in takes its place while timm copies the network (where a network built in
        full has its generator), and the copy gets a meta tensor of the parameter's shape back."""
        name, first = next(iter(net.named_parameters()))
        if not first.is_meta:
            return ModelEmaV3(net, **kwargs)
        owner, _, leaf = name.rpartition(".")
        net.get_submodule(owner)._parameters[leaf] = torch.nn.Parameter(torch.empty(0))
        try:
            ema = ModelEmaV3(net, **kwargs)
        finally:
            net.get_submodule(owner)._parameters[leaf] = first
        ema.module.get_submodule(owner)._parameters[leaf] = torch.nn.Parameter(torch.empty_like(first))
        return ema

    def networks(self) -> list[torch.nn.Module]:
        """The network and its EMA copy (when the task keeps one)."""
        ema = getattr(self, "ema", None)
        nets = [self.net] if isinstance(getattr(self, "net", None), torch.nn.Module) else []
        return nets + ([ema.module] if isinstance(ema, torch.nn.Module) else [])

    def configure_callbacks(self) -> list[L.Callback]:
        """Every task draws its training randomness per data-parallel rank (:mod:`experiments.parallel.streams`)
        and reports its speed (:mod:`experiments.monitoring.throughput`)."""
        return [RankStreams(), Throughput()]

    @property
    def sequence_length(self) -> int | None:
        """The trunk's token count per sample when the task knows it before the first batch (tensor parallelism
        checks it divides); None when it does not."""
        return None

    def configure_model(self) -> None:
        """Under ``ModelParallelStrategy``: tensor parallelism (``tensor_parallel_size`` > 1), then FSDP2, applied to
        the network (and to its EMA copy, the same way, so the two stay shard for shard). Every other strategy
        leaves the module as it is. Then, for a network built with ``meta_init``, each rank draws the values of its
        own shards (:mod:`experiments.parallel.meta_init`; under any other strategy, the whole network), the same
        bits as a network built in full. With ``parallel.compile`` each trunk Block is compiled (under a mesh by
        ``parallelize``, between tensor parallelism and FSDP2). Lightning calls this at every stage; the second call
        does nothing.

        Raises:
            ValueError: a network or trunk the mesh cannot shard (one line saying why and what is valid).
        """
        nets = self.networks()
        plans = [(net, plan_of(net)) for net in nets if on_meta(net)]  # before parallelize packs the projections
        if self._device_mesh is not None:
            self.parallelize_networks(nets)
        trainer = getattr(self, "_trainer", None)
        device = trainer.strategy.root_device if trainer is not None and self._device_mesh is not None else "cpu"
        for net, plan in plans:
            materialize(net, plan, net.init_seed, device)
        if self._device_mesh is None:  # single device / DDP; under a mesh, parallelize compiled the Blocks
            for net in nets:
                if getattr(net, "trunk", None) is not None:
                    compile_blocks(net.trunk, self.parallel_cfg)

    def parallelize_networks(self, nets: list[torch.nn.Module]) -> None:
        """Shards ``nets`` over the strategy's mesh (each once: ``configure_model`` runs at every stage)."""
        mesh = self._device_mesh
        if not nets or is_parallelized(nets[0]):
            return
        if getattr(nets[0], "trunk", None) is None:  # the VAE
            raise ValueError(f"{type(self).__name__} has no trunk to shard; valid strategies for it: auto, ddp")
        for net in nets:
            parallelize(net, mesh, self.parallel_cfg, self.sequence_length)

    def configure_gradient_clipping(
        self, optimizer, gradient_clip_val: float | None = None, gradient_clip_algorithm: str | None = None
    ) -> None:
        # Under ModelParallelStrategy parameters live on several meshes (tensor parallelism) or beside them (what
        # FSDP2 leaves whole), which torch's clip_grad_norm_ cannot stack: the same norm, computed per mesh
        # (experiments.parallel.clip). Every other strategy gets Lightning's own clipping.
        if self._device_mesh is None or not gradient_clip_val or gradient_clip_algorithm == "value":
            return super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)
        clip_grad_norm(self.net.parameters(), gradient_clip_val)

    def on_after_backward(self) -> None:
        # Tensor parallelism: the gradients each rank took from its share of the sequence, summed; expert
        # parallelism: the experts' gradients averaged. After the backward of the micro-batch the optimizer steps
        # after, so every callback's on_before_optimizer_step (Diagnostics' gradient norms: Lightning calls the
        # callbacks' hook before the module's) and clipping see the whole gradients.
        if self._device_mesh is not None and not self.trainer.fit_loop.epoch_loop._should_accumulate():
            sync_grads(self.net, self._device_mesh)

    def on_train_batch_start(self, batch, batch_idx: int) -> None:
        """Gradient accumulation under FSDP2: Lightning's ``no_sync`` covers DDP only, so FSDP2 would reduce-scatter
        after every micro-batch. Its gradient sync is turned off for the micro-batches that only accumulate and on
        for the one the optimizer steps after (Lightning's own decision, made before this hook)."""
        net = getattr(self, "net", None)
        if self._device_mesh is None or not isinstance(net, FSDPModule):
            return
        net.set_requires_gradient_sync(not self.trainer.fit_loop.epoch_loop._should_accumulate())

    @property
    def scheme(self) -> str:
        return self.trunk_cfg.norm_scheme

    def configure_optimizers(self) -> dict:
        total = int(self.trainer.estimated_stepping_batches)
        epochs = self.trainer.max_epochs if self.trainer.max_epochs and self.trainer.max_epochs > 0 else 1
        return build_optimizer(self.net, self.optim_cfg, total, total / epochs)

    def setup(self, stage: str) -> None:
        # An EMA copy (timm ModelEmaV3, a submodule so it is checkpointed) is updated by hand, never by autograd:
        # frozen before the strategy wraps the module, or DDP waits for gradients that never come.
        ema = getattr(self, "ema", None)
        if isinstance(ema, torch.nn.Module):
            ema.requires_grad_(False)

    def hparams_columns(self) -> dict[str, Any]:
        """The short HPARAMS set TensorBoard shows per run: what a comparison varies, the scheme first.

        TensorBoard orders the columns by name, so every name after ``norm_scheme`` sorts after it; the full
        hyperparameters stay in the run's ``hparams.yaml`` and ``config.yaml``.
        """
        trunk, optim = self.trunk_cfg, self.optim_cfg
        seed = os.environ.get("PL_GLOBAL_SEED")  # what seed_everything set (display only)
        return {
            "norm_scheme": trunk.norm_scheme,
            "optim/lr": optim.lr,
            "optim/warmup_steps": optim.warmup_steps,
            "seed": int(seed) if seed is not None else -1,
            "trunk/depth": trunk.depth,
            "trunk/dim": trunk.dim,
        }

    def shown_hparams_columns(self) -> dict[str, Any]:
        """:meth:`hparams_columns`, cut to ``--hparams_columns`` when given (set as ``hparams_shown`` by the CLI;
        a sweep names the axes its grid varies), the scheme always first; after a ``--resume_with_changes``
        resume, a ``changed_on_resume`` column lists the changes (old -> new), as the run's config.yaml does."""
        columns = self.hparams_columns()
        shown = getattr(self, "hparams_shown", None)
        if shown:
            columns = {name: value for name, value in columns.items() if name == "norm_scheme" or name in shown}
        changed = getattr(self, "changed_on_resume", None)  # set by the CLI after a --resume_with_changes resume
        return {**columns, "changed_on_resume": "; ".join(changed)} if changed else columns

    def hparams_metrics(self) -> list[str]:
        """Metric columns of the HPARAMS tab: the key metric, its test counterpart, ``test/loss``, ``test_metrics``."""
        names = [self.key_metric, self.key_metric.replace("val/", "test/", 1), "test/loss", *self.test_metrics]
        return list(dict.fromkeys(names))

    def output_paths(self, stage: str, run_dir: Path) -> list[Path]:
        """Files or directories ``stage`` writes besides the run directory's events, checkpoints and configs.

        The CLI refuses to start when one of them already exists (unless ``--overwrite``), so nothing is
        replaced unasked; a task that writes such files (samples, an exported network) lists them here.
        """
        return []

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Outside ``fit`` (validate, test), metrics are logged at the step the checkpoint was saved at, so they sit
        at the end of the run's training curves in TensorBoard instead of at step 0.

        Lightning restores its loops (and so the logging step) only for ``fit``; the logging step is the fit loop's
        count of optimizer-stepped batches, read back here from the checkpoint's own record of it.
        """
        trainer = self._trainer
        if trainer is None or trainer.state.fn == TrainerFn.FITTING:
            return
        loops = checkpoint.get("loops") or {}
        stepped = ((loops.get("fit_loop") or {}).get("epoch_loop.state_dict") or {}).get("_batches_that_stepped")
        if isinstance(stepped, int) and stepped >= 0:
            trainer.fit_loop.epoch_loop._batches_that_stepped = stepped

    def on_fit_start(self) -> None:
        # The HPARAMS row: the short column set, with the metrics declared as columns (values: their scalars).
        for logger in self.loggers:
            if isinstance(logger, TensorBoardLogger):
                declare_hparams(logger, self.shown_hparams_columns(), self.hparams_metrics())

    def training_step(self, batch, batch_idx: int):
        return self.model_step(batch, "train")

    def validation_step(self, batch, batch_idx: int):
        return self.model_step(batch, "val")

    def test_step(self, batch, batch_idx: int):
        return self.model_step(batch, "test")

    def model_step(self, batch, split: str):
        raise NotImplementedError
