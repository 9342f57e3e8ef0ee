"""Sharded, resumable sampling: 2 gloo processes give the 1-process samples; a killed run resumes to exactly N."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from experiments.tasks.diffusion import make_scheduler, sample_latents
from experiments.tasks.sampling import (
    SamplePlan,
    chunk_files,
    generate_chunks,
    image_batches,
    read_chunks,
    write_adm_npz,
)
from models import DiT, TrunkConfig

PLAN = SamplePlan(num_samples=10, chunk_size=3, num_classes=3, seed=7)  # chunks of 3, 3, 3, 1


def tiny_net() -> DiT:
    torch.manual_seed(0)
    cfg = TrunkConfig(dim=32, depth=2, num_heads=2, mlp="gelu_tanh", init="xavier")
    net = DiT(cfg, input_size=4, patch_size=2, in_channels=4, num_classes=3, learn_sigma=True).eval()
    for p in net.parameters():  # away from the zero init, so samples depend on the labels
        p.data.normal_(0, 0.1)
    return net


def make_generate(net: DiT, calls: list | None = None, fail_at: int | None = None):
    """Real DDPM sampling (learned sigma, noise at every step) with one generator per sample; the first
    three latent channels quantized stand in for decoded images (uint8 (B, 3, 4, 4))."""
    sched = make_scheduler("ddpm", 1000, "linear", learn_sigma=True)

    def generate(labels: torch.Tensor, seeds: list[int]) -> torch.Tensor:
        if calls is not None:
            calls.append(list(seeds))
            if fail_at is not None and len(calls) == fail_at:
                raise InterruptedError("stop")
        gens = [torch.Generator().manual_seed(s) for s in seeds]
        x = sample_latents(net, sched, labels, (4, 4, 4), steps=3, generator=gens)
        return ((x[:, :3].clamp(-2, 2) + 2) * 63.75).round().to(torch.uint8)

    return generate


def samples_of(directory: Path, plan: SamplePlan = PLAN) -> tuple[np.ndarray, np.ndarray]:
    parts = list(read_chunks(directory, plan))
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def test_plan_labels_seeds_and_chunks():
    assert PLAN.num_chunks == 4 and list(PLAN.indices(3)) == [9]
    assert PLAN.labels(PLAN.indices(1)).tolist() == [0, 1, 2]
    seeds = [s for c in range(4) for s in PLAN.seeds(PLAN.indices(c))]
    assert len(set(seeds)) == 10 and seeds[0] == 7 * 2**32
    other = SamplePlan(10, 3, 3, seed=8)  # another seed shares no sample seed
    assert not set(seeds) & {s for c in range(4) for s in other.seeds(other.indices(c))}


def test_a_sample_does_not_depend_on_its_batch(tmp_path: Path):
    generate = make_generate(tiny_net())
    whole = generate(torch.tensor([0, 1, 2]), [11, 12, 13])
    alone = generate(torch.tensor([1]), [12])
    torch.testing.assert_close(alone[0].int(), whole[1].int(), atol=1, rtol=0)


def _rank(rank: int, world: int, store: str, directory: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        generate_chunks(PLAN, Path(directory), make_generate(tiny_net()), rank, world, progress=False)
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.xdist_group("processes")  # several busy processes: never beside another such test
def test_two_gloo_processes_give_the_one_process_samples(tmp_path: Path):
    torch.set_num_threads(1)
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir(), two.mkdir()
    calls: list = []
    assert generate_chunks(PLAN, one, make_generate(tiny_net(), calls), progress=False) == 10
    # fork: the children reuse this process's imports (spawn would re-import torch and diffusers in each).
    mp.start_processes(_rank, args=(2, str(tmp_path / "store"), str(two)), nprocs=2, start_method="fork")
    images_1, labels_1 = samples_of(one)
    images_2, labels_2 = samples_of(two)
    assert images_2.shape == (10, 4, 4, 3) and labels_2.tolist() == [i % 3 for i in range(10)]
    np.testing.assert_array_equal(labels_1, labels_2)
    # Same seeds, same network, one thread each: identical up to float rounding at a quantization edge.
    assert np.abs(images_1.astype(int) - images_2.astype(int)).max() <= 1
    # Chunk c came from rank c mod 2, every sample index once, every seed once.
    indices = [np.load(f, allow_pickle=False)["indices"].tolist() for f in chunk_files(two, PLAN)]
    assert sum(indices, []) == list(range(10))
    assert sorted(s for batch in calls for s in batch) == sorted(set(s for batch in calls for s in batch))
    assert not (images_1[:3] == images_1[3:6]).all()  # different seeds, different samples


def test_an_interrupted_run_resumes_to_exactly_n(tmp_path: Path):
    net = tiny_net()
    calls: list = []
    with pytest.raises(InterruptedError):
        generate_chunks(PLAN, tmp_path, make_generate(net, calls, fail_at=3), progress=False)
    assert [p.name for p in sorted(tmp_path.glob("chunk_*.npz"))] == ["chunk_000000.npz", "chunk_000001.npz"]
    again: list = []
    assert generate_chunks(PLAN, tmp_path, make_generate(net, again), progress=False) == 4  # chunks 2 and 3
    assert [len(c) for c in again] == [3, 1]
    reference = tmp_path / "reference"
    reference.mkdir()
    generate_chunks(PLAN, reference, make_generate(net), progress=False)
    np.testing.assert_array_equal(samples_of(tmp_path)[0], samples_of(reference)[0])
    # A larger N reuses the full chunks and regenerates the short last one.
    bigger = SamplePlan(12, 3, 3, 7)
    more: list = []
    generate_chunks(bigger, tmp_path, make_generate(net, more), progress=False)
    assert [len(c) for c in more] == [3] and sum(len(b) for b in image_batches(tmp_path, bigger)) == 12


def test_adm_npz_holds_every_sample_once_in_order(tmp_path: Path):
    generate_chunks(PLAN, tmp_path, make_generate(tiny_net()), progress=False)
    files = chunk_files(tmp_path, PLAN)
    out = write_adm_npz([*files, files[1]], tmp_path / "samples.npz")  # a repeated part is dropped
    with np.load(out, allow_pickle=False) as data:
        assert sorted(data.files) == ["arr_0", "arr_1"]
        assert data["arr_0"].dtype == np.uint8 and data["arr_0"].shape == (10, 4, 4, 3)
        np.testing.assert_array_equal(data["arr_0"], samples_of(tmp_path)[0])
        np.testing.assert_array_equal(data["arr_1"], [i % 3 for i in range(10)])
    assert not [p for p in os.listdir(tmp_path) if ".tmp" in p]
