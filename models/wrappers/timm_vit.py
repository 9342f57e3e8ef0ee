"""The suite's ViT as timm models: ``SuiteViT`` and one registered entrypoint per norm scheme.

    timm.create_model("suite_vit_siamese", trunk={...}, img_size=32, patch_size=4, num_classes=10)
    timm.create_model("local-dir:EXPORT", pretrained=True)     (after importing this module, or the copy of it
                                                                that an export carries, suite_vit.py)

Importing the module registers ``suite_vit_<scheme>`` for every scheme of :class:`models.schemes.NormScheme`,
each with a ``pretrained_cfg`` (DeiT's ImageNet preprocessing by default; an export's ``config.json`` holds
its run's). The network is :class:`models.vit.ViTClassifier`, unchanged (same parameter names), with what
timm's factory and tools expect on top: ``in_chans``, ``num_features``, ``global_pool``,
``get_classifier`` / ``reset_classifier``. timm's factory records the build arguments (the trunk as a
dict), so ``timm.models.save_for_hf`` writes them into ``config.json`` as ``model_args``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model
from torch import nn

from models.config import TrunkConfig
from models.schemes import NormScheme
from models.vit import ViTClassifier

PREFIX = "suite_vit_"


class SuiteViT(ViTClassifier):
    """:class:`ViTClassifier` built from plain arguments, as timm's factory passes them.

    Args:
        trunk: the suite's ``TrunkConfig`` as a dict (norm scheme included); missing fields take its defaults.
        img_size: input side (an int, or a square ``(H, W)``).
        patch_size: patch side.
        in_chans: input channels.
        num_classes: classifier outputs (0: no head, ``forward`` returns the class-token features).
        drop_rate: dropout before the head.
        global_pool: "token" only: the head reads the class token (timm records and passes it back).
    """

    def __init__(
        self,
        trunk: dict[str, Any] | None = None,
        img_size: int | Sequence[int] = 224,
        patch_size: int = 16,
        in_chans: int = 3,
        num_classes: int = 1000,
        drop_rate: float = 0.0,
        global_pool: str = "token",
    ) -> None:
        if global_pool != "token":
            raise ValueError(f"global_pool={global_pool!r}; the suite's ViT reads the class token ('token')")
        self_pool = global_pool
        if not isinstance(img_size, int):
            if len(img_size) != 2 or img_size[0] != img_size[1]:
                raise ValueError(f"img_size {tuple(img_size)} is not square; the suite's ViT takes square inputs")
            img_size = int(img_size[0])
        super().__init__(TrunkConfig(**(trunk or {})), img_size, patch_size, in_chans, max(num_classes, 1), drop_rate)
        self.in_chans, self.num_features, self.global_pool = in_chans, self.cfg.dim, self_pool
        if num_classes <= 0:
            self.reset_classifier(0)

    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """A fresh head for ``num_classes`` outputs (trunc-normal std 0.02, zero bias), or none for 0."""
        if global_pool not in (None, "token"):
            raise ValueError(f"global_pool={global_pool!r}; the suite's ViT reads the class token ('token')")
        self.num_classes = num_classes
        if num_classes <= 0:
            self.head = nn.Identity()
            return
        self.head = nn.Linear(self.num_features, num_classes)
        nn.init.trunc_normal_(self.head.weight, std=0.02)
        nn.init.zeros_(self.head.bias)


def _cfg(**overrides: Any) -> dict[str, Any]:
    """A ``pretrained_cfg`` without weights: DeiT's ImageNet evaluation preprocessing."""
    return {
        "url": "",
        "num_classes": 1000,
        "input_size": (3, 224, 224),
        "pool_size": None,
        "crop_pct": 0.875,
        "interpolation": "bicubic",
        "fixed_input_size": True,
        "mean": IMAGENET_DEFAULT_MEAN,
        "std": IMAGENET_DEFAULT_STD,
        "first_conv": "patch_embed.proj",
        "classifier": "head",
        **overrides,
    }


# timm's register_model reads a module-level ``default_cfgs`` for each entrypoint's pretrained_cfg.
default_cfgs = generate_default_cfgs({f"{PREFIX}{scheme.value}": _cfg() for scheme in NormScheme})


def _head_filter(name: str, asked: int | None) -> Callable[[dict, nn.Module], dict]:
    """timm's ``pretrained_filter_fn`` for ``name``: the weights' classifier is loaded whenever it fits the model.

    timm drops a checkpoint's head (leaving a random one, with only an INFO log) when the model's class count
    differs from the registered ``pretrained_cfg``'s, which for a weights file (``pretrained_cfg_overlay=
    dict(file=...)``) is this module's default, not the export's. Here the head's own shape decides: it fits
    the model, it loads (the config's count is set to it); it does not and the user asked for another count
    (``num_classes=N``: fine-tuning), timm's fresh head stays; it does not and nobody asked, the load is refused
    with the count to pass, never a silent random head.
    """

    def keep_head(state_dict: dict, model: nn.Module) -> dict:
        head = state_dict.get("head.weight")
        if head is None:
            return state_dict
        rows, classes = int(head.shape[0]), int(getattr(model, "num_classes", 0))
        if rows == classes:
            model.pretrained_cfg["num_classes"] = rows  # the same dict timm compares against: the head loads
        elif asked is None:
            raise ValueError(
                f"{name}: the weights' classifier has {rows} classes but the model was built with {classes} "
                f"(pretrained_cfg's default); pass num_classes={rows} (or num_classes=N for a new head of N classes)"
            )
        return state_dict

    return keep_head


def _entrypoint(scheme: str) -> Callable[..., SuiteViT]:
    """The registered ``suite_vit_<scheme>`` factory: the trunk's ``norm_scheme`` is the entrypoint's."""
    name = f"{PREFIX}{scheme}"

    def create(pretrained: bool = False, **kwargs: Any) -> SuiteViT:
        trunk = dict(kwargs.pop("trunk", None) or {})
        if trunk.setdefault("norm_scheme", scheme) != scheme:
            raise ValueError(f"{name} builds norm_scheme {scheme!r}; its trunk says {trunk['norm_scheme']!r}")
        keep_head = _head_filter(name, asked=kwargs.get("num_classes"))
        return build_model_with_cfg(SuiteViT, name, pretrained, trunk=trunk, pretrained_filter_fn=keep_head, **kwargs)

    create.__name__ = create.__qualname__ = name
    create.__doc__ = f"The suite's ViT under the {scheme!r} norm scheme (``trunk``: a TrunkConfig dict)."
    return register_model(create)


for _scheme in NormScheme:
    _entrypoint(_scheme.value)
