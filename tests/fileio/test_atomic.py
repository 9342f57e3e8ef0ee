"""fileio.atomic: a folder built beside its target and swapped in whole (the sharded-checkpoint write)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import fileio.atomic as atomic
from fileio import previous_dir, publish_dir, stale_temp_dirs, temp_dir


def build(path: Path, **files: str) -> Path:
    tmp = temp_dir(path, tag="save")
    tmp.mkdir()
    for name, text in files.items():
        (tmp / name).write_text(text)
    return tmp


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "two-renames"])
def test_publish_replaces_the_whole_folder_and_leaves_no_temp(tmp_path: Path, exchange: bool, monkeypatch):
    if not exchange:
        monkeypatch.setattr(atomic, "_exchange", lambda a, b: False)
    target = tmp_path / "last.ckpt"
    publish_dir(build(target, shard="old", meta="old"), target)
    killed = build(target, shard="half")  # a writer killed before publishing
    publish_dir(build(target, shard="new"), target)
    assert sorted(p.name for p in target.iterdir()) == ["shard"] and (target / "shard").read_text() == "new"
    assert not killed.exists() and not stale_temp_dirs(target)
    assert sorted(os.listdir(tmp_path)) == ["last.ckpt"]


def test_a_temp_folder_is_hidden_and_never_a_ckpt(tmp_path: Path):
    tmp = temp_dir(tmp_path / "last.ckpt", tag="save")
    assert tmp.name.startswith(".last.ckpt.save.") and tmp.name.endswith(".partial")
    assert not list(tmp_path.glob("*.ckpt"))


def test_a_file_of_the_same_name_gives_way_and_a_crash_between_renames_is_found(tmp_path: Path):
    target = tmp_path / "last.ckpt"
    target.write_bytes(b"a single-file checkpoint")
    publish_dir(build(target, shard="new"), target)
    assert target.is_dir()
    # the two-rename fallback killed between its renames: the old folder is aside, the target gone
    aside = build(target, shard="new").with_name(".last.ckpt.save.x.partial.previous")
    os.rename(target, aside)
    assert previous_dir(target) == aside
