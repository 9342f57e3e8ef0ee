"""Image classification with the DeiT recipe: Mixup/CutMix, label smoothing, drop-path, EMA, top-1/top-5."""

# Annotations are evaluated (no ``from __future__ import annotations``): jsonargparse checks the
# ``Annotated`` bounds while parsing only then.

from typing import Annotated

import torch
import torch.nn.functional as F
from annotated_types import Ge, Interval
from timm.data import Mixup
from timm.loss import SoftTargetCrossEntropy
from torch import Tensor
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy

from experiments.parallel import ParallelConfig
from experiments.tasks.base import TaskModule
from experiments.tasks.optim import OptimConfig
from models import TrunkConfig, ViTClassifier


class ImageClassification(TaskModule):
    """ViT classifier over the shared trunk, trained with timm's DeiT pieces.

    Args:
        trunk: trunk shape and norm scheme (``drop_path`` is DeiT's stochastic depth).
        optim: optimizer and schedule (DeiT: lr 5e-4 x batch / 512, wd 0.05, 5 warmup epochs).
        num_classes: linked from the DataModule.
        img_size: linked from the DataModule.
        patch_size: ViT patch side.
        drop_rate: dropout before the head.
        mixup_alpha: Mixup alpha (0 disables).
        cutmix_alpha: CutMix alpha (0 disables).
        mixup_switch_prob: chance of CutMix instead of Mixup when both are on.
        label_smoothing: smoothing of the (mixed) targets.
        ema_decay: keep an EMA of the weights and evaluate it (None disables; DeiT: 0.99996).
        parallel: FSDP2 settings under ``ModelParallelStrategy`` (``configs/trainer/fsdp2.yaml``).
        meta_init: build the network's large tensors on the meta device and give each rank only its own shards'
            values once the strategy has laid out the mesh (``configure_model``; experiments/parallel/meta_init.py):
            no rank ever holds the whole network. The values are the same bits as with false.
    """

    task = "vit"
    key_metric = "val/acc1"
    test_metrics = ("test/acc5",)

    def __init__(
        self,
        trunk: TrunkConfig,
        optim: OptimConfig,
        num_classes: Annotated[int, Ge(1)] = 1000,
        img_size: Annotated[int, Ge(1)] = 224,
        patch_size: Annotated[int, Ge(1)] = 16,
        drop_rate: Annotated[float, Interval(ge=0, lt=1)] = 0.0,
        mixup_alpha: Annotated[float, Ge(0)] = 0.8,
        cutmix_alpha: Annotated[float, Ge(0)] = 1.0,
        mixup_switch_prob: Annotated[float, Interval(ge=0, le=1)] = 0.5,
        label_smoothing: Annotated[float, Interval(ge=0, lt=1)] = 0.1,
        ema_decay: Annotated[float, Interval(gt=0, lt=1)] | None = None,
        parallel: ParallelConfig | None = None,
        meta_init: bool = False,
    ) -> None:
        super().__init__(trunk, optim, parallel, meta_init)
        self.save_hyperparameters()
        with self.building():
            self.net = ViTClassifier(trunk, img_size, patch_size, 3, num_classes, drop_rate)
        self.mixup = (
            Mixup(
                mixup_alpha,
                cutmix_alpha,
                switch_prob=mixup_switch_prob,
                label_smoothing=label_smoothing,
                num_classes=num_classes,
            )  # fmt: skip
            if mixup_alpha > 0 or cutmix_alpha > 0
            else None
        )
        self.soft_ce = SoftTargetCrossEntropy()
        self.label_smoothing = label_smoothing
        self.ema = self.ema_of(self.net, decay=ema_decay) if ema_decay else None
        splits = ("val", "test")
        self.losses = torch.nn.ModuleDict({s: MeanMetric() for s in splits})
        self.acc1 = torch.nn.ModuleDict({s: MulticlassAccuracy(num_classes, top_k=1, average="micro") for s in splits})
        self.acc5 = torch.nn.ModuleDict(
            {s: MulticlassAccuracy(num_classes, top_k=min(5, num_classes), average="micro") for s in splits}
        )

    @property
    def sequence_length(self) -> int:
        return self.net.patch_embed.num_patches + 1  # + the class token

    def forward(self, images: Tensor) -> Tensor:
        return self.net(images)

    def _eval_net(self) -> torch.nn.Module:
        return self.ema.module if self.ema is not None else self.net

    def model_step(self, batch: tuple[Tensor, Tensor], split: str) -> Tensor:
        images, labels = batch
        if split == "train":
            if self.mixup is not None and len(images) % 2 == 0:  # timm's Mixup pairs samples
                images, soft = self.mixup(images, labels)
                loss = self.soft_ce(self.net(images), soft)
            else:
                loss = F.cross_entropy(self.net(images), labels, label_smoothing=self.label_smoothing)
            self.log("train/loss", self.step_mean(loss, self.global_step), prog_bar=True, sync_dist=True)  # step mean
            return loss
        logits = self._eval_net()(images)
        loss = F.cross_entropy(logits, labels)
        self.losses[split].update(loss, weight=len(labels))
        self.acc1[split].update(logits, labels)
        self.acc5[split].update(logits, labels)
        self.log(f"{split}/loss", self.losses[split])
        self.log(f"{split}/acc1", self.acc1[split], prog_bar=True)
        self.log(f"{split}/acc5", self.acc5[split])
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        if self.ema is not None:
            self.ema.update(self.net, step=self.global_step)

    def predict_step(self, batch, batch_idx: int) -> Tensor:
        """Class probabilities ``(B, num_classes)``."""
        images = batch[0] if isinstance(batch, list | tuple) else batch
        return self._eval_net()(images).softmax(dim=-1)
