"""The submitit launcher: a real 2-run sweep through submitit's local executor, one run requeued the way SLURM
does it, against the process launcher; the SLURM job script read back without SLURM."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from experiments.sweeps import sweep
from experiments.sweeps.cluster import fit_job, sbatch_script
from experiments.sweeps.spec import grid, load_specs
from tests.conftest import PROCESSES
from tests.experiments.tiny import tiny_lm

ROOT = Path(__file__).resolve().parents[2]
STEPS = 40


def spec_file(tmp_path: Path, name: str, **keys) -> Path:
    spec = {
        "name": name,
        "configs": [str(ROOT / "configs/lm/tiny.yaml")],
        "schemes": ["pre", "siamese"],
        "runs_root": str(tmp_path / name),
        "parallel": 2,
        "progress_every_s": 1,
        "args": [*tiny_lm(), "--divergence.max_loss=50", f"--data.init_args.data_dir={tmp_path / 'data'}",
                 f"--trainer.max_steps={STEPS}", "--trainer.val_check_interval=10", "--summary.log_every_n_steps=1",
                 "--summary.progress_every_s=0.5", "--trainer.callbacks+=tests.experiments.pacing.Pace",
                 "--trainer.callbacks.seconds=0.08"],
        **keys,
    }  # fmt: skip
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def table_without_wall_time(sweep_dir: Path) -> list[list[str]]:
    """Every table of comparison.md, with the wall-time column of the tables that have one dropped."""
    rows, wall = [], None
    for line in (sweep_dir / "comparison.md").read_text().splitlines():
        if not line.startswith("|"):
            wall = None  # a new table starts after any other line
            continue
        cells = line.split("|")
        if wall is None and " wall_s " in cells:
            wall = cells.index(" wall_s ")
        rows.append([c for i, c in enumerate(cells) if i != wall])
    assert rows, sweep_dir
    return rows


def wait_for(predicate, proc: subprocess.Popen, what: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert proc.poll() is None, f"the sweep ended before {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def step_of(run_dir: Path) -> int:
    try:
        return json.loads((run_dir / "progress.json").read_text())["step"]
    except (OSError, ValueError, KeyError):
        return 0


@pytest.mark.slow
@pytest.mark.xdist_group("processes")  # several busy processes: never beside another such test
def test_local_submitit_sweep_requeues_exactly_and_matches_the_process_launcher(tmp_path: Path, monkeypatch, capsys):
    """Both sweeps run at once (the submitit one in its own process); the submitit run `pre` gets SIGUSR1 at step
    10, is stopped at a step boundary, requeued by submitit and resumed: its curves equal the process launcher's."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # both launchers: one thread per run, so the runs agree bit for bit
    local = spec_file(tmp_path, "jobs", launcher={"kind": "submitit", "cluster": "local", "cpus_per_task": 1,
                                                  "timeout_min": 20, "signal_delay_s": 60})  # fmt: skip
    run_dir = tmp_path / "jobs/lm/jobs/pre"
    proc = subprocess.Popen([sys.executable, "-m", "experiments", "sweep", str(local)], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    signalled: list[int] = []

    def requeue_at_step_10() -> None:  # what `#SBATCH --signal=SIGUSR1@<s>` sends before the time limit
        wait_for(lambda: step_of(run_dir) >= 10 and (run_dir / "job.json").exists(), proc, "step 10 of the pre run")
        os.kill(json.loads((run_dir / "job.json").read_text())["pid"], signal.SIGUSR1)
        signalled.append(step_of(run_dir))

    watcher = threading.Thread(target=requeue_at_step_10, daemon=True)
    watcher.start()
    try:
        sweep.main(["sweep", str(spec_file(tmp_path, "procs"))])
        out = capsys.readouterr().out
        jobs_out, _ = proc.communicate(timeout=900)
    finally:
        proc.kill()
    watcher.join(timeout=5)
    # Live progress (issue 18): a line per running run with step / total, loss, rate and ETA, then the grid's ETA.
    assert re.search(
        rf"\[\d/2\] (pre|siamese): step \d+/{STEPS} \(\d+%\), loss [\d.]+, [\d.]+ steps/s, eta \d\d:\d\d", out
    )
    assert re.search(r"sweep procs: \d done, \d running, \d waiting; eta \d\d:\d\d \(grid\)", out), out
    assert proc.returncode == 0 and signalled and signalled[0] < STEPS, jobs_out
    assert re.search(rf"\[1/2\] pre: step \d+/{STEPS}", jobs_out), jobs_out  # the waiting sweep shows progress too
    job = json.loads((run_dir / "job.json").read_text())
    assert job["attempts"] == 2 and job["requeues"] == 1, job  # stopped, requeued, started again by submitit
    assert (run_dir / "checkpoints" / "interrupted.ckpt").exists()  # where the first attempt stopped
    log = (tmp_path / "jobs/lm/jobs/logs/pre.log").read_text()
    assert "interrupted by SIGTERM" in log and log.count("--ckpt_path=last") == 1, log[-2000:]

    for name in ("pre", "siamese"):
        a = json.loads((tmp_path / f"procs/lm/procs/{name}/summary.json").read_text())
        b = json.loads((tmp_path / f"jobs/lm/jobs/{name}/summary.json").read_text())
        assert b["status"] == "finished" and [s for s, _ in b["train_curve"]] == list(range(1, STEPS + 1))
        assert b["train_curve"] == a["train_curve"], name  # the requeued run continued the same trajectory
        assert b["val_curve"] == a["val_curve"], name
    assert table_without_wall_time(tmp_path / "jobs/lm/jobs") == table_without_wall_time(tmp_path / "procs/lm/procs")

    sweep.main(["sweep", str(local), "--status"])
    status = capsys.readouterr().out
    assert re.search(r"pre\s+finished\s+\d+\s+step 40", status) and re.search(r"siamese\s+finished\s+\d+", status)
    assert "2 finished" in status, status


def test_the_slurm_job_script_carries_the_requeue_signal_and_the_devices(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(ROOT)
    path = tmp_path / "big.yaml"
    path.write_text(yaml.safe_dump({
        "name": "big", "configs": ["configs/lm/olmo-1b.yaml"], "schemes": ["pre", "siamese"], "lrs": [1e-3, 2e-3],
        "runs_root": str(tmp_path / "runs"), "budget": {"tokens": 1e9},
        "launcher": {"kind": "submitit", "cluster": "slurm", "nodes": 2, "gpus_per_node": 4, "cpus_per_task": 6,
                     "partition": "gpu", "timeout_min": 600, "signal_delay_s": 240, "array_parallelism": 3,
                     "extra": {"constraint": "h100"}},
    }))  # fmt: skip
    (spec,) = load_specs(str(path))
    runs = grid(spec)
    script = sbatch_script(spec, len(runs), tmp_path / "submitit")
    lines = set(script.splitlines())
    for line in ("#SBATCH --signal=SIGUSR1@240", "#SBATCH --requeue", "#SBATCH --nodes=2", "#SBATCH --gpus-per-node=4",
                 "#SBATCH --ntasks-per-node=4", "#SBATCH --cpus-per-task=6", "#SBATCH --partition=gpu",
                 "#SBATCH --time=600", "#SBATCH --array=0-3%3", "#SBATCH --constraint=h100"):  # fmt: skip
        assert line in lines, f"{line} not in\n{script}"
    assert not any(line.startswith("#SBATCH --signal=USR2") for line in lines)  # submitit's default is replaced
    assert re.search(r"^srun .* -m submitit\.core\._submit ", script, re.MULTILINE)  # srun: one task per GPU
    job = fit_job(spec, runs[0], tmp_path / "runs/lm/big")
    # Lightning's SLURM environment checks devices x num_nodes against srun's tasks; 1e9 tokens at the config's
    # global batch of 2,048 x 2,048 tokens, whatever the cluster.
    assert {"--trainer.num_nodes=2", "--trainer.devices=4", "--trainer.max_steps=239"} <= set(job.fit_argv)
    assert job.test_argv is None and job.threads == 6 and job.fit_argv[3] == "fit"


@pytest.mark.slow
@pytest.mark.xdist_group(PROCESSES)
def test_two_submitit_sweeps_on_one_spec_submit_each_run_once(tmp_path: Path, corpus, monkeypatch, capsys):
    """Two `sweep SPEC` commands with `launcher: {kind: submitit, cluster: local}` (one its own process, one in this
    one) decide what to submit at the same moment (tests/experiments/submit_race.py makes both read before either
    records): each run gets one job, one fit, one line in jobs.json; the other sweep leaves it alone, waits for
    it, and both end 0."""
    from experiments.__main__ import main as suite_main
    from experiments.sweeps.cluster import Submission
    from tests.experiments.submit_race import racing

    text, shards = corpus
    fits, arrived = tmp_path / "fits.txt", tmp_path / "arrived"
    path = tmp_path / "race.yaml"
    path.write_text(yaml.safe_dump({
        "name": "race", "configs": [str(ROOT / "configs/lm/tiny.yaml")], "schemes": ["pre", "post"],
        "runs_root": str(tmp_path / "runs"), "progress_every_s": 0.5,
        "launcher": {"kind": "submitit", "cluster": "local", "cpus_per_task": 1, "timeout_min": 20},
        "args": [*tiny_lm(depth=1, seq_len=16, batch_size=4, eval_samples=8), f"--data.init_args.source={text}",
                 f"--data.init_args.data_dir={shards}", "--trainer.max_steps=2", "--trainer.val_check_interval=2",
                 "--trainer.limit_val_batches=1", "--trainer.num_sanity_val_steps=0",
                 "--trainer.callbacks+=tests.experiments.racing.RecordFit", f"--trainer.callbacks.record={fits}"],
    }))  # fmt: skip
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-m", "tests.experiments.submit_race", str(arrived), "sweep", str(path)]
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for name, function in racing(arrived).items():
            monkeypatch.setattr(Submission, name, function)
        suite_main(["sweep", str(path)])  # returns: exit status 0
        outputs = [capsys.readouterr().out, proc.communicate(timeout=600)[0]]
    finally:
        proc.kill()
    both = "\n".join(outputs)
    assert proc.returncode == 0, both
    assert len(list(arrived.iterdir())) == 2, both  # both sweeps really were deciding at once
    sweep_dir = tmp_path / "runs/lm/race"
    started = sorted(Path(line.split()[1]).name for line in fits.read_text().splitlines())
    assert started == ["post", "pre"], (started, both)  # one fit per run
    assert len(list((sweep_dir / "submitit").glob("*_submitted.pkl"))) == 2, both  # one job per run
    jobs = json.loads((sweep_dir / "jobs.json").read_text())
    assert sorted(jobs) == ["post", "pre"] and jobs["pre"]["job_id"] != jobs["post"]["job_id"], jobs
    assert both.count("submitted") == sum(o.count("submitted") for o in outputs)
    assert re.search(r"(pre|post): (in use by sweep race \(pid \d+|job \d+ is running, left as it is)", both), both
    for name in ("pre", "post"):
        assert json.loads((sweep_dir / name / "summary.json").read_text())["status"] == "finished"
        assert (sweep_dir / "logs" / f"{name}.log").read_text().count("run saved to") == 1
    assert "crashed" not in both.lower(), both


@pytest.mark.parametrize(
    ("entry", "says"),
    [([1], "is list, not an object"), ({"job_id": "abc", "cluster": "local"}, "has job_id 'abc' (not a process id)"),
     ({"job_id": "12", "cluster": "cloud"}, "has cluster 'cloud' (not 'local' or 'slurm')"),
     ({"job_id": "12_0", "cluster": "slurm"}, "has folder None (not a submitit folder)")],
)  # fmt: skip
def test_a_jobs_file_that_is_not_the_sweeps_is_one_line(entry, says, tmp_path: Path, monkeypatch, capsys):
    """`--status` (which asks the scheduler about each job) and a process-launcher sweep on the spec (which
    leaves runs with active jobs alone) both read jobs.json: a bad entry is one line naming it, before any run."""
    from experiments.sweeps.ownership import claim_sweep_dir
    from tests.experiments.test_hostile_configs import error_line

    monkeypatch.chdir(ROOT)
    spec = spec_file(tmp_path, "bad")
    sweep_dir = tmp_path / "bad/lm/bad"
    claim_sweep_dir(sweep_dir, "bad", str(spec))
    (sweep_dir / "jobs.json").write_text(json.dumps({"pre": entry}))
    before = (sweep_dir / "jobs.json").read_bytes()
    monkeypatch.setattr(sweep.Children, "call", lambda *a, **k: pytest.fail("a run started"))
    for args in (["--status"], []):
        assert error_line(["sweep", str(spec), *args], capsys) == (
            f"error: {sweep_dir / 'jobs.json'}: the entry of run 'pre' {says}; valid: the records the sweep writes "
            "({job_id, cluster, folder, submitted} per run), or no jobs.json (the sweep then forgets its jobs)"
        )
    assert (sweep_dir / "jobs.json").read_bytes() == before and not (sweep_dir / "pre").exists()
