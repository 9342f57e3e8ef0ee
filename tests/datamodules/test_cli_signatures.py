"""Every DataModule argument is typed and plain, so LightningCLI (jsonargparse) can expose it."""

from __future__ import annotations

import inspect
import types
import typing

import pytest
import torch
from jsonargparse import ArgumentParser

from datamodules import EmbeddedImageDataModule, ImageFolderDataModule, TextDataModule

MODULES = [TextDataModule, EmbeddedImageDataModule, ImageFolderDataModule]


PLAIN = (str, int, float, bool, type(None))


def _is_plain(annotation: object) -> bool:
    """str/int/float/bool/None, a Literal or a list of those, or a union of such."""
    if annotation in PLAIN:
        return True
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return all(isinstance(a, PLAIN) for a in args)
    if origin is list:
        return len(args) == 1 and args[0] in PLAIN
    return origin in (typing.Union, types.UnionType) and all(_is_plain(a) for a in args)


@pytest.mark.parametrize("cls", MODULES)
def test_every_init_argument_is_typed_with_a_plain_type(cls: type) -> None:
    hints = typing.get_type_hints(cls.__init__)
    for name, param in inspect.signature(cls.__init__).parameters.items():
        if name == "self":
            continue
        assert name in hints, f"{cls.__name__}.{name} has no type"
        assert _is_plain(hints[name]), f"{cls.__name__}.{name}: {hints[name]} is not a plain type"
        assert param.default is inspect.Parameter.empty or isinstance(param.default, PLAIN)


def test_plain_type_check_can_fail() -> None:
    assert _is_plain(int | None) and _is_plain(typing.Literal["a", "b"])
    assert _is_plain(list[str] | None)
    assert not _is_plain(dict[str, int]) and not _is_plain(list[torch.Tensor]) and not _is_plain(torch.nn.Module | None)


@pytest.mark.parametrize(
    ("cls", "args", "expected"),
    [
        (TextDataModule, ["--data.tokenizer=bpe", "--data.seq_len=64"], {"tokenizer": "bpe", "seq_len": 64}),
        (EmbeddedImageDataModule, ["--data.normalize=half", "--data.limit_train=null"], {"normalize": "half"}),
        (ImageFolderDataModule, ["--data.root=/x", "--data.auto_augment=null"], {"root": "/x", "auto_augment": None}),
    ],
)
def test_jsonargparse_parses_and_checks_the_arguments(cls: type, args: list[str], expected: dict) -> None:
    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(cls, "data")
    parsed = parser.parse_args(args)
    for key, value in expected.items():
        assert parsed.data[key] == value
    if cls is not ImageFolderDataModule:
        assert isinstance(cls(**parsed.data.as_dict()), cls)


def test_literal_choices_are_enforced_by_the_parser() -> None:
    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(TextDataModule, "data")
    with pytest.raises(Exception, match="tokenizer"):
        parser.parse_args(["--data.tokenizer=wordpiece"])
