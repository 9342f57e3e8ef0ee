"""GPU benchmark at the paper's shapes: every norm scheme's bf16 training step, its memory and its MFU.

    python scripts/gpu_bench.py                                  # 1.3B-LM block stack, DiT-B/2, DeiT-S
    python scripts/gpu_bench.py --schemes pre,siamese --tasks lm --lm-depth 8 --peak-tflops 989
    python scripts/gpu_bench.py --cpu-smoke                      # micro shapes on the CPU: checks the script only

The method is ``python -m experiments.bench``'s (one model and AdamW per candidate, interleaved rounds,
medians and paired ratios to ``pre``, saved-for-backward activation bytes), plus on CUDA the peak allocated
memory of one step and MFU = model FLOPs per step / step time / the device's peak dense bf16 FLOP/s.
Model FLOPs are what ``torch.utils.flop_counter`` counts over one forward + backward: matmuls,
convolutions and attention (in full also when causal, as in PaLM's MFU; its backward with the recomputed
scores, 3.5x the forward where PaLM counts 3x); not elementwise work or AdamW.

Shapes (one GPU): the LM is the 1.3B model's block (d 2048, 16 heads, SwiGLU 8192, QK-norm, RMSNorm) x
``--lm-depth`` with its 50304-token embedding and head, seq 2048; DiT-B/2 on 32x32x4 latents with learned
sigma; DeiT-S at 224 px. Without a CUDA device the script falls back to the CPU smoke shapes by itself.
"""

from __future__ import annotations

import argparse
import math
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file from anywhere

from experiments.bench import (  # noqa: E402
    SIZES,
    TASKS,
    Options,
    Row,
    RunSpec,
    Task,
    Workload,
    bench_tasks,
    machine_info,
    parse_schemes,
    write_report,
)
from experiments.monitoring.throughput import peak_flops_of  # noqa: E402
from models.presets import PRESETS  # noqa: E402


# Dense (not 2:4-sparse) bf16 tensor-core peaks from the vendors' datasheets, TFLOP/s; first match wins.
def peak_tflops(device_name: str) -> float:
    """The datasheet peak for a device name such as ``"NVIDIA H200"`` (the one table every run's MFU uses:
    :data:`experiments.monitoring.throughput.PEAK_BF16`); NaN when unknown."""
    flops = peak_flops_of(device_name)
    return math.nan if flops is None else flops / 1e12


def paper_workloads(lm_depth: int, lm_batch: int, dit_batch: int, vit_batch: int) -> dict[Task, Workload]:
    """The paper's shapes, sized for one GPU."""
    lm_trunk = {**PRESETS["lm-1.3b"].trunk, "depth": lm_depth}  # the 1.3B model's block, fewer of them
    lm_net = dict(vocab_size=50304, max_seq_len=2048)
    dit_net = dict(input_size=32, patch_size=2, in_channels=4, num_classes=1000, learn_sigma=True)
    vit_net = dict(img_size=224, patch_size=16, in_chans=3, num_classes=1000)
    return {
        "lm": Workload("lm", lm_trunk, lm_net, lm_batch),
        "dit": Workload("dit", PRESETS["dit-b2"].trunk, dit_net, dit_batch),
        "vit": Workload("vit", PRESETS["deit-small"].trunk, vit_net, vit_batch),
    }


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python scripts/gpu_bench.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", default="lm,dit,vit", help=f"comma list of {', '.join(TASKS)}")
    p.add_argument("--schemes", default="all", help="comma list of norm schemes, or 'all'")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--lm-depth", type=int, default=4, help="blocks of the 1.3B LM (the full model has 16)")
    p.add_argument("--lm-batch", type=int, default=4, help="sequences of 2048 tokens per step")
    p.add_argument("--dit-batch", type=int, default=64)
    p.add_argument("--vit-batch", type=int, default=128)
    p.add_argument("--peak-tflops", type=float, default=None, help="peak bf16 TFLOP/s (default: by device name)")
    p.add_argument("--fp32", action="store_true", help="no bf16 autocast")
    p.add_argument("--compile", action="store_true", help="torch.compile every network")
    p.add_argument("--checkpointing", action="store_true", help="activation checkpointing per block")
    p.add_argument("--no-reference", action="store_true", help="skip timm / diffusers / transformers")
    p.add_argument("--cpu-smoke", action="store_true", help="micro shapes on the CPU (also used without CUDA)")
    p.add_argument("--out", default="runs/bench/gpu", help="output directory")
    return p


def main(argv: Sequence[str] | None = None) -> list[Row]:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if not tasks or any(t not in TASKS for t in tasks):
        raise SystemExit(f"error: --tasks takes a comma list of {', '.join(TASKS)}, got {args.tasks!r}")
    smoke = args.cpu_smoke or not torch.cuda.is_available()
    if smoke and not args.cpu_smoke:
        print("note: no CUDA device; running the CPU smoke shapes (the numbers only show the script works)")
    device = torch.device("cpu" if smoke else "cuda")
    if smoke:
        workloads, size, name = SIZES["micro"], "micro (cpu smoke)", "cpu"
        torch.set_num_threads(1)  # as experiments.bench on CPU: a second OpenMP thread only stalls on a shared host
    else:
        workloads = paper_workloads(args.lm_depth, args.lm_batch, args.dit_batch, args.vit_batch)
        size, name = "paper", torch.cuda.get_device_name(device)
        torch.backends.cuda.matmul.allow_tf32 = True  # only --fp32 runs reach fp32 matmuls
    peak = args.peak_tflops if args.peak_tflops is not None else peak_tflops(name)
    opts = Options(device, bf16=not args.fp32, compile=args.compile, checkpointing=args.checkpointing)
    spec = RunSpec(parse_schemes(args.schemes), args.steps, args.warmup, reference=not args.no_reference,
                   peak_tflops=peak)  # fmt: skip
    header = {"command": shlex.join(["python", "scripts/gpu_bench.py", *argv]), **machine_info(device)}
    header["settings"] = (
        f"{args.steps} measured rounds after {args.warmup} warm-up rounds; bf16 {'off' if args.fp32 else 'on'}, "
        f"compile {'on' if args.compile else 'off'}, checkpointing {'on' if args.checkpointing else 'off'}; "
        f"MFU against {peak:g} TFLOP/s" + (" (unknown device: pass --peak-tflops)" if math.isnan(peak) else "")
    )
    rows, notes = bench_tasks([workloads[task] for task in tasks], size, spec, opts, header)
    text = write_report(Path(args.out), rows, header, notes)
    print(text)
    print(f"wrote {Path(args.out) / 'bench.md'} and {Path(args.out) / 'bench.csv'}")
    return rows


if __name__ == "__main__":
    main()
