"""Shared pieces of the downstream tests: tiny untrained LMs, byte and BPE tokenizers, rigged models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

from datamodules.text.tokenizers import BPETokenizer, ByteTokenizer
from models import LanguageModel, TrunkConfig

WINDOW = 64  # short enough that OLMo's left truncation is exercised on most questions


def tiny_net(vocab_size: int, window: int = WINDOW, seed: int = 0) -> LanguageModel:
    """A 2-block, 32-wide LM with random weights (its choices are arbitrary but deterministic)."""
    torch.manual_seed(seed)
    trunk = TrunkConfig(dim=32, depth=2, num_heads=2, mlp="swiglu", mlp_hidden=64, norm_layer="rmsnorm", bias=False)
    return LanguageModel(trunk, vocab_size, max_seq_len=window).eval()


@pytest.fixture(scope="session")
def byte_tokenizer() -> ByteTokenizer:
    return ByteTokenizer()


@pytest.fixture(scope="session")
def bpe_tokenizer() -> BPETokenizer:
    """A byte-level BPE trained on Python's bundled help text (offline, a second)."""
    import pydoc_data.topics

    return BPETokenizer.train("".join(pydoc_data.topics.topics.values())[:100_000], vocab_size=512)


class Uniform(nn.Module):
    """Every next token equally likely: the cross-entropy of n tokens is n ln V."""

    def __init__(self, vocab_size: int, window: int = WINDOW) -> None:
        super().__init__()
        self.vocab_size, self.max_seq_len = vocab_size, window

    def forward(self, idx: Tensor) -> Tensor:
        return torch.zeros(*idx.shape, self.vocab_size)


class GoldLookup(nn.Module):
    """Rigged to know the answers: after a prefix that starts a gold (context, answer) row, it puts almost all
    probability on the gold answer's next token; everywhere else it is uniform."""

    def __init__(self, gold_rows: list[tuple[list[int], int, list[int]]], vocab_size: int, window: int = WINDOW):
        super().__init__()
        self.vocab_size, self.max_seq_len = vocab_size, window
        self.next: dict[tuple[int, ...], int] = {}
        for query, ctx_len, continuation in gold_rows:
            for offset, token in enumerate(continuation):  # position ctx_len - 1 + offset predicts token
                self.next[tuple(query[: ctx_len + offset])] = token

    def forward(self, idx: Tensor) -> Tensor:
        logits = torch.zeros(*idx.shape, self.vocab_size)
        for b, row in enumerate(idx.tolist()):
            for n in range(len(row)):
                token = self.next.get(tuple(row[: n + 1]))
                if token is not None:
                    logits[b, n, token] = 30.0
        return logits


def yes_no_task(directory: Path, name: str, n: int = 6) -> None:
    """An lm-eval task YAML over a local JSON file (both written here): ``n`` questions, choices yes / no."""
    data = directory / f"{name}.json"
    data.write_text("\n".join(json.dumps({"q": f"Is {i} a number?", "a": 0}) for i in range(n)))
    (directory / f"{name}.yaml").write_text(
        f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\n"
        'test_split: test\noutput_type: multiple_choice\ndoc_to_text: "{{q}}"\ndoc_to_choice: ["yes", "no"]\n'
        'doc_to_target: "{{a}}"\nmetric_list:\n  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n'
    )
