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
     (+ "experts": E: an MoE trunk, experts split over the d ranks, or over groups of "ep": P of them, or with
        "split": false not split (FSDP2-sharded as every other parameter);
        "kv_heads": K: grouped-query attention, 4 query heads over K key/value heads;
        "steps": S: S AdamW steps, the result [first step's, largest gradient difference, loss difference, graphs
        compiled];
        "compile": BACKEND: the sharded network's Blocks compiled; "checkpointing": activation checkpointing;
        "ddp": torch's DistributedDataParallel over the d ranks instead of the mesh);
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
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch._dynamo.utils import counters

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from experiments.parallel import ParallelConfig, compile_blocks, parallelize, sync_grads  # noqa: E402
from experiments.parallel.packed import unpack_state_dict  # noqa: E402
from models import LanguageModel, TrunkConfig  # noqa: E402


def tiny_lm(scheme: str, experts: int = 0, kv_heads: int = 0, checkpointing: bool = False) -> LanguageModel:
    torch.manual_seed(0)
    moe = {"moe_experts": experts, "moe_top_k": 2, "moe_hidden": 16} if experts else {}
    heads = {"num_heads": 4, "num_kv_heads": kv_heads} if kv_heads else {"num_heads": 2}
    cfg = TrunkConfig(
        dim=32, depth=2, mlp="swiglu", mlp_hidden=64, norm_scheme=scheme, norm_layer="rmsnorm",
        qk_norm=True, bias=False, init="normal", init_std=0.02, activation_checkpointing=checkpointing, **moe, **heads,
    )  # fmt: skip
    return LanguageModel(cfg, 256, max_seq_len=32)


def grad_difference(
    scheme: str,
    dp: int,
    tp: int,
    experts: int = 0,
    kv_heads: int = 0,
    ep: int = 0,
    steps: int = 0,
    compile: str = "",
    checkpointing: bool = False,
    ddp: bool = False,
    split: bool = True,
) -> float | list[float]:
    """Largest ``|g_sharded - g| / max|g|`` over the parameters; the loss is asymmetric in the batch rows.
    With ``experts``, an MoE trunk whose experts are split over the ``dp`` ranks (expert parallelism), or over groups
    of ``ep`` of them (each expert FSDP2-sharded over the dp / ep groups), or not split (``split`` off); with
    ``kv_heads``, grouped-query attention (its packed qkv compared in the plain layout); with ``compile`` (a
    backend), the sharded network's Blocks compiled (the reference stays eager); ``checkpointing``: activation
    checkpointing on both; ``ddp``: torch's DistributedDataParallel over the ``dp`` ranks instead of the mesh. With
    ``steps``: that many AdamW steps on a new batch each, both networks stepping on their own gradients, and ``[the
    first step's gradient difference, the largest over the steps, the largest relative loss difference]`` (the
    sharded loss summed over the ranks)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.nn.parallel import DistributedDataParallel

    net, reference_net = (tiny_lm(scheme, experts, kv_heads, checkpointing) for _ in range(2))
    weights = torch.arange(1, 5, dtype=torch.float32).view(4, 1, 1)  # rows weigh differently: order matters

    def loss(logits: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return (logits.float().square() * w).sum() / (4 * logits.shape[1] * logits.shape[2])

    config = ParallelConfig(
        expert_parallel=bool(experts) and split and not ep, expert_parallel_size=ep, compile=bool(compile),
        compile_backend=compile or "inductor",
    )  # fmt: skip
    mesh = None if ddp else init_device_mesh("cpu", (dp, tp), mesh_dim_names=("data_parallel", "tensor_parallel"))
    if mesh is None:  # what the task's configure_model does under every strategy without a mesh
        compile_blocks(net.trunk, config)
        model, rows = DistributedDataParallel(net), dist.get_rank()
    else:
        parallelize(net, mesh, config, seq_len=32)
        model, rows = net, mesh["data_parallel"].get_local_rank()
    share = slice(rows * 4 // dp, (rows + 1) * 4 // dp)
    optimizers = [torch.optim.AdamW(n.parameters(), lr=1e-2, foreach=False) for n in (net, reference_net)]
    worst, worst_loss, first = 0.0, 0.0, 0.0
    for step in range(max(steps, 1)):
        idx = torch.randint(0, 256, (4, 32), generator=torch.Generator().manual_seed(1 + step))
        whole = loss(reference_net(idx), weights)
        whole.backward()
        reference = {name: p.grad.clone() for name, p in reference_net.named_parameters()}
        part = loss(model(idx[share]), weights[share])
        (part * dp).backward()  # FSDP and DDP average over dp: undo it for a sum
        if mesh is not None:
            sync_grads(net, mesh)
        summed, whole = part.detach().clone(), whole.detach()
        dist.all_reduce(summed)
        worst_loss = max(worst_loss, abs(float(summed) / tp - float(whole)) / abs(float(whole)))
        # Relative to each parameter's largest gradient, floored at 1e-3 of the largest of all: gradients 10^6 below
        # the others (Hyper-Connections' dynamic weights at init, ~3e-9) differ by float noise alone
        scale = max(float(g.abs().max()) for g in reference.values())
        for name, p in net.named_parameters():
            grad = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
            grad = unpack_state_dict({name: grad})[name]  # a grouped-query qkv: back in the fused row order
            ref = reference[name]
            worst = max(
                worst, float((grad.reshape(ref.shape) - ref).abs().max()) / max(float(ref.abs().max()), 1e-3 * scale)
            )
        if step == 0:
            first = worst
        if not steps:
            return worst
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad()
    return [first, worst, worst_loss]


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
        began = time.monotonic()
        if job["kind"] == "grads":
            graphs = counters["stats"]["unique_graphs"]
            result = grad_difference(**{k: v for k, v in job.items() if k != "kind"})
            compiled = counters["stats"]["unique_graphs"] - graphs  # a backend that fell back to eager: 0
            results.append([*result, compiled] if isinstance(result, list) else result)
        else:
            from experiments.__main__ import main  # here: a launch of gradient jobs alone does not load the CLI

            try:
                with refused_save_folders(job.get("deny_mkdir_on_rank") == rank), bounded(job):
                    main(job["argv"])
                status = 0
            except SystemExit as stop:  # a run stopped by a signal exits 143 (the job says it expects that)
                status = stop.code or 0
            if status != job.get("expect", 0):
                raise SystemExit(f"{job['argv']} exited with {status}, not {job.get('expect', 0)}")
            results.append(None)
        print(f"job {len(results)} of {len(jobs)} ({job['kind']}) took {time.monotonic() - began:.1f} s", flush=True)
        dist.barrier()
        (out / f"rank{rank}.json").write_text(json.dumps(results))  # after each job: a last job may end the process


if __name__ == "__main__":
    run(json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2]))
