"""Token windows, the random-window sampler and the fixed evaluation windows."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from datamodules.text.windows import RandomWindowSampler, TokenWindows, epoch_seed, eval_window_starts


@pytest.fixture
def token_file(tmp_path: Path) -> tuple[Path, np.ndarray]:
    tokens = np.random.default_rng(1).integers(0, 65535, size=5000).astype("<u2")
    path = tmp_path / "train.bin"
    tokens.tofile(path)
    return path, tokens


def test_window_is_seq_len_plus_one_tokens_from_its_start(token_file: tuple[Path, np.ndarray]) -> None:
    path, tokens = token_file
    windows = TokenWindows(path, "uint16", seq_len=16)
    assert len(windows) == 5000 - 16  # last start leaves exactly 17 tokens
    for start in (0, 123, len(windows) - 1):
        item = windows[start]
        assert item.dtype == torch.int64 and item.shape == (17,)
        assert item.tolist() == tokens[start : start + 17].tolist()
    with pytest.raises(IndexError):
        windows[len(windows)]


def test_windows_pickle_without_their_tokens(token_file: tuple[Path, np.ndarray]) -> None:
    path, _ = token_file
    windows = TokenWindows(path, "uint16", seq_len=16)
    _ = windows[0]  # opens the memmap
    blob = pickle.dumps(windows)
    assert len(blob) < 1000  # the 10 KB array is not in the pickle
    assert torch.equal(pickle.loads(blob)[42], windows[42])


def test_too_short_split_names_the_file_and_seq_len(tmp_path: Path) -> None:
    np.arange(10, dtype="<u2").tofile(tmp_path / "val.bin")
    with pytest.raises(ValueError, match=r"val\.bin' holds 10 tokens, fewer than seq_len\+1=17"):
        TokenWindows(tmp_path / "val.bin", "uint16", seq_len=16)


def _draw(seed: int, epoch: int, num_starts: int = 10_000, num_samples: int = 256) -> list[int]:
    sampler = RandomWindowSampler(num_starts, num_samples, seed)
    sampler.set_epoch(epoch)
    return list(sampler)


def test_sampler_is_a_function_of_seed_and_epoch() -> None:
    assert _draw(7, 0) == _draw(7, 0)
    assert _draw(7, 3) == _draw(7, 3)
    assert _draw(7, 0) != _draw(7, 1)
    assert _draw(7, 0) != _draw(8, 0)
    draw = _draw(7, 2, num_starts=50, num_samples=5000)
    assert len(draw) == 5000 and min(draw) == 0 and max(draw) == 49  # uniform over every start


def test_sampler_draw_matches_a_torch_generator_reference() -> None:
    expected = torch.randint(0, 10_000, (256,), generator=torch.Generator().manual_seed(epoch_seed(7, 4)))
    assert _draw(7, 4) == expected.tolist()
    assert epoch_seed(7, 4) != epoch_seed(7, 5) and 0 <= epoch_seed(7, 4) < 2**63


def test_sampler_state_dict_round_trip() -> None:
    sampler = RandomWindowSampler(1000, 64, seed=3)
    sampler.set_epoch(5)
    fresh = RandomWindowSampler(1000, 64, seed=0)
    fresh.load_state_dict(sampler.state_dict())
    assert fresh.state_dict() == {"seed": 3, "epoch": 5}
    assert list(fresh) == list(sampler) and len(fresh) == 64


@pytest.mark.parametrize(("num_starts", "num_samples"), [(0, 10), (10, 0)])
def test_sampler_rejects_empty_ranges(num_starts: int, num_samples: int) -> None:
    with pytest.raises(ValueError, match="must be positive"):
        RandomWindowSampler(num_starts, num_samples)


def test_eval_windows_by_hand() -> None:
    assert eval_window_starts(101, 10, 100).tolist() == list(range(0, 91, 10))  # 10 windows tile 101 tokens
    assert eval_window_starts(101, 10, 4).tolist() == [0, 30, 60, 90]
    assert eval_window_starts(11, 10, 50).tolist() == [0]
    with pytest.raises(ValueError, match=r"split holds 10 tokens, fewer than seq_len\+1=11"):
        eval_window_starts(10, 10, 5)


@pytest.mark.parametrize(("num_tokens", "seq_len", "max_windows"), [(5000, 16, 64), (5000, 128, 1000), (777, 7, 50)])
def test_eval_windows_are_fixed_in_range_and_never_overlap(num_tokens: int, seq_len: int, max_windows: int) -> None:
    starts = eval_window_starts(num_tokens, seq_len, max_windows)
    assert np.array_equal(starts, eval_window_starts(num_tokens, seq_len, max_windows))
    assert len(starts) == min(max_windows, (num_tokens - 1) // seq_len)
    assert starts[0] == 0 and starts[-1] == num_tokens - seq_len - 1  # spans the whole split
    assert np.all(np.diff(starts) >= seq_len)  # windows share at most their boundary token
