"""Causal language modeling: cross-entropy, perplexity, MoE router losses and routing statistics, text generation.

The training loss is OLMo's / OLMoE's::

    loss = CE + moe_aux_weight * moe_aux + moe_z_weight * moe_z + z_loss_weight * z_loss

``moe_aux`` and ``moe_z`` are means over the MoE layers, as Megablocks / OLMoE normalize them (their
``batched_load_balancing_loss`` divides by ``num_layers``), so a weight means the same at any depth; ``z_loss`` is
OLMo's logit z-loss, ``mean_t logsumexp(logits_t)^2`` (allenai/OLMo ``olmo/train.py`` ``cross_entropy_loss``,
lines 125-145 at 59a53e3), computed and logged only when its weight is above 0.

An MoE trunk logs what its router did, from the same forward (no extra pass), under ``<split>/moe_*``:

    moe_aux         the load-balancing loss, mean over the MoE layers (1 for a uniform router)
    moe_z           the router z-loss ``mean_t logsumexp(router logits)^2``, mean over the MoE layers
    moe_entropy     expert-usage entropy over ln E, mean over layers (1 = every expert equally used)
    moe_load_max    the busiest expert's share of assignments x E, mean over layers (1 = balanced)
    moe_load_min    the idlest expert's share x E, mean over layers (0 = some expert got no token)
    moe_load_ratio  busiest / idlest expert's assignment count (an idle expert counts as one), mean over layers

``train/`` every step; ``val/`` and ``test/`` as means over the split's batches, so the last validation's
values reach ``summary.json`` (``final_val``) and the sweep's comparison. The router is dropless (no expert
capacity): no token is dropped, and ``summary.json`` says so under ``moe`` rather than logging a zero.
Per-layer values: :class:`experiments.monitoring.diagnostics.Diagnostics` (``diag/moe/...``).
"""

# Annotations are evaluated (no ``from __future__ import annotations``): jsonargparse checks the
# ``Annotated`` bounds while parsing only then.

from typing import Annotated

import torch
import torch.nn.functional as F
from annotated_types import Ge
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch import Tensor
from torchmetrics import MeanMetric

from experiments.evaluation.downstream import DownstreamConfig, evaluate_at_test
from experiments.parallel import ParallelConfig
from experiments.reliability.checkpointing import stop_requested
from experiments.tasks.base import TaskModule
from experiments.tasks.optim import OptimConfig
from models import LanguageModel, TrunkConfig
from models.layers import Routing, expert_usage
from models.loaders.suite_export import load_suite_export

ROUTER_LOSSES = ("moe_aux", "moe_z")
USAGE_STATS = ("moe_entropy", "moe_load_max", "moe_load_min", "moe_load_ratio")
ROUTING_STATS = ROUTER_LOSSES + USAGE_STATS


def logit_z_loss(logits: Tensor) -> Tensor:
    """OLMo's logit z-loss ``mean over tokens of logsumexp_v(logits)^2`` (float32), from ``(..., V)`` logits:
    allenai/OLMo ``olmo/train.py`` ``cross_entropy_loss`` (lines 125-145 at 59a53e3), every token a target."""
    return torch.logsumexp(logits.float(), dim=-1).square().mean()


class PerplexityFromLoss(MeanMetric):
    """Perplexity as ``exp`` of the token-weighted mean cross-entropy (update with each batch's mean loss and its
    token count). The same number as torchmetrics' ``Perplexity`` without its second full-vocabulary softmax (13
    GB of logits at the 1.3B shape), and finite where a target's probability underflows to zero in a softmax
    (its log-softmax does not)."""

    def compute(self) -> Tensor:
        return super().compute().exp()


class LanguageModeling(TaskModule):
    """Next-token prediction over the shared trunk (dense or MoE).

    Args:
        trunk: trunk shape and norm scheme.
        optim: optimizer and schedule.
        vocab_size: linked from the DataModule's tokenizer.
        seq_len: linked from the DataModule; RoPE tables cover it.
        tie_embeddings: share input and output embeddings.
        moe_aux_weight: weight of the load-balancing loss, a mean over the MoE layers (MoE trunks only; OLMoE's
            ``moe_loss_weight`` 0.01).
        moe_z_weight: weight of the router z-loss, a mean over the MoE layers and tokens (MoE trunks only; 0: off).
        z_loss_weight: weight of OLMo's logit z-loss ``mean_t logsumexp(logits_t)^2`` (0: off; OLMo's
            ``softmax_auxiliary_loss`` with ``auxiliary_loss_multiplier`` 1e-4 when on).
        max_new_tokens: tokens generated per prompt by ``predict``.
        temperature: sampling temperature for ``predict`` (0 is greedy).
        top_k: sample only from the k most likely tokens.
        downstream: OLMo's downstream tasks scored at the end of ``test`` (``configs/lm/downstream.yaml``).
        init_from: a folder written by ``python -m experiments export`` to start ``fit`` from (fine-tuning): its
            weights replace the fresh init (a resumed fit then restores its checkpoint over them; ``test`` and
            ``predict`` never read it); its trunk must be this one (dropouts and recomputation may differ).
        parallel: FSDP2 settings under ``ModelParallelStrategy`` (``configs/trainer/fsdp2.yaml``).
        meta_init: build the network's large tensors on the meta device and give each rank only its own shards'
            values once the strategy has laid out the mesh (``configure_model``; experiments/parallel/meta_init.py):
            no rank ever holds the whole network. The values are the same bits as with false.
    """

    task = "lm"
    key_metric = "val/ppl"

    def __init__(
        self,
        trunk: TrunkConfig,
        optim: OptimConfig,
        vocab_size: Annotated[int, Ge(1)] = 256,
        seq_len: Annotated[int, Ge(1)] = 128,
        tie_embeddings: bool = False,
        moe_aux_weight: Annotated[float, Ge(0)] = 0.01,
        moe_z_weight: Annotated[float, Ge(0)] = 0.0,
        z_loss_weight: Annotated[float, Ge(0)] = 0.0,
        max_new_tokens: Annotated[int, Ge(1)] = 200,
        temperature: Annotated[float, Ge(0)] = 0.8,
        top_k: Annotated[int, Ge(1)] | None = 40,
        downstream: DownstreamConfig | None = None,
        init_from: str | None = None,
        parallel: ParallelConfig | None = None,
        meta_init: bool = False,
    ) -> None:
        super().__init__(trunk, optim, parallel, meta_init)
        if meta_init and init_from is not None:  # the export is read into the whole network, before any sharding
            raise ValueError(
                f"model.init_args.meta_init=true with init_from={init_from!r}: the exported weights replace the "
                "fresh init in the whole network; valid: meta_init false to start from an export"
            )
        self.save_hyperparameters()
        with self.building():
            self.net = LanguageModel(trunk, vocab_size, max_seq_len=seq_len, tie_embeddings=tie_embeddings)
        self.moe_aux_weight = moe_aux_weight if trunk.moe_experts else 0.0
        self.moe_z_weight = moe_z_weight if trunk.moe_experts else 0.0
        self.z_loss_weight = z_loss_weight
        self.losses = torch.nn.ModuleDict({s: MeanMetric() for s in ("val", "test")})
        # MoE routing statistics of val / test, averaged over the split's batches (synced under DDP)
        names = ROUTING_STATS if trunk.moe_experts else ()
        self.routing = torch.nn.ModuleDict({f"{s}_{n}": MeanMetric() for s in ("val", "test") for n in names})
        self.ppl = torch.nn.ModuleDict({s: PerplexityFromLoss() for s in ("val", "test")})
        self.downstream = downstream

    def setup(self, stage: str) -> None:
        super().setup(stage)
        if stage == "fit" and self.hparams.init_from is not None:
            load_suite_export(self.net, self.hparams.init_from)

    @property
    def sequence_length(self) -> int:
        return self.hparams.seq_len

    @property
    def routing_record(self) -> dict | None:
        """How the MoE routes (``summary.json``'s ``moe``): experts, top-k, capacity; None for a dense trunk."""
        trunk = self.trunk_cfg
        if not trunk.moe_experts:
            return None
        return {
            "experts": trunk.moe_experts,
            "top_k": trunk.moe_top_k,
            "expert_hidden": trunk.moe_hidden or trunk.hidden,
            "aux_weight": self.moe_aux_weight,
            "aux_normalization": "mean over the MoE layers (Megablocks / OLMoE)",
            "router_z_weight": self.moe_z_weight,
            "capacity": None,
            "dropped_tokens": "none: the router is dropless (no expert capacity); every token reaches its k experts",
        }

    def forward(self, idx: Tensor) -> Tensor:
        return self.net(idx)

    def model_step(self, batch: Tensor, split: str) -> Tensor:
        inputs, targets = batch[:, :-1], batch[:, 1:]  # (B, N) each
        logits, routing = self.net(inputs, return_aux=True)  # (B, N, V)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
        if self.trunk_cfg.moe_experts:
            self.log_routing(split, routing, targets.numel())
        if split == "train":
            self.log("train/loss", self.step_mean(loss, self.global_step), prog_bar=True, sync_dist=True)  # step mean
            total = loss + self.moe_aux_weight * routing.mean_loss + self.moe_z_weight * routing.mean_z
            if self.z_loss_weight > 0:
                z_loss = logit_z_loss(logits)
                self.log("train/z_loss", z_loss.detach())
                total = total + self.z_loss_weight * z_loss
            return total
        self.losses[split].update(loss, weight=targets.numel())
        self.ppl[split].update(loss, weight=targets.numel())
        self.log(f"{split}/loss", self.losses[split], prog_bar=True)
        self.log(f"{split}/ppl", self.ppl[split], prog_bar=split == "val")
        return loss

    def log_routing(self, split: str, routing: Routing, tokens: int) -> None:
        """``<split>/moe_*`` from this step's routing: per step in training, batch means in val / test."""
        usage = expert_usage(routing.load)  # per layer, (L,)
        values = {"moe_aux": routing.mean_loss.detach(), "moe_z": routing.mean_z.detach()}
        values.update({name: getattr(usage, name.removeprefix("moe_")).mean() for name in USAGE_STATS})
        for name, value in values.items():
            if split == "train":
                self.log(f"train/{name}", value)
            else:
                metric = self.routing[f"{split}_{name}"]
                metric.update(value, weight=tokens)
                self.log(f"{split}/{name}", metric)

    def on_test_epoch_end(self) -> None:
        if self.downstream is not None:
            evaluate_at_test(self, self.downstream)

    def predict_step(self, batch: Tensor, batch_idx: int) -> list[str]:
        """Continues each prompt (token ids ``(1, N)`` from the DataModule); prints and returns the text."""
        hp, trainer = self.hparams, self._trainer
        stop = lambda: stop_requested(trainer)  # noqa: E731 - SIGTERM / Ctrl-C, checked between tokens
        out = self.net.generate(batch, hp.max_new_tokens, hp.temperature, hp.top_k, should_stop=stop)
        if stop():
            raise SIGTERMException  # no half-generated sample is printed
        tokenizer = self.trainer.datamodule.tokenizer
        texts = [tokenizer.decode(row.tolist()) for row in out]
        for prompt, text in zip(batch, texts, strict=True):
            head = tokenizer.decode(prompt.tolist())
            print(f"--- sample {batch_idx}\n[{head}]{text[len(head) :]}", flush=True)
        return texts
