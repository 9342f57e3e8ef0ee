"""The training-step benchmark: its table, its memory and FLOP measures against hand counts, compiled vs
eager trunks, the reference pairs, and the GPU script's CPU smoke mode. No timing is asserted."""

from __future__ import annotations

import csv
import dataclasses
import importlib.util
import json
import math
import os
import re
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from experiments import bench
from experiments.bench import COLUMNS, SIZES, Candidate, Options, make_batch, reference, saved_tensor_bytes, step_flops
from models import TrunkConfig
from models.layers import MoE, rope_tables
from models.presets import PRESETS
from models.trunk import Trunk

ROOT = Path(__file__).resolve().parents[2]
F32 = 4  # bytes


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)  # the CLI sets 1 thread on CPU; leave the session as it was


def read_rows(out: Path) -> list[dict[str, str]]:
    with open(out / "bench.csv") as f:
        return list(csv.DictReader(f))


#################################################################################
#                                The table                                      #
#################################################################################


def test_bench_writes_table_with_exact_unit_ratios_for_pre_vs_pre(tmp_path: Path):
    argv = ["--task", "lm", "--size", "micro", "--schemes", "pre,pre", "--steps", "2", "--warmup", "0"]
    argv += ["--data-batches", "5", "--data-dir", str(tmp_path / "text"), "--out", str(tmp_path / "out")]
    bench.main(argv)
    rows = read_rows(tmp_path / "out")
    with open(tmp_path / "out" / "bench.csv") as f:
        assert next(csv.reader(f)) == COLUMNS
    schemes = {r["name"]: r for r in rows if r["group"] == "schemes"}
    assert list(schemes) == ["pre", "pre#2"]
    for r in schemes.values():
        # two builds of one model save the same tensors and hold the same parameters, exactly
        assert float(r["act_ratio"]) == 1.0 and float(r["alive_ratio"]) == 1.0 and float(r["param_ratio"]) == 1.0
        # two independent counts of activation memory: saved-tensor hook and profiler memory events
        assert float(r["alive_mb"]) == pytest.approx(float(r["act_mb"]), rel=0.05)
        assert float(r["act_mb"]) > 0 and float(r["step_ms"]) > 0 and r["unit"] == "tokens/s"
    assert float(schemes["pre"]["step_ratio"]) == 1.0  # each round's time over itself
    assert 0 < float(schemes["pre#2"]["step_ratio"]) < math.inf
    tokens = SIZES["micro"]["lm"].batch_size * SIZES["micro"]["lm"].net["max_seq_len"]
    r = schemes["pre"]
    assert float(r["throughput"]) == pytest.approx(tokens / (float(r["step_ms"]) / 1e3))
    (data,) = [r for r in rows if r["group"] == "data"]
    assert float(data["throughput"]) > 0 and float(data["step_ratio"]) > 0
    text = (tmp_path / "out" / "bench.md").read_text()
    assert "python -m experiments bench --task lm --size micro --schemes pre,pre" in text
    assert f"torch: {torch.__version__}" in text and "threads: 1 intra-op" in text
    assert "| pre#2 |" in text and "data loading vs training" in text


def test_bench_compares_schemes_and_reference_on_vit(tmp_path: Path):
    argv = ["--task", "vit", "--size", "micro", "--schemes", "pre,siamese", "--steps", "1", "--warmup", "0"]
    bench.main(argv + ["--out", str(tmp_path)])
    rows = read_rows(tmp_path)
    assert [(r["group"], r["name"]) for r in rows] == [
        ("schemes", "pre"),
        ("schemes", "siamese"),
        ("reference", "timm VisionTransformer"),
        ("reference", "ours (pre)"),
    ]
    siamese = rows[1]
    assert float(siamese["act_ratio"]) > 1.0  # two extra norm inputs per sublayer are saved
    assert float(siamese["param_ratio"]) > 1.0
    assert float(rows[3]["act_ratio"]) == 1.0 and float(rows[3]["param_ratio"]) == 1.0  # same network as timm's
    assert "same weights" in rows[3]["note"]


def test_checkpointed_two_stream_memory_is_seen_by_both_counts(tmp_path: Path):
    """Under activation checkpointing each block keeps only its input state: SiameseNorm's second stream is
    one (B, N, D) tensor per block but the first (whose two streams are both the embedding). The trunk hands
    the streams to the checkpoint as tensors, so the saved-tensor count sees them (not only the profiler's),
    and the two independent counts agree."""
    argv = ["--task", "lm", "--size", "micro", "--schemes", "pre,siamese", "--steps", "1", "--warmup", "0"]
    rows = bench.main(argv + ["--checkpointing", "--no-reference", "--data-batches", "0", "--out", str(tmp_path)])
    pre, siamese = rows
    w = SIZES["micro"]["lm"]
    tokens = w.batch_size * w.net["max_seq_len"]
    stream = tokens * w.trunk["dim"] * F32
    # the readouts (not checkpointed): siamese recomputes N_o(N_a(x) + N_b(y)), keeping x and y where pre's
    # N_f keeps x; and N_a, N_b, N_o keep their per-row 1/rms (B, N, 1) where N_f keeps one
    readout = 2 * stream + 2 * tokens * F32
    assert (siamese.act_mb - pre.act_mb) * 2**20 == (w.trunk["depth"] - 1) * stream + readout
    for r in rows:  # the profiler also sees each checkpoint's saved CPU RNG state (5 KB per block)
        assert r.alive_mb == pytest.approx(r.act_mb, rel=0.02, abs=w.trunk["depth"] * 8 / 2**10)
    assert not any("disagree" in line for line in (tmp_path / "bench.md").read_text().splitlines())


def test_alive_after_forward_is_repeatable_after_checkpointed_graphs():
    """The profiler's count is allocations minus frees in the window: garbage from an earlier checkpointed
    graph (reference cycles) freed inside it made it negative once. Now it repeats exactly."""
    w = SIZES["micro"]["lm"]
    model = bench.build_ours(w, "siamese", activation_checkpointing=True)
    c = Candidate("siamese", model, bench.OUR_LOSS["lm"], make_batch(w, torch.device("cpu")), Options())
    counts = []
    for _ in range(3):
        c.compute_loss().backward()  # leaves cycles behind, as the timed rounds do
        counts.append(bench.alive_after_forward_bytes(c))
    assert counts[0] > 0 and counts == [counts[0]] * 3


def siamese_row(act_mb: float, alive_mb: float, step_ratio: float = 1.05, size: str = "small") -> bench.Row:
    return bench.Row("lm", size, "schemes", "siamese", "pre", 10.0, 9.0, 11.0, 1.0, "tokens/s", step_ratio,
                     act_mb, act_mb / 20, alive_mb, alive_mb / 20, 1, 1.0, 1.0)  # fmt: skip


def test_targets_judge_activation_memory_on_the_count_that_sees_everything():
    agree = bench.targets([siamese_row(act_mb=21.4, alive_mb=21.4)])
    assert [(t.what, t.value, t.met) for t in agree] == [
        ("lm/small siamese/pre activation memory", pytest.approx(1.07), True),
        ("lm/small siamese/pre step time", 1.05, True),
    ]
    disagree = bench.targets([siamese_row(act_mb=20.0, alive_mb=36.0, step_ratio=1.2, size="tiny")])
    assert [(t.what, t.value, t.met) for t in disagree] == [  # tiny: no step-time goal
        ("lm/tiny siamese/pre activation memory (profiler)", pytest.approx(1.8), False),
    ]
    compiled = bench.targets([siamese_row(act_mb=21.4, alive_mb=21.4)], compiled=True)
    assert [(t.what, t.limit, t.met) for t in compiled] == [
        ("lm/small compiled siamese/pre activation memory", 1.05, False),
        ("lm/small compiled siamese/pre step time", 1.05, True),
    ]


def test_unknown_scheme_is_refused():
    with pytest.raises(SystemExit, match="unknown scheme 'prenorm'"):
        bench.parse_schemes("pre,prenorm")
    with pytest.raises(SystemExit, match="unknown recompute suffix 'siamese@maybe'"):
        bench.parse_schemes("siamese@maybe")
    assert bench.parse_schemes("pre,siamese,pre") == ["pre", "siamese", "pre#2"]
    assert bench.parse_schemes("siamese,siamese@off") == ["siamese", "siamese@off"]
    with pytest.raises(SystemExit, match="unknown norm layer in 'pre:batchnorm'"):
        bench.parse_schemes("pre:batchnorm")
    assert bench.parse_schemes("pre:dyt,siamese:dyt@off") == ["pre:dyt", "siamese:dyt@off"]


def test_recompute_suffix_builds_the_network_it_names():
    w = SIZES["micro"]["lm"]
    spec = bench.RunSpec(["siamese"], recompute_norms=False)
    for label, expected in (("siamese", False), ("siamese@on", True), ("siamese@auto", "auto")):
        c = bench.build_candidate(w, label, spec, Options())
        assert c.model.trunk.cfg.recompute_norms == expected and c.name == label


def test_norm_layer_suffix_builds_the_network_it_names():
    """``pre:dyt``: the workload's scheme with every norm DyT (the workload's own layer otherwise)."""
    from models.norms import DyT

    w = SIZES["micro"]["lm"]
    spec = bench.RunSpec(["pre"])
    plain, dyt = (bench.build_candidate(w, label, spec, Options()) for label in ("pre", "pre:dyt@off"))
    assert plain.model.trunk.cfg.norm_layer == "rmsnorm" and not any(isinstance(m, DyT) for m in plain.model.modules())
    assert dyt.model.trunk.cfg.norm_layer == "dyt" and dyt.model.trunk.cfg.recompute_norms is False
    assert any(isinstance(m, DyT) for m in dyt.model.modules()) and dyt.name == "pre:dyt@off"


#################################################################################
#                         Hand-counted memory and FLOPs                          #
#################################################################################


def test_saved_tensor_bytes_of_linear_gelu_is_the_hand_count():
    lin = nn.Linear(8, 16)
    x = torch.randn(4, 8)
    nbytes, out = saved_tensor_bytes(lambda: F.gelu(lin(x)), lin.parameters())
    # Linear saves its input x (for the weight gradient); GELU saves its input, the Linear output.
    assert nbytes == (4 * 8 + 4 * 16) * F32
    x.requires_grad_()  # now the input gradient needs the weight: it is saved too, and counted unless excluded
    nbytes, out = saved_tensor_bytes(lambda: F.gelu(lin(x)), lin.parameters())
    assert nbytes == (4 * 8 + 4 * 16) * F32
    nbytes, out = saved_tensor_bytes(lambda: F.gelu(lin(x)))
    assert nbytes == (4 * 8 + 4 * 16 + 16 * 8) * F32


def test_saved_tensor_bytes_counts_a_storage_once():
    lin = nn.Linear(8, 16)
    x = torch.randn(4, 8)

    def fn():
        a1, a2 = lin(x).chunk(2, dim=-1)  # two views of one (4, 16) storage, each saved by its GELU
        return F.gelu(a1) + F.gelu(a2)

    nbytes, out = saved_tensor_bytes(fn, lin.parameters())
    assert nbytes == (4 * 8 + 4 * 16) * F32


def test_step_flops_is_the_hand_count():
    class TwoLayer(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 4)

        def forward(self, x):
            return self.fc2(F.gelu(self.fc1(x)))

    b = 5
    c = Candidate("mlp", TwoLayer(), lambda m, batch: m(batch[0]).square().mean(), (torch.randn(b, 8),), Options())
    forward = 2 * b * (8 * 16 + 16 * 4)
    backward = 2 * (2 * b * 16 * 4) + 2 * b * 8 * 16  # fc2: input and weight gradients; fc1: weight only
    assert step_flops(c) == forward + backward


def test_step_flops_counts_cpu_attention():
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

    class Attend(nn.Module):
        def __init__(self):
            super().__init__()
            self.q = nn.Parameter(torch.randn(2, 3, 10, 8))

        def forward(self, kv):
            return F.scaled_dot_product_attention(self.q, kv, kv, is_causal=True)

    shape = (2, 3, 10, 8)
    c = Candidate("sdpa", Attend(), lambda m, batch: m(batch[0]).sum(), (torch.randn(shape),), Options())
    assert step_flops(c) == sdpa_flop_count(shape, shape, shape) + sdpa_backward_flop_count(shape, *[shape] * 3) > 0


#################################################################################
#                          Reference implementations                            #
#################################################################################


@pytest.mark.parametrize("task", ["lm", "vit", "dit"])
def test_reference_pair_computes_the_same_loss(task: str):
    w = SIZES["micro"][task]
    ref = reference(w)
    assert not isinstance(ref, str) and ref.same_weights
    batch = make_batch(w, torch.device("cpu"))
    ref.theirs.eval()
    ref.ours.eval()
    with torch.no_grad():
        torch.testing.assert_close(bench.OUR_LOSS[task](ref.ours, batch), ref.loss(ref.theirs, batch))


def test_reference_pair_with_grouped_query_attention_computes_the_same_loss():
    """The micro LM with 1 key/value head of 2 (``num_kv_heads``): transformers' Llama with grouped-query attention."""
    lm = SIZES["micro"]["lm"]
    w = dataclasses.replace(lm, trunk={**lm.trunk, "num_kv_heads": 1})
    ref = reference(w)
    assert not isinstance(ref, str) and ref.same_weights
    assert ref.theirs.config.num_key_value_heads == 1 < ref.theirs.config.num_attention_heads
    assert ref.ours.cfg.num_kv_heads == 1
    batch = make_batch(w, torch.device("cpu"))
    ref.theirs.eval()
    ref.ours.eval()
    with torch.no_grad():
        torch.testing.assert_close(bench.OUR_LOSS["lm"](ref.ours, batch), ref.loss(ref.theirs, batch))


#################################################################################
#                              Compiled vs eager                                 #
#################################################################################


@pytest.mark.skipif(
    shutil.which(os.environ.get("CXX", "g++")) is None, reason="torch.compile on CPU needs a C++ compiler"
)
@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["pre", "siamese"])
def test_compiled_trunk_matches_eager(scheme: str):
    """The tiny LM's trunk (one block, to keep the compile short) through inductor, in one graph."""
    cfg = TrunkConfig(**{**PRESETS["lm-tiny"].trunk, "norm_scheme": scheme, "depth": 1})
    trunk = Trunk(cfg).eval()
    x, rope = torch.randn(2, 16, cfg.dim), rope_tables(16, cfg.dim // cfg.num_heads)
    with torch.no_grad():
        eager = trunk(x, rope=rope, is_causal=True)
        # scalar C++ kernels compile several times faster than vectorized ones; the fusion is the same
        with torch._inductor.config.patch({"cpp.vec_isa_ok": False}):
            compiled = torch.compile(trunk, fullgraph=True)(x, rope=rope, is_causal=True)
    torch.testing.assert_close(compiled, eager)


#################################################################################
#                                  GPU script                                    #
#################################################################################


def test_gpu_bench_cpu_smoke_reports_flops_and_mfu(tmp_path: Path):
    spec = importlib.util.spec_from_file_location("gpu_bench", ROOT / "scripts" / "gpu_bench.py")
    gpu_bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_bench)
    argv = ["--cpu-smoke", "--tasks", "dit", "--schemes", "pre,siamese", "--steps", "1", "--warmup", "0"]
    rows = gpu_bench.main(argv + ["--peak-tflops", "0.5", "--out", str(tmp_path)])
    assert [r.name for r in rows] == ["pre", "siamese", "diffusers DiTTransformer2DModel", "ours (pre)"]
    for r in rows:
        assert r.tflop > 0
        assert r.mfu == pytest.approx(r.tflop / (r.step_ms / 1e3) / 0.5)
    assert rows[1].tflop == rows[0].tflop  # SiameseNorm adds norms and additions, no matmul
    assert "TFLOP/step" in (tmp_path / "bench.md").read_text()
    assert gpu_bench.peak_tflops("NVIDIA H200") == 989.0 and math.isnan(gpu_bench.peak_tflops("cpu"))
    assert gpu_bench.peak_tflops("NVIDIA H100 PCIe") == 756.0


@pytest.mark.slow
def test_gpu_check_cpu_smoke_writes_every_section(tmp_path: Path):
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    argv = ["--cpu-smoke", "--steps", "1", "--warmup", "0", "--loss-steps", "4", "--out", str(tmp_path)]
    report = gpu_check.main(argv)
    names = [r.name for r in report["rows"]]
    assert names[:5] == list(gpu_check.LM_SCHEMES)
    assert names[5:] == ["timm VisionTransformer", "ours (pre)", "diffusers DiTTransformer2DModel", "ours (pre)"]
    checks = {t.what.split(":")[0]: t for t in report["targets"]}
    assert set(checks) == {"fsdp", "fsdp2 fit", "loss", "bf16 params (hyper)", "bf16 params (siamese)", "moe", "diag",
                           "meta init", "train-compiled"}  # fmt: skip
    assert checks["train-compiled"].value == 0  # every compiled module compiled, no eager one did
    assert checks["meta init"].value == 0  # the same bits: built on meta and filled, or built in full
    assert all(t.met for t in checks.values())
    assert 0 < checks["loss"].value < gpu_check.LOSS_RTOL  # bf16 against fp32: close, not identical
    text = (tmp_path / "gpu_check.md").read_text()
    trained = json.loads((tmp_path / "training_step.json").read_text())  # bench --training-step's own record
    assert [(c["scheme"], c["mode"]) for c in trained["runs"][0]["candidates"]] == [
        (s, m) for s in gpu_check.TRAIN_SCHEMES_SMOKE for m in ("eager", "compiled")
    ]
    assert all(sum(c["graphs_per_step"]) > 0 for c in trained["runs"][0]["candidates"] if c["mode"] == "compiled")
    assert "compiled (aot_eager), activation checkpointing" in text and "| siamese | " in text
    assert re.search(r"whole validation split after the FSDP2 resume: [1-9]\d* batches", text)
    for heading in ("# GPU check", "## Compiled training step (every scheme, eager and compiled)",
                    "## FSDP2 on one device", "## fit / resume under configs/trainer/fsdp2.yaml",
                    "## 4 real steps of the tiny LM", "## bf16 parameters under FSDP2", "## MoE under bf16-mixed",
                    "## Diagnostics under FSDP2", "## Meta-device init", "## Checks"):  # fmt: skip
        assert heading in text
    with pytest.raises(SystemExit, match="--sections"):
        gpu_check.main(["--cpu-smoke", "--sections", "lm,gpu"])


#################################################################################
#                          Norm share and the scaling sweep                      #
#################################################################################


def test_norm_share_is_zero_without_norms_and_most_of_a_norm_stack():
    class Stack(nn.Module):
        def __init__(self, norms: bool):
            super().__init__()
            self.scale = nn.Parameter(torch.ones(256))
            self.layers = nn.ModuleList(nn.LayerNorm(256) if norms else nn.Identity() for _ in range(6))

        def forward(self, x):
            x = x * self.scale
            for layer in self.layers:
                x = layer(x)
            return x

    batch = (torch.randn(512, 256),)
    shares = {}
    for norms in (False, True):
        c = Candidate("stack", Stack(norms), lambda m, b: m(b[0]).square().mean(), batch, Options())
        shares[norms] = bench.norm_time_share(c)
    assert shares[False] == 0.0
    # A share of measured time: only its presence is asserted, not its size (a loaded machine moves it).
    assert 0.0 < shares[True] <= 1.0


@pytest.mark.slow
def test_scaling_sweep_writes_table_csv_and_plot(tmp_path: Path):
    argv = ["--scaling", "--widths", "32,64", "--depths", "1,2", "--width-depth", "1", "--depth-width", "32"]
    rows = bench.main(argv + ["--scaling-batch", "2x16", "--steps", "1", "--warmup", "0", "--out", str(tmp_path)])
    assert [(r.axis, r.dim, r.depth) for r in rows] == [("width", 32, 1), ("width", 64, 1), ("depth", 32, 1),
                                                         ("depth", 32, 2)]  # fmt: skip
    for r in rows:
        assert r.act_ratio > 1.0 and r.step_ratio > 0  # the second stream is always kept
        assert 0 < r.norm_share_pre < 1 and 0 < r.norm_share_siamese < 1
    with open(tmp_path / "scaling.csv") as f:
        assert next(csv.reader(f)) == bench.SCALING_COLUMNS
    text = (tmp_path / "scaling.md").read_text()
    assert "siamese/pre step" in text and "scaling: siamese/pre step time overhead at d64 over d32" in text
    assert (tmp_path / "scaling.png").stat().st_size > 10_000
    with pytest.raises(SystemExit, match="--widths"):
        bench.main(["--scaling", "--widths", "0,x"])


def test_scaling_target_is_met_when_the_overhead_shrinks():
    def row(dim: int, step: float, act: float) -> bench.ScalingRow:
        return bench.ScalingRow("width", dim, 2, 2, 1, 1.0, step, step, 1.0, act, 0.1, 0.2)

    goals = bench.scaling_targets([row(128, 1.20, 1.07), row(1024, 1.05, 1.08)])
    assert [(t.met, round(t.value, 3)) for t in goals] == [(True, 0.25), (False, 1.143)]


#################################################################################
#                     The MoE LM and the paper's overhead claim                 #
#################################################################################


def test_moe_bench_measures_schemes_and_prints_the_papers_claim_beside_them(tmp_path: Path):
    argv = ["--task", "moe", "--size", "micro", "--schemes", "pre,siamese", "--steps", "1", "--warmup", "0"]
    rows = bench.main(argv + ["--out", str(tmp_path)])
    assert [(r.group, r.name, r.unit) for r in rows] == [
        ("schemes", "pre", "tokens/s"),
        ("schemes", "siamese", "tokens/s"),
    ]
    pre, siamese = rows
    w = SIZES["micro"]["moe"]
    model = bench.build_ours(w, "pre")
    assert all(isinstance(block.mlp, MoE) and block.mlp.num_experts == 4 for block in model.trunk.blocks)
    assert pre.params == sum(p.numel() for p in model.parameters()) and siamese.param_ratio > 1.0
    text = (tmp_path / "bench.md").read_text()
    assert "moe/micro reference skipped: no reference MoE LM here" in text
    throughput = 100 * (1 / siamese.step_ratio - 1)
    line = next(ln for ln in text.splitlines() if ln.startswith("- moe/micro siamese vs pre:"))
    assert f"throughput {throughput:+.2f} % (paper: -0.50 %)" in line
    assert f"activation memory {100 * (siamese.act_ratio - 1):+.2f} % (paper: +2.00 %)" in line
    assert f"parameters {100 * (siamese.param_ratio - 1):+.2f} % (paper: < 0.1 %)" in line


def test_moe_loss_is_cross_entropy_plus_the_weighted_load_balancing_loss():
    w = SIZES["micro"]["moe"]
    torch.manual_seed(0)
    model = bench.build_ours(w, "siamese")
    batch = make_batch(w, torch.device("cpu"))
    logits, routing = model(batch[0][:, :-1], return_aux=True)
    ce = F.cross_entropy(logits.reshape(-1, 256), batch[0][:, 1:].reshape(-1))
    expected = ce + 0.04 * routing.loss / w.trunk["depth"]  # the per-layer mean at moe-tiny's weight
    assert bench.moe_loss(model, batch).item() == pytest.approx(expected.item(), rel=1e-6)
    assert routing.loss.item() > 0.9 * w.trunk["depth"]  # about 1 per layer: the term is there, not zero


def test_claim_lines_put_the_papers_overhead_next_to_each_siamese_row():
    overhead = {"setting": "15B MoE on GPUs", "throughput": -0.005, "activation_memory": 0.02, "parameters": 0.001}
    row = siamese_row(act_mb=21.0, alive_mb=21.0, step_ratio=1.25)  # act_ratio 21 / 20 = 1.05
    assert bench.claim_lines([row], overhead) == [
        "- lm/small siamese vs pre: throughput -20.00 % (paper: -0.50 %), activation memory +5.00 % "
        "(paper: +2.00 %), parameters +0.00 % (paper: < 0.1 %)",
        "- the paper measured a 15B MoE on GPUs; the lines above, this bench's model on this device and load",
    ]
    assert bench.claim_lines([row], None) == []
    assert bench.paper_overhead() == {
        "setting": "15B MoE on GPUs", "parameters": 0.001, "throughput": -0.005, "activation_memory": 0.02
    }  # fmt: skip
