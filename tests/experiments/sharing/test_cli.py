"""``python -m experiments export``: refusals are one line with exit 2 and leave nothing behind; a run exports to
the format of its task, checked, with a model card whose ``model-index`` holds the run's test numbers and their
protocol; ``--overwrite`` replaces only an earlier export."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from huggingface_hub import ModelCard

from experiments.__main__ import main
from experiments.sharing.card import eval_results, metric_protocol
from experiments.sharing.checkpoint import RunCheckpoint
from tests.experiments.sharing.conftest import IMAGE_DATA, TEXT_DATA, lm_module, save_run, vit_module

SUMMARY = {
    "task": "vit",
    "scheme": "siamese",
    "status": "finished",
    "test": {"test/acc1": 0.4375, "test/acc5": 0.875, "test/loss": 1.625},
    "final_val": {"val/acc1": 0.5},
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("cli")
    vit = save_run(
        root, "siamese", vit_module("siamese", 0), "experiments.tasks.ImageClassification", IMAGE_DATA, SUMMARY
    )
    lm = save_run(root, "pre", lm_module("pre", 1), "experiments.tasks.LanguageModeling", TEXT_DATA)
    not_a_run = root / "weights.pt"
    torch.save({"state_dict": {"w": torch.ones(2)}, "epoch": 3}, not_a_run)
    tensor = root / "tensor.pt"
    torch.save(torch.ones(3), tensor)
    unsafe = root / "unsafe.ckpt"
    torch.save({"hyper_parameters": Plant(root / "planted")}, unsafe)
    calls = torch.load(vit, weights_only=True)
    calls["datamodule_hyper_parameters"] = {"_class_path": "os.system", "command": f"touch {root / 'ran'}"}
    torch.save(calls, root / "calls.ckpt")
    return {"vit": vit, "lm": lm, "not_a_run": not_a_run, "tensor": tensor, "unsafe": unsafe,
            "calls": root / "calls.ckpt", "root": root}  # fmt: skip


class Plant:
    """Unpickled the unsafe way, this creates a marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def error_line(args: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(["export", *args])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2, err[-2000:]
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err[-2000:]
    return lines[0]


def test_refusals_are_one_line_and_write_nothing(runs, tmp_path, capsys):
    out = tmp_path / "out"
    cases = {
        "unknown format": (["--ckpt", str(runs["lm"]), "--out", str(out), "--format", "onnx"],
                           "--format 'onnx' is not a format; valid: hf, timm, diffusers"),
        "format of another task": (["--ckpt", str(runs["lm"]), "--out", str(out), "--format", "timm"],
                                   "--format timm exports vit runs but"),
        "not a run's checkpoint": (["--ckpt", str(runs["not_a_run"]), "--out", str(out)],
                                   "is not a suite run's checkpoint"),
        "a tensor file": (["--ckpt", str(runs["tensor"]), "--out", str(out)], "holds a Tensor, not a checkpoint dict"),
        "an unsafe pickle": (["--ckpt", str(runs["unsafe"]), "--out", str(out)], "only an unsafe unpickle would build"),
        "a DataModule path naming any callable": (["--ckpt", str(runs["calls"]), "--out", str(out)],
                                                  "records the DataModule 'os.system'; valid: a LightningDataModule"),
        "a missing checkpoint": (["--ckpt", str(tmp_path / "none.ckpt"), "--out", str(out)], "does not exist"),
        "no --ckpt": (["--out", str(out)], "the following arguments are required: --ckpt"),
    }  # fmt: skip
    for what, (args, message) in cases.items():
        assert message in error_line(args, capsys), what
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no output, no partial directory
    assert not (runs["root"] / "planted").exists() and not (runs["root"] / "ran").exists()  # nothing ran
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    line = error_line(["--ckpt", str(runs["lm"]), "--out", str(out)], capsys)
    assert f"--out {out} already exists; valid: --overwrite" in line
    line = error_line(["--ckpt", str(runs["lm"]), "--out", str(out), "--overwrite"], capsys)
    assert "is not an export of this suite" in line and (out / "notes.txt").read_text() == "mine"


def test_a_vit_run_exports_checked_with_its_results_in_the_model_index(runs, tmp_path, capsys):
    out = tmp_path / "exports" / "vit"
    main(["export", "--ckpt", str(runs["vit"]), "--out", str(out)])  # the format comes from the task
    printed = capsys.readouterr().out
    assert f"export: {out} (timm, suite_vit_siamese (SuiteViT), scheme siamese, step 7)" in printed
    assert "check: reloaded without the suite in" in printed and "max |diff| 0.0e+00" in printed
    card = ModelCard.load(out / "README.md")
    assert card.data.library_name == "timm" and "norm-scheme-siamese" in card.data.tags
    results = {r.metric_name: r for r in card.data.eval_results}
    assert {k: r.metric_value for k, r in results.items()} == SUMMARY["test"]
    assert results["test/acc1"].metric_type == "accuracy" and results["test/acc1"].dataset_split == "test"
    assert results["test/acc1"].metric_args == {
        "split": "test", "weights": "EMA", "step": 7, "image_size": 16,
        "transform": "the run's eval transform (pretrained_cfg)",
    }  # fmt: skip
    text = (out / "README.md").read_text()
    assert "| test/acc1 | 0.4375 | split: test; weights: EMA; step: 7" in text  # the human table, protocol in words
    assert "x = N_X(x);  o = F(N_in(x + N_Y(y)))" in text  # the scheme's equation, from its own docstring
    assert sorted(p.name for p in out.parent.iterdir()) == ["vit"]  # the staging directory is gone
    main(["export", "--ckpt", str(runs["vit"]), "--out", str(out), "--overwrite", "--no-check"])
    assert "check:" not in capsys.readouterr().out and "not run (`--no-check`)" in (out / "README.md").read_text()


def run_of(task: str, summary: dict) -> RunCheckpoint:
    hparams = {"trunk": {"norm_scheme": "siamese"}, "seq_len": 128, "img_size": 32}
    return RunCheckpoint(Path("last.ckpt"), task, hparams, {"batch_size": 8}, {}, step=100, summary=summary)


def test_each_metric_carries_its_recorded_protocol():
    fid_protocol = {"samples": 50000, "sampler": "ddpm", "steps": 250, "cfg_scale": 1.0, "reference_sha256": "ab12"}
    dit = run_of("dit", {"test": {"test/fid": 12.5, "test/loss": 0.1}, "test_protocol": fid_protocol})
    results = {r.metric_name: r for r in eval_results(dit, "tiny-siamese")}
    assert results["test/fid"].metric_type == "fid" and results["test/fid"].metric_args == fid_protocol
    assert results["test/loss"].metric_args["weights"] == "EMA"  # a loss is not measured by the FID protocol
    downstream = {"downstream": {"window": 128, "tasks": {"piqa": {"rows": 100}, "sciq": {"rows": 50}}}}
    lm = run_of("lm", {"test": {"test/downstream/piqa/acc": 0.6, "test/ppl": 9.5}, "test_protocol": downstream})
    assert metric_protocol(lm, "test/downstream/piqa/acc") == {"window": 128, "task": {"rows": 100}}
    assert metric_protocol(lm, "test/ppl") == {"split": "test", "weights": "trained", "step": 100, "batch_size": 8,
                                               "window": 128, "tokenizer": "see data"}  # fmt: skip
    assert eval_results(run_of("lm", {}), "x") == []  # never tested: no model-index


def test_a_missing_vae_is_named_before_any_work(runs, tmp_path, capsys):
    from tests.experiments.sharing.conftest import LATENT_DATA, dit_module

    module = dit_module("pre", 3, tmp_path / "no-vae")  # "pre" ships no VAE; point vae_path at a missing one
    module.hparams.vae_path = str(tmp_path / "missing-vae")
    ckpt = save_run(tmp_path, "pre", module, "experiments.tasks.LatentDiffusion", LATENT_DATA)
    line = error_line(["--ckpt", str(ckpt), "--out", str(tmp_path / "out")], capsys)
    assert "the run's vae_path" in line and "missing-vae" in line and "valid: --vae DIR" in line
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.partial-*"))


def test_compare_reads_a_folder_of_exports(runs, tmp_path, capsys):
    exports = tmp_path / "exports"
    other = save_run(runs["root"] / "other", "pre", vit_module("pre", 5), "experiments.tasks.ImageClassification",
                     IMAGE_DATA, {**SUMMARY, "scheme": "pre", "test": {"test/acc1": 0.25}})  # fmt: skip
    for name, ckpt in (("siamese", runs["vit"]), ("pre", other)):
        main(["export", "--ckpt", str(ckpt), "--out", str(exports / name), "--no-check"])
    main(["compare", str(exports)])
    capsys.readouterr()
    table = (exports / "comparison.md").read_text()
    cells = [line for line in table.splitlines() if line.startswith(("| pre |", "| siamese |"))][:2]
    assert [c.split(" | ")[2] for c in cells] == ["0.25 (n = 1)", "0.4375 (n = 1)"]  # test/acc1, from each summary


def digest(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root`` (links as their target text): what a refusal must leave as it was."""
    import hashlib

    return {
        str(p.relative_to(root)): (
            f"-> {p.readlink()}" if p.is_symlink() else hashlib.sha256(p.read_bytes()).hexdigest()
        )
        for p in sorted(root.rglob("*"))
        if p.is_file() or p.is_symlink()
    }


def test_absurd_hyperparameters_and_bad_destinations_are_refused_before_any_work(runs, tmp_path, capsys):
    """A checkpoint whose hyperparameters were edited to absurd shapes, and an --out below a file, a symlink, the
    run itself or a folder above it: one line each, exit 2, nothing allocated, nothing written or changed."""
    payload = torch.load(runs["lm"], weights_only=True)
    edits = {"width 2**40": ("trunk", "dim", 2**40), "window 2**62": (None, "seq_len", 2**62),
             "depth -3": ("trunk", "depth", -3)}  # fmt: skip
    edited = {}
    for what, (section, key, value) in edits.items():
        changed = {**payload, "hyper_parameters": {**payload["hyper_parameters"]}}
        target = changed["hyper_parameters"]
        if section is not None:
            target[section] = {**target[section], key: value}
        else:
            target[key] = value
        edited[what] = tmp_path / "edited" / f"{key}{value}.ckpt"
        edited[what].parent.mkdir(exist_ok=True)
        torch.save(changed, edited[what])
    (tmp_path / "a_file").write_text("mine")
    (tmp_path / "link").symlink_to(tmp_path / "edited")
    run_dir = runs["lm"].parent.parent
    before, runs_before = digest(tmp_path), digest(runs["root"])
    for what, ckpt in edited.items():
        line = error_line(["--ckpt", str(ckpt), "--out", str(tmp_path / "out")], capsys)
        assert f"checkpoint {ckpt}: its hyperparameters do not build a network" in line, what
        assert "valid: the hyperparameters the run was trained with" in line
    lm = ["--ckpt", str(runs["lm"])]
    cases = {
        "below a file": (tmp_path / "a_file" / "out", "lies under"),
        "a file": (tmp_path / "a_file", "is a file"),
        "a symlink": (tmp_path / "link", "is a symlink"),
        "the run itself": (run_dir, f"is or holds the run directory {run_dir}"),
        "a folder above the run": (run_dir.parent.parent, "is or holds the run directory"),
    }
    for what, (out, message) in cases.items():
        for overwrite in ([], ["--overwrite"]):
            line = error_line([*lm, "--out", str(out), *overwrite], capsys)
            assert message in line and str(out) in line and "valid:" in line, (what, line)
    assert digest(tmp_path) == before and digest(runs["root"]) == runs_before


def test_overwrite_replaces_only_the_earlier_exports_own_files_and_modes_follow_the_umask(runs, tmp_path, capsys):
    import os

    out = tmp_path / "export"
    old_umask = os.umask(0o002)  # group-writable, as a shared project directory sets it
    try:
        main(["export", "--ckpt", str(runs["lm"]), "--out", str(out), "--no-check"])
    finally:
        os.umask(old_umask)
    modes = {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()}
    assert modes["model.safetensors"] == 0o664 and set(modes.values()) == {0o664}, modes  # safetensors' 0600 fixed
    card = ModelCard.load(out / "README.md")
    assert card.data.pipeline_tag == "text-generation"
    assert card.data.datasets[0] in ("KJV Bible", "Python documentation topics (pydoc)")  # the data, not the class
    assert "TextDataModule" not in card.data.eval_results[0].dataset_name if card.data.eval_results else True
    (out / "my_notes.txt").write_text("mine")  # the user's file, added to the export afterwards
    before = digest(out)
    line = error_line(["--ckpt", str(runs["lm"]), "--out", str(out), "--overwrite", "--no-check"], capsys)
    assert f"{out}/my_notes.txt is not a file of the earlier export" in line
    assert digest(out) == before
    (out / "my_notes.txt").unlink()
    main(["export", "--ckpt", str(runs["lm"]), "--out", str(out), "--overwrite", "--no-check"])  # its own files only
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]


def test_a_full_disk_mid_export_is_one_line_naming_the_path_and_leaves_nothing(runs, tmp_path, capsys, monkeypatch):
    """ENOSPC while the export is written (here: its card): one line with the path and the free space; --out
    is not created and no partial directory stays beside it."""
    import errno

    import experiments.sharing.cli as export_cli

    def full(run, report, folder):
        raise OSError(errno.ENOSPC, "No space left on device", str(folder / "README.md"))

    monkeypatch.setattr(export_cli, "write_card", full)
    out = tmp_path / "exports" / "lm"
    line = error_line(["--ckpt", str(runs["lm"]), "--out", str(out), "--no-check"], capsys)
    assert line.startswith("error: No space left on device: ") and "README.md" in line
    assert "free on its file system)" in line
    assert sorted(p.name for p in (tmp_path / "exports").iterdir()) == []  # no out, no .lm.partial-*
