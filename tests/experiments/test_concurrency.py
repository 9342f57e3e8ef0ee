"""Issue #36, concurrency: two sweeps on one spec share the grid (each run claimed under the run lock, none
trained twice, none deleted or reported as crashed by the other), and ``compare`` / ``compare --export`` /
``sweep --collect`` beside a running sweep read only the runs nobody writes.

Real processes race here: two ``sweep`` commands started together, whose runs hold at step 1 until the test
lets them go (tests/experiments/racing.py), so every check happens while both are provably running."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from experiments.__main__ import main
from experiments.reliability.run_lock import claim_path, lock_path
from experiments.sweeps import sweep
from tests.conftest import PROCESSES
from tests.experiments.tiny import tiny_lm

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def tree_hashes(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root`` (relative path -> digest)."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def wait_for(condition, what: str, procs: list[subprocess.Popen], timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        for proc in procs:
            if proc.poll() is not None:
                raise AssertionError(f"a sweep ended ({proc.returncode}) before {what}: {proc.stdout.read()[-3000:]}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def write_spec(tmp_path: Path, corpus, *extra: str) -> Path:
    text, shards = corpus
    spec = {
        "name": "race",
        "configs": [str(ROOT / "configs/lm/tiny.yaml")],
        "schemes": ["pre", "post"],
        "lrs": [1e-3],
        "progress_every_s": 1000,
        "runs_root": str(tmp_path / "runs"),
        "args": [*tiny_lm(depth=1, seq_len=16, batch_size=4, eval_samples=8), f"--data.init_args.source={text}",
                 f"--data.init_args.data_dir={shards}", "--trainer.max_steps=2", "--trainer.val_check_interval=2",
                 "--trainer.limit_val_batches=1", "--trainer.num_sanity_val_steps=0", *extra],
    }  # fmt: skip
    path = tmp_path / "race.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.mark.slow
@pytest.mark.xdist_group(PROCESSES)
def test_two_sweeps_on_one_spec_share_the_grid_and_compare_reads_only_finished_runs(tmp_path, corpus, capsys):
    ready, go, fits = tmp_path / "ready", tmp_path / "go", tmp_path / "fits.txt"
    spec = write_spec(
        tmp_path, corpus,
        "--trainer.callbacks+=tests.experiments.racing.RecordFit", f"--trainer.callbacks.record={fits}",
        "--trainer.callbacks+=tests.experiments.racing.HoldUntil", f"--trainer.callbacks.ready_dir={ready}",
        f"--trainer.callbacks.release={go}",
    )  # fmt: skip
    sweep_dir = tmp_path / "runs" / "lm" / "race"
    before = tree_hashes(tmp_path)  # the spec, and the corpus below when it lies here
    before |= {"corpus": hashlib.sha256(corpus[0].read_bytes()).hexdigest()}
    command = [sys.executable, "-m", "experiments", "sweep", str(spec)]
    procs = [
        subprocess.Popen(command, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for _ in range(2)
    ]
    try:
        # One run at a time each, two runs held at once: each sweep holds one, so each skipped the other's.
        wait_for(lambda: ready.is_dir() and len(list(ready.iterdir())) == 2, "both runs holding at step 1", procs)
        runs = {sweep_dir / "pre": tree_hashes(sweep_dir / "pre"), sweep_dir / "post": tree_hashes(sweep_dir / "post")}

        # compare --export beside them: both listed as running, nothing of theirs read, copied or written.
        main(["compare", str(sweep_dir), "--export", str(tmp_path / "export")])
        out = capsys.readouterr().out
        assert "runs: 2 running" in out and "some runs have not finished" in out, out
        assert not list((tmp_path / "export").glob("*/summary.json"))
        assert "| pre | pre | 0.001 | running |" in (tmp_path / "export" / "comparison.md").read_text()
        assert not list(sweep_dir.glob("*/events.out.tfevents.*.sweep_layout"))  # no layout into a running run
        # sweep --collect: nothing finished yet.
        sweep.main(["sweep", str(spec), "--collect"])
        assert "sweep race: no run has finished yet; nothing to compare" in capsys.readouterr().out
        # A third sweep on the spec: both runs in use, both skipped, nothing started, not a crash.
        assert sweep.main(["sweep", str(spec)]) is None
        third = capsys.readouterr()
        for tag in ("[1/2] pre", "[2/2] post"):
            assert f"{tag}: in use by sweep race (pid " in third.out, third.out
        assert "2 run(s) in use by another sweep or command, left to it: pre, post" in third.out
        assert "crashed" not in third.err.lower() and "running (log:" not in third.out
        assert {d: tree_hashes(d) for d in runs} == runs  # the held runs: not one byte changed by any of it
    finally:
        go.touch()
        outputs = [proc.communicate(timeout=300)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], outputs
    both = "\n".join(outputs)
    assert "CRASHED" not in both and "crashed" not in both, both
    for tag in ("[1/2] pre", "[2/2] post"):  # each run started by exactly one of the two sweeps
        assert both.count(f"{tag}: running (log:") == 1, both
    started = fits.read_text().splitlines()
    assert sorted(Path(line.split()[1]).name for line in started) == ["post", "pre"], started  # none twice
    for name in ("pre", "post"):
        assert json.loads((sweep_dir / name / "summary.json").read_text())["status"] == "finished"
        log = (sweep_dir / "logs" / f"{name}.log").read_text()
        assert log.count("run saved to") == 1 and "in use" not in log, log  # one fit, its log not truncated
    after = {k: v for k, v in tree_hashes(tmp_path).items() if k in before}
    assert after | {"corpus": hashlib.sha256(corpus[0].read_bytes()).hexdigest()} == before  # unchanged

    # Finished now: the comparison reads both, the export copies both summaries.
    main(["compare", str(sweep_dir), "--export", str(tmp_path / "export2")])
    assert "runs: 2 finished" in capsys.readouterr().out.replace("stalled", "finished")
    assert sorted(p.parent.name for p in (tmp_path / "export2").glob("*/summary.json")) == ["post", "pre"]


def hold(code: str) -> subprocess.Popen:
    """A process that runs ``code`` (taking a lock), prints ``held`` and sleeps until killed."""
    proc = subprocess.Popen(
        [sys.executable, "-c", f"{code}\nprint('held', flush=True)\nimport time\ntime.sleep(600)"],
        cwd=ROOT, env=ENV, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_run_in_use_is_skipped_and_a_dead_holder_blocks_nothing(tmp_path, corpus, monkeypatch, capsys):
    """A fit still holding its run (its sweep was killed, or started by hand) is left alone by the next sweep; a
    claim or lock whose holder died (SIGKILL: no cleanup ran) is no obstacle: the kernel dropped it."""
    monkeypatch.chdir(ROOT)
    spec = write_spec(tmp_path, corpus)
    run_dir = tmp_path / "runs" / "lm" / "race" / "pre"
    calls = []

    def fake_run(self, argv, **kwargs) -> int:
        calls.append(argv)
        name = "pre" if "configs/norm/pre.yaml" in " ".join(argv) else "post"
        (run_dir.parent / name / "summary.json").write_text(json.dumps({"scheme": name, "status": "finished"}))
        return 0

    monkeypatch.setattr(sweep.Children, "call", fake_run)
    from experiments.results import compare as compare_module

    monkeypatch.setattr(compare_module.plots, "plot_curves", lambda *args, **kwargs: False)  # drawn elsewhere
    sweep.claim_sweep_dir(run_dir.parent, "race", str(spec))  # the sweep whose process was killed made it
    dead_sweep = hold(
        "from pathlib import Path; from experiments.reliability.run_lock import sweep_claim\n"
        f"claim = sweep_claim(Path({str(run_dir)!r}), 'sweep race'); claim.__enter__()"
    )
    fit = hold(
        "from pathlib import Path; from experiments.reliability.run_lock import acquire_run_lock, record_holder\n"
        f"acquire_run_lock(Path({str(run_dir)!r})); record_holder(Path({str(run_dir)!r}), 'fit')"
    )
    try:
        dead_sweep.send_signal(signal.SIGKILL)
        dead_sweep.wait(timeout=60)
        assert claim_path(run_dir).is_file()  # left behind, but nobody holds it
        assert sweep.main(["sweep", str(spec)]) is None
        out = capsys.readouterr().out
        assert f"[1/2] pre: in use by fit (pid {fit.pid} on " in out, out
        assert "[2/2] post: running" in out and len(calls) == 1, out
        assert "1 run(s) in use by another sweep or command, left to it: pre" in out
        assert not run_dir.exists()  # never created, let alone removed, by the sweep that skipped it
    finally:
        fit.send_signal(signal.SIGKILL)  # dies without cleanup: its lock file stays, unheld
        fit.wait(timeout=60)
    assert lock_path(run_dir).is_file()
    assert sweep.main(["sweep", str(spec)]) is None
    out = capsys.readouterr().out
    assert "[1/2] pre: running" in out and "[2/2] post: already done (finished), skipped" in out, out
    assert len(calls) == 2


def test_the_process_launcher_leaves_a_run_with_an_active_submitit_job_alone(tmp_path, corpus, monkeypatch, capsys):
    """A submitit sweep on the same spec recorded a job for `pre` in jobs.json and it is running (its local job
    process alive): a process-launcher sweep started beside it skips `pre` as in use, naming the job."""
    monkeypatch.chdir(ROOT)
    spec = write_spec(tmp_path, corpus)
    sweep_dir = tmp_path / "runs" / "lm" / "race"
    calls = []

    def fake_run(self, argv, **kwargs) -> int:
        calls.append(argv)
        (sweep_dir / "post" / "summary.json").write_text(json.dumps({"scheme": "post", "status": "finished"}))
        return 0

    monkeypatch.setattr(sweep.Children, "call", fake_run)
    from experiments.results import compare as compare_module

    monkeypatch.setattr(compare_module.plots, "plot_curves", lambda *args, **kwargs: False)
    sweep.claim_sweep_dir(sweep_dir, "race", str(spec))
    job = hold("role = 'submitit job'")  # its command line names submitit, as a local job's does in /proc
    try:
        record = {"job_id": str(job.pid), "cluster": "local", "folder": str(sweep_dir / "submitit"), "submitted": 0}
        (sweep_dir / "jobs.json").write_text(json.dumps({"pre": record}))
        assert sweep.main(["sweep", str(spec)]) is None
    finally:
        job.kill()
        job.wait(timeout=60)
    out = capsys.readouterr().out
    assert f"[1/2] pre: in use by local job {job.pid} (running), skipped" in out, out
    assert "[2/2] post: running" in out and len(calls) == 1 and not (sweep_dir / "pre").exists(), out
