"""Stopping and failing cleanly beyond fit: SIGTERM / Ctrl-C in test and predict, and a disk that fills up mid-fit.

(SIGTERM and Ctrl-C during fit, and exact resume after them, are in test_reliability.py.)
"""

from __future__ import annotations

import errno
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from lightning.pytorch.callbacks import Callback

from experiments.__main__ import main
from experiments.reliability.errors import SIGINT_EXIT, SIGTERM_EXIT
from experiments.reliability.safe_load import load_checkpoint
from tests.experiments.tiny import tiny_lm

ROOT = Path(__file__).resolve().parents[2]


SENT_AT: list[float] = []  # when SignalAtStart sent its signal (monotonic seconds)


class SignalAtStart(Callback):
    """Sends ``signum`` to this process when the first test / predict batch starts (a real signal, mid-run)."""

    def __init__(self, signum: int = signal.SIGTERM) -> None:
        self.signum = signum

    def _send(self) -> None:
        if not SENT_AT:
            SENT_AT.append(time.monotonic())
            os.kill(os.getpid(), self.signum)

    def on_test_batch_start(self, *args) -> None:
        self._send()

    def on_predict_batch_start(self, *args) -> None:
        self._send()


def lm(sub: str, runs: Path, corpus, *extra: str) -> list[str]:
    text, shards = corpus
    return [
        sub, "-c", str(ROOT / "configs/lm/tiny.yaml"), f"--runs_root={runs}", f"--data.init_args.source={text}",
        f"--data.init_args.data_dir={shards}", *tiny_lm(depth=1, eval_samples=64), *extra,
    ]  # fmt: skip


def stopped(args: list[str], capsys) -> tuple[int, str, float]:
    """Runs the CLI in-process; returns the exit status, the error line and the seconds from signal to exit."""
    SENT_AT.clear()
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    elapsed = time.monotonic() - SENT_AT[0]
    err = capsys.readouterr().err
    assert "Traceback" not in err
    (line,) = [x for x in err.splitlines() if x.startswith("error:")]
    return exit_info.value.code, line, elapsed


SEND = "--trainer.callbacks+=tests.experiments.test_interrupts.SignalAtStart"


def test_sigterm_stops_a_long_generation_between_tokens(tmp_path: Path, corpus, capsys):
    # 100000 new tokens per prompt would take minutes; the flag is read before every token.
    args = lm("predict", tmp_path, corpus, "--model.init_args.max_new_tokens=100000", SEND,
              f"--trainer.callbacks.signum={int(signal.SIGTERM)}")  # fmt: skip
    status, line, elapsed = stopped(args, capsys)
    assert status == SIGTERM_EXIT and "interrupted by SIGTERM during predict" in line
    assert elapsed < 10, f"predict took {elapsed:.1f} s to stop"


def test_ctrl_c_stops_test_after_the_current_batch(tmp_path: Path, corpus, capsys):
    args = lm("test", tmp_path, corpus, "--trainer.limit_test_batches=1.0", SEND,
              f"--trainer.callbacks.signum={int(signal.SIGINT)}")  # fmt: skip
    handler_before = signal.getsignal(signal.SIGINT)
    status, line, elapsed = stopped(args, capsys)
    assert status == SIGINT_EXIT and "interrupted by SIGINT during test" in line
    assert elapsed < 10
    assert signal.getsignal(signal.SIGINT) is handler_before  # the handler was put back
    summary = tmp_path / "lm" / "tiny" / "pre" / "summary.json"
    assert not summary.exists() or "test" not in summary.read_text()  # no partial test result recorded


#################################################################################
#                     A full disk during a checkpoint write                     #
#################################################################################


def fill_when(path: Path, disk: Path, done: threading.Event) -> None:
    """Once ``path`` exists (a good checkpoint), fills ``disk`` until it has no space left."""
    deadline = time.monotonic() + 120
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        with open(disk / "filler", "wb") as fh:
            while True:
                fh.write(b"\0" * (1 << 20))
                fh.flush()
    except OSError as err:
        assert err.errno == errno.ENOSPC
    done.set()


def test_full_disk_mid_fit_is_one_line_naming_the_newest_good_checkpoint(small_disk: Path, corpus, capsys):
    runs = small_disk / "runs"
    run = runs / "lm" / "tiny" / "pre"
    done = threading.Event()
    filler = threading.Thread(target=fill_when, args=(run / "checkpoints" / "last.ckpt", small_disk, done), daemon=True)
    filler.start()
    args = lm("fit", runs, corpus, "--trainer.val_check_interval=2", "--trainer.max_steps=100000",
              "--trainer.limit_val_batches=1", "--trainer.num_sanity_val_steps=0")  # fmt: skip
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    filler.join(timeout=60)
    err = capsys.readouterr().err
    assert done.is_set() and exit_info.value.code == 2 and "Traceback" not in err, err[-2000:]
    (line,) = [x for x in err.splitlines() if x.startswith("error:")]
    assert line.startswith(f"error: disk full while writing to {run} (") and " free on its file system); " in line, line
    assert f"; the newest good checkpoint is {run / 'checkpoints'}" in line, line
    newest = Path(line.split("the newest good checkpoint is ")[1].split(" (it loads")[0])
    assert load_checkpoint(newest)["global_step"] >= 2  # it loads: a resume point survived the full disk
    assert not list((run / "checkpoints").glob(".*.tmp"))  # no half-written temp file left behind
