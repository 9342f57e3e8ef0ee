"""Faults: exact resume, corrupt checkpoints, SIGTERM / Ctrl-C mid-fit, unwritable output, atomic writes, EMA state."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from experiments.__main__ import main
from experiments.reliability.checkpointing import (
    INTERRUPTED_NAME,
    AtomicCheckpointIO,
    checkpoint_problem,
    resolve_checkpoint,
)
from experiments.reliability.errors import SIGINT_EXIT, SIGTERM_EXIT, CheckpointError, OutputDirError
from experiments.tasks.optim import OptimConfig
from models import TrunkConfig
from tests.experiments.tiny import tiny_lm

ROOT = Path(__file__).resolve().parents[2]
K = 4  # the interrupted run stops after K steps; the uninterrupted one runs 2K


def lm_args(runs: Path, corpus: tuple[Path, Path], *extra: str) -> list[str]:
    text, shards = corpus
    return [
        "fit", "-c", str(ROOT / "configs/lm/tiny.yaml"),
        f"--runs_root={runs}", f"--data.init_args.source={text}", f"--data.init_args.data_dir={shards}",
        *tiny_lm(eval_samples=8), "--trainer.limit_val_batches=1", "--trainer.num_sanity_val_steps=0",
        "--summary.log_every_n_steps=1",
        *extra,
    ]  # fmt: skip


def run_dir(runs: Path) -> Path:
    return runs / "lm" / "tiny" / "pre"


def summary(runs: Path) -> dict:
    return json.loads((run_dir(runs) / "summary.json").read_text())


#################################################################################
#                                  Exact resume                                  #
#################################################################################


@pytest.fixture(scope="module")
def interrupted_run(tmp_path_factory, corpus) -> Path:
    """A run stopped after K steps (last.ckpt at step K, a best checkpoint at step K/2)."""
    runs = tmp_path_factory.mktemp("interrupted")
    main(lm_args(runs, corpus, *RESUME_ARGS, f"--trainer.max_steps={K}"))
    return runs


# Warmup covers the first K steps, so a run told max_steps=K follows the same LR as one told 2K (the
# cosine part depends on max_steps); drop_path draws from the global RNG every step.
RESUME_ARGS = (
    f"--model.init_args.optim.warmup_steps={K}",
    f"--trainer.val_check_interval={K // 2}",
    "--model.init_args.trunk.drop_path=0.1",
)


@pytest.mark.slow
def test_resume_continues_the_uninterrupted_trajectory(tmp_path: Path, corpus, interrupted_run: Path):
    main(lm_args(tmp_path / "full", corpus, *RESUME_ARGS, f"--trainer.max_steps={2 * K}"))
    resumed = tmp_path / "resumed"
    shutil.copytree(interrupted_run, resumed)
    main(lm_args(resumed, corpus, *RESUME_ARGS, f"--trainer.max_steps={2 * K}", "--ckpt_path=last"))
    full, again = summary(tmp_path / "full"), summary(resumed)
    assert [s for s, _ in full["train_curve"]] == list(range(1, 2 * K + 1))
    # Same windows in the same order, same dropout draws, same LR schedule: bit-identical losses on CPU.
    assert again["train_curve"] == full["train_curve"]
    assert again["val_curve"] == full["val_curve"]
    assert again["status"] == "finished" and again["steps"] == 2 * K


def vit_args(runs: Path, *extra: str) -> list[str]:
    """The tiny ViT shrunk to 64 training images in batches of 8: an epoch is 8 steps."""
    return [
        "fit", "-c", str(ROOT / "configs/vit/tiny.yaml"), f"--runs_root={runs}",
        "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
        "--model.init_args.trunk.dim=16", "--model.init_args.trunk.depth=1", "--model.init_args.trunk.num_heads=2",
        "--model.init_args.trunk.drop_path=0.1", "--model.init_args.optim.warmup_steps=5",
        "--data.init_args.batch_size=8", "--data.init_args.limit_train=64", "--data.init_args.val_size=16",
        "--trainer.val_check_interval=5", "--trainer.limit_val_batches=1", "--trainer.num_sanity_val_steps=0",
        "--summary.log_every_n_steps=1", *extra,
    ]  # fmt: skip


@pytest.mark.slow
def test_image_task_resumed_mid_epoch_continues_the_uninterrupted_trajectory(tmp_path: Path):
    # Stopped at step 5 of an 8-step epoch and resumed to step 10 (across the epoch boundary): the same
    # images in the same order, the same crop / flip / drop-path draws, as the run that never stopped.
    main(vit_args(tmp_path / "full", "--trainer.max_steps=10"))
    main(vit_args(tmp_path / "part", "--trainer.max_steps=5"))
    main(vit_args(tmp_path / "part", "--trainer.max_steps=10", "--ckpt_path=last"))
    (full,) = [json.loads(p.read_text()) for p in (tmp_path / "full").rglob("summary.json")]
    (again,) = [json.loads(p.read_text()) for p in (tmp_path / "part").rglob("summary.json")]
    assert [s for s, _ in full["train_curve"]] == list(range(1, 11))
    assert again["train_curve"] == full["train_curve"]
    assert again["status"] == "finished" and again["steps"] == 10


def test_checkpoint_holds_rng_and_the_samplers_position(interrupted_run: Path):
    ckpt = torch.load(run_dir(interrupted_run) / "checkpoints" / "last.ckpt", weights_only=True)
    state = ckpt["exact_resume"]
    assert state["sampler"] == {"seed": 1234, "epoch": 0, "offset": K * 8}  # K batches of 8 windows consumed
    assert state["rng"]["torch"].dtype == torch.uint8
    assert len(ckpt["callbacks"]["RunSummary"]["train_curve"]) == K  # the resumed summary keeps its curve


#################################################################################
#                               Corrupt checkpoints                              #
#################################################################################


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def test_last_skips_a_truncated_checkpoint_and_says_which_file_it_took(tmp_path: Path, corpus, interrupted_run: Path):
    runs = tmp_path / "runs"
    shutil.copytree(interrupted_run, runs)
    ckpts = run_dir(runs) / "checkpoints"
    last = ckpts / "last.ckpt"
    good = next(p for p in ckpts.glob("epoch=*.ckpt"))  # the best checkpoint (val/loss)
    good_step = torch.load(good, weights_only=True)["global_step"]
    truncate(last)
    assert "truncated" in checkpoint_problem(last)
    with pytest.raises(CheckpointError, match="truncated"):
        AtomicCheckpointIO().load_checkpoint(last)
    took = rf"--ckpt_path last: resuming from {good} \(skipped unreadable {last.name}\)"
    with pytest.warns(UserWarning, match=took):
        assert resolve_checkpoint("last", ckpts) == str(good)
    with pytest.warns(UserWarning, match=took):
        main(lm_args(runs, corpus, *RESUME_ARGS, f"--trainer.max_steps={good_step + 1}", "--ckpt_path=last"))
    assert summary(runs)["steps"] == good_step + 1  # resumed from the good checkpoint, not from scratch


def test_a_named_unreadable_checkpoint_is_refused_and_names_the_good_one(
    tmp_path: Path, corpus, interrupted_run: Path, capsys
):
    runs = tmp_path / "runs"
    shutil.copytree(interrupted_run, runs)
    ckpts = run_dir(runs) / "checkpoints"
    last, good = ckpts / "last.ckpt", next(ckpts.glob("epoch=*.ckpt"))
    truncate(last)
    before = summary(runs)
    with pytest.raises(SystemExit) as exit_info:
        main(lm_args(runs, corpus, *RESUME_ARGS, f"--trainer.max_steps={2 * K}", f"--ckpt_path={last}"))
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Traceback" not in err
    (line,) = [x for x in err.splitlines() if x.startswith("error:")]
    assert f"checkpoint {last} is truncated" in line and f"newest readable checkpoint beside it is {good}" in line
    assert summary(runs) == before  # nothing trained, nothing written


def test_truncated_checkpoint_without_fallback_is_one_line(tmp_path: Path, corpus, interrupted_run: Path, capsys):
    lone = tmp_path / "lone" / "last.ckpt"
    lone.parent.mkdir()
    shutil.copy(run_dir(interrupted_run) / "checkpoints" / "last.ckpt", lone)
    truncate(lone)
    with pytest.raises(SystemExit) as exit_info:
        main(lm_args(tmp_path / "runs", corpus, f"--ckpt_path={lone}"))
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Traceback" not in err
    (line,) = [x for x in err.splitlines() if x.startswith("error:")]
    assert str(lone) in line and "truncated" in line and "beside it" not in line


@pytest.mark.parametrize("sub", ["validate", "test", "predict"])
def test_evaluating_last_without_a_checkpoint_is_an_error(sub: str, tmp_path: Path, corpus, capsys):
    args = [sub, *lm_args(tmp_path / "runs", corpus, "--ckpt_path=last")[1:]]
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    (line,) = [x for x in err.splitlines() if x.startswith("error:")]
    assert f"--ckpt_path last: no readable checkpoint in {run_dir(tmp_path / 'runs') / 'checkpoints'}" in line
    assert f"{sub} needs a trained model" in line
    assert not (tmp_path / "runs").exists()  # refused before anything was written


def test_atomic_save_keeps_the_previous_file_when_a_write_fails(tmp_path: Path):
    io = AtomicCheckpointIO()
    path = tmp_path / "last.ckpt"
    io.save_checkpoint({"step": 1}, path)
    with pytest.raises(Exception, match="lambda|pickle"):
        io.save_checkpoint({"step": 2, "bad": lambda: 0}, path)  # fails halfway through torch.save
    assert io.load_checkpoint(path) == {"step": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]  # no temp file left behind
    (tmp_path / "file").write_text("")
    with pytest.raises(CheckpointError, match="could not write checkpoint .*previous checkpoint is untouched"):
        io.save_checkpoint({"step": 3}, tmp_path / "file" / "x.ckpt")


#################################################################################
#                            SIGTERM / Ctrl-C mid-fit                            #
#################################################################################


def wait_for(path: Path, proc: subprocess.Popen | None = None, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout  # generous: a busy machine starts Python slowly
    while not path.exists():
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"the run ended (status {proc.returncode}) before {path} appeared")
        if time.monotonic() > deadline:
            pytest.fail(f"{path} did not appear within {timeout} s")
        time.sleep(0.2)


@pytest.mark.slow
def test_sigterm_saves_a_resumable_checkpoint_and_exits_143(tmp_path: Path, corpus):
    runs = tmp_path / "runs"
    args = lm_args(runs, corpus, "--trainer.val_check_interval=2", "--trainer.max_steps=100000")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "experiments", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for(run_dir(runs) / "checkpoints" / "last.ckpt", proc)  # training is under way
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    err = err.decode()
    assert proc.returncode == SIGTERM_EXIT, err[-2000:]
    assert "Traceback" not in err
    interrupted = run_dir(runs) / "checkpoints" / INTERRUPTED_NAME
    (line,) = [x for x in err.splitlines() if x.startswith("error:")]
    assert "interrupted by SIGTERM at step" in line and str(interrupted) in line
    stopped = summary(runs)
    assert stopped["status"] == "interrupted" and checkpoint_problem(interrupted) is None
    step = stopped["steps"]
    # The same command with --ckpt_path last picks the interrupted checkpoint (the newest) and goes on.
    main(lm_args(runs, corpus, "--trainer.val_check_interval=2", f"--trainer.max_steps={step + 2}", "--ckpt_path=last"))
    resumed = summary(runs)
    assert resumed["status"] == "finished" and resumed["steps"] == step + 2
    assert [s for s, _ in resumed["train_curve"]] == list(range(1, step + 3))


def test_first_ctrl_c_finishes_the_step_saves_and_exits_130(tmp_path: Path, corpus, capsys):
    runs = tmp_path / "runs"
    last = run_dir(runs) / "checkpoints" / "last.ckpt"

    def interrupt_when_training() -> None:
        deadline = time.monotonic() + 60
        while not last.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)  # delivered to the main thread, inside trainer.fit

    handler_before = signal.getsignal(signal.SIGINT)  # SIG_IGN when pytest itself runs as a background job
    watcher = threading.Thread(target=interrupt_when_training, daemon=True)
    watcher.start()
    with pytest.raises(SystemExit) as exit_info:
        main(lm_args(runs, corpus, "--trainer.val_check_interval=2", "--trainer.max_steps=100000"))
    watcher.join()
    assert exit_info.value.code == SIGINT_EXIT
    assert "interrupted by SIGINT at step" in capsys.readouterr().err
    assert checkpoint_problem(run_dir(runs) / "checkpoints" / INTERRUPTED_NAME) is None
    assert summary(runs)["status"] == "interrupted"
    assert signal.getsignal(signal.SIGINT) is handler_before  # the handler was put back


#################################################################################
#                              Unwritable output                                 #
#################################################################################


def test_run_dir_blocked_by_a_file_is_one_line_and_leaves_earlier_runs(tmp_path: Path, corpus, capsys):
    runs = tmp_path / "runs"
    earlier = runs / "lm" / "tiny" / "other" / "summary.json"
    earlier.parent.mkdir(parents=True)
    earlier.write_text('{"status": "finished"}')
    (runs / "lm" / "blocked").write_text("a file where the experiment directory should be")
    with pytest.raises(SystemExit) as exit_info:
        main(lm_args(runs, corpus, "--experiment=blocked", "--trainer.max_steps=1"))
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Traceback" not in err
    (line,) = [x for x in err.splitlines() if x.startswith("error:")]
    assert f"{runs / 'lm' / 'blocked'} is a file" in line
    assert earlier.read_text() == '{"status": "finished"}'
    assert sorted(p.name for p in (runs / "lm").iterdir()) == ["blocked", "tiny"]


def test_full_disk_is_caught_before_training(tmp_path: Path, monkeypatch):
    from experiments.reliability.errors import describe
    from experiments.reliability.layout import ensure_writable

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    # The probe write hits a full disk.
    monkeypatch.setattr("experiments.reliability.layout.open", full_disk, raising=False)
    with pytest.raises(OutputDirError) as err:
        ensure_writable(tmp_path / "runs" / "lm" / "tiny" / "pre")
    assert describe(err.value) == (
        2,
        f"cannot write to run directory {tmp_path}/runs/lm/tiny/pre: No space left on device",
    )
    assert list((tmp_path / "runs" / "lm" / "tiny" / "pre").iterdir()) == []  # no probe left behind


def test_read_only_runs_root_is_one_line(tmp_path: Path, corpus, capsys, monkeypatch):
    runs = tmp_path / "ro"
    runs.mkdir(mode=0o500)
    if os.geteuid() == 0:  # root (CI) writes through permissions: refuse inside ``runs`` as the kernel does others
        real_mkdir = os.mkdir

        def read_only_mkdir(path, *args, **kwargs):
            if Path(path).is_relative_to(runs):
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
            return real_mkdir(path, *args, **kwargs)

        monkeypatch.setattr(os, "mkdir", read_only_mkdir)
    with pytest.raises(SystemExit) as exit_info:
        main(lm_args(runs, corpus, "--trainer.max_steps=1"))
    assert exit_info.value.code == 2
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error:")]
    assert line == f"error: cannot write to run directory {run_dir(runs)}: Permission denied"
    assert list(runs.iterdir()) == []  # nothing written


#################################################################################
#                                EMA in checkpoints                              #
#################################################################################


def test_ema_is_part_of_the_state_dict_and_frozen():
    from experiments.tasks.vit import ImageClassification

    trunk = TrunkConfig(dim=16, depth=1, num_heads=2)
    module = ImageClassification(trunk, OptimConfig(), num_classes=3, img_size=8, patch_size=4, ema_decay=0.9)
    keys = module.state_dict().keys()
    assert {f"ema.module.{k}" for k in module.net.state_dict()} <= set(keys)  # checkpointed with the weights
    module.setup("fit")
    assert not any(p.requires_grad for p in module.ema.parameters())  # DDP must not wait for EMA gradients
    assert all(p.requires_grad for p in module.net.parameters())


def test_last_takes_a_sharded_folder_a_killed_two_rename_publish_left_aside(tmp_path: Path, monkeypatch):
    """Where the file system cannot exchange two folders, a save renames the old one aside first; killed between
    its two renames, the previous checkpoint is only there, and ``--ckpt_path last`` still finds it."""
    import experiments.reliability.checkpointing as checkpointing
    from experiments.reliability.checkpointing import newest_readable

    monkeypatch.setattr(checkpointing, "checkpoint_problem", lambda path: None)  # (any folder reads, here)
    older = tmp_path / "epoch=0-step=2.ckpt"
    older.mkdir()
    (older / "meta.pt").write_bytes(b"")
    aside = tmp_path / ".last.ckpt.save.0a1b2c3d.partial.previous"
    aside.mkdir()
    time.sleep(0.01)
    (aside / "meta.pt").write_bytes(b"")
    assert newest_readable(tmp_path) == aside
    (tmp_path / "last.ckpt").mkdir()  # once last.ckpt is back, the aside folder is no candidate
    assert newest_readable(tmp_path) != aside
