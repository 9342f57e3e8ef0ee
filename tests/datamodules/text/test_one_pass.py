"""One pass over the training split: every non-overlapping window once per epoch, resumable at any world size."""

from __future__ import annotations

import json
import re
from pathlib import Path
from pydoc_data.topics import topics
from types import SimpleNamespace

import pytest
import torch

from datamodules.samplers import epoch_seed, shard_over_ranks
from datamodules.text.datamodule import TextDataModule
from datamodules.text.windows import PermutedWindowSampler, RandomWindowSampler
from experiments.__main__ import main
from tests.experiments.tiny import tiny_lm

ROOT = Path(__file__).resolve().parents[3]

TOKENS, SEQ = 1000, 9  # windows of 10 tokens: 100 of them, the split read end to end


def _epoch(sampler: PermutedWindowSampler, epoch: int) -> list[int]:
    sampler.set_epoch(epoch)
    return list(sampler)


def _rank_view(state: dict[str, int], world: int) -> list[list[int]]:
    """What each of ``world`` data-parallel ranks reads (Lightning's DistributedSamplerWrapper split), each rank
    with its own sampler loaded from ``state`` (a resume offset is used by the first pass only)."""
    shares = []
    for rank in range(world):
        sampler = PermutedWindowSampler(TOKENS, SEQ, seed=0)
        sampler.load_state_dict(state)
        sampler.set_epoch(state["epoch"])  # Lightning calls it before every epoch, the resumed one included
        trainer = SimpleNamespace(distributed_sampler_kwargs={"num_replicas": world, "rank": rank})
        shares.append(list(shard_over_ranks(sampler, trainer)))
    return shares


def test_every_window_start_appears_once_and_windows_do_not_overlap() -> None:
    sampler = PermutedWindowSampler(TOKENS + 7, SEQ, seed=3)  # 7 tail tokens: less than a window, not read
    starts = _epoch(sampler, 0)
    assert len(sampler) == len(starts) == 100
    assert sorted(starts) == list(range(0, 1000, 10))  # each start once, on the window grid
    covered = sorted(t for s in starts for t in range(s, s + SEQ + 1))
    assert covered == list(range(1000))  # every token of the split in exactly one window: no overlap, no gap


def test_the_order_is_a_seeded_function_of_seed_and_epoch() -> None:
    first = _epoch(PermutedWindowSampler(TOKENS, SEQ, seed=3), 4)
    expected = (torch.randperm(100, generator=torch.Generator().manual_seed(epoch_seed(3, 4))) * 10).tolist()
    assert first == expected
    assert _epoch(PermutedWindowSampler(TOKENS, SEQ, seed=3), 4) == first
    assert _epoch(PermutedWindowSampler(TOKENS, SEQ, seed=3), 5) != first
    assert _epoch(PermutedWindowSampler(TOKENS, SEQ, seed=4), 4) != first


@pytest.mark.parametrize(("world", "resume_world"), [(1, 1), (2, 2), (2, 4), (4, 1), (2, 5)])
def test_a_mid_epoch_resume_reads_exactly_the_unseen_windows(world: int, resume_world: int) -> None:
    """Ranks read batches of 5; after 3 steps the checkpoint stores offset = 3 x 5 x world (sampler_position)."""
    shares = _rank_view({"seed": 11, "epoch": 2}, world)
    steps, batch = 3, 5
    seen = {s for share in shares for s in share[: steps * batch]}
    offset = steps * batch * world
    assert len(seen) == offset

    remaining = 100 - offset
    per_rank = -(-remaining // resume_world)  # the ranks' first items of the resumed pass, up to the epoch's end
    after = [share[:per_rank] for share in _rank_view({"seed": 11, "epoch": 2, "offset": offset}, resume_world)]
    unseen = [s for share in after for s in share][:remaining] if resume_world == 1 else None
    read = sorted({s for share in after for s in share})
    if remaining % resume_world == 0:
        assert sorted(s for share in after for s in share) == sorted(set(range(0, 1000, 10)) - seen)
    else:  # the last rank's final item of the resumed epoch wraps to an already read window, as padding does
        assert set(range(0, 1000, 10)) - seen <= set(read)
    if unseen is not None:
        assert unseen == _epoch(PermutedWindowSampler(TOKENS, SEQ, seed=11), 2)[offset:]
    resumed = PermutedWindowSampler(TOKENS, SEQ, seed=0)
    resumed.load_state_dict({"seed": 11, "epoch": 2, "offset": offset})
    assert _epoch(resumed, 3) == _epoch(PermutedWindowSampler(TOKENS, SEQ, seed=11), 3)  # next epoch is whole


def test_the_module_reads_one_pass_by_name_and_keeps_with_replacement_as_the_default(tmp_path: Path) -> None:
    corpus = tmp_path / "topics.txt"
    corpus.write_text("\n\n".join(topics[k] for k in sorted(topics))[:30_000])
    small = {"source": str(corpus), "data_dir": str(tmp_path / "d"), "seq_len": 31, "batch_size": 4}
    one_pass = TextDataModule(**small, sampling="permutation")
    one_pass.prepare_data()
    one_pass.setup("fit")
    sampler, windows = one_pass.train_sampler, one_pass.train_dataset
    assert isinstance(sampler, PermutedWindowSampler)
    assert len(sampler) == windows.num_tokens // 32
    loader = one_pass.train_dataloader()
    rows = torch.cat(list(loader))
    assert rows.shape == (len(sampler) // 4 * 4, 32)
    starts = list(sampler)[: rows.shape[0]]
    assert torch.equal(rows, torch.stack([windows[s] for s in starts]))
    default = TextDataModule(**small)
    default.setup("fit")
    assert isinstance(default.train_sampler, RandomWindowSampler) and len(default.train_sampler) == 20000
    with pytest.raises(ValueError, match=re.escape("sampling='shuffle' is not a window sampling; valid: perm")):
        TextDataModule(**small, sampling="shuffle")


def _fit(runs: Path, corpus: Path, steps: int, *extra: str) -> list[str]:
    return [
        "fit", "-c", str(ROOT / "configs/lm/tiny.yaml"), f"--runs_root={runs}", f"--data.init_args.source={corpus}",
        f"--data.init_args.data_dir={runs.parent / 'shards'}", *tiny_lm(depth=1, eval_samples=4),
        "--data.init_args.sampling=permutation", f"--trainer.max_steps={steps}", "--trainer.limit_val_batches=1",
        "--trainer.num_sanity_val_steps=0", "--summary.log_every_n_steps=1", "--trainer.val_check_interval=3", *extra,
    ]  # fmt: skip


def _curve(runs: Path) -> list[float]:
    (summary,) = runs.rglob("summary.json")
    return [value for _, value in json.loads(summary.read_text())["train_curve"]]


@pytest.mark.slow
def test_a_one_pass_fit_stopped_mid_epoch_resumes_on_the_uninterrupted_trajectory(tmp_path: Path) -> None:
    """~2,700 training tokens: 81 windows of 33, 10 batches of 8 an epoch; stopped at step 6 and resumed to 14
    (across the epoch boundary), the losses are those of the run that never stopped."""
    corpus = tmp_path / "topics.txt"
    corpus.write_text("\n\n".join(topics[k] for k in sorted(topics))[:3000])
    main(_fit(tmp_path / "full", corpus, 14))
    main(_fit(tmp_path / "part", corpus, 6))
    main(_fit(tmp_path / "part", corpus, 14, "--ckpt_path=last"))
    full = _curve(tmp_path / "full")
    assert len(full) == 14
    torch.testing.assert_close(torch.tensor(_curve(tmp_path / "part")), torch.tensor(full), rtol=1e-6, atol=0)
