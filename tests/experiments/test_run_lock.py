"""One command at a time per run directory, with real processes: a second fit (or a test) into a run that is in
use stops in one line naming the holder's pid; a crashed holder (SIGKILL) leaves nothing stuck, and the run
resumes from its last checkpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from experiments.__main__ import main
from experiments.reliability.checkpointing import resolve_checkpoint
from experiments.reliability.errors import OutputDirError
from experiments.reliability.run_lock import acquire_run_lock, lock_path, record_holder, release_run_locks
from experiments.reliability.safe_load import load_checkpoint
from tests.experiments.tiny import tiny_lm

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def lm(sub: str, runs: Path, corpus, *extra: str) -> list[str]:
    text, shards = corpus
    return [
        sub, "-c", str(ROOT / "configs/lm/tiny.yaml"), f"--runs_root={runs}", f"--data.init_args.source={text}",
        f"--data.init_args.data_dir={shards}", *tiny_lm(depth=1, seq_len=16, batch_size=4, eval_samples=8), *extra,
    ]  # fmt: skip


def wait_for(condition, timeout: float, what: str, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the holder ended ({proc.returncode}) before {what}: {proc.stderr.read()[-3000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.5)


def holder_pid(run_dir: Path) -> int | None:
    try:
        return json.loads(lock_path(run_dir).read_text() or "{}").get("pid")
    except (OSError, ValueError):
        return None


def test_the_lock_in_one_process(tmp_path: Path):
    """The mechanism alone: a second open of the same lock is refused while the first holds it; released, it
    is free again; the holder's JSON is written only when asked (a refused command changes no file)."""
    run_dir = tmp_path / "lm" / "tiny" / "pre"
    code = (f"from pathlib import Path; from experiments.reliability.run_lock import acquire_run_lock; "
            f"acquire_run_lock(Path({str(run_dir)!r}))")  # fmt: skip
    try:
        acquire_run_lock(run_dir)
        assert lock_path(run_dir).read_text() == ""
        record_holder(run_dir, "fit")
        assert json.loads(lock_path(run_dir).read_text())["pid"] == os.getpid()
        other = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=ENV, capture_output=True, text=True)
        assert other.returncode != 0, other.stderr
        assert f"run directory {run_dir} is in use by fit (pid {os.getpid()} on" in other.stderr
    finally:
        release_run_locks()
    ok = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=ENV, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    with pytest.raises(OutputDirError, match="is a file, not a directory"):
        (tmp_path / "afile").write_text("x")
        acquire_run_lock(tmp_path / "afile" / "lm" / "pre")


@pytest.mark.slow
def test_a_second_command_into_a_run_in_use_stops_and_a_crash_leaves_nothing_stuck(tmp_path: Path, corpus, capsys):
    runs = tmp_path / "runs"
    run_dir = runs / "lm" / "tiny" / "pre"
    # The holder: a fit long enough to be caught running; it saves last.ckpt every 5 steps.
    holder = subprocess.Popen(
        [sys.executable, "-m", "experiments", *lm("fit", runs, corpus, "--trainer.max_steps=1000000",
         "--trainer.val_check_interval=5", "--trainer.limit_val_batches=1", "--trainer.num_sanity_val_steps=0")],
        cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_for(lambda: holder_pid(run_dir) == holder.pid, 300, "the holder's lock", holder)
        wait_for(lambda: (run_dir / "checkpoints" / "last.ckpt").is_file(), 300, "a checkpoint", holder)
        # A second fit through the entry point (this process is another process than the holder's): refused at
        # once, naming the directory and the holder.
        with pytest.raises(SystemExit) as second:
            main(lm("fit", runs, corpus))
        err = capsys.readouterr().err
        assert second.value.code == 2 and "Traceback" not in err, err[-3000:]
        last = err.strip().splitlines()[-1]
        assert last.startswith(f"error: run directory {run_dir} is in use by fit (pid {holder.pid} on "), last
        assert "valid: wait for it to end or stop it, or write elsewhere with --run_name NEW" in last
        # A test into the same run would write config.test.yaml and summary.json beside the running fit: refused too.
        with pytest.raises(SystemExit) as exc:
            main(lm("test", runs, corpus))
        assert exc.value.code == 2 and f"is in use by fit (pid {holder.pid}" in capsys.readouterr().err
        assert len(list(run_dir.glob("events.out.tfevents.*"))) == 1  # only the holder's event file
        assert not (run_dir / "config.test.yaml").exists()
    finally:
        holder.send_signal(signal.SIGKILL)  # a crash: no handler runs, no cleanup
        holder.wait(timeout=60)
    # The checkpoint --ckpt_path last resumes from: the newest readable one (the kill may land between a
    # periodic checkpoint and last.ckpt, so last.ckpt need not be the newest).
    step = load_checkpoint(resolve_checkpoint("last", run_dir / "checkpoints"))["global_step"]
    main(lm("fit", runs, corpus, "--ckpt_path=last", f"--trainer.max_steps={step + 2}",
            "--trainer.val_check_interval=1", "--trainer.limit_val_batches=1"))  # fmt: skip
    assert load_checkpoint(run_dir / "checkpoints" / "last.ckpt")["global_step"] == step + 2
    assert holder_pid(run_dir) == os.getpid()  # the resumed fit held it; released on return
    main(lm("test", runs, corpus, "--ckpt_path=last"))  # and the next command gets it
