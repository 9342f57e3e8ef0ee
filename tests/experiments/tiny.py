"""Command-line overrides that shrink the shipped LM config to a network that trains in milliseconds.

Tests run the real ``configs/lm/tiny.yaml`` through the real CLI and only override sizes, so what they
exercise is what a user runs.
"""

from __future__ import annotations


def tiny_lm(
    depth: int = 2, seq_len: int = 32, batch_size: int = 8, eval_samples: int | None = 16, quiet: bool = True
) -> list[str]:
    """A 32-wide, 2-head LM (``depth`` blocks) on short windows; ``quiet`` drops the progress bar."""
    args = [
        "--model.init_args.trunk.dim=32",
        f"--model.init_args.trunk.depth={depth}",
        "--model.init_args.trunk.num_heads=2",
        "--model.init_args.trunk.mlp_hidden=64",
        f"--data.init_args.seq_len={seq_len}",
        f"--data.init_args.batch_size={batch_size}",
    ]
    if eval_samples is not None:
        args.append(f"--data.init_args.eval_samples={eval_samples}")
    if quiet:
        args += ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]
    args.append("--final_validation.enabled=false")  # the whole-split pass: tests/experiments/test_final_validation.py
    return args
