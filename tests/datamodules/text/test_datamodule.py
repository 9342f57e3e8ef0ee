"""TextDataModule: caching, deterministic splits, batch contents, Lightning integration, arg errors."""

from __future__ import annotations

import re
from pathlib import Path
from pydoc_data.topics import topics

import lightning as L
import numpy as np
import pytest
import torch

from datamodules.text.datamodule import RandomWindowSampler, TextDataModule
from datamodules.text.shards import SPLITS, open_shard, read_meta
from datamodules.text.tokenizers import ByteTokenizer

# ~60 KB of ASCII-heavy English that every Python ships: fast to tokenize, real enough to test.
TEXT = "\n\n".join(topics[k] for k in sorted(topics))[:60_000]
SMALL = {"seq_len": 32, "batch_size": 4, "train_samples_per_epoch": 64, "eval_samples": 16}


@pytest.fixture
def corpus(tmp_path: Path) -> str:
    path = tmp_path / "topics.txt"
    path.write_text(TEXT)
    return str(path)


def _ready(corpus: str, data_dir: Path, **kwargs: object) -> TextDataModule:
    dm = TextDataModule(source=corpus, data_dir=str(data_dir), **{**SMALL, **kwargs})
    dm.prepare_data()
    dm.setup()
    return dm


def test_properties_before_setup(corpus: str, tmp_path: Path) -> None:
    dm = TextDataModule(source=corpus, data_dir=str(tmp_path / "d"))
    assert (dm.vocab_size, dm.seq_len, dm.corpus_name) == (256, 128, "topics")
    assert dm.tokenizer.decode(dm.tokenizer.encode("héllo")) == "héllo"
    bpe = TextDataModule(source=corpus, data_dir=str(tmp_path / "d"), tokenizer="bpe", bpe_vocab_size=512)
    assert bpe.vocab_size == 512
    with pytest.raises(RuntimeError, match="call prepare_data"):
        _ = bpe.tokenizer


def test_splits_are_deterministic_contiguous_and_disjoint(corpus: str, tmp_path: Path) -> None:
    a = _ready(corpus, tmp_path / "a", val_fraction=0.1, test_fraction=0.2)
    b = _ready(corpus, tmp_path / "b", val_fraction=0.1, test_fraction=0.2)
    parts = [open_shard(a.shard_dir, s) for s in SPLITS]
    for split, part in zip(SPLITS, parts, strict=True):
        np.testing.assert_array_equal(part, open_shard(b.shard_dir, split))
    everything = ByteTokenizer().encode_array(TEXT)
    np.testing.assert_array_equal(np.concatenate(parts), everything)  # train | val | test, in order
    n = len(everything)
    assert [len(p) for p in parts] == [n - round(0.1 * n) - round(0.2 * n), round(0.1 * n), round(0.2 * n)]


def test_shards_are_cached_per_source_and_tokenizer(corpus: str, tmp_path: Path) -> None:
    dm = _ready(corpus, tmp_path)
    stamp = (dm.shard_dir / "meta.json").stat().st_mtime_ns
    again = _ready(corpus, tmp_path)
    assert again.shard_dir == dm.shard_dir and (dm.shard_dir / "meta.json").stat().st_mtime_ns == stamp
    other_text = tmp_path / "other.txt"
    other_text.write_text(TEXT[::-1])
    assert _ready(str(other_text), tmp_path).shard_dir != dm.shard_dir
    assert TextDataModule(source=corpus, data_dir=str(tmp_path), tokenizer="bpe").shard_dir != dm.shard_dir
    assert _ready(corpus, tmp_path, val_fraction=0.2).shard_dir != dm.shard_dir
    assert dm.shard_dir.name.startswith("topics-byte256-")


def test_train_batches_are_windows_of_the_train_split(corpus: str, tmp_path: Path) -> None:
    dm = _ready(corpus, tmp_path)
    batches = list(dm.train_dataloader())
    assert len(batches) == 64 // 4
    train_text = ByteTokenizer().decode(open_shard(dm.shard_dir, "train").tolist())
    for batch in batches:
        assert batch.dtype == torch.int64 and batch.shape == (4, 33)
        for row in batch:
            assert dm.tokenizer.decode(row.tolist()) in train_text  # a contiguous window of train text


def test_training_windows_follow_seed_and_epoch(corpus: str, tmp_path: Path) -> None:
    dm = _ready(corpus, tmp_path)
    assert isinstance(dm.train_sampler, RandomWindowSampler)

    def epoch_batches(epoch: int) -> torch.Tensor:
        loader = dm.train_dataloader()
        loader.sampler.set_epoch(epoch)
        return torch.cat(list(loader))

    assert torch.equal(epoch_batches(0), epoch_batches(0))
    assert not torch.equal(epoch_batches(0), epoch_batches(1))
    other = _ready(corpus, tmp_path, seed=99)
    assert not torch.equal(torch.cat(list(other.train_dataloader())), epoch_batches(0))


def test_eval_windows_are_fixed_and_evenly_spaced(corpus: str, tmp_path: Path) -> None:
    dm = _ready(corpus, tmp_path)
    first, second = torch.cat(list(dm.val_dataloader())), torch.cat(list(dm.val_dataloader()))
    assert torch.equal(first, second) and first.shape == (16, 33)
    assert torch.equal(first, torch.cat(list(_ready(corpus, tmp_path).val_dataloader())))
    val = open_shard(dm.shard_dir, "val")
    starts = np.round(np.linspace(0, len(val) - 33, 16)).astype(int)  # hand-written spacing
    assert first.tolist() == [val[s : s + 33].tolist() for s in starts]
    test = torch.cat(list(dm.test_dataloader()))
    assert test.shape == (16, 33) and not torch.equal(test, first)
    few = _ready(corpus, tmp_path, seq_len=1024, batch_size=1)
    assert len(few.val_dataset) == (len(val) - 1) // 1024 < 16  # short split: fewer windows


def test_bpe_module_trains_saves_and_decodes(corpus: str, tmp_path: Path) -> None:
    dm = _ready(corpus, tmp_path, tokenizer="bpe", bpe_vocab_size=320)
    meta = read_meta(dm.shard_dir)
    assert (meta.tokenizer, meta.vocab_size, dm.vocab_size) == ("bpe", 320, 320)
    batch = next(iter(dm.train_dataloader()))
    assert batch.shape == (4, 33) and int(batch.max()) < dm.vocab_size
    assert dm.tokenizer.decode(dm.tokenizer.encode("def f(x): return x\n")) == "def f(x): return x\n"


def test_shard_directory_as_source(corpus: str, tmp_path: Path) -> None:
    made = _ready(corpus, tmp_path)
    reuse = _ready(str(made.shard_dir), tmp_path / "unused")
    assert reuse.shard_dir == made.shard_dir and reuse.corpus_name == "topics"
    assert not (tmp_path / "unused").exists()
    with pytest.raises(ValueError, match=r"made with tokenizer=byte vocab_size=256.*set tokenizer=byte"):
        TextDataModule(source=str(made.shard_dir), tokenizer="bpe")


def test_workers_return_the_same_windows(corpus: str, tmp_path: Path) -> None:
    dm = _ready(corpus, tmp_path)
    serial = torch.cat(list(dm.val_dataloader()))
    dm.num_workers = 1
    loader = dm.val_dataloader()
    assert loader.persistent_workers
    assert torch.equal(torch.cat(list(loader)), serial)


class _Recorder(L.LightningModule):
    """Keeps each epoch's first training batch; learns nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(()))
        self.first: dict[int, torch.Tensor] = {}
        self.val_shapes: list[tuple[int, ...]] = []

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        if batch_idx == 0:
            self.first[self.current_epoch] = batch.clone()
        return self.weight * batch[:, :-1].float().mean()

    def validation_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        self.val_shapes.append(tuple(batch.shape))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.0)


def test_lightning_fit_sets_the_sampler_epoch(corpus: str, tmp_path: Path) -> None:
    dm = TextDataModule(source=corpus, data_dir=str(tmp_path / "d"), **SMALL)
    model = _Recorder()
    trainer = L.Trainer(
        max_epochs=2,
        limit_train_batches=2,
        limit_val_batches=1,
        num_sanity_val_steps=0,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(model, datamodule=dm)
    for epoch in (0, 1):
        sampler = RandomWindowSampler(len(dm.train_dataset), 64, seed=1234)
        sampler.set_epoch(epoch)
        starts = list(sampler)[:4]
        assert torch.equal(model.first[epoch], torch.stack([dm.train_dataset[s] for s in starts]))
    assert model.val_shapes[0] == (4, 33)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"seq_len": 0}, "seq_len=0 must be a positive integer"),
        ({"batch_size": -2}, "batch_size=-2 must be a positive integer"),
        ({"eval_samples": 0}, "eval_samples=0 must be a positive integer"),
        ({"num_workers": -1}, "num_workers=-1 must be >= 0"),
        ({"val_fraction": 0.0}, "val_fraction=0.0 must lie strictly between 0 and 1"),
        ({"test_fraction": 1.0}, "test_fraction=1.0 must lie strictly between 0 and 1"),
        ({"val_fraction": 0.6, "test_fraction": 0.4}, "val_fraction + test_fraction = 1.0 must be < 1"),
        ({"tokenizer": "wordpiece"}, "tokenizer='wordpiece' is not a tokenizer kind"),
        ({"tokenizer": "bpe", "bpe_vocab_size": 100}, "bpe_vocab_size=100 must lie in [256"),
        ({"train_samples_per_epoch": 8, "batch_size": 16}, "train_samples_per_epoch=8 is below batch_size=16"),
    ],
)
def test_bad_arguments_name_the_value(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        TextDataModule(**kwargs)


def test_missing_source_is_named_at_prepare(tmp_path: Path) -> None:
    dm = TextDataModule(source=str(tmp_path / "nowhere.txt"), data_dir=str(tmp_path / "d"))
    with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path / "nowhere.txt"))):
        dm.prepare_data()


def test_baseline_loss_is_the_unigram_entropy_of_the_training_split(tmp_path: Path) -> None:
    path = tmp_path / "abc.txt"
    path.write_text("aaab" * 3000)  # train = the first 80 %: p(a) = 3/4, p(b) = 1/4
    dm = TextDataModule(source=str(path), data_dir=str(tmp_path / "d"), val_fraction=0.1, test_fraction=0.1)
    assert dm.baseline_loss is None  # no shards yet
    dm.prepare_data()
    expected = -(0.75 * np.log(0.75) + 0.25 * np.log(0.25))
    assert dm.baseline_loss == pytest.approx(expected, abs=1e-4)
