"""Causal language modeling: cross-entropy, perplexity, MoE auxiliary loss, text generation."""

# Annotations are evaluated (no ``from __future__ import annotations``): jsonargparse checks the
# ``Annotated`` bounds while parsing only then.

from typing import Annotated

import torch
import torch.nn.functional as F
from annotated_types import Ge
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch import Tensor
from torchmetrics import MeanMetric
from torchmetrics.text import Perplexity

from experiments.evaluation.downstream import DownstreamConfig, evaluate_at_test
from experiments.reliability.checkpointing import stop_requested
from experiments.tasks.base import TaskModule
from experiments.tasks.optim import OptimConfig
from models import LanguageModel, TrunkConfig
from models.loaders.suite_export import load_suite_export


class LanguageModeling(TaskModule):
    """Next-token prediction over the shared trunk (dense or MoE).

    Args:
        trunk: trunk shape and norm scheme.
        optim: optimizer and schedule.
        vocab_size: linked from the DataModule's tokenizer.
        seq_len: linked from the DataModule; RoPE tables cover it.
        tie_embeddings: share input and output embeddings.
        moe_aux_weight: weight of the load-balancing loss (MoE trunks only).
        max_new_tokens: tokens generated per prompt by ``predict``.
        temperature: sampling temperature for ``predict`` (0 is greedy).
        top_k: sample only from the k most likely tokens.
        downstream: OLMo's downstream tasks scored at the end of ``test`` (``configs/lm/downstream.yaml``).
        init_from: a folder written by ``python -m experiments export`` to start ``fit`` from (fine-tuning): its
            weights replace the fresh init (a resumed fit then restores its checkpoint over them; ``test`` and
            ``predict`` never read it); its trunk must be this one (dropouts and recomputation may differ).
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
        max_new_tokens: Annotated[int, Ge(1)] = 200,
        temperature: Annotated[float, Ge(0)] = 0.8,
        top_k: Annotated[int, Ge(1)] | None = 40,
        downstream: DownstreamConfig | None = None,
        init_from: str | None = None,
    ) -> None:
        super().__init__(trunk, optim)
        self.save_hyperparameters()
        self.net = LanguageModel(trunk, vocab_size, max_seq_len=seq_len, tie_embeddings=tie_embeddings)
        self.moe_aux_weight = moe_aux_weight if trunk.moe_experts else 0.0
        self.losses = torch.nn.ModuleDict({s: MeanMetric() for s in ("val", "test")})
        self.ppl = torch.nn.ModuleDict({s: Perplexity() for s in ("val", "test")})
        self.downstream = downstream

    def setup(self, stage: str) -> None:
        super().setup(stage)
        if stage == "fit" and self.hparams.init_from is not None:
            load_suite_export(self.net, self.hparams.init_from)

    def forward(self, idx: Tensor) -> Tensor:
        return self.net(idx)

    def model_step(self, batch: Tensor, split: str) -> Tensor:
        inputs, targets = batch[:, :-1], batch[:, 1:]  # (B, N) each
        logits, aux = self.net(inputs, return_aux=True)  # (B, N, V)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
        if split == "train":
            self.log("train/loss", loss, prog_bar=True)
            if self.moe_aux_weight:
                self.log("train/moe_aux", aux)
            return loss + self.moe_aux_weight * aux
        self.losses[split].update(loss, weight=targets.numel())
        self.ppl[split].update(logits.float(), targets)
        self.log(f"{split}/loss", self.losses[split], prog_bar=True)
        self.log(f"{split}/ppl", self.ppl[split], prog_bar=split == "val")
        return loss

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
