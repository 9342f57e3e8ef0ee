"""The fit's final validation reads the whole validation split and lands in summary.json (``whole_split_val``)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
import torch.nn.functional as F

from datamodules.text import TextDataModule
from datamodules.text.shards import open_split
from experiments.__main__ import main
from experiments.monitoring.divergence import DivergenceDetector
from experiments.monitoring.final_validation import FinalValidation
from models import LanguageModel, TrunkConfig
from tests.experiments.tiny import tiny_lm

ROOT = Path(__file__).resolve().parents[2]
SEQ = 16


def _reference_loss(checkpoint: Path, tokens: np.ndarray) -> tuple[float, int]:
    """Token-weighted cross-entropy of the checkpoint's network over windows tiling ``tokens`` end to end (each
    target predicted once), computed here from the weights alone; and the number of windows."""
    state = torch.load(checkpoint, weights_only=True)
    hp = state["hyper_parameters"]
    net = LanguageModel(TrunkConfig(**hp["trunk"]), hp["vocab_size"], max_seq_len=hp["seq_len"],
                        tie_embeddings=hp["tie_embeddings"])  # fmt: skip
    net.load_state_dict({k.removeprefix("net."): v for k, v in state["state_dict"].items() if k.startswith("net.")})
    net.eval()
    count = (len(tokens) - 1) // SEQ
    starts = np.round(np.linspace(0, len(tokens) - SEQ - 1, count)).astype(np.int64)
    targets = {int(s) + 1 + i for s in starts for i in range(SEQ)}
    assert len(targets) == count * SEQ and len(targets) >= len(tokens) - SEQ  # once each, all but < SEQ of them
    windows = torch.from_numpy(np.stack([tokens[s : s + SEQ + 1].astype(np.int64) for s in starts]))
    with torch.no_grad():
        logits = net(windows[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1).double(), windows[:, 1:].flatten())
    return float(loss), count


def test_the_final_validation_covers_the_whole_split_and_is_recorded(corpus, tmp_path: Path) -> None:
    """In-loop validation reads 1 batch of 8 windows; the final one every window of the split, on the final weights:
    its loss equals a direct computation over the tiling windows (float64 reference, rtol 1e-5)."""
    text, shards = corpus
    runs = tmp_path / "runs"
    main(
        [
            "fit",
            "-c",
            str(ROOT / "configs/lm/tiny.yaml"),
            f"--runs_root={runs}",
            f"--data.init_args.source={text}",
            f"--data.init_args.data_dir={shards}",
            *tiny_lm(depth=1, seq_len=SEQ, batch_size=8, eval_samples=8),
            "--trainer.max_steps=2",
            "--trainer.val_check_interval=2",
            "--trainer.limit_val_batches=1",
            "--final_validation.enabled=true",
        ]
    )  # fmt: skip (tiny_lm turns it off for the other tests)
    (path,) = runs.rglob("summary.json")
    summary = json.loads(path.read_text())
    tokens = open_split(TextDataModule(source=str(text), data_dir=str(shards), seq_len=SEQ).shard_dir, "val")
    loss, windows = _reference_loss(path.parent / "checkpoints" / "last.ckpt", np.asarray(tokens))
    protocol = summary["whole_split_val_protocol"]
    assert protocol == {"scope": "whole validation split", "step": 2, "batches_per_rank": -(-windows // 8),
                        "samples": windows, "tokens": windows * SEQ, "ranks": 1}  # fmt: skip
    assert windows > 100  # the in-loop validation read 8
    np.testing.assert_allclose(summary["whole_split_val"]["val/loss"], loss, rtol=1e-5)
    np.testing.assert_allclose(summary["whole_split_val"]["val/ppl"], np.exp(loss), rtol=1e-5)
    assert summary["final_val"]["val/loss"] != summary["whole_split_val"]["val/loss"]  # the last in-loop one stays
    assert summary["val_curve"][-1] == [2, summary["final_val"]]


def _trainer(limit: float = 1.0, diverged_at: int | None = None) -> SimpleNamespace:
    detector = DivergenceDetector()
    detector.diverged_at = diverged_at
    return SimpleNamespace(fast_dev_run=False, limit_val_batches=limit, callbacks=[detector])


def test_the_final_validation_is_skipped_when_off_diverged_or_without_validation() -> None:
    from experiments.tasks import LanguageModeling

    model = LanguageModeling(TrunkConfig(dim=8, depth=1, num_heads=1), optim=None)  # type: ignore[arg-type]
    data = TextDataModule(source="embedded", data_dir="unused")
    assert FinalValidation().skip_reason(_trainer(), model, data) is None
    assert FinalValidation(enabled=False).skip_reason(_trainer(), model, data) == "final_validation.enabled is false"
    assert FinalValidation().skip_reason(_trainer(0), model, data) == "validation is off (limit_val_batches: 0)"
    assert FinalValidation().skip_reason(_trainer(diverged_at=7), model, data) == "the run diverged at step 7"
