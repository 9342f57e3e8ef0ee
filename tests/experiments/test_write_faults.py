"""Faults in the middle of a write: SIGKILL inside a checkpoint (a file or a sharded folder) or a summary, and a
full disk inside a sharded save. The previous file stays byte for byte, nothing half-written takes its name, and
``--ckpt_path last`` resumes from the newest complete checkpoint.

The kills are real (``tests/experiments/kill_inside_write.py``: SIGKILL at the N-th fsync of a matching file,
after cutting it in half), through the real command line.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from experiments.__main__ import main
from experiments.reliability.checkpointing import resolve_checkpoint
from experiments.reliability.safe_load import load_checkpoint
from experiments.reliability.sharded import sharded_problem
from tests.experiments.kill_inside_write import digest
from tests.experiments.tiny import tiny_lm

pytestmark = pytest.mark.slow  # one suite process at a time per test: no need to keep it apart from the others

ROOT = Path(__file__).resolve().parents[2]
KILLER = ROOT / "tests" / "experiments" / "kill_inside_write.py"
SHARDED = [
    "--trainer.strategy=experiments.reliability.sharded.ModelParallelStrategy",
    "--trainer.strategy.data_parallel_size=1", "--trainer.strategy.tensor_parallel_size=1",
    "--trainer.strategy.save_distributed_checkpoint=true", "--trainer.devices=1", "--trainer.precision=32-true",
]  # fmt: skip
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    import pydoc_data.topics

    text = tmp_path_factory.mktemp("text") / "corpus.txt"
    text.write_text("".join(pydoc_data.topics.topics.values())[:100_000])
    return text


def fit(runs: Path, corpus: Path, *extra: str, steps: int = 6) -> list[str]:
    """The tiny LM's fit, validated (and so checkpointed: best and last.ckpt) every 2 steps."""
    return [
        "fit", "-c", str(ROOT / "configs/lm/tiny.yaml"), "-c", str(ROOT / "configs/norm/pre.yaml"),
        f"--runs_root={runs}", f"--data.init_args.source={corpus}", f"--data.init_args.data_dir={runs.parent / 'data'}",
        "--trainer.accelerator=cpu", *tiny_lm(), f"--trainer.max_steps={steps}", "--trainer.val_check_interval=2",
        "--trainer.limit_val_batches=1", "--trainer.num_sanity_val_steps=0", "--summary.log_every_n_steps=1", *extra,
    ]  # fmt: skip


def killed_inside(pattern: str, count: int, argv: list[str], report: Path) -> dict:
    """Runs ``argv`` until the ``count``-th fsync of a file matching ``pattern``; asserts SIGKILL; the report."""
    cmd = [sys.executable, str(KILLER), pattern, str(count), str(report), "--", *argv]
    done = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    assert done.returncode == -9, done.stderr[-3000:]
    return json.loads(report.read_text())


def run_dir(runs: Path) -> Path:
    return runs / "lm" / "tiny" / "pre"


def test_sigkill_inside_a_sharded_save_keeps_the_previous_folder_and_resume_takes_the_newest(tmp_path, corpus):
    runs = tmp_path / "runs"
    ckpts = run_dir(runs) / "checkpoints"
    # The second save of last.ckpt (step 4), killed halfway through its first shard.
    report = killed_inside(r"/\.last\.ckpt\.save\.[^/]*\.partial/__0_0\.distcp$", 2, fit(runs, corpus, *SHARDED),
                           tmp_path / "kill.json")  # fmt: skip
    assert report["live"] == str(ckpts / "last.ckpt") and report["sha256"] is not None
    assert digest(ckpts / "last.ckpt") == report["sha256"]  # the step-2 folder, byte for byte: no shard mixed in
    assert sharded_problem(ckpts / "last.ckpt") is None
    assert [p.name for p in ckpts.glob(".*.partial")] == [Path(report["writing"]).parent.name]  # hidden, not *.ckpt
    # (the step-4 best checkpoint was published whole before the kill: it is the newest complete save)
    newest = Path(resolve_checkpoint("last", ckpts))
    assert newest.name == "epoch=0-step=4.ckpt" and load_checkpoint(newest)["global_step"] == 4

    # The resume runs with HOME on a read-only file system: the suite keeps nothing there, so it trains and ends.
    home = tmp_path / "home"
    home.mkdir()
    read_only_mount(home, tmpfs=True)
    try:
        argv = [sys.executable, "-m", "experiments", *fit(runs, corpus, *SHARDED), "--ckpt_path=last"]
        resumed = subprocess.run(argv, cwd=ROOT, env={**ENV, "HOME": str(home)}, capture_output=True, text=True,
                                 timeout=600)  # fmt: skip
    finally:
        subprocess.run(["umount", str(home)], check=False, capture_output=True)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"--ckpt_path last: resuming from {ckpts / 'epoch=0-step=4.ckpt'}" in resumed.stderr
    assert not list(ckpts.glob(".*.partial"))  # the killed save's leftovers went with the next save
    summary = json.loads((run_dir(runs) / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["steps"] == 6
    assert load_checkpoint(ckpts / "last.ckpt")["global_step"] == 6


def test_sigkill_inside_a_checkpoint_file_keeps_the_previous_file(tmp_path, corpus):
    runs = tmp_path / "runs"
    ckpts = run_dir(runs) / "checkpoints"
    report = killed_inside(r"/\.last\.ckpt\.\d+\.[0-9a-f]+\.tmp$", 2, fit(runs, corpus), tmp_path / "kill.json")
    assert report["live"] == str(ckpts / "last.ckpt") and digest(ckpts / "last.ckpt") == report["sha256"]
    assert load_checkpoint(ckpts / "last.ckpt")["global_step"] == 2
    half = Path(report["writing"])
    assert half.exists() and half.name.startswith(".") and half.suffix == ".tmp"  # under no name a reader takes
    newest = Path(resolve_checkpoint("last", ckpts))
    steps = [load_checkpoint(p)["global_step"] for p in ckpts.glob("*.ckpt")]
    assert load_checkpoint(newest)["global_step"] == max(steps)


def test_sigkill_inside_a_summary_write_keeps_the_previous_summary(tmp_path, corpus):
    runs = tmp_path / "runs"
    summary = run_dir(runs) / "summary.json"
    report = killed_inside(r"/\.summary\.json\.\d+\.[0-9a-f]+\.tmp$", 3, fit(runs, corpus), tmp_path / "kill.json")
    assert report["live"] == str(summary) and digest(summary) == report["sha256"]
    assert json.loads(summary.read_text())["status"] == "running"  # whole JSON: the last one written before the kill


#################################################################################
#                        A full disk inside a sharded save                      #
#################################################################################


def test_a_full_disk_inside_a_sharded_save_is_one_line_and_the_previous_folder_stands(small_disk, corpus):
    runs = small_disk / "runs"
    ckpts = run_dir(runs) / "checkpoints"
    filler = small_disk / "filler"

    def fill_once_saved() -> None:  # once the first sharded last.ckpt is out, leave less room than a shard needs
        deadline = time.monotonic() + 300
        while not (ckpts / "last.ckpt" / "meta.pt").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        try:
            with open(filler, "wb") as fh:
                while True:
                    fh.write(b"\0" * (1 << 16))
                    fh.flush()
        except OSError as err:
            assert err.errno == errno.ENOSPC
        # 128 KiB: the summaries and event files of the next steps fit, the next save's ~600 KB shard does not
        os.truncate(filler, max(filler.stat().st_size - (1 << 17), 0))

    thread = threading.Thread(target=fill_once_saved, daemon=True)
    thread.start()
    argv = fit(runs, corpus, *SHARDED, steps=100_000)
    done = subprocess.run([sys.executable, "-m", "experiments", *argv], cwd=ROOT, env=ENV, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    thread.join(timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("error:")]
    assert line.startswith(f"error: disk full while writing to {run_dir(runs)} (") and " free on its file " in line
    newest = Path(line.split("the newest good checkpoint is ")[1].split(" (it loads")[0])
    assert not list(ckpts.glob(".*.partial"))  # the failed save's temp folder is gone
    filler.unlink()  # room for the consolidated copy a read makes
    assert sharded_problem(newest) is None and load_checkpoint(newest)["global_step"] >= 2


#################################################################################
#                    Read-only places: the run directory, HOME                  #
#################################################################################


def read_only_mount(path: Path, tmpfs: bool = False) -> None:
    """Makes ``path`` read-only for root too (a read-only bind mount, or a fresh read-only tmpfs); or skips."""
    steps = (
        [["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(path)]]
        if tmpfs
        else [["mount", "--bind", str(path), str(path)], ["mount", "-o", "remount,bind,ro", str(path)]]
    )
    for step in steps:
        try:
            subprocess.run(step, check=True, capture_output=True)
        except (OSError, subprocess.CalledProcessError) as err:
            reason = getattr(err, "stderr", b"") or str(err).encode()
            pytest.skip(f"cannot mount read-only here: {reason.decode().strip()[:200]}")


def test_a_read_only_run_directory_is_refused_before_training(tmp_path, corpus, capsys):
    runs = tmp_path / "runs"
    main(fit(runs, corpus, steps=2))
    run = run_dir(runs)
    before = digest(run)
    read_only_mount(run)
    try:
        for sub in ("fit", "test"):  # (in this process: a refusal needs no fresh interpreter)
            with pytest.raises(SystemExit) as exit_info:
                main([sub, *fit(runs, corpus, steps=4)[1:], "--ckpt_path=last"])
            err = capsys.readouterr().err
            assert exit_info.value.code == 2 and "Traceback" not in err, err[-3000:]
            (line,) = [x for x in err.splitlines() if x.startswith("error:")]
            assert line == f"error: cannot write to run directory {run}: Read-only file system", line
            assert "Trainer.fit" not in err and "Restoring" not in err  # refused before any work
    finally:
        subprocess.run(["umount", str(run)], check=False, capture_output=True)
    assert digest(run) == before
