"""Training diagnostics the paper argues with (docs/architecture.md, "Diagnostics"), one callback away::

    python -m experiments fit -c configs/lm/tiny.yaml -c configs/norm/siamese.yaml \\
        --trainer.callbacks+=experiments.monitoring.diagnostics.Diagnostics --trainer.callbacks.every_n_steps=25

Every ``every_n_steps`` optimizer steps, written straight to every logger of the module (so TensorBoard
shows them whatever ``log_every_n_steps`` is), under these stable tags:

    diag/rms/<stream>/block_<b>       RMS of each residual stream after block b
    diag/max_abs/block_<b>            max |state| after block b, over its streams
    diag/max_abs_activation           max over blocks ("massive activations")
    diag/grad_norm/block_<b>          L2 norm of block b's gradients, BEFORE clipping
    diag/grad_norm/global             L2 norm of every optimized gradient, before clipping (what clipping sees)
    diag/scale/<norm>                 mean |weight| of a readout norm (SiameseNorm N_a, N_b, N_o; ResiDual N_d)
    diag/scale/<norm>/sublayer_<s>    mean |weight| of a residual site's norm (SiameseNorm N_X, N_Y, N_in, and
                                      the attention gain g of siamese_hybrid): how much each stream contributes
    diag/alpha/<norm>                 DyT / Derf norms (``norm_layer: dyt`` / ``derf``): the learned alpha of a
    diag/alpha/<norm>/sublayer_<s>    readout norm, and of a residual site's norm (affine or not: adaLN's learn it
                                      too); Derf's learned shift s likewise under ``diag/shift/...``
    diag/saturation/<norm>            DyT / Derf norms: the fraction of the norm's point-wise inputs
    diag/saturation/<norm>/sublayer_<s>  ``z = alpha x (+ s)`` with ``|z| > 2`` on that step's batch (tanh / erf
    diag/saturation/<q_norm|k_norm>/block_<b>  within 4 % / 0.5 % of +-1, slope < 0.07 / 0.02: saturated);
                                      attention's QK-norms per block
    diag/moe/<stat>/block_<b>         MoE trunks: block b's router on that step's batch: ``entropy`` (expert-usage
                                      entropy / ln E), ``load_max`` / ``load_min`` (busiest / idlest expert's
                                      share x E), ``load_ratio`` (their counts' ratio); see models.layers.moe

Streams (:func:`stream_dict`): ``x`` for one stream (Pre-, Post-, Peri-Norm, DeepNorm, Mix-LN, HybridNorm,
LayerNorm Scaling, the reordered norm, Keel; Attention Residuals: the latest block's sum of outputs),
``post``/``pre`` (SiameseNorm), ``post``/``delta`` (ResiDual),
``h0``/``h1`` (Hyper-Connections), ``h0`` .. ``h{n-1}`` (mHC's n streams).

Lightning 2.6 calls ``on_before_optimizer_step`` after backward (and after AMP unscaling) and only then
runs ``configure_gradient_clipping`` (``Precision._after_closure``), so gradients read there are the
unclipped ones.

On several processes every tag describes the whole global batch, as one process running it would: the hooks
keep sums (of squares, of saturated inputs, of expert assignments) with their counts and maxima of this rank's
part (a tensor-parallel rank's sequence shard, a data-parallel rank's micro-batch), and the logging step reduces
them over every rank (one all-reduce of the sums, one of the maxima) before dividing. Gradient norms and norm
scales are read from the parameters, which FSDP2 / DDP already make whole (DTensor norms, all-reduced
gradients).
"""

from __future__ import annotations

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from experiments.parallel.clip import grad_norm
from models.layers import Routing, expert_usage
from models.norms import POINTWISE, Derf
from models.schemes import DepthSources, State
from models.trunk import Trunk

#: ``|alpha x (+ s)|`` above which a point-wise norm's input counts as saturated (``diag/saturation``).
SATURATION_Z = 2.0


def stream_dict(state: State) -> dict[str, Tensor]:
    """Names each residual stream of a trunk state: ``{"x": ...}``, ``{"post", "pre"}``, ``{"h0", "h1"}`` ..."""
    if isinstance(state, DepthSources):  # Attention Residuals: the latest block's sum of sublayer outputs
        return {"x": state.partial}
    if isinstance(state, tuple):  # TwoStream / DualStream NamedTuples
        return dict(state._asdict())
    if state.ndim == 4:  # Hyper-Connections: (B, N, n, D), the n copies on dim -2
        return {f"h{i}": h for i, h in enumerate(state.unbind(dim=-2))}
    return {"x": state}


def rms(t: Tensor) -> Tensor:
    """Root mean square over every element, in float32."""
    return t.detach().float().pow(2).mean().sqrt()


def local(t: Tensor) -> Tensor:
    """This rank's part of ``t``: a DTensor's local shard (a tensor-parallel rank's sequence shard), else ``t``."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def whole(t: Tensor) -> Tensor:
    """A reduction of a sharded parameter made whole: FSDP2's ``weight.abs().mean()`` is a DTensor whose local value
    is this rank's shard's mean (``float()`` of it reads only that); a plain tensor as it is. A collective."""
    full_tensor = getattr(t, "full_tensor", None)
    return full_tensor() if callable(full_tensor) else t


def sum_and_count(values: Tensor) -> Tensor:
    """``[sum, count]`` of ``values`` in float64: what a mean over several ranks' parts is reduced from."""
    return torch.stack([values.detach().double().sum(), torch.tensor(float(values.numel()), device=values.device)])


def reduced(sums: dict[str, Tensor], maxima: dict[str, Tensor]) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """``sums`` added and ``maxima`` maxed over every process (one all-reduce each, keys in one order on every
    rank); themselves when only one process runs."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return sums, maxima
    out = []
    for values, op in ((sums, dist.ReduceOp.SUM), (maxima, dist.ReduceOp.MAX)):
        keys = sorted(values)
        if not keys:
            out.append({})
            continue
        flat = torch.cat([values[k].reshape(-1).double() for k in keys])
        dist.all_reduce(flat, op=op)
        sizes = [values[k].numel() for k in keys]
        out.append({k: part.reshape(values[k].shape) for k, part in zip(keys, flat.split(sizes), strict=True)})
    return out[0], out[1]


def find_trunk(pl_module: nn.Module) -> Trunk | None:
    """The task's trunk: ``pl_module.net.trunk`` (LM, ViT, DiT), else the first Trunk found."""
    trunk = getattr(getattr(pl_module, "net", None), "trunk", None)
    if isinstance(trunk, Trunk):
        return trunk
    return next((m for m in pl_module.modules() if isinstance(m, Trunk)), None)


def grad_norms(trunk: Trunk, params: list[nn.Parameter]) -> dict[str, Tensor]:
    """L2 norms of the current gradients: per block and over ``params`` (the optimizer's); whole on every rank,
    sharded gradients on several meshes included (tensor parallelism: :func:`experiments.parallel.clip.grad_norm`)."""
    out = {}
    for b, block in enumerate(trunk.blocks):
        if any(p.grad is not None for p in block.parameters()):
            out[f"diag/grad_norm/block_{b}"] = grad_norm(block.parameters())
    if any(p.grad is not None for p in params):
        out["diag/grad_norm/global"] = grad_norm(params)
    return out


def _norm_stats(module: nn.Module) -> dict[str, Tensor]:
    """``{"scale": mean |weight|}`` of an affine norm, and DyT's / Derf's ``{"alpha": alpha}`` (affine or not;
    Derf's ``"shift"`` too)."""
    out = {}
    if isinstance(module, (nn.LayerNorm, nn.RMSNorm, *POINTWISE)) and module.weight is not None:
        out["scale"] = whole(module.weight.abs().mean())
    if isinstance(module, POINTWISE):
        out["alpha"] = whole(module.alpha.detach()).reshape(())
    if isinstance(module, Derf):
        out["shift"] = whole(module.shift.detach()).reshape(())
    return out


def saturated(module: nn.Module, x: Tensor) -> Tensor:
    """Whether each point-wise input ``z = alpha x (+ s)`` of a DyT / Derf ``module`` has ``|z| > 2`` (0 / 1)."""
    z = local(module.alpha.detach()) * local(x.detach())
    if isinstance(module, Derf):
        z = z + local(module.shift.detach())
    return (z.abs() > SATURATION_Z).float()


def saturated_fraction(module: nn.Module, x: Tensor) -> Tensor:
    """The fraction of the point-wise inputs ``z = alpha x (+ s)`` of a DyT / Derf ``module`` with ``|z| > 2``."""
    return saturated(module, x).mean()


def pointwise_norms(trunk: Trunk) -> dict[str, nn.Module]:
    """Every DyT / Derf norm of the trunk under its diagnostics name: ``<name>`` (readout),
    ``<name>/sublayer_<s>`` (a residual site's), ``<q_norm|k_norm|v_norm>/block_<b>`` (attention's)."""
    out = {}
    for name, module in trunk.readout.named_children():
        if isinstance(module, POINTWISE):
            out[name] = module
    for b, block in enumerate(trunk.blocks):
        for s, site in ((2 * b, block.attn_res), (2 * b + 1, block.mlp_res)):
            for name, module in site.named_modules():
                if isinstance(module, POINTWISE):
                    out[f"{name.rsplit('.', 1)[-1]}/sublayer_{s}"] = module
        for name in ("q_norm", "k_norm", "v_norm"):
            module = getattr(block.attn, name, None)
            if isinstance(module, POINTWISE):
                out[f"{name}/block_{b}"] = module
    return out


@torch.no_grad()
def norm_scales(trunk: Trunk) -> dict[str, Tensor]:
    """Mean |weight| of every affine norm of the readout and of each residual site (+ siamese_hybrid's g), and
    every DyT / Derf norm's alpha there (Derf's shift too)."""
    out = {}
    for name, module in trunk.readout.named_children():
        for stat, value in _norm_stats(module).items():
            out[f"diag/{stat}/{name}"] = value
    for b, block in enumerate(trunk.blocks):
        for s, site in ((2 * b, block.attn_res), (2 * b + 1, block.mlp_res)):
            for name, module in site.named_modules():
                for stat, value in _norm_stats(module).items():  # Mix-LN nests its site as ``inner``: the leaf name
                    out[f"diag/{stat}/{name.rsplit('.', 1)[-1]}/sublayer_{s}"] = value
            gain = getattr(site, "gain", None)  # siamese_hybrid: h = g * x + N_Y(y) at attention
            if isinstance(gain, Tensor):
                out[f"diag/scale/gain/sublayer_{s}"] = whole(gain.abs().mean())
    return out


class Diagnostics(Callback):
    """Logs residual-stream RMS, max |activation|, pre-clip gradient norms and norm scales.

    Forward hooks on the trunk's blocks exist only while a logging step's forward runs (attached in
    ``on_train_batch_start``, removed before backward, so activation-checkpoint recomputation is not
    counted); with ``residual_rms``, ``max_activation`` and (on an MoE trunk) ``routing`` off no hook is ever
    registered.

    Args:
        every_n_steps: log every n optimizer steps (step 0 included).
        residual_rms: ``diag/rms/<stream>/block_<b>``.
        grad_norms: ``diag/grad_norm/block_<b>`` and ``diag/grad_norm/global`` (before clipping).
        norm_scales: ``diag/scale/...``: fusion-norm and per-sublayer branch-input norm scales.
        max_activation: ``diag/max_abs/block_<b>`` and ``diag/max_abs_activation``.
        routing: ``diag/moe/<stat>/block_<b>`` of each MoE block (dense trunks log nothing here).
        saturation: ``diag/saturation/...`` of each DyT / Derf norm (trunks without one log nothing here).
    """

    def __init__(
        self,
        every_n_steps: int = 50,
        residual_rms: bool = True,
        grad_norms: bool = True,
        norm_scales: bool = True,
        max_activation: bool = True,
        routing: bool = True,
        saturation: bool = True,
    ) -> None:
        if every_n_steps < 1:
            raise ValueError(f"every_n_steps must be >= 1, got {every_n_steps}")
        self.every_n_steps = every_n_steps
        self.residual_rms, self.grad_norms = residual_rms, grad_norms
        self.norm_scales, self.max_activation, self.routing = norm_scales, max_activation, routing
        self.saturation = saturation
        self.last: dict[str, float] = {}  # the most recently logged values (for tests and notebooks)
        self._handles: list[RemovableHandle] = []
        self._pending: dict[str, Tensor] = {}  # values already whole (gradient norms, norm scales)
        self._sums: dict[str, Tensor] = {}  # this rank's [sum, count] (RMS: of squares; saturation: of 0 / 1)
        self._maxima: dict[str, Tensor] = {}  # this rank's max |state| per block
        self._loads: dict[int, Tensor] = {}  # this rank's expert assignments per MoE block
        self._captured_step: int | None = None
        self._warned = False

    # ----------------------------------------------------------------------------- activations
    def attach(self, trunk: Trunk) -> None:
        """Registers one forward hook per block that records its output state's statistics, and one per DyT / Derf
        norm that records its saturated fraction."""
        self.detach()
        if self.saturation:
            for name, module in pointwise_norms(trunk).items():
                self._handles.append(module.register_forward_hook(self._saturation_hook(name)))
        if not (self.residual_rms or self.max_activation or (self.routing and trunk.cfg.moe_experts)):
            return
        for b, block in enumerate(trunk.blocks):
            self._handles.append(block.register_forward_hook(self._block_hook(b)))

    def _saturation_hook(self, name: str):
        def hook(module: nn.Module, args: tuple, output: Tensor) -> None:
            self._sums[f"diag/saturation/{name}"] = sum_and_count(saturated(module, args[0]))

        return hook

    def detach(self) -> None:
        """Removes the forward hooks."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _block_hook(self, b: int):
        def hook(module: nn.Module, args: tuple, output: tuple[State, Routing | None]) -> None:
            streams = {name: local(t) for name, t in stream_dict(output[0]).items()}  # Block: (state, routing)
            if self.routing and output[1] is not None:
                self._loads[b] = local(output[1].load).detach().double()
            if self.residual_rms:
                for name, t in streams.items():
                    self._sums[f"diag/rms/{name}/block_{b}"] = sum_and_count(t.float().pow(2))
            if self.max_activation:
                self._maxima[f"diag/max_abs/block_{b}"] = torch.stack(
                    [t.detach().abs().max().float() for t in streams.values()]
                ).max()

        return hook

    def captured(self) -> dict[str, float]:
        """The tags of what the hooks and the optimizer step recorded, reduced over every process (a collective
        when several run: every rank calls it at the same step)."""
        sums = {**self._sums, **{f"load/{b}": load for b, load in self._loads.items()}}
        sums, maxima = reduced(sums, self._maxima)  # every rank's part of the global batch (module docstring)
        metrics = {k: float(v) for k, v in self._pending.items()}
        for key, (total, count) in ((k, v) for k, v in sums.items() if not k.startswith("load/")):
            mean = float(total / count.clamp_min(1))
            metrics[key] = mean**0.5 if key.startswith("diag/rms/") else mean
        metrics.update({k: float(v) for k, v in maxima.items()})
        for b in sorted(self._loads):
            for name, value in expert_usage(sums[f"load/{b}"])._asdict().items():
                metrics[f"diag/moe/{name}/block_{b}"] = float(value)
        blocks = [v for k, v in metrics.items() if k.startswith("diag/max_abs/block_")]
        if blocks:
            metrics["diag/max_abs_activation"] = max(blocks)
        return metrics

    # ----------------------------------------------------------------------------- Lightning hooks
    def _due(self, trainer: L.Trainer) -> bool:
        return trainer.global_step % self.every_n_steps == 0

    def _trunk(self, pl_module: L.LightningModule) -> Trunk | None:
        trunk = find_trunk(pl_module)
        if trunk is None and not self._warned:
            rank_zero_warn("Diagnostics: the module has no Trunk (expected at pl_module.net.trunk); nothing logged")
            self._warned = True
        return trunk

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        if not self._due(trainer) or self._captured_step == trainer.global_step:
            return
        trunk = self._trunk(pl_module)
        if trunk is None:
            return
        self._captured_step = trainer.global_step
        self._pending, self._sums, self._maxima, self._loads = {}, {}, {}, {}
        self.attach(trunk)

    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: Tensor) -> None:
        self.detach()

    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        if self._captured_step != trainer.global_step:
            return
        trunk = self._trunk(pl_module)
        if trunk is None:
            return
        if self.grad_norms:
            params = [p for group in optimizer.param_groups for p in group["params"]]
            self._pending.update(grad_norms(trunk, params))
        if self.norm_scales:
            self._pending.update(norm_scales(trunk))

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int
    ) -> None:
        self.detach()
        if self._captured_step is None or trainer.global_step == self._captured_step:
            return  # nothing captured, or gradient accumulation: the optimizer step is still to come
        if not (self._pending or self._sums or self._maxima or self._loads):
            return
        metrics, step = self.captured(), self._captured_step
        self._pending, self._sums, self._maxima, self._loads = {}, {}, {}, {}
        self._captured_step = None
        self.last = metrics
        for logger in pl_module.loggers:
            logger.log_metrics(metrics, step=step)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self.detach()
