"""A sharded checkpoint folder handed in by someone else: nothing in it runs code, points outside it, mixes two
saves, or is trusted because it is there (issue #43's scale-out surfaces). Every reader is held to it: the
readers that consolidate (export, prune, logit-lens, evaluate, test with one device) and Lightning's own sharded
load (a resume), each through the real command line, exit 2 with one line and the folder left byte for byte.

The folders come from two real one-process FSDP2 runs (``ModelParallelStrategy``, 2 and 4 steps) of one tiny LM,
so their files have the same names and sizes and differ only in content."""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, MetadataIndex

from experiments.__main__ import main
from experiments.reliability.safe_load import checkpoint_problem, load_checkpoint
from experiments.reliability.sharded import CACHE, MANIFEST, consolidate, read_metadata, sharded_problem
from tests.experiments.tiny import tiny_lm

ROOT = Path(__file__).resolve().parents[2]
SHARDED = ["-c", str(ROOT / "configs/trainer/fsdp2.yaml"), "--trainer.devices=1",
           "--trainer.strategy.init_args.data_parallel_size=1"]  # fmt: skip


def digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*"))
            if p.is_file()}  # fmt: skip


def fit_args(runs: Path, corpus: tuple[Path, Path], name: str, steps: int, *extra: str) -> list[str]:
    text, shards = corpus
    return ["fit", "-c", str(ROOT / "configs/lm/tiny.yaml"), *SHARDED, f"--runs_root={runs}", f"--experiment={name}",
            f"--data.init_args.source={text}", f"--data.init_args.data_dir={shards}", *tiny_lm(depth=2),
            f"--trainer.max_steps={steps}", "--trainer.limit_val_batches=1", "--trainer.num_sanity_val_steps=0",
            *extra]  # fmt: skip


@pytest.fixture(scope="module")
def saves(tmp_path_factory, corpus) -> dict[str, Path]:
    """Two sharded saves of one model shape (2 and 4 steps): ``{"two": folder, "four": folder, "runs": root}``."""
    runs = tmp_path_factory.mktemp("sharded") / "runs"
    for name, steps in (("two", 2), ("four", 4)):
        main(fit_args(runs, corpus, name, steps))
    found = {name: runs / "lm" / name / "pre" / "checkpoints" / "last.ckpt" for name in ("two", "four")}
    assert all(folder.is_dir() and (folder / MANIFEST).is_file() for folder in found.values())
    return {**found, "runs": runs}


class Marker:
    """Unpickling it creates a file: what a hostile entry would run."""

    def __reduce__(self):
        return (open, (str(Path(os.environ["SHARDED_MARKER"]) / "owned"), "w"))


def with_entry(folder: Path, target: Path, fqn: str, payload: bytes, manifest: bool) -> Path:
    """A copy of ``folder`` whose ``.metadata`` has one more non-tensor entry ``fqn`` whose bytes are ``payload``,
    appended to the first shard (as a forged folder would have it); ``manifest``: keep the manifest."""
    shutil.copytree(folder, target)
    metadata = read_metadata(target)
    shard = target / "__0_0.distcp"
    offset = shard.stat().st_size
    with open(shard, "ab") as f:
        f.write(payload)
    metadata.state_dict_metadata[fqn] = BytesStorageMetadata()
    metadata.storage_data[MetadataIndex(fqn)] = _StorageInfo("__0_0.distcp", offset, len(payload))
    (target / ".metadata").write_bytes(pickle.dumps(metadata))
    if not manifest:
        (target / MANIFEST).unlink(missing_ok=True)
    return target


def code_payload() -> bytes:
    buffer = io.BytesIO()
    torch.save(Marker(), buffer)
    return buffer.getvalue()


def one_line(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as stop:
        main(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "Traceback" not in err, err[-2000:]
    (line,) = [x for x in err.splitlines() if x.startswith("error:")]
    return line


def readers(ckpt: Path, out: Path, runs: Path, corpus) -> dict[str, list[str]]:
    """Every command that reads a checkpoint, on ``ckpt``, writing under ``out``."""
    config = runs / "lm" / "two" / "pre" / "config.yaml"
    return {
        "export": ["export", "--ckpt", str(ckpt), "--out", str(out / "export"), "--no-check"],
        "prune": ["prune", "--ckpt", str(ckpt), "--batches", "1", "--out", str(out / "prune"), "--device", "cpu"],
        "logit-lens": [
            "logit-lens",
            "--ckpt",
            str(ckpt),
            "--batches",
            "1",
            "--out",
            str(out / "lens"),
            "--device",
            "cpu",
        ],  # fmt: skip
        "evaluate": ["evaluate", "--ckpt", str(ckpt), "--tasks", "copa", "--limit", "2", "--out", str(out / "e.json")],
        "test": [
            "test",
            "-c",
            str(config),
            f"--ckpt_path={ckpt}",
            "--trainer.devices=1",
            "--trainer.strategy=auto",
            "--trainer.limit_test_batches=1",
        ],  # fmt: skip
        "resume": fit_args(runs, corpus, "resumed", 6, f"--ckpt_path={ckpt}"),
    }


@pytest.mark.parametrize("manifest", [False, True], ids=["plain-lightning-folder", "with-manifest"])
@pytest.mark.parametrize("fqn", ["state_dict.evil", "optimizer_0.param_groups.0.evil"])
def test_a_non_tensor_entry_that_would_run_code_is_refused_by_every_reader(
    saves, fqn, manifest, tmp_path, corpus, capsys, monkeypatch
):
    """The entry sits where the consolidating readers look (``state_dict.``) or where only Lightning's resume
    looks (the optimizer's): torch's load planner would unpickle it with ``weights_only=False`` either way."""
    monkeypatch.setenv("SHARDED_MARKER", str(tmp_path))
    hostile = with_entry(saves["two"], tmp_path / "hostile.ckpt", fqn, code_payload(), manifest)
    before = digest(hostile)
    problem = checkpoint_problem(hostile)
    assert problem is not None
    if not manifest:  # with the manifest the grown shard is refused by its size first
        assert f"has an entry {fqn} in __0_0.distcp that is not plain data" in problem, problem
    for command, argv in readers(hostile, tmp_path / "out", saves["runs"], corpus).items():
        line = one_line(argv, capsys)
        assert str(hostile) in line, (command, line)
        assert not (tmp_path / "owned").exists(), command  # nothing ran
    assert digest(hostile) == before and not (saves["runs"] / "lm" / "resumed").exists()


def test_plain_data_entries_still_load_and_the_readers_are_not_fooled(saves, tmp_path):
    """A forged entry of plain data (what the optimizer's hyperparameters are) passes; the consolidated weights are
    the shards' own (the 2-step run's, which differ from the 4-step run's)."""
    folder = with_entry(saves["two"], tmp_path / "plain.ckpt", "state_dict.note", _saved(3.5), manifest=False)
    assert checkpoint_problem(folder) is None
    two, four = (load_checkpoint(saves[name])["state_dict"] for name in ("two", "four"))
    key = "net.trunk.blocks.1.mlp.fc1.weight"
    assert not torch.equal(two[key], four[key]) and two[key].shape == (128, 32)  # SwiGLU: gate and up packed
    assert load_checkpoint(saves["two"])["global_step"] == 2 and load_checkpoint(saves["four"])["global_step"] == 4


def _saved(value) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def test_a_shard_named_outside_the_folder_is_refused(saves, tmp_path):
    folder = tmp_path / "outside.ckpt"
    shutil.copytree(saves["two"], folder)
    shutil.copy(folder / "__0_0.distcp", tmp_path / "elsewhere.distcp")
    metadata = read_metadata(folder)
    for index, info in list(metadata.storage_data.items()):
        metadata.storage_data[index] = _StorageInfo("../elsewhere.distcp", info.offset, info.length)
    (folder / ".metadata").write_bytes(pickle.dumps(metadata))
    (folder / MANIFEST).unlink()
    problem = sharded_problem(folder)
    assert problem == (
        "has a .metadata naming the shard '../elsewhere.distcp', which is not a file name inside the folder"
    )
    with pytest.raises(Exception, match="not a file name inside the folder"):
        load_checkpoint(folder)


def test_a_shard_cut_short_is_named(saves, tmp_path):
    folder = tmp_path / "cut.ckpt"
    shutil.copytree(saves["two"], folder)
    shard = folder / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:-1000])
    (folder / MANIFEST).unlink()  # as plain Lightning saves it: the offsets still tell
    problem = sharded_problem(folder)
    assert problem is not None and problem.startswith("has a shard __0_0.distcp of ") and "cut short" in problem
    with_manifest = tmp_path / "cut-manifest.ckpt"
    shutil.copytree(saves["two"], with_manifest)
    (with_manifest / "__0_0.distcp").write_bytes(shard.read_bytes())
    assert "it was cut short" in sharded_problem(with_manifest)


def test_shards_of_two_saves_mixed_in_one_folder_are_refused_by_every_reader(saves, tmp_path, corpus, capsys):
    """The 4-step run's shard in the 2-step run's folder: same name, same size, other weights."""
    mixed = tmp_path / "mixed.ckpt"
    shutil.copytree(saves["two"], mixed)
    shutil.copy(saves["four"] / "__0_0.distcp", mixed / "__0_0.distcp")
    assert (mixed / "__0_0.distcp").stat().st_size == (saves["two"] / "__0_0.distcp").stat().st_size
    assert sharded_problem(mixed) is None  # sizes agree: only the hashes tell, when the folder is read
    with pytest.raises(Exception, match="sha256 differs from shards.json"):
        consolidate(mixed)
    before = digest(mixed)
    for command, argv in readers(mixed, tmp_path / "out", saves["runs"], corpus).items():
        line = one_line(argv, capsys)
        assert "__0_0.distcp whose content is not what its save wrote" in line, (command, line)
    assert digest(mixed) == before and not (saves["runs"] / "lm" / "resumed").exists()  # refused before the claim


def test_a_planted_cache_is_never_read_and_nothing_is_written_into_the_folder(saves, tmp_path):
    """Earlier versions cached the consolidated weights inside the folder and trusted a stamp of sizes and times;
    a cache holding the 4-step weights in the 2-step folder is ignored, and reading writes nothing there (a folder
    on read-only storage reads the same)."""
    folder = tmp_path / "planted.ckpt"
    shutil.copytree(saves["two"], folder)
    torch.save(load_checkpoint(saves["four"]), folder / CACHE)
    before = digest(folder)
    key = "net.head.weight"
    loaded = load_checkpoint(folder)["state_dict"][key]
    assert torch.equal(loaded, load_checkpoint(saves["two"])["state_dict"][key])
    assert not torch.equal(loaded, load_checkpoint(saves["four"])["state_dict"][key])
    assert digest(folder) == before


def test_a_resume_from_an_intact_folder_still_works_through_the_strategy(saves, tmp_path, corpus):
    """The check before Lightning's own sharded load passes a folder the suite saved (and continues it)."""
    runs = tmp_path / "runs"
    shutil.copytree(saves["runs"] / "lm" / "two", runs / "lm" / "two")
    main(fit_args(runs, corpus, "two", 3, "--ckpt_path=last"))
    saved = (runs / "lm" / "two" / "pre" / "checkpoints").glob("*.ckpt")  # a copied run saves last-v1.ckpt
    assert max(load_checkpoint(folder)["global_step"] for folder in saved) == 3
