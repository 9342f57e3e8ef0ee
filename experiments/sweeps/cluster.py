"""The submitit launcher: every run of the grid one job, the grid one SLURM job array.

    launcher: {kind: submitit, cluster: slurm, partition: gpu, nodes: 1, gpus_per_node: 8, timeout_min: 1440, ...}

``sweep SPEC`` submits the runs that are not done and not already queued or running, records their job ids
in ``<sweep>/jobs.json`` and returns at once; ``sweep SPEC --status`` reads the jobs and the run directories,
``sweep SPEC --collect`` rebuilds the comparison from what has finished, ``--wait`` stays and prints progress.
Each job runs :class:`experiments.sweeps.jobs.FitJob`. The job script is submitit's, with one task per GPU
(Lightning's SLURM environment takes its ranks from ``srun``), ``--requeue`` and the requeue signal
``--signal=SIGUSR1@<signal_delay_s>``. ``cluster: local`` runs the same jobs on this machine through submitit's
local executor (tests, a workstation), ``array_parallelism`` at a time, the sweep waiting for them.

Two sweeps on one spec never submit a run twice: each run is claimed (the local launcher's
:func:`~experiments.reliability.run_lock.sweep_claim`) before ``jobs.json`` is read for it, and the claim is kept
until its job is recorded there; ``jobs.json`` itself is updated under its own lock, so neither sweep's records
replace the other's. A run the other sweep holds is left to it (``pre: in use by sweep demo (pid ...)``) and,
for the local executor, waited for like this sweep's own jobs.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from experiments.monitoring.records import SUMMARY_FILE
from experiments.reliability.errors import SuiteError
from experiments.reliability.run_lock import in_use, sweep_claim
from experiments.sweeps.estimate import run_extra_args
from experiments.sweeps.jobs import DONE, FitJob
from experiments.sweeps.ownership import prepare_run_dir, read_json, remove_run_dir
from experiments.sweeps.spec import Run, SweepSpec
from fileio import atomic_write_json
from fileio.locks import holder, try_lock, unlock, write_holder

JOBS_FILE = "jobs.json"
JOBS_LOCK = ".jobs.json.lock"  # held while a sweep reads, updates and replaces jobs.json
JOBS_LOCK_WAIT_S = 60.0  # another sweep holds it for one read-modify-write: milliseconds, seconds on a slow disk
SUBMITIT_DIR = "submitit"
QUEUED = {"PENDING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "CONFIGURING", "SUSPENDED", "RESV_DEL_HOLD"}
RUNNING = {"RUNNING", "COMPLETING", "RESIZING", "STAGE_OUT", "SIGNALING"}
ACTIVE = QUEUED | RUNNING


def slurm_parameters(spec: SweepSpec) -> dict[str, Any]:
    """``SlurmExecutor.update_parameters`` arguments (submitit's own names) for the spec's launcher."""
    la = spec.launcher
    params: dict[str, Any] = {
        "job_name": f"sweep-{spec.name}",
        "time": la["timeout_min"],
        "nodes": la["nodes"],
        "ntasks_per_node": max(1, la["gpus_per_node"]),  # one task per GPU: Lightning's ranks are srun's tasks
        "signal_delay_s": la["signal_delay_s"],
        "array_parallelism": la["array_parallelism"],
        "stderr_to_stdout": True,
        # The requeue signal Lightning's SLURM environment names (submitit's own default is USR2), and
        # permission to requeue the job.
        "additional_parameters": {"signal": f"SIGUSR1@{la['signal_delay_s']}", "requeue": True, **la["extra"]},
    }
    optional = {
        "partition": la["partition"],
        "gpus_per_node": la["gpus_per_node"] or None,
        "cpus_per_task": la["cpus_per_task"],
        "account": la["account"],
        "qos": la["qos"],
        "mem": _memory(la["mem_gb"]),
        "setup": la["setup"] or None,
    }
    params.update({k: v for k, v in optional.items() if v is not None})
    return params


def _memory(mem_gb: float | None) -> str | None:
    """SLURM's ``--mem``: whole GB as ``64GB``, a fraction in MB (``0.5`` -> ``512MB``, never ``0GB``)."""
    if mem_gb is None:
        return None
    return f"{int(mem_gb)}GB" if float(mem_gb).is_integer() else f"{math.ceil(mem_gb * 1024)}MB"


def sbatch_script(spec: SweepSpec, num_jobs: int, folder: Path) -> str:
    """The sbatch script submitit writes for ``num_jobs`` runs of the spec (an array when more than one).

    Built by submitit's own script writer with the parameters the executor gets, so it reads the same as
    the submitted one; no SLURM is needed to look at it.
    """
    from submitit.slurm.slurm import _make_sbatch_string

    command = " ".join([sys.executable, "-u -m submitit.core._submit", str(folder)])
    return _make_sbatch_string(
        command=command, folder=folder, map_count=num_jobs if num_jobs > 1 else None, **slurm_parameters(spec)
    )


def make_executor(spec: SweepSpec, folder: Path):
    """A submitit executor for the spec's cluster, its parameters set."""
    import submitit

    la = spec.launcher
    if la["cluster"] == "local":
        executor = submitit.LocalExecutor(folder=folder, max_num_timeout=la["max_requeues"])
        executor.update_parameters(
            timeout_min=la["timeout_min"],
            tasks_per_node=1,
            gpus_per_node=la["gpus_per_node"],
            signal_delay_s=la["signal_delay_s"],
            stderr_to_stdout=True,
            **({"setup": la["setup"]} if la["setup"] else {}),
        )
        return executor
    executor = submitit.SlurmExecutor(folder=folder, max_num_timeout=la["max_requeues"])
    executor.update_parameters(**slurm_parameters(spec))
    return executor


def fit_job(spec: SweepSpec, run: Run, sweep_dir: Path) -> FitJob:
    """The job of one run: its fit (and test) commands, as the process launcher would run them."""
    extra = run_extra_args(spec, run)
    name = run.name(spec)
    return FitJob(
        fit_argv=run.argv(spec, extra=extra),
        test_argv=run.argv(spec, "test", extra=extra) if spec.test else None,
        run_dir=str((sweep_dir / name).resolve()),
        log=str((sweep_dir / "logs" / f"{name}.log").resolve()),
        cwd=os.getcwd(),
        threads=spec.launcher["cpus_per_task"],
        max_requeues=spec.launcher["max_requeues"],
    )


def read_jobs(sweep_dir: Path) -> dict[str, dict]:
    """``jobs.json``: run name -> {job_id, cluster, folder, submitted} ({} without one).

    Raises:
        SuiteError: an entry that is not such a record (a hand-edited or foreign file), in one line naming it.
    """
    path = sweep_dir / JOBS_FILE
    jobs = read_json(path)
    for name, record in jobs.items():
        problem = _job_problem(record)
        if problem is not None:
            raise SuiteError(
                f"{path}: the entry of run {name!r} {problem}; valid: the records the sweep writes "
                "({job_id, cluster, folder, submitted} per run), or no jobs.json (the sweep then forgets its jobs)"
            )
    return jobs


def _job_problem(record: object) -> str | None:
    """What is wrong with one ``jobs.json`` entry (None: a job record this code can ask about)."""
    if not isinstance(record, dict):
        return f"is {type(record).__name__}, not an object"
    job_id, cluster = record.get("job_id"), record.get("cluster")
    if cluster not in ("local", "slurm"):
        return f"has cluster {cluster!r} (not 'local' or 'slurm')"
    if not isinstance(job_id, str) or not job_id or (cluster == "local" and not job_id.isdigit()):
        return f"has job_id {job_id!r} (not " + ("a process id)" if cluster == "local" else "a SLURM job id)")
    if cluster == "slurm" and not isinstance(record.get("folder"), str):
        return f"has folder {record.get('folder')!r} (not a submitit folder)"
    return None


def record_jobs(sweep_dir: Path, records: dict[str, dict], command: str) -> dict[str, dict]:
    """Adds ``records`` to ``jobs.json`` under its lock (read, update, replace): two sweeps recording their jobs
    at once both keep theirs. Returns the whole file as written.

    Raises:
        SuiteError: another process held the lock for over ``JOBS_LOCK_WAIT_S`` seconds (it names the holder).
    """
    path = sweep_dir / JOBS_LOCK
    handle = try_lock(path, wait_s=JOBS_LOCK_WAIT_S)
    if handle is None:
        raise SuiteError(
            f"{sweep_dir / JOBS_FILE} is being updated by {holder(path)} for over {JOBS_LOCK_WAIT_S:.0f} s; "
            "valid: stop that process, then run the sweep again"
        )
    try:
        write_holder(handle, command)
        merged = {**read_jobs(sweep_dir), **records}
        atomic_write_json(sweep_dir / JOBS_FILE, merged)
        return merged
    finally:
        unlock(handle)


def job_state(record: dict) -> str:
    """The scheduler's state of a recorded job ("PENDING", "RUNNING", "COMPLETED", "FAILED", ...; "UNKNOWN")."""
    if record.get("cluster") == "local":
        return _local_state(record)
    try:
        import submitit

        return str(submitit.SlurmJob(folder=record["folder"], job_id=record["job_id"]).state).split()[0]
    except Exception:  # noqa: BLE001 - no sacct here, or the job is too old for it: unknown, not fatal
        return "UNKNOWN"


def _local_state(record: dict) -> str:
    """A local job's controller process: alive (running) or not (done), read from /proc across processes."""
    pid = int(record["job_id"])
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "COMPLETED"
    alive = b"submitit" in cmdline and stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X")
    return "RUNNING" if alive else "COMPLETED"


class Submission:
    """Submits a spec's runs and, for the local executor (no queue of its own), starts the rest as slots free.

    Args:
        spec: the sweep.
        sweep_dir: its directory.
        emit: where progress lines go.
    """

    def __init__(self, spec: SweepSpec, sweep_dir: Path, emit=print) -> None:
        self.spec, self.sweep_dir, self.emit = spec, sweep_dir, emit
        self.folder = (sweep_dir / SUBMITIT_DIR).resolve()
        self.records = read_jobs(sweep_dir)
        self.jobs: list = []  # submitit jobs submitted by this process
        self.pending: list[Run] = []
        self.held: list[str] = []  # runs another sweep (or command) was submitting or running: left to it
        self.command = f"sweep {spec.name}"
        self._executor = None

    def submit(self, runs: list[Run], restart: bool) -> int:
        """Submits every run that is not done and has no active job; returns how many were submitted.

        A run with a queued or running job is left alone, and so is one another sweep or command is using; an
        unfinished one resumes from its newest checkpoint when its job starts, or from scratch with ``--restart``
        (its directory removed first, if the suite made it). Each run is decided and submitted under its claim.
        """
        local = self.spec.launcher["cluster"] == "local"
        with contextlib.ExitStack() as claims:
            todo = [run for run in runs if self._claim(run, restart, claims)]
            if not todo:
                return 0
            limit = self.spec.launcher["array_parallelism"] if local else len(todo)
            self.pending = todo[limit:]
            submitted = self._submit(todo[:limit])  # recorded in jobs.json before the claims are let go
        first = str(submitted[0].job_id)
        array = f", job array {first.split('_')[0]}" if len(submitted) > 1 and "_" in first else ""
        waiting = f", {len(self.pending)} waiting for a free slot" if self.pending else ""
        self.emit(
            f"sweep {self.spec.name}: submitted {len(submitted)} job(s) to {self.spec.launcher['cluster']}"
            f"{array}{waiting}"
        )
        return len(todo)

    def _claim(self, run: Run, restart: bool, claims: contextlib.ExitStack) -> bool:
        """Claims ``run`` into ``claims`` and says whether this sweep should submit it (prepares its directory);
        a run that is done, has an active job, or is used by another sweep or command is released and skipped.
        ``jobs.json`` is read again under the claim: what another sweep submitted a moment ago counts."""
        name = run.name(self.spec)
        claim = contextlib.ExitStack()
        other = claim.enter_context(sweep_claim(self.sweep_dir / name, self.command))
        keep = False
        try:
            if other is not None:
                self.emit(f"{name}: in use by {other}, left to it")
                self.held.append(name)
                return False
            if is_done(self.spec, self.sweep_dir / name):
                return False
            record = read_jobs(self.sweep_dir).get(name)
            if record is not None:
                self.records[name] = record
                if (state := job_state(record)) in ACTIVE:
                    self.emit(f"{name}: job {record['job_id']} is {state.lower()}, left as it is")
                    self.held.append(name)
                    return False
            if restart and read_json(self.sweep_dir / name / SUMMARY_FILE).get("status") not in DONE:
                remove_run_dir(self.sweep_dir, name)  # a finished run only missing its test keeps its fit
            prepare_run_dir(self.sweep_dir, name)
            keep = True
            return True
        finally:
            if keep:
                claims.enter_context(claim)
            else:
                claim.close()

    def top_up(self) -> None:
        """Local executor: starts waiting runs while fewer than ``array_parallelism`` jobs run (each one checked
        again under its claim: another sweep on the spec may have submitted it meanwhile)."""
        free = self.spec.launcher["array_parallelism"] - sum(not job.done() for job in self.jobs)
        if not self.pending or free <= 0:
            return
        with contextlib.ExitStack() as claims:
            batch = []
            while self.pending and len(batch) < free:
                run = self.pending.pop(0)
                if self._claim(run, False, claims):
                    batch.append(run)
            if batch:
                self._submit(batch)
        if batch:
            self.emit(f"sweep {self.spec.name}: started {len(batch)} more local job(s), {len(self.pending)} waiting")

    def active(self) -> bool:
        """Whether jobs submitted here still run, or runs still wait for a slot."""
        return bool(self.pending) or any(not job.done() for job in self.jobs)

    def others_busy(self) -> bool:
        """Whether a run left to another sweep or command is still claimed by it (its job not recorded yet, or
        its fit running): a local sweep waits for those too before it compares."""
        return any(
            in_use(self.sweep_dir / name) is not None and not is_done(self.spec, self.sweep_dir / name)
            for name in self.held
        )

    def _submit(self, runs: list[Run]) -> list:
        if self._executor is None:
            self._executor = make_executor(self.spec, self.folder)
        payloads = [fit_job(self.spec, run, self.sweep_dir) for run in runs]
        with self._executor.batch():  # one job array on SLURM
            submitted = [self._executor.submit(job) for job in payloads]
        records = {
            run.name(self.spec): {
                "job_id": str(job.job_id),
                "cluster": self.spec.launcher["cluster"],
                "folder": str(self.folder),
                "submitted": time.time(),
            }
            for run, job in zip(runs, submitted, strict=True)
        }
        self.records = record_jobs(self.sweep_dir, records, self.command)
        self.jobs += submitted
        return submitted


def is_done(spec: SweepSpec, run_dir: Path) -> bool:
    """Finished or diverged (and tested, when the spec tests): nothing left to run."""
    summary = read_json(run_dir / SUMMARY_FILE)
    status = summary.get("status")
    return status in DONE and not (spec.test and status == "finished" and "test" not in summary)
