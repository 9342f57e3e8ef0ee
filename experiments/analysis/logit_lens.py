"""Per-stream logit lens: each residual stream of the final state read out alone through the LM head."""

from __future__ import annotations

import math

import lightning as L
import torch
import torch.nn.functional as F


@torch.no_grad()
def logit_lens_table(module: L.LightningModule, batches: list) -> list[dict]:
    """One row per stream of the final state (+ the full readout): agreement, accuracy, loss."""
    net = module.net
    captured: dict[str, object] = {}
    handle = net.trunk.readout.register_forward_hook(lambda m, args, out: captured.update(state=args[0]))
    stats: dict[str, dict[str, float]] = {}
    positions = disagree = 0
    try:
        for batch in batches:
            inputs, targets = batch[:, :-1], batch[:, 1:]  # (B, N) each
            full = net(inputs)  # (B, N, V); the hook keeps the state the readout saw
            logits = {"full": full} | {k: net.head(v) for k, v in net.trunk.readout.streams(captured["state"]).items()}
            top1 = {k: v.argmax(-1) for k, v in logits.items()}  # (B, N) each
            stream_preds = torch.stack([p for k, p in top1.items() if k != "full"])  # (S, B, N)
            mask = (stream_preds != stream_preds[0]).any(0)  # positions where the streams disagree
            positions, disagree = positions + targets.numel(), disagree + int(mask.sum())
            for name, pred in top1.items():
                s = stats.setdefault(name, dict.fromkeys(("agree", "agree_masked", "correct", "loss"), 0.0))
                same = pred == top1["full"]
                s["agree"] += float(same.sum())
                s["agree_masked"] += float((same & mask).sum())
                s["correct"] += float((pred == targets).sum())
                flat = logits[name].flatten(0, 1).float()
                s["loss"] += float(F.cross_entropy(flat, targets.flatten(), reduction="sum"))
    finally:
        handle.remove()
    return [
        {
            "stream": name,
            "agreement": s["agree"] / positions,
            "agreement_where_streams_disagree": s["agree_masked"] / disagree if disagree else math.nan,
            "streams_disagree": disagree / positions,
            "accuracy": s["correct"] / positions,
            "loss": s["loss"] / positions,
        }
        for name, s in sorted(stats.items(), key=lambda kv: kv[0] == "full")  # streams first, full last
    ]
