"""What a DiT generation protocol costs: the three parts of every sample, timed, and FLOPs for a GPU estimate.

    python scripts/dit_sampling_cost.py                     # DiT-B/2, 250 DDPM steps, 50k samples, on CPU
    python scripts/dit_sampling_cost.py --preset dit-l4 --batch 8 --rounds 3

Per sample: ``steps`` forward passes of the DiT (x2 with guidance != 1), one decode by an sd-vae-ft-ema-shaped
``AutoencoderKL`` (random weights: the cost is the shape's), one InceptionV3 feature pass. Each part is
timed on this machine (median of ``--rounds``), and its FLOPs are counted with ``torch.utils.flop_counter``,
so the same protocol on another device can be estimated as FLOPs / (peak FLOP/s x an assumed utilization).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file from anywhere

from diffusers import AutoencoderKL  # noqa: E402

from experiments.evaluation.fid import build_feature_extractor  # noqa: E402
from models import DiT, TrunkConfig  # noqa: E402

PRESETS = {"dit-b2": (768, 12, 12, 2), "dit-l4": (1024, 24, 16, 4)}  # dim, depth, heads, patch


def timed(fn, rounds: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def flops(fn) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


@torch.no_grad()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="dit-b2")
    parser.add_argument("--batch", type=int, default=4, help="samples per forward pass")
    parser.add_argument("--steps", type=int, default=250)
    parser.add_argument("--samples", type=int, default=50000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--peak-tflops", type=float, default=494.0, help="target device peak: H200 dense TF32 (sampling is fp32/TF32)"
    )
    parser.add_argument("--utilization", type=float, default=0.4, help="assumed fraction of the peak reached")
    args = parser.parse_args()
    dim, depth, heads, patch = PRESETS[args.preset]
    trunk = TrunkConfig(dim=dim, depth=depth, num_heads=heads, mlp="gelu_tanh", init="xavier")
    net = DiT(trunk, input_size=32, patch_size=patch, in_channels=4, num_classes=1000, learn_sigma=True).eval()
    vae = AutoencoderKL(  # sd-vae-ft-ema's architecture (diffusers defaults for it), random weights
        down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
        block_out_channels=(128, 256, 512, 512), layers_per_block=2, latent_channels=4, sample_size=256,
    ).eval()  # fmt: skip
    extractor = build_feature_extractor()  # the metrics' own network (proxy if no weights: then it says so)
    x, t = torch.randn(args.batch, 4, 32, 32), torch.full((args.batch,), 500)
    y = torch.arange(args.batch) % 1000
    images = torch.randint(0, 256, (1, 3, 256, 256), dtype=torch.uint8)
    parts = {
        f"DiT forward x{args.steps} steps": (lambda: net(x, t, y), args.batch, args.steps),
        "VAE decode 32x32x4 -> 256 px": (lambda: vae.decode(x[:1] / 0.18215).sample, 1, 1),
    }
    parts[f"features ({extractor.backend})"] = (lambda: extractor.module(images), 1, 1)
    total_s = total_flops = 0.0
    print(f"{args.preset}, {args.samples} samples, {args.steps} steps, threads={torch.get_num_threads()}")
    for name, (fn, per_call, calls) in parts.items():
        seconds = timed(fn, args.rounds) / per_call * calls  # per sample
        work = flops(fn) / per_call * calls
        total_s, total_flops = total_s + seconds, total_flops + work
        print(f"  {name:<28} {seconds:9.3f} s/sample  {work / 1e9:9.1f} GFLOP/sample")
    hours = total_s * args.samples / 3600
    gpu_s = total_flops * args.samples / (args.peak_tflops * 1e12 * args.utilization)
    print(f"  this machine: {1 / total_s:.4f} samples/s -> {args.samples} samples in {hours:.1f} h")
    print(
        f"  {total_flops * args.samples / 1e15:.1f} PFLOP in all; at {args.peak_tflops:g} TFLOP/s x "
        f"{args.utilization:g} utilization: {gpu_s / 60:.1f} min"
    )


if __name__ == "__main__":
    main()
