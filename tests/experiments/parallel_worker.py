"""One of W processes that tests/experiments/test_parallel.py starts (as torchrun would: RANK, WORLD_SIZE, ...).

Runs a list of jobs one after another in the same process group, so the processes pay Python's and Lightning's
start-up once for many runs:

    {"kind": "fit", "argv": [...]}                   python -m experiments ARGV through the real CLI and Trainer
     (+ "expect": status: the exit status it must end with, e.g. 143 for a run stopped by SIGTERM;
        "deny_mkdir_on_rank": R: on rank R only, creating a sharded save's temp folder is refused, as a
        read-only or full file system would;
        "within_s": T: a job still running T seconds after it began ends the process at once (exit 3, one
        line): a hang fails the launch in T seconds, not at the test's timeout. A job that ends the process
        itself (a rank stuck for good, ended by the suite's stop deadline) must be the launch's last)
    {"kind": "grads", "scheme": S, "dp": d, "tp": t}  one forward/backward of a tiny LM sharded on a (d, t) mesh
     (+ "experts": E: an MoE trunk, experts split over the d ranks;
        "kv_heads": K: grouped-query attention, 4 query heads over K key/value heads);
                                                      writes the largest relative gradient difference to the
                                                      same network in one process, on the whole batch

    python tests/experiments/parallel_worker.py JOBS.json OUT_DIR
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
from pathlib import Path

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from experiments.__main__ import main  # noqa: E402 - after the path: the worker runs as a script
from experiments.parallel import ParallelConfig, parallelize, sync_grads  # noqa: E402
from experiments.parallel.packed import unpack_state_dict  # noqa: E402
from models import LanguageModel, TrunkConfig  # noqa: E402


def tiny_lm(scheme: str, experts: int = 0, kv_heads: int = 0) -> LanguageModel:
    torch.manual_seed(0)
    moe = {"moe_experts": experts, "moe_top_k": 2, "moe_hidden": 16} if experts else {}
    heads = {"num_heads": 4, "num_kv_heads": kv_heads} if kv_heads else {"num_heads": 2}
    cfg = TrunkConfig(
        dim=32, depth=2, mlp="swiglu", mlp_hidden=64, norm_scheme=scheme, norm_layer="rmsnorm",
        qk_norm=True, bias=False, init="normal", init_std=0.02, **moe, **heads,
    )  # fmt: skip
    return LanguageModel(cfg, 256, max_seq_len=32)


def grad_difference(scheme: str, dp: int, tp: int, experts: int = 0, kv_heads: int = 0) -> float:
    """Largest ``|g_sharded - g| / max|g|`` over the parameters; the loss is asymmetric in the batch rows.
    With ``experts``, an MoE trunk whose experts are split over the ``dp`` ranks (expert parallelism); with
    ``kv_heads``, grouped-query attention (its packed qkv compared in the plain layout)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    net = tiny_lm(scheme, experts, kv_heads)
    idx = torch.randint(0, 256, (4, 32), generator=torch.Generator().manual_seed(1))
    weights = torch.arange(1, 5, dtype=torch.float32).view(4, 1, 1)  # rows weigh differently: order matters

    def loss(logits: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return (logits.float().square() * w).sum() / (4 * logits.shape[1] * logits.shape[2])

    loss(net(idx), weights).backward()
    reference = {name: p.grad.clone() for name, p in net.named_parameters()}
    net.zero_grad()
    mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("data_parallel", "tensor_parallel"))
    parallelize(net, mesh, ParallelConfig(expert_parallel=bool(experts)), seq_len=32)
    rows = mesh["data_parallel"].get_local_rank()
    share = slice(rows * 4 // dp, (rows + 1) * 4 // dp)
    (loss(net(idx[share]), weights[share]) * dp).backward()  # FSDP averages over dp: undo it for a sum
    sync_grads(net, mesh)
    # Relative to each parameter's largest gradient, floored at 1e-3 of the largest of all: gradients 10^6 below
    # the others (Hyper-Connections' dynamic weights at init, ~3e-9) differ by float noise alone
    scale = max(float(g.abs().max()) for g in reference.values())
    worst = 0.0
    for name, p in net.named_parameters():
        grad = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
        grad = unpack_state_dict({name: grad})[name]  # a grouped-query qkv: back in the fused row order
        ref = reference[name]
        worst = max(
            worst, float((grad.reshape(ref.shape) - ref).abs().max()) / max(float(ref.abs().max()), 1e-3 * scale)
        )
    return worst


@contextlib.contextmanager
def refused_save_folders(refuse: bool):
    """While on (``refuse``): creating a sharded save's temp folder (``fileio.temp_dir(..., tag="save")``) raises
    ``PermissionError``, as a read-only or full file system would; every other folder is made as usual."""
    mkdir = Path.mkdir

    def refusing(path: Path, *args, **kwargs) -> None:
        if path.name.endswith(".partial") and ".save." in path.name:
            raise PermissionError(13, "Permission denied", str(path))
        mkdir(path, *args, **kwargs)

    if refuse:
        Path.mkdir = refusing
    try:
        yield
    finally:
        Path.mkdir = mkdir


@contextlib.contextmanager
def bounded(job: dict):
    """Ends the process (exit 3, one line) when ``job`` runs past its ``within_s``."""
    limit = job.get("within_s")

    def overdue() -> None:
        where = " ".join(arg for arg in job["argv"] if arg.startswith("--runs_root"))
        print(f"job did not end within {limit} s: {where}", file=sys.stderr, flush=True)
        os._exit(3)

    timer = threading.Timer(limit, overdue) if limit else None
    if timer is not None:
        timer.daemon = True
        timer.start()
    try:
        yield
    finally:
        if timer is not None:
            timer.cancel()


def run(jobs: list[dict], out: Path) -> None:
    rank = int(os.environ["RANK"])
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    results = []
    for job in jobs:
        if job["kind"] == "grads":
            args = job["scheme"], job["dp"], job["tp"], job.get("experts", 0), job.get("kv_heads", 0)
            results.append(grad_difference(*args))
        else:
            try:
                with refused_save_folders(job.get("deny_mkdir_on_rank") == rank), bounded(job):
                    main(job["argv"])
                status = 0
            except SystemExit as stop:  # a run stopped by a signal exits 143 (the job says it expects that)
                status = stop.code or 0
            if status != job.get("expect", 0):
                raise SystemExit(f"{job['argv']} exited with {status}, not {job.get('expect', 0)}")
            results.append(None)
        dist.barrier()
        (out / f"rank{rank}.json").write_text(json.dumps(results))  # after each job: a last job may end the process


if __name__ == "__main__":
    run(json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2]))
