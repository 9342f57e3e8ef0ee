"""A network too big for one host: built on the meta device, parallelized, then each rank draws its own shards
(experiments/parallel/meta_init.py, ``model.init_args.meta_init``).

Every rank of a world of 1, 2 and 4 under FSDP2, tensor parallelism and expert parallelism is checked in this
one process with torch's fake process group (rank r of W: no collective runs, and materializing needs none):
each parameter's and buffer's local tensor must equal, bit for bit, the slice that rank holds of the network built
in full at the same seed. The slice of the full network is cut with ``torch.chunk`` by the parameter's
placements from the full network packed by ``pack_trunk`` itself; under plain FSDP2 also by today's path,
``fully_shard`` cutting a full network (with no meta tensor, FSDP2 chunks locally too). The EMA copies (ViT,
DiT) are checked the same way. Then one real one-process fit under ``ModelParallelStrategy`` with and without
``meta_init`` takes the same first step.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.placement_types import _StridedShard
from torch.testing._internal.distributed.fake_pg import FakeStore

from experiments.parallel import ParallelConfig
from experiments.parallel.meta_init import local_of, materialize, on_meta
from experiments.parallel.packed import pack_trunk
from experiments.tasks import ImageClassification, LanguageModeling, LatentDiffusion
from experiments.tasks.base import TaskModule
from experiments.tasks.optim import OptimConfig
from models import TrunkConfig
from tests.experiments.tiny import tiny_lm

ROOT = Path(__file__).resolve().parents[2]
SEED = 11
LM = dict(dim=32, depth=2, num_heads=4, mlp_hidden=64)


def lm(meta: bool, expert_parallel: bool = False, **trunk) -> LanguageModeling:
    torch.manual_seed(SEED)
    return LanguageModeling(TrunkConfig(**{**LM, **trunk}), OptimConfig(), vocab_size=48, seq_len=16,
                            parallel=ParallelConfig(expert_parallel=expert_parallel), meta_init=meta)  # fmt: skip


def vit(meta: bool) -> ImageClassification:  # mHC: a random constant (hc_fn) built for real beside meta tensors
    torch.manual_seed(SEED)
    trunk = TrunkConfig(**LM, norm_scheme="mhc")
    return ImageClassification(trunk, OptimConfig(), num_classes=5, img_size=8, patch_size=4, ema_decay=0.9,
                               meta_init=meta)  # fmt: skip


def dit(meta: bool) -> LatentDiffusion:  # adaLN-Zero, xavier, hyper-connections' buffers, an EMA copy
    torch.manual_seed(SEED)
    trunk = TrunkConfig(**LM, init="xavier", norm_scheme="hyper", adaln_zero_init=False)
    return LatentDiffusion(trunk, OptimConfig(), num_classes=3, latent_size=4, patch_size=2, fid_samples=0,
                           meta_init=meta)  # fmt: skip


# (case, world, tensor-parallel size, the task built with meta_init on / off)
CASES = [
    *[(f"fsdp2-w{w}", w, 1, lambda meta: lm(meta, mlp="swiglu", init="mitchell", norm_scheme="hyper"))
      for w in (1, 2, 4)],
    ("fsdp2-w2-vit-ema", 2, 1, vit),
    ("tp-w2-gelu", 2, 2, lambda meta: lm(meta, mlp="gelu", qk_norm=True)),
    ("tp-w4-gqa", 4, 2, lambda meta: lm(meta, mlp="swiglu", num_kv_heads=2, init="olmo_normal")),
    ("tp-w4-dit-ema", 4, 2, dit),
    *[(f"ep-w{w}", w, 1, lambda meta: lm(meta, True, mlp="swiglu", moe_experts=4, moe_hidden=16)) for w in (1, 2, 4)],
]  # fmt: skip


@contextmanager
def fake_rank(rank: int, world: int, tp: int):
    """This process as rank ``rank`` of ``world`` (torch's fake backend), with the strategy's 2-D mesh."""
    dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())
    try:
        yield init_device_mesh("cpu", (world // tp, tp), mesh_dim_names=("data_parallel", "tensor_parallel"))
    finally:
        dist.destroy_process_group()


def configured(task: TaskModule, mesh) -> TaskModule:
    task._device_mesh = mesh  # what ModelParallelStrategy sets before it calls configure_model
    task.configure_model()
    return task


def full_values(task: TaskModule) -> list[dict[str, torch.Tensor]]:
    """Every parameter and buffer of each network of ``task`` (built in full), in the packed layout."""
    values = []
    for net in task.networks():
        pack_trunk(net.trunk)
        values.append({name: t.detach() for name, t in tensors(net).items()})
    return values


def tensors(net: torch.nn.Module) -> dict[str, torch.Tensor]:
    return dict([*net.named_parameters(), *net.named_buffers()])


def shard(full: torch.Tensor, held: torch.Tensor) -> torch.Tensor:
    """The part of ``full`` this rank holds as ``held`` holds it, cut with ``torch.chunk`` mesh dimension by mesh
    dimension (right to left when FSDP2 cut what tensor parallelism had cut on the same axis: its
    ``_StridedShard``). The rank's coordinate comes from its global rank: torch interns meshes that compare equal,
    so in one process a parameter's mesh object can be an earlier rank's (its own ``get_coordinate`` then stale)."""
    if not isinstance(held, DTensor):
        return full
    mesh = held.device_mesh
    where = (mesh.mesh == dist.get_rank()).nonzero()[0].tolist()
    dims = list(enumerate(held.placements))
    if any(isinstance(p, _StridedShard) for p in held.placements):
        dims.reverse()
    for i, placement in dims:
        if isinstance(placement, Shard | _StridedShard):
            chunks = full.chunk(mesh.size(i), dim=placement.dim)
            full = chunks[where[i]] if where[i] < len(chunks) else full.narrow(placement.dim, 0, 0)
    return full


@pytest.mark.parametrize(("case", "world", "tp", "build"), CASES, ids=[c[0] for c in CASES])
def test_every_rank_gets_its_slice_of_the_one_process_init(case: str, world: int, tp: int, build):
    full = full_values(build(False))
    for rank in range(world):
        with fake_rank(rank, world, tp) as mesh:
            task = build(True)
            assert all(on_meta(net) for net in task.networks())  # the build left the large tensors on meta
            configured(task, mesh)
            today = configured(build(False), mesh) if tp == 1 and not case.startswith("ep") else None
            for i, net in enumerate(task.networks()):
                assert not on_meta(net), f"{case} rank {rank}: {on_meta(net)[:3]} left on the meta device"
                old = tensors(today.networks()[i]) if today else {}
                for name, held in tensors(net).items():
                    mine = local_of(held)
                    assert torch.equal(mine, shard(full[i][name], held)), f"{case} rank {rank} net {i}: {name}"
                    if today:
                        assert torch.equal(mine, local_of(old[name])), f"{case} rank {rank}: {name} differs from today"


def test_a_meta_tensor_outside_the_plan_is_refused_before_anything_is_allocated():
    task = lm(True)
    plan = task.net.init_plan()
    del plan["trunk.blocks.1.attn.proj.weight"]
    with pytest.raises(ValueError, match=r"^trunk\.blocks\.1\.attn\.proj\.weight of LanguageModel is on the meta"):
        materialize(task.net, plan, task.net.init_seed)
    assert task.net.embed.weight.is_meta


def test_meta_init_with_an_export_to_start_from_is_refused():
    with pytest.raises(ValueError, match=r"^model\.init_args\.meta_init=true with init_from='x'"):
        LanguageModeling(TrunkConfig(**LM), OptimConfig(), init_from="x", meta_init=True)


def first_loss(runs: Path, corpus: tuple[Path, Path], name: str, *extra: str) -> float:
    """The first training loss of a one-step, one-process FSDP2 fit through the command line."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from experiments.__main__ import main

    text, shards = corpus
    main(["fit", "-c", str(ROOT / "configs/lm/tiny.yaml"), "-c", str(ROOT / "configs/trainer/fsdp2.yaml"),
          "--trainer.devices=1", "--trainer.strategy.init_args.data_parallel_size=1", f"--runs_root={runs}",
          f"--experiment={name}", f"--data.init_args.source={text}", f"--data.init_args.data_dir={shards}",
          *tiny_lm(depth=2), "--trainer.max_steps=1", "--trainer.limit_val_batches=0",
          "--trainer.num_sanity_val_steps=0", "--trainer.log_every_n_steps=1", *extra])  # fmt: skip
    if dist.is_initialized():  # ModelParallelStrategy leaves its group to the process
        dist.destroy_process_group()
    events = EventAccumulator(str(runs / "lm" / name / "pre"))
    events.Reload()
    return events.Scalars("train/loss")[0].value


@pytest.mark.slow  # two real fits (seconds each)
def test_a_fit_built_on_the_meta_device_takes_the_first_step_of_a_fit_built_in_full(tmp_path, corpus, monkeypatch):
    """The real Trainer, ModelParallelStrategy on one process: ``--model.init_args.meta_init=true`` builds on meta
    and materializes in configure_model; its first loss is the full build's, bit for bit."""
    for name in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK"):
        monkeypatch.setenv(name, "")  # what Lightning sets for its one-process group: put back after the test
        monkeypatch.delenv(name)
    seen: list[list[str]] = []
    real = materialize

    def recorded(*args, **kwargs):
        seen.append(real(*args, **kwargs))
        return seen[-1]

    monkeypatch.setattr("experiments.tasks.base.materialize", recorded)
    full = first_loss(tmp_path, corpus, "full")
    assert seen == []
    meta = first_loss(tmp_path, corpus, "meta", "--model.init_args.meta_init=true")
    assert len(seen) == 1 and "embed.weight" in seen[0] and "head.weight" in seen[0]
    assert meta == full and 3 < full < 7  # about ln 256 = 5.5 at init
