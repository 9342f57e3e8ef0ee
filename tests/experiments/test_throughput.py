"""Every run reports its speed (experiments.monitoring.throughput): the FLOP convention by hand, the peak table
against the datasheets, and the speed tags of a real tiny LM and MoE run through the command line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from experiments.__main__ import main
from experiments.monitoring import throughput
from experiments.monitoring.throughput import flop_parameters, flops_per_token, peak_flops
from models import LanguageModel, TrunkConfig
from tests.experiments.tiny import tiny_lm

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "name, peak",
    [("NVIDIA H100 80GB HBM3", 989e12), ("NVIDIA H200", 989e12), ("NVIDIA H100 PCIe", 756e12),
     ("NVIDIA A100-SXM4-80GB", 312e12), ("NVIDIA A100 80GB PCIe", 312e12), ("NVIDIA L40S", 362e12),
     ("NVIDIA A10G", 70e12), ("NVIDIA GH200 480GB", 989e12), ("NVIDIA GeForce RTX 3090", None)],
)  # fmt: skip
def test_peak_flops_are_the_dense_bf16_datasheet_numbers(name, peak, monkeypatch):
    monkeypatch.setattr(throughput.torch.cuda, "get_device_name", lambda device=None: name)
    assert peak_flops(torch.device("cuda", 0)) == peak
    assert peak_flops(torch.device("cpu")) is None  # the CPU: "n/a"


def test_flop_parameters_leave_out_the_embedding_table_and_count_experts_at_top_k_over_e():
    dense = LanguageModel(TrunkConfig(dim=32, depth=2, num_heads=2, mlp_hidden=64), vocab_size=64, max_seq_len=8)
    total = sum(p.numel() for p in dense.parameters())
    assert flop_parameters(dense) == total - 64 * 32  # the untied head counts; the input table does not
    tied = LanguageModel(TrunkConfig(dim=32, depth=2, num_heads=2, mlp_hidden=64), 64, 8, tie_embeddings=True)
    assert flop_parameters(tied) == sum(p.numel() for p in tied.parameters())  # the table is the head: once
    cfg = TrunkConfig(dim=32, depth=2, num_heads=2, moe_experts=4, moe_top_k=2, moe_hidden=16)
    moe = LanguageModel(cfg, vocab_size=64, max_seq_len=8)
    experts = sum(p.numel() for n, p in moe.named_parameters() if ".experts." in f".{n}.")
    assert experts > 0
    assert flop_parameters(moe) == sum(p.numel() for p in moe.parameters()) - 64 * 32 - experts + experts * 2 // 4


def test_flops_per_token_is_6n_plus_12ldt_and_causal_halves_the_attention_term():
    # OLMo-1B's shape: N ~ 1.18e9 without embeddings, 16 x 2048, 2048 tokens
    n, depth, dim, tokens = 1_176_000_000, 16, 2048, 2048
    assert flops_per_token(n, depth, dim, tokens, causal=False) == 6 * n + 12 * 16 * 2048 * 2048
    assert flops_per_token(n, depth, dim, tokens, causal=True) == 6 * n + 6 * 16 * 2048 * 2048


def tags(run: Path) -> dict[str, list[float]]:
    (events,) = run.rglob("events.out.tfevents.*")
    acc = EventAccumulator(str(events))
    acc.Reload()
    return {tag: [e.value for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


@pytest.mark.slow
@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_a_tiny_run_logs_its_tokens_per_second_and_peak_memory(moe, tmp_path, corpus):
    text, shards = corpus
    extra = ["-c", str(ROOT / "configs/lm/moe-tiny.yaml"), "--model.init_args.trunk.moe_experts=4",
             "--model.init_args.trunk.moe_hidden=16"] if moe else []  # fmt: skip
    main(["fit", "-c", str(ROOT / "configs/lm/tiny.yaml"), *extra, f"--runs_root={tmp_path}",
          f"--data.init_args.source={text}", f"--data.init_args.data_dir={shards}", *tiny_lm(batch_size=4),
          "--trainer.max_steps=4", "--trainer.log_every_n_steps=1", "--trainer.limit_val_batches=1",
          "--trainer.num_sanity_val_steps=0"])  # fmt: skip
    logged = tags(tmp_path)
    assert len(logged["train/tokens_per_s"]) == 4 and all(v > 0 for v in logged["train/tokens_per_s"])
    for tokens, samples in zip(logged["train/tokens_per_s"], logged["train/samples_per_s"], strict=True):
        assert tokens == pytest.approx(samples * 32, rel=1e-6)  # 32-token windows
    assert all(0.05 < v < 100 for v in logged["train/peak_mem_gb"])  # this process's peak resident set
    assert "train/mfu" not in logged  # a CPU has no peak in the table: "n/a", never a made-up number


@pytest.mark.slow
def test_summary_json_records_the_runs_speed_with_its_convention(tmp_path, corpus):
    import json

    text, shards = corpus
    main(["fit", "-c", str(ROOT / "configs/lm/tiny.yaml"), f"--runs_root={tmp_path}",
          f"--data.init_args.source={text}", f"--data.init_args.data_dir={shards}", *tiny_lm(batch_size=4),
          "--trainer.max_steps=3", "--trainer.log_every_n_steps=1", "--trainer.limit_val_batches=1",
          "--trainer.num_sanity_val_steps=0"])  # fmt: skip
    (summary,) = tmp_path.rglob("summary.json")
    perf = json.loads(summary.read_text())["perf"]
    assert perf["tokens_per_sample"] == 32 and perf["tokens_per_s"] == pytest.approx(perf["samples_per_s"] * 32)
    assert perf["mfu"] == "n/a" and perf["peak_flops_per_device"] == "n/a" and perf["device"] == "cpu"
    assert perf["flop_convention"].startswith("6N + 12LdT") and perf["flop_parameters"] > 0
