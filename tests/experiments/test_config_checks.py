"""Every bounded config field is checked while parsing, with the field, the value, its origin and the valid range.

The bounds are ``Annotated[int, Ge(1)]``-style declarations in the task, data and callback signatures (and
their config dataclasses); the cases below are discovered from those signatures, so a field that gains
a bound is tested without editing this file, and ``EXPECTED`` keeps the known ones from losing theirs.
"""

from __future__ import annotations

import dataclasses
import inspect
import types
import typing
from pathlib import Path

import pytest
from annotated_types import Ge, Gt, Interval, Le, Lt

from experiments.cli import SuiteCLI
from experiments.reliability.config_files import _hints, bound_text
from experiments.reliability.errors import SuiteError

ROOT = Path(__file__).resolve().parents[2]

# (section, class path, base config): every class the shipped configs reach.
CLASSES = [
    ("model", "experiments.tasks.LanguageModeling", "configs/lm/tiny.yaml"),
    ("model", "experiments.tasks.ImageClassification", "configs/vit/tiny.yaml"),
    ("model", "experiments.tasks.LatentDiffusion", "configs/dit/tiny.yaml"),
    ("model", "experiments.tasks.AutoencoderTraining", "configs/vae/tiny.yaml"),
    ("data", "datamodules.text.TextDataModule", "configs/lm/tiny.yaml"),
    ("data", "datamodules.images.EmbeddedImageDataModule", "configs/vit/tiny.yaml"),
    ("data", "datamodules.images.folder.ImageFolderDataModule", "configs/vit/deit-tiny.yaml"),
    ("data", "datamodules.latents.LatentDataModule", "configs/dit/tiny.yaml"),
    ("divergence", "experiments.monitoring.divergence.DivergenceDetector", "configs/lm/tiny.yaml"),
    ("summary", "experiments.monitoring.summary.RunSummary", "configs/lm/tiny.yaml"),
]
# Fields that must stay bounded (a subset: new bounds are picked up on their own).
EXPECTED = {
    "model.init_args.temperature", "model.init_args.top_k", "model.init_args.max_new_tokens",
    "model.init_args.optim.lr", "model.init_args.optim.betas", "model.init_args.optim.eps",
    "model.init_args.optim.warmup_steps", "model.init_args.optim.min_lr_ratio", "model.init_args.drop_rate",
    "model.init_args.label_smoothing", "model.init_args.ema_decay", "model.init_args.patch_size",
    "data.init_args.batch_size", "data.init_args.seq_len", "data.init_args.val_fraction", "data.init_args.num_workers",
    "data.init_args.image_size", "data.init_args.re_prob", "divergence.window", "divergence.spike_factor",
}  # fmt: skip
LINKED = {"vocab_size", "seq_len", "num_classes", "img_size", "latent_size", "latent_channels"}  # set by the data


def _import(class_path: str):
    module, _, name = class_path.rpartition(".")
    return getattr(__import__(module, fromlist=[name]), name)


def bounded_fields() -> list[tuple[str, str, str, typing.Any]]:
    """(base config, option key, owner, annotation) for every bounded parameter the CLI parses."""
    cases, seen = [], set()
    for section, class_path, config in CLASSES:
        prefix = f"{section}.init_args" if section in ("model", "data") else section
        for name, annotation in _hints(_import(class_path)).items():
            if section == "model" and name in LINKED:
                continue  # linked from the data module: not an option
            if bound_text(annotation):
                cases.append((config, f"{prefix}.{name}", class_path, annotation))
            for nested in (annotation, *typing.get_args(annotation)):
                if inspect.isclass(nested) and dataclasses.is_dataclass(nested) and nested not in seen:
                    seen.add(nested)  # trunk / optim dataclasses are shared by the tasks: tested once
                    cases += [
                        (config, f"{prefix}.{name}.{field}", nested.__name__, field_type)
                        for field, field_type in _hints(nested).items()
                        if bound_text(field_type)
                    ]
    return cases


def out_of_range(annotation: typing.Any) -> str:
    """A value just outside the declared bound, as the command line would give it."""
    if typing.get_origin(annotation) is tuple:
        bad = out_of_range(typing.get_args(annotation)[0])
        return f"[{bad},{bad}]"
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
    for meta in annotation.__metadata__:
        if isinstance(meta, Interval):
            if meta.ge is not None:
                return str(meta.ge - 1)
            if meta.gt is not None:
                return str(meta.gt)
            return str(meta.le + 1) if meta.le is not None else str(meta.lt)
        for kind, shift in ((Ge, -1), (Gt, 0), (Le, 1), (Lt, 0)):
            if isinstance(meta, kind):
                return str(next(iter(dataclasses.astuple(meta))) + shift)
    raise AssertionError(f"no bound in {annotation}")


class ParseOnlyCLI(SuiteCLI):
    def instantiate_classes(self) -> None:
        pass


@pytest.fixture(scope="module")
def parsers() -> dict[str, SuiteCLI]:
    """One real SuiteCLI per base config; each case re-runs its argument parsing (building parsers is slow)."""
    return {cfg: ParseOnlyCLI(args=["-c", str(ROOT / cfg)], run=False) for cfg in sorted({c for _, _, c in CLASSES})}


def parse(cli: SuiteCLI, args: list[str]) -> None:
    cli.parse_arguments(cli.parser, args)


CASES = bounded_fields()


def test_the_known_bounded_fields_are_all_declared():
    assert not EXPECTED - {key for _, key, _, _ in CASES}


@pytest.mark.parametrize(("config", "key", "owner", "annotation"), CASES, ids=[c[1] for c in CASES])
def test_an_out_of_range_value_is_one_line_naming_field_origin_and_range(config, key, owner, annotation, parsers):
    bad = out_of_range(annotation)
    with pytest.raises(SuiteError) as err:
        parse(parsers[config], ["-c", str(ROOT / config), f"--{key}={bad}"])
    line = str(err.value)
    assert line.startswith(f"{key}=") and "(command line); valid: " in line, line
    assert line.endswith(bound_text(annotation)), line
    assert "\n" not in line


def test_a_bad_value_in_a_config_file_names_that_file(parsers, tmp_path: Path):
    overlay = tmp_path / "sampling.yaml"
    overlay.write_text("model:\n  init_args:\n    top_k: 0\n")
    later = tmp_path / "later.yaml"
    later.write_text("trainer:\n  max_steps: 5\n")
    with pytest.raises(SuiteError) as err:
        parse(parsers["configs/lm/tiny.yaml"], ["-c", str(ROOT / "configs/lm/tiny.yaml"), "-c", str(overlay),
                                                "-c", str(later)])  # fmt: skip
    assert str(err.value) == f"model.init_args.top_k=0 ({overlay}); valid: >= 1 or null"


def test_values_on_the_bound_are_accepted(parsers):
    cli = parsers["configs/lm/tiny.yaml"]
    parse(cli, ["-c", str(ROOT / "configs/lm/tiny.yaml"), "--model.init_args.temperature=0",
                "--model.init_args.top_k=1", "--model.init_args.top_k=null", "--model.init_args.optim.warmup_steps=0",
                "--model.init_args.optim.min_lr_ratio=1.0", "--data.init_args.num_workers=0"])  # fmt: skip
    assert cli.config.model.init_args.temperature == 0 and cli.config.model.init_args.top_k is None
