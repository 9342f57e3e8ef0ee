"""Bad input ends in one line naming the bad value and what would be valid, exit status 2, no traceback."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from datamodules.text.datamodule import TextDataModule
from experiments.__main__ import main
from experiments.reliability.errors import describe, jsonargparse_line
from tests.experiments.tiny import tiny_lm

ROOT = Path(__file__).resolve().parents[2]
TINY = tiny_lm(depth=1, seq_len=16, batch_size=4, eval_samples=4)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[Path, Path]:
    """A small UTF-8 corpus and its byte-level shard directory (prepared once)."""
    import pydoc_data.topics

    root = tmp_path_factory.mktemp("text")
    text = root / "corpus.txt"
    text.write_text("".join(pydoc_data.topics.topics.values())[:100_000])
    dm = TextDataModule(source=str(text), data_dir=str(root / "cache"), seq_len=16, batch_size=4)
    dm.prepare_data()
    return text, dm.shard_dir


def lm(tmp: Path, corpus: tuple[Path, Path], *extra: str, scheme: str = "pre", sub: str = "fit") -> list[str]:
    text, _ = corpus
    return [
        sub, "-c", str(ROOT / "configs/lm/tiny.yaml"), "-c", str(ROOT / f"configs/norm/{scheme}.yaml"),
        f"--runs_root={tmp / 'runs'}", f"--data.init_args.source={text}", f"--data.init_args.data_dir={tmp / 'data'}",
        *TINY, *extra,
    ]  # fmt: skip


def error_line(args: list[str], capsys) -> str:
    """Runs the CLI in-process; asserts exit status 2, one ``error:`` line and no traceback; returns the line."""
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2, err[-3000:]
    assert "Traceback" not in err
    lines = [x for x in err.splitlines() if x.startswith("error:")]
    assert len(lines) == 1, err[-3000:]
    return lines[0]


#################################################################################
#                          Config values, caught at parse time                   #
#################################################################################


@pytest.mark.parametrize(
    ("extra", "needles"),
    [
        (["--model.init_args.trunk.norm_scheme=bogus"], ["norm_scheme 'bogus'", "valid: pre, post", "siamese"]),
        (["--model.init_args.trunk.norm_layer=batchnorm"], ["norm_layer 'batchnorm'", "valid: layernorm, rmsnorm"]),
        (["--model.init_args.trunk.num_heads=5"], ["dim 32 is not divisible by num_heads 5"]),
        (["--model.init_args.optim.lr=-0.001"], ["model.init_args.optim.lr=-0.001 (command line); valid: > 0"]),
        (["--model.init_args.optim.lr=inf"], ["model.init_args.optim.lr=inf (command line) is not a finite number",
                                              "valid: finite numbers > 0"]),
        (["--model.init_args.optim.weight_decay=nan"], ["model.init_args.optim.weight_decay=nan (command line)"]),
        (["--data.init_args.batch_size=0"], ["data.init_args.batch_size=0 (command line); valid: >= 1"]),
        (["--trainer.max_steps=abc"], ["trainer.max_steps: expected int, got abc"]),
        (["--model.init_args.trunk.nope=1"], ["unrecognized arguments: --trunk.nope=1"]),
        (["-c", "/nonexistent/overlay.yaml"], ["config file /nonexistent/overlay.yaml does not exist"]),
        (["--ckpt_path=/nonexistent/last.ckpt"], ["checkpoint /nonexistent/last.ckpt does not exist"]),
        (["--model.init_args.top_k=0"], ["model.init_args.top_k=0 (command line); valid: >= 1 or null"]),
        (["--model.init_args.temperature=-0.5"], ["model.init_args.temperature=-0.5 (command line); valid: >= 0"]),
        (["--trainer.max_stepz=5"], ["arguments: --trainer.max_stepz=5", "did you mean --trainer.max_steps?"]),
        (["--model.init_args.temprature=0.5"], ["'temprature' is not", "did you mean --model.init_args.temperature?"]),
        (["--data.init_args.batch_sise=4"], ["did you mean --data.init_args.batch_size?"]),
        (["-c", str(ROOT / "configs/vit/tiny.yaml")], [f"config {ROOT / 'configs/vit/tiny.yaml'} is a 'vit' config but",
                                                       "configs/lm/tiny.yaml is a 'lm' config"]),
        (["--weights_only=false"], ["--weights_only=false would let a checkpoint run code"]),
    ],
    ids=["scheme", "norm-layer", "heads", "lr", "lr-inf", "wd-nan", "batch-size", "not-an-int", "unknown-key",
         "no-config", "no-ckpt", "top-k", "temperature", "typo-trainer", "typo-model", "typo-data",
         "two-tasks", "weights-only"],
)  # fmt: skip
def test_bad_config_value(extra: list[str], needles: list[str], tmp_path: Path, corpus, capsys):
    line = error_line(lm(tmp_path, corpus, *extra), capsys)
    for needle in needles:
        assert needle in line, line
    assert not (tmp_path / "runs").exists() or extra[0].startswith("--ckpt_path")  # failed before any run dir


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("trainer:\n  max_steps: [1\n", "is not valid YAML at line 3"),
        ("", "is empty"),
        ("- a\n- b\n", "holds a YAML list"),
    ],
    ids=["syntax", "empty", "a-list"],
)
def test_a_broken_config_file_is_named(content: str, needle: str, tmp_path: Path, corpus, capsys):
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text(content)
    line = error_line(lm(tmp_path, corpus, "-c", str(overlay)), capsys)
    assert f"config {overlay} {needle}" in line
    assert not (tmp_path / "runs").exists()


#################################################################################
#                                     Data                                       #
#################################################################################


def test_missing_text_source(tmp_path: Path, corpus, capsys):
    line = error_line(lm(tmp_path, corpus, f"--data.init_args.source={tmp_path / 'nowhere.txt'}"), capsys)
    assert f"input '{tmp_path / 'nowhere.txt'}' does not exist; valid: 'embedded', .txt .md .jsonl" in line


@pytest.mark.parametrize(
    ("content", "needle"), [(b"  \n\t\n", "is empty"), (b"caf\xe9 \xff\xfe text", "is not valid UTF-8")]
)
def test_empty_or_undecodable_corpus(content: bytes, needle: str, tmp_path: Path, corpus, capsys):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(content)
    line = error_line(lm(tmp_path, corpus, f"--data.init_args.source={bad}"), capsys)
    assert str(bad) in line and needle in line


def test_tokenizer_that_does_not_match_the_shards(tmp_path: Path, corpus, capsys):
    _, shards = corpus
    args = lm(tmp_path, corpus, f"--data.init_args.source={shards}", "--data.init_args.tokenizer=bpe")
    line = error_line(args, capsys)
    assert "made with tokenizer=byte vocab_size=256" in line and "set tokenizer=byte" in line


def image_args(tmp: Path, root: Path, *extra: str) -> list[str]:
    return [
        "fit", "-c", str(ROOT / "configs/vit/deit-tiny.yaml"), f"--runs_root={tmp / 'runs'}",
        f"--data.init_args.root={root}", "--trainer.accelerator=cpu", "--trainer.devices=1", "--trainer.strategy=auto",
        "--trainer.precision=32-true", "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
        "--model.init_args.trunk.dim=16", "--model.init_args.trunk.depth=1", "--model.init_args.trunk.num_heads=2",
        "--data.init_args.image_size=16", "--model.init_args.patch_size=8", "--data.init_args.batch_size=2",
        "--data.init_args.num_workers=0", "--data.init_args.auto_augment=null",
        "--data.init_args.global_batch_size=null", *extra,
    ]  # fmt: skip


@pytest.mark.parametrize("layout", ["missing", "no-train-dir"])
def test_missing_or_empty_image_folder(layout: str, tmp_path: Path, capsys):
    root = tmp_path / "imagenet"
    if layout == "no-train-dir":
        root.mkdir()
    line = error_line(image_args(tmp_path, root), capsys)
    expected = f"ImageFolder root '{root}' does not exist" if layout == "missing" else f"'{root / 'train'}' is missing"
    assert expected in line and "train/ and val/" in line


def test_an_image_folder_whose_every_image_is_truncated_is_one_line(tmp_path: Path, capsys):
    root = tmp_path / "imagenet"
    for split in ("train", "val"):
        for cls in ("cat", "dog"):
            (root / split / cls).mkdir(parents=True)
            (root / split / cls / "0.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    line = error_line(image_args(tmp_path, root, "--trainer.fast_dev_run=1"), capsys)
    assert f"{root / 'train'}: none of the first 32 images can be decoded" in line and "0.png" in line


def test_unreadable_images_are_skipped_and_counted(tmp_path: Path, recwarn):
    root = tmp_path / "imagenet"
    for split in ("train", "val"):
        for cls in ("cat", "dog"):
            (root / split / cls).mkdir(parents=True)
            for i in range(2):
                Image.new("RGB", (20, 20), (40 * i, 80, 120)).save(root / split / cls / f"{i}.png")
    (root / "train" / "cat" / "0.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")  # a broken file
    main(
        image_args(
            tmp_path,
            root,
            "--trainer.fast_dev_run=2",
            "--data.init_args.batch_size=4",
            "--data.init_args.repeated_augmentation=1",
        )
    )  # four images: too few for DeiT's 256-image epochs
    messages = [str(w.message) for w in recwarn]
    assert any("skipped unreadable image" in m and "0.png" in m for m in messages), messages
    assert any("1 unreadable images were skipped" in m for m in messages), messages


#################################################################################
#                        Checkpoints of another model or scheme                  #
#################################################################################


@pytest.fixture(scope="module")
def siamese_ckpt(tmp_path_factory, corpus) -> Path:
    tmp = tmp_path_factory.mktemp("siamese")
    main(lm(tmp, corpus, "--trainer.max_steps=1", "--trainer.val_check_interval=1", "--trainer.limit_val_batches=1",
            "--trainer.num_sanity_val_steps=0", scheme="siamese"))  # fmt: skip
    return tmp / "runs" / "lm" / "tiny" / "siamese" / "checkpoints" / "last.ckpt"


@pytest.mark.parametrize("sub", ["fit", "test"])
def test_checkpoint_of_another_scheme_and_shape(sub: str, tmp_path: Path, corpus, siamese_ckpt: Path, capsys):
    args = lm(tmp_path, corpus, f"--ckpt_path={siamese_ckpt}", "--model.init_args.trunk.dim=48", sub=sub)
    line = error_line(args, capsys)
    assert f"checkpoint {siamese_ckpt} was trained with dim=32" in line, line
    assert "norm_scheme=siamese" in line and "this config has dim=48" in line and "norm_scheme=pre" in line


def test_checkpoint_of_another_scheme_whose_tensors_fit_is_refused(tmp_path: Path, corpus, siamese_ckpt: Path, capsys):
    # post and deepnorm share one state-dict layout: only the saved hparams can tell them apart.
    payload = torch.load(siamese_ckpt, weights_only=True)
    payload["hyper_parameters"]["trunk"]["norm_scheme"] = "deepnorm"
    relabelled = tmp_path / "relabelled.ckpt"
    torch.save(payload, relabelled)
    line = error_line(lm(tmp_path, corpus, f"--ckpt_path={relabelled}", scheme="siamese", sub="test"), capsys)
    assert "was trained with norm_scheme=deepnorm; this config has norm_scheme=siamese (0 missing" in line


#################################################################################
#                     Errors raised deep inside: VAE, FID, jsonargparse          #
#################################################################################


def test_a_directory_that_is_not_an_autoencoder_is_one_line(tmp_path: Path):
    from models.vae import load_vae

    (tmp_path / "unet").mkdir()
    (tmp_path / "unet" / "config.json").write_text(json.dumps({"_class_name": "UNet2DModel"}))
    for path, needle in [
        (tmp_path / "unet", "holds a 'UNet2DModel', not an AutoencoderKL"),
        (tmp_path, "no config.json"),
    ]:
        with pytest.raises(ValueError) as err:
            load_vae(str(path))
        status, line = describe(err.value)
        assert status == 2 and needle in line and str(path) in line and "\n" not in line


def test_missing_fid_reference_statistics_are_one_line(tmp_path: Path):
    from experiments.evaluation.fid.stats import load_real_stats

    with pytest.raises(FileNotFoundError) as err:
        load_real_stats(tmp_path / "imagenet-256px.npz")
    status, line = describe(err.value)
    assert status == 2 and str(tmp_path / "imagenet-256px.npz") in line and "--save-real-stats" in line
    assert "\n" not in line


def test_a_bug_is_not_dressed_up_as_bad_input():
    assert describe(KeyError("oops")) is None and describe(RuntimeError("CUDA error")) is None


def test_jsonargparse_union_report_is_reduced_to_its_reason():
    report = """Parser key "trainer.strategy":
  Does not validate against any of the Union subtypes
  Subtypes: [<class 'str'>, <class 'lightning.pytorch.strategies.strategy.Strategy'>]
  Errors:
    - Expected a <class 'str'>
    - Problem with given class_path 'lightning.pytorch.strategies.FSDPStrategy':
        Option 'limit_all_gathers' is not accepted
  Given value type: <class 'dict'>"""
    assert jsonargparse_line(report) == "trainer.strategy: Option 'limit_all_gathers' is not accepted"


#################################################################################
#                 The real command line: status, stderr, --debug                 #
#################################################################################


def test_command_line_prints_one_line_and_exits_2(tmp_path: Path, corpus):
    args = lm(tmp_path, corpus, "--model.init_args.trunk.norm_scheme=siamesee")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "experiments", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    last = proc.stderr.splitlines()[-1]
    assert last.startswith("error: unknown norm_scheme 'siamesee' (command line); valid: pre, post")
    assert "Traceback" not in proc.stderr


def test_debug_adds_the_traceback(tmp_path: Path, corpus, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--debug", *lm(tmp_path, corpus, "--model.init_args.trunk.norm_scheme=siamesee")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert "Traceback (most recent call last)" in err and "unknown norm_scheme 'siamesee'" in err.splitlines()[-1]


@pytest.mark.parametrize("where", ["file", "command line"])
def test_a_value_the_model_refuses_names_the_file_that_set_it(where: str, tmp_path: Path, corpus, capsys):
    """The trunk checks its scheme and numbers when it is built, after parsing: the line still says where
    the bad value came from."""
    overlay = tmp_path / "mine.yaml"
    overlay.write_text("model:\n  init_args:\n    trunk:\n      norm_scheme: bogus\n")
    extra = ["-c", str(overlay)] if where == "file" else ["--model.init_args.trunk.norm_scheme=bogus"]
    line = error_line([*lm(tmp_path, corpus), *extra], capsys)
    origin = str(overlay) if where == "file" else "command line"
    assert line.startswith(f"error: unknown norm_scheme 'bogus' ({origin}); valid: pre, post, ")


#################################################################################
#       Second round: the newer surfaces (fid, evaluate, lm-eval, sweeps, compare) #
#################################################################################


def tree_hashes(*roots: Path) -> dict[str, str]:
    """sha256 of every file under ``roots`` (symlinks by their target text): compared before and after a case."""
    out = {}
    for root in roots:
        for path in sorted(Path(root).rglob("*")):
            if path.is_symlink():
                out[str(path)] = "link:" + os.readlink(path)
            elif path.is_file():
                out[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def write_images(folder: Path, count: int, size: int, seed: int) -> Path:
    folder.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    for i in range(count):
        Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(folder / f"{i}.png")
    return folder


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict[str, Path]:
    """Inputs the cases point at: image folders, statistics files, a regular file, a sweep spec and a sweep
    directory, checkpoints. Built once; every case checks that none of it changes."""
    root = tmp_path_factory.mktemp("world")
    w = {"root": root, "a": write_images(root / "a", 4, 16, 0), "b": write_images(root / "b", 4, 16, 1)}
    w["file"] = root / "notes.txt"
    w["file"].write_text("a regular file\n")
    w["stats"] = root / "stats.npz"
    np.savez(w["stats"], mu=np.zeros(4), sigma=np.eye(4))
    w["neg_stats"] = root / "neg-identity.npz"
    np.savez(w["neg_stats"], mu=np.zeros(4), sigma=-np.eye(4))  # -I: no features have it
    w["asym_stats"] = root / "asymmetric.npz"
    np.savez(w["asym_stats"], mu=np.zeros(2), sigma=np.array([[1.0, 0.5], [0.0, 1.0]]))
    w["ckpt"] = root / "lm.ckpt"
    torch.save({"state_dict": {}, "hyper_parameters": {}}, w["ckpt"])  # options are checked before it is read
    spec = yaml.safe_load((ROOT / "configs/sweeps/demo.yaml").read_text())
    w["spec"] = root / "sweep.yaml"
    w["spec"].write_text(yaml.safe_dump({**spec, "runs_root": str(root / "runs")}))
    return w


def in_world(args: list[str], world: dict[str, Path]) -> list[str]:
    return [a.format(**world) for a in args]


# Each: argv (with {name} for the world's paths), then what the one line must name.
OPTION_CASES = {
    "fid-device": (["fid", "{a}", "{b}", "--device", "gpu"], ["--device 'gpu' is not a device name; valid: cpu"]),
    "fid-cuda-absent": (["fid", "{a}", "{b}", "--device", "cuda:3"], ["--device 'cuda:3'", "valid: cpu"]),
    "fid-batch-inf": (["fid", "{a}", "{b}", "--batch-size", "inf"], ["--batch-size='inf' is not a finite number"]),
    "fid-stats-exists": (["fid", "{a}", "{b}", "--save-real-stats", "{stats}"],
                         ["--save-real-stats {stats} exists; valid: another path, or --overwrite"]),
    "fid-stats-under-file": (["fid", "{a}", "{b}", "--save-real-stats", "{file}/stats.npz"],
                             ["--save-real-stats {file}/stats.npz lies under {file}, which is a file"]),
    "fid-stats-of-stats": (["fid", "{stats}", "{b}", "--save-real-stats", "{root}/new.npz"],
                           ["--save-real-stats: {stats} holds stored statistics already"]),
    "evaluate-device": (["evaluate", "--ckpt", "{ckpt}", "--device", "gpu"], ["--device 'gpu' is not a device name"]),
    "evaluate-out-under-file": (["evaluate", "--ckpt", "{ckpt}", "--out", "{file}/scores.json"],
                                ["--out {file}/scores.json lies under {file}, which is a file"]),
    "evaluate-limit": (["evaluate", "--ckpt", "{ckpt}", "--limit", "-3"], ["downstream.limit=-3 must be a positive"]),
    "prune-device": (["prune", "--ckpt", "{ckpt}", "--device", "tpu"], ["--device 'tpu' is not a device name"]),
    "logit-lens-device": (["logit-lens", "--ckpt", "{ckpt}", "--device", "cuda"], ["--device 'cuda'", "valid: cpu"]),
    "lm-eval-limit": (["lm-eval", "--ckpt", "{ckpt}", "--tasks", "x", "--limit", "-5"],
                      ["--limit='-5' must be > 0 (command line)"]),
    "lm-eval-fewshot": (["lm-eval", "--ckpt", "{ckpt}", "--tasks", "x", "--num_fewshot", "nan"],
                        ["--num_fewshot='nan' is not a finite number"]),
    "lm-eval-batch": (["lm-eval", "--ckpt", "{ckpt}", "--tasks", "x", "--batch_size", "0"],
                      ["--batch_size='0'; valid: an integer >= 1, auto or auto:N"]),
    "lm-eval-device": (["lm-eval", "--ckpt", "{ckpt}", "--tasks", "x", "--device", "gpu"], ["--device 'gpu'"]),
    "lm-eval-output-under-file": (["lm-eval", "--ckpt", "{ckpt}", "--tasks", "x", "--output_path", "{file}/out"],
                                  ["--output_path {file}/out lies under {file}, which is a file"]),
    "sweep-extra": (["sweep", "{spec}", "--launcher", "extra=abc", "--dry-run"],
                    ["launcher.extra='abc' (command line --launcher); valid: a mapping"]),
    "sweep-tokens-1e400": (["sweep", "{spec}", "--budget", "tokens=1e400", "--dry-run"],
                           ["budget.tokens='1e400' is not a finite number (command line --budget)"]),
    "sweep-steps-inf": (["sweep", "{spec}", "--budget", "steps=.inf", "--dry-run"],
                        ["budget.steps=inf is not a finite number (command line --budget)"]),
    "sweep-mfu-nan": (["sweep", "{spec}", "--compute", "mfu=.nan", "--dry-run"], ["compute.mfu=nan is not a finite"]),
    "sweep-mem": (["sweep", "{spec}", "--launcher", "kind=submitit", "--launcher", "mem_gb=-5", "--dry-run"],
                  ["launcher.mem_gb=-5 must be > 0 (command line --launcher)"]),
    "sweep-sbatch-newline": (["sweep", "{spec}", "--launcher", "kind=submitit", "--launcher",
                              'partition="gpu\\n#SBATCH --wrap=evil"', "--dry-run"],
                             ["launcher.partition=", "spans several lines (command line --launcher)"]),
    "compare-export-under-file": (["compare", "{root}/sweep-dir", "--export", "{file}/results"],
                                  ["--export {file}/results lies under {file}, which is a file"]),
    "fid-neg-identity-sigma": (["fid", "{neg_stats}", "{b}"],
                               ["{neg_stats}: sigma has the negative eigenvalue -1", "positive semi-definite"]),
    "fid-asymmetric-sigma": (["fid", "{asym_stats}", "{b}"],
                             ["{asym_stats}: sigma is not symmetric (|sigma - sigma^T| up to 0.5)"]),
    # Third round (issue #36), numbers out of range: refused before any work, the valid range named.
    "fid-bootstrap-negative": (["fid", "{a}", "{b}", "--bootstrap", "-1"],
                               ["--bootstrap='-1' must be >= 0", "valid: 0 (off) or 2 to 10,000 resamples"]),
    "fid-bootstrap-nan": (["fid", "{a}", "{b}", "--bootstrap", "nan"],
                          ["--bootstrap='nan' is not a finite number", "valid: 0 (off) or 2 to 10,000"]),
    "fid-bootstrap-1e9": (["fid", "{a}", "{b}", "--bootstrap", "1000000000"],
                          ["--bootstrap='1000000000' must be >= 0 and <= 10000", "valid: 0 (off) or 2 to 10,000"]),
    "fid-bootstrap-one": (["fid", "{a}", "{b}", "--bootstrap", "1"], ["--bootstrap=1: 1 resample has no spread"]),
    "fid-unknown-option": (["fid", "{a}", "{b}", "--bootstrapp", "3"],
                           ["unrecognized arguments: --bootstrapp 3; see python -m experiments fid --help"]),
    "bench-schemes-empty": (["bench", "--schemes", "", "--out", "{root}/bench"],
                            ["--schemes '' names no scheme; valid: all, or a comma list of", "siamese"]),
    "bench-schemes-commas": (["bench", "--schemes", ",", "--out", "{root}/bench"], ["--schemes ',' names no scheme"]),
    "bench-steps-zero": (["bench", "--steps", "0", "--out", "{root}/bench"],
                         ["--steps='0' must be >= 1 and <= 10000 (command line)"]),
    "bench-steps-1e9": (["bench", "--steps", "1e9", "--out", "{root}/bench"], ["--steps='1e9' must be >= 1 and <= "]),
    "bench-warmup-nan": (["bench", "--warmup", "nan", "--out", "{root}/bench"],
                         ["--warmup='nan' is not a finite number (command line)"]),
    "bench-widths-huge": (["bench", "--scaling", "--widths", "128,99999999", "--out", "{root}/bench"],
                          ["--widths '128,99999999'; valid: integers from 1 to 65536"]),
    "bench-unknown-option": (["bench", "--stepz", "3"], ["unrecognized arguments: --stepz 3; see python -m "]),
    "compare-baseline-absent": (["compare", "{root}/sweep-dir", "--baseline", "bogus"],
                                ["--baseline bogus: not a scheme of this sweep; valid: "]),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(OPTION_CASES))
def test_a_bad_option_or_statistics_file_is_one_line_before_any_work(case, world, capsys):
    """Exit 2, one line naming the value and what is valid, and nothing written or changed anywhere."""
    args, needles = OPTION_CASES[case]
    if case.startswith("compare") and not (world["root"] / "sweep-dir").exists():
        (world["root"] / "sweep-dir" / "pre").mkdir(parents=True)
        (world["root"] / "sweep-dir" / "pre" / "summary.json").write_text('{"status": "finished"}')
    before = tree_hashes(world["root"])
    line = error_line(in_world(args, world), capsys)
    for needle in needles:
        assert needle.format(**world) in line, line
    assert tree_hashes(world["root"]) == before


def test_the_real_command_line_exits_2_without_a_traceback(world):
    """A tool's bad option as a user types it: a separate process, status 2, one line, the value named (every
    tool's cases run in this process above; test_command_line_prints_one_line_and_exits_2 is fit's process)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    before = tree_hashes(world["root"])
    for args, needle in [
        (["sweep", str(world["spec"]), "--budget", "tokens=1e400"], "error: budget.tokens='1e400' is not a finite"),
    ]:
        proc = subprocess.run([sys.executable, "-m", "experiments", *args], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=300)  # fmt: skip
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
        assert proc.stderr.strip().splitlines()[-1].startswith(needle), proc.stderr
    assert tree_hashes(world["root"]) == before


def test_save_real_stats_replaces_a_file_only_with_overwrite(world, monkeypatch, tmp_path, capsys):
    import experiments.evaluation.fid.weights as fid_weights

    monkeypatch.setattr(fid_weights, "locate_fid_helper_torchscript", lambda: None)  # the fast proxy network
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path / "hub"))
    stats = tmp_path / "real.npz"
    stats.write_bytes(b"mine")
    args = ["fid", str(world["a"]), str(world["b"]), "--feature", "64", "--no-progress"]
    args += ["--save-real-stats", str(stats)]
    assert "exists; valid: another path, or --overwrite" in error_line(args, capsys)
    assert stats.read_bytes() == b"mine"
    # --overwrite replaces only statistics an earlier --save-real-stats wrote: not the user's own file
    assert "--overwrite replaces only such a file" in error_line([*args, "--overwrite"], capsys)
    assert stats.read_bytes() == b"mine"
    stats.unlink()
    main(args)
    main([*args, "--overwrite"])
    assert np.load(stats, allow_pickle=False)["features"].shape == (4, 64)


def test_two_save_real_stats_into_one_file_the_first_wins_whole(world, monkeypatch, tmp_path, capsys):
    """Issue #36, concurrency: two ``fid --save-real-stats`` writing one new file. The other process finishes
    first (simulated: it writes while this one computes); this one says so, and the file stays the other's."""
    import experiments.evaluation.fid.weights as fid_weights
    import experiments.evaluation.generation as generation

    monkeypatch.setattr(fid_weights, "locate_fid_helper_torchscript", lambda: None)  # the fast proxy network
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path / "hub"))
    stats = tmp_path / "out" / "real.npz"
    compute = generation.score_against

    def the_other_finishes_first(*args, **kwargs):
        result = compute(*args, **kwargs)
        stats.parent.mkdir(exist_ok=True)
        stats.write_bytes(b"the other process's whole file")
        return result

    monkeypatch.setattr(generation, "score_against", the_other_finishes_first)
    args = [
        "fid",
        str(world["a"]),
        str(world["b"]),
        "--feature",
        "64",
        "--no-progress",
        "--save-real-stats",
        str(stats),
    ]
    line = error_line(args, capsys)
    assert f"{stats} was written by another process while this one worked; it is left as it is" in line
    assert stats.read_bytes() == b"the other process's whole file"
    assert sorted(p.name for p in stats.parent.iterdir()) == ["real.npz"]  # no temp file left


#################################################################################
#          Second round: prompts, run directories that are links                 #
#################################################################################


def test_an_undecodable_prompt_names_the_option(tmp_path: Path, corpus, capsys):
    """A prompt typed in another encoding arrives as a lone surrogate ('\\udce9' for the byte 0xE9)."""
    line = error_line(lm(tmp_path, corpus, '--data.init_args.prompts=["caf\udce9 au lait"]', sub="predict"), capsys)
    assert line.startswith("error: --data.init_args.prompts (command line) holds a byte that is not UTF-8 at ")
    assert "character 5" in line and "valid: UTF-8 text" in line
    assert not (tmp_path / "runs").exists()
    # From a config file or Python the datamodule names the prompt itself.
    with pytest.raises(
        ValueError, match=r"^data\.init_args\.prompts\[1\] holds a byte that is not UTF-8 at character 0"
    ):
        TextDataModule(source=str(corpus[0]), prompts=["fine", "\udcff"])


def test_overwrite_refuses_a_run_directory_that_is_a_link(tmp_path: Path, corpus, capsys):
    elsewhere = tmp_path / "big-disk" / "pre"
    main(lm(tmp_path, corpus, "--trainer.max_steps=1", "--trainer.limit_val_batches=1",
            "--trainer.num_sanity_val_steps=0", "--run_name=pre"))  # fmt: skip
    shutil.move(tmp_path / "runs" / "lm" / "tiny" / "pre", elsewhere)
    (tmp_path / "runs" / "lm" / "tiny" / "pre").symlink_to(elsewhere, target_is_directory=True)
    before = tree_hashes(tmp_path / "runs", tmp_path / "big-disk")
    line = error_line(lm(tmp_path, corpus, "--trainer.max_steps=1", "--overwrite"), capsys)
    link = tmp_path / "runs" / "lm" / "tiny" / "pre"
    assert f"--overwrite: run directory {link} is a symbolic link (to {elsewhere}); it is left as it is" in line
    assert link.is_symlink() and tree_hashes(tmp_path / "runs", tmp_path / "big-disk") == before


# Every tool of ``python -m experiments`` reads its options with the suite's parser: an unknown or missing option
# is the same one ``error:`` line as a bad value, not argparse's usage block (which names no help to read).
@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["sweep", "configs/sweeps/demo.yaml", "--nope"], "unrecognized arguments: --nope"),
        (["compare"], "the following arguments are required: sweep_dir"),
        (["readme", "--nope"], "unrecognized arguments: --nope"),
        (["prune"], "the following arguments are required: --ckpt"),
        (["logit-lens"], "the following arguments are required: --ckpt"),
        (["evaluate"], "the following arguments are required: --ckpt"),
        (["lm-eval"], "the following arguments are required: --ckpt"),
        (["export"], "the following arguments are required"),
        (["bench", "--nope"], "unrecognized arguments: --nope"),
    ],
    ids=lambda v: v[0] if isinstance(v, list) else None,
)
def test_every_tools_bad_option_is_one_line_naming_its_help(argv: list[str], needle: str, capsys):
    line = error_line(argv, capsys)
    assert needle in line and line.endswith(f"; see python -m experiments {argv[0]} --help"), line
    assert "usage:" not in capsys.readouterr().err
