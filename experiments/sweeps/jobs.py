"""What one submitit job runs: the run's ``fit`` (then ``test``), resumed from its newest checkpoint, requeued
exactly when SLURM warns that the job is about to end.

    sbatch --array (one task per GPU, srun) -> submitit -> FitJob() -> python -m experiments fit ... [--ckpt_path=last]
                                                                     (Lightning's SLURM environment: ranks from srun)
    #SBATCH --signal=SIGUSR1@<s>: SIGUSR1 <s> seconds before the time limit (or on preemption notice)
        -> FitJob sends the fit SIGTERM: it finishes the running step, saves checkpoints/interrupted.ckpt
           (every rank stops at the same step: Lightning broadcasts rank 0's flag) and exits
        -> rank 0 requeues the job through submitit (``scontrol requeue``; the local executor's requeue exit code)
        -> the job starts again, FitJob resumes the fit with --ckpt_path=last: the same trajectory, no gap, no repeat

Why not Lightning's own SIGUSR1 handler: it saves ``hpc_ckpt_<n>.ckpt`` from inside the signal handler, in the
middle of whatever step each rank is in, which breaks the bit-exact resume the suite promises and can run a
collective on one rank while another is inside a gradient all-reduce. The fit is therefore started with
SIGUSR1 ignored (Lightning then leaves it alone) and the requeue signal becomes the suite's step-boundary
SIGTERM stop. A SIGTERM from the scheduler (``scancel``, preemption) stops the fit the same way, without a
requeue: SLURM requeues preempted jobs itself when configured to.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from experiments.monitoring.records import SUMMARY_FILE
from experiments.sweeps.ownership import read_json
from fileio import atomic_write_json

JOB_FILE = "job.json"  # in the run directory: job id, attempts, requeues, host and pid of the job process
DONE = ("finished", "diverged")
# SIGUSR1: the requeue signal of the sbatch script. SIGUSR2: what submitit's local executor sends at its timeout.
REQUEUE_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)


class RunFailed(RuntimeError):
    """The run's process failed; submitit records the job as failed with this message."""


def _ignore_requeue_signals() -> None:  # runs in the child between fork and exec
    for signum in REQUEUE_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)


@dataclass
class FitJob:
    """The callable submitit pickles for one run (one per array task; every task of a multi-GPU job runs it).

    Args:
        fit_argv: ``python -m experiments fit ...`` of the run, without a ``--ckpt_path``.
        test_argv: the ``test`` command, or None; the newest checkpoint is added when it runs.
        run_dir: the run's directory (on a file system every node sees).
        log: where the run's output goes (appended across attempts).
        cwd: the repository the configs are relative to.
        threads: ``OMP_NUM_THREADS`` for the run (the job's CPUs per task), None to inherit.
        max_requeues: requeues allowed before the run is failed instead.
    """

    fit_argv: list[str]
    test_argv: list[str] | None
    run_dir: str
    log: str
    cwd: str
    threads: int | None = None
    max_requeues: int = 20
    _child: subprocess.Popen | None = field(default=None, init=False, repr=False)
    _requeue: bool = field(default=False, init=False, repr=False)
    _stop: int | None = field(default=None, init=False, repr=False)

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in ("_child", "_requeue", "_stop")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._child, self._requeue, self._stop = None, False, None

    def __call__(self) -> str:
        import submitit

        env = submitit.JobEnvironment()
        rank0 = env.global_rank == 0
        for signum in REQUEUE_SIGNALS:
            signal.signal(signum, self._on_requeue_signal)
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._on_stop_signal)
        run_dir = Path(self.run_dir)
        if rank0:
            self._record(env, attempt=True)
        summary = read_json(run_dir / SUMMARY_FILE)
        status = summary.get("status")
        if status not in DONE:
            resume = ["--ckpt_path=last"] if any((run_dir / "checkpoints").glob("*.ckpt")) else []
            code = self._call(self.fit_argv + resume)
            self._after_stage(env, rank0)
            summary = read_json(run_dir / SUMMARY_FILE)
            status = summary.get("status", "crashed")
            if code != 0 and status not in DONE:
                raise RunFailed(f"{run_dir.name}: fit exited with {code} (status {status}); log: {self.log}")
        if self.test_argv is not None and status == "finished" and "test" not in summary:
            # Imported here: it brings torch, which the job process (it only waits for its commands) needs for
            # nothing else; every job of a grid would otherwise spend seconds importing it before its fit starts.
            from experiments.reliability.checkpointing import newest_readable

            ckpt = newest_readable(run_dir / "checkpoints")  # the highest recorded step, as the local launcher tests
            if ckpt is not None:
                code = self._call([*self.test_argv, f"--ckpt_path={ckpt}"])
                self._after_stage(env, rank0)
                if code != 0:
                    raise RunFailed(f"{run_dir.name}: test exited with {code}; log: {self.log}")
        return status

    def _call(self, argv: list[str]) -> int:
        """Runs one command of the run in its own session, its output appended to the run's log."""
        if self._requeue or self._stop is not None:
            return 1  # asked to stop before this stage began
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if self.threads:
            env["OMP_NUM_THREADS"] = str(self.threads)
        Path(self.log).parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "a") as out:
            out.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} {socket.gethostname()}: {' '.join(argv[3:])}\n")
            out.flush()
            self._child = subprocess.Popen(
                argv,
                cwd=self.cwd,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_ignore_requeue_signals,
            )
            try:
                while True:
                    try:
                        return self._child.wait()
                    except InterruptedError:  # a signal handler ran; keep waiting for the child
                        continue
            finally:
                self._child = None

    def _on_requeue_signal(self, signum: int, frame) -> None:
        self._requeue = True
        self._forward(signal.SIGTERM)  # the fit's step-boundary stop: interrupted.ckpt, then exit

    def _on_stop_signal(self, signum: int, frame) -> None:
        if self._stop is None:
            self._stop = signum
            self._forward(signum)

    def _forward(self, signum: int) -> None:
        child = self._child
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    def _after_stage(self, env, rank0: bool) -> None:
        """After a stage ended because of a signal: requeue the job (rank 0), or stop it."""
        if self._requeue:
            if not rank0:
                raise SystemExit(0)  # rank 0 requeues the whole job
            record = self._record(env)
            if record["requeues"] >= self.max_requeues:
                raise RunFailed(f"{Path(self.run_dir).name}: requeued {record['requeues']} times; not again")
            self._record(env, requeued=True)
            print(
                f"{Path(self.run_dir).name}: requeue signal; checkpoint saved, requeueing job {env.job_id}", flush=True
            )
            env._requeue(self.max_requeues - record["requeues"])  # submitit's per-cluster requeue (may exit)
            raise SystemExit(-1)  # as submitit does after its own requeue: no result, the job comes back
        if self._stop is not None:
            raise SystemExit(128 + self._stop)

    def _record(self, env, attempt: bool = False, requeued: bool = False) -> dict:
        path = Path(self.run_dir) / JOB_FILE
        record = {"attempts": 0, "requeues": 0, **read_json(path)}
        record.update(job_id=env.job_id, cluster=env.cluster, host=socket.gethostname(), pid=os.getpid())
        record["attempts"] += int(attempt)
        record["requeues"] += int(requeued)
        if attempt:
            record["started"] = time.time()
        atomic_write_json(path, record)
        return record


def describe_job(job: FitJob) -> str:
    """The commands a job runs, for ``--dry-run``."""
    return json.dumps({"fit": " ".join(job.fit_argv[3:]), "run_dir": job.run_dir}, indent=None)


if __name__ == "__main__":  # pragma: no cover - submitit imports this module, it never runs it
    sys.exit("experiments.sweeps.jobs is run by submitit, not directly")
