"""One-shot GPU check (one command on one H200: about 8 minutes, plus the compiled training step's compilation of
six schemes): writes ``gpu_check.md``.

    python scripts/gpu_check.py                       # everything, bf16 + torch.compile + SDPA flash
    python scripts/gpu_check.py --sections lm,loss    # a subset
    python scripts/gpu_check.py --cpu-smoke           # micro shapes on the CPU: checks the script only

Sections, in order (each reports what it measured and its targets met or missed; the report is rewritten
after every section, so a run cut short keeps what it finished; ``--budget-s`` skips sections that would
start after the budget is spent):

1. ``lm``: a 1.3B-shape slice (d 2048, 16 heads, SwiGLU 8192, QK-norm, RMSNorm, ``--lm-depth`` blocks, the
   50304-token head, seq 2048): step time, tokens/s and MFU of pre, siamese and siamese_hybrid, the
   SiameseNorm ones with and without recomputed norms (``@on`` / ``@off``), interleaved as in
   ``python -m experiments bench`` (whose method this is: :mod:`experiments.bench`).
   ``train-compiled``: the training step as ``fit`` takes it (``python -m experiments bench --training-step``,
   :mod:`experiments.bench.training_step`): pre, post, deepnorm, hybrid, siamese and siamese_hybrid as the LM task
   builds them at the slice's shape with activation checkpointing (as ``configs/lm/olmo-1b.yaml`` trains), each
   eager and with training's compile path (``parallel.compile``: each Block compiled by inductor), interleaved in
   one process; median step time, its quartiles and the ratio to pre with its interval, eager and compiled side by
   side (also written as ``training_step.md`` / ``.csv`` / ``.json``). The CPU smoke run times pre and siamese at
   micro shapes under ``aot_eager``.
2. ``loss``: 200 real steps of ``configs/lm/tiny.yaml`` through ``python -m experiments fit``, bf16 on the
   GPU and fp32 on the CPU: the two training-loss curves agree within bf16 tolerance.
3. ``fsdp``: the LM slice under the suite's FSDP2 path on one GPU (``experiments.parallel.parallelize``: a unit
   per Block, bf16 parameters, fp32 reductions): the loss of a few steps against the unwrapped model, and the
   step time. ``fsdp2-fit``: the tiny LM through ``fit`` under ``configs/trainer/fsdp2.yaml`` (ModelParallelStrategy,
   a sharded checkpoint), resumed from it, against the default strategy. (Tensor parallelism needs 2 devices.)
4. ``bf16-params``: the tiny LM under ``hyper`` and ``siamese`` through ``fit`` with FSDP2's bfloat16 parameters
   (``param_dtype: bfloat16``) against the default strategy in float32: the curves agree within bf16 tolerance,
   and the run reports its tokens/s and peak memory (``summary.json``'s ``perf``).
   ``moe``: the tiny MoE under ``bf16-mixed`` on the GPU (the experts' ``_grouped_mm`` in bfloat16, CUDA's only
   kernel) against float32 on the CPU. (Expert parallelism needs two devices: the CPU tests hold it.)
   ``diag``: ``Diagnostics`` every step under FSDP2 on one device against the default strategy: every ``diag/``
   tag within bf16 tolerance. (A one-rank divergence needs two ranks: the CPU tests hold it; meta-device init
   is not built yet.)
5. ``images``: DeiT-S (224 px) against timm's VisionTransformer and DiT-B/2 (32x32x4 latents) against
   diffusers' DiTTransformer2DModel, same weights: images/s and ours/theirs step time.

The timing method, FLOP counting and MFU are :mod:`scripts.gpu_bench`'s.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a file from anywhere

from experiments.bench import (  # noqa: E402
    SIZES,
    Options,
    Row,
    RunSpec,
    Target,
    Workload,
    bench_task,
    interleave,
    machine_info,
    make_batch,
    markdown,
    reference,
    reference_candidates,
    summarize,
)
from scripts.gpu_bench import paper_workloads, peak_tflops  # noqa: E402

SECTIONS = ("lm", "train-compiled", "loss", "fsdp", "fsdp2-fit", "bf16-params", "moe", "diag", "meta-init", "images")
# The tiny LM shrunk for --cpu-smoke runs of `experiments fit` (the loss and fsdp2-fit sections)
TINY_LM_SMOKE = ["--model.init_args.trunk.dim=32", "--model.init_args.trunk.num_heads=2",
                 "--model.init_args.trunk.mlp_hidden=64", "--data.init_args.seq_len=32",
                 "--data.init_args.batch_size=8", "--data.init_args.eval_samples=16"]  # fmt: skip
LM_SCHEMES = ("pre", "siamese@on", "siamese@off", "siamese_hybrid@on", "siamese_hybrid@off")
TRAIN_SCHEMES = ("pre", "post", "deepnorm", "hybrid", "siamese", "siamese_hybrid")  # the compiled training step
TRAIN_SCHEMES_SMOKE = ("pre", "siamese")
LOSS_RTOL = 0.03  # bf16 vs fp32 training loss, averaged over windows of 20 steps


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python scripts/gpu_check.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--sections", default=",".join(SECTIONS), help=f"comma list of {', '.join(SECTIONS)}")
    p.add_argument("--lm-depth", type=int, default=2, help="blocks of the 1.3B-shape slice")
    p.add_argument("--lm-batch", type=int, default=4, help="sequences of 2048 tokens per step")
    p.add_argument("--steps", type=int, default=10, help="measured rounds")
    p.add_argument("--warmup", type=int, default=3, help="unmeasured rounds (the compile happens in the first)")
    p.add_argument("--loss-steps", type=int, default=None, help="training steps of the tiny LM (200; smoke 10)")
    p.add_argument("--no-compile", action="store_true", help="eager instead of torch.compile")
    p.add_argument("--peak-tflops", type=float, default=None, help="peak bf16 TFLOP/s (default: by device name)")
    p.add_argument("--budget-s", type=float, default=750.0, help="no section starts after this many seconds")
    p.add_argument("--cpu-smoke", action="store_true", help="micro shapes on the CPU (also used without CUDA)")
    p.add_argument("--out", default="runs/gpu_check", help="output directory (gpu_check.md and runs)")
    return p


#################################################################################
#                                   Sections                                    #
#################################################################################


def lm_section(w: Workload, size: str, opts: Options, args, peak: float) -> tuple[list[Row], list[str]]:
    spec = RunSpec(LM_SCHEMES, args.steps, args.warmup, reference=False, peak_tflops=peak)
    with _flash(opts):
        return bench_task(w, size, spec, opts)


def train_compiled_section(
    w: Workload, size: str, opts: Options, args, out: Path, smoke: bool, header: dict[str, str]
) -> tuple[list[str], list[Target]]:
    """Every scheme's training step eager and compiled as training compiles it (:mod:`experiments.bench.training_step`),
    checkpointed as the paper config trains; the report's table and lines, training_step.{md,csv,json} in ``out``."""
    from experiments.bench.training_report import bench_training_steps, training_markdown, write_training

    schemes = TRAIN_SCHEMES_SMOKE if smoke else TRAIN_SCHEMES
    spec = RunSpec(schemes, args.steps, max(args.warmup, 1), reference=False)
    train_opts = Options(opts.device, bf16=opts.bf16, checkpointing=True)
    backend = "aot_eager" if smoke else "inductor"
    header = {**header, "section": "train-compiled"}  # gpu_check's command line and machine
    with _flash(opts):
        rows, records = bench_training_steps([w], size, spec, train_opts, backend, header)
    write_training(out, rows, header, records)
    text = training_markdown(rows, {}).split("\n", 1)[1].strip()  # without the title; its headings one level down
    table = [f"#{line}" if line.startswith("## ") else line for line in text.splitlines()]
    problems = sum(not r.compiled or r.graphs == 0 or r.timed_graphs > 0 for r in rows if r.mode == "compiled")
    problems += sum(r.graphs > 0 for r in rows if r.mode == "eager")
    lines = [f"- {len(schemes)} schemes x eager, compiled ({backend}), activation checkpointing, bf16 "
             f"{'on' if opts.bf16 else 'off'}; {args.steps} rounds after {spec.warmup}; also in "
             f"{out / 'training_step.md'}", "", *table]  # fmt: skip
    what = "train-compiled: compiled modules without a graph or recompiling while timed, eager ones compiling"
    return lines, [Target(what, problems, 0)]


def images_section(
    workloads: Sequence[Workload], size: str, opts: Options, args, peak: float
) -> tuple[list[Row], list[str]]:
    """Ours (pre) against the reference library at the same weights, per workload."""
    rows, notes = [], []
    for w in workloads:
        torch.manual_seed(0)
        with opts.device:
            ref = reference(w)
        if isinstance(ref, str):
            notes.append(f"{w.task}/{size} reference {ref}")
            continue
        cands = reference_candidates(ref, w, make_batch(w, opts.device), opts)
        print(f"[{w.task}/{size}] ours vs {ref.name} x {args.steps} rounds ...", flush=True)
        with _flash(opts):
            interleave(cands, args.steps, args.warmup)
            rows += summarize(cands, w, size, "reference", ref.name, peak)
        del cands, ref
        if opts.device.type == "cuda":
            torch.cuda.empty_cache()
    return rows, notes


def fsdp_section(w: Workload, opts: Options, args, out: Path) -> tuple[list[str], list[Target]]:
    """The siamese LM slice, plain and under the suite's FSDP2 path (``experiments.parallel.parallelize`` on a
    one-process mesh: packed projections, fully_shard per Block and the root, bf16 parameters and fp32
    reductions on the GPU), same init and batch: losses and step times."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from experiments.bench.run import build_candidate
    from experiments.parallel import ParallelConfig, parallelize

    spec = RunSpec(("siamese",), args.steps, args.warmup)
    plain = build_candidate(w, "siamese", spec, opts)
    wrapped = build_candidate(w, "siamese", spec, opts)
    backend = "nccl" if opts.device.type == "cuda" else "gloo"
    store = out / "fsdp-store"
    store.unlink(missing_ok=True)
    dist.init_process_group(backend, init_method=f"file://{store.resolve()}", rank=0, world_size=1)
    try:
        mesh = init_device_mesh(opts.device.type, (1, 1), mesh_dim_names=("data_parallel", "tensor_parallel"))
        model = parallelize(wrapped.model, mesh, ParallelConfig(), seq_len=None)
        wrapped.model = wrapped.forward_model = model  # eager: FSDP2's hooks, no compile
        wrapped.optimizer = torch.optim.AdamW(model.parameters(), lr=opts.lr)
        plain.forward_model = plain.model
        plain.optimizer = torch.optim.AdamW(plain.model.parameters(), lr=opts.lr)
        losses = {"plain": [], "fsdp": []}
        for key, c in (("plain", plain), ("fsdp", wrapped)):
            for _ in range(3):
                c.optimizer.zero_grad(set_to_none=True)
                loss = c.compute_loss()
                loss.backward()
                c.optimizer.step()
                losses[key].append(loss.item())
        interleave([plain, wrapped], args.steps, args.warmup)
    finally:
        dist.destroy_process_group()
    gap = max(abs(a - b) / abs(a) for a, b in zip(losses["plain"], losses["fsdp"], strict=True))
    ratio = statistics.median(f / p for f, p in zip(wrapped.times, plain.times, strict=True))
    lines = [
        f"- losses of 3 steps, plain: {', '.join(f'{x:.4f}' for x in losses['plain'])}",
        f"- losses of 3 steps, FSDP2 (experiments.parallel, a unit per Block, bf16 parameters on the GPU): "
        f"{', '.join(f'{x:.4f}' for x in losses['fsdp'])}",
        f"- step time plain {1e3 * statistics.median(plain.times):.1f} ms, FSDP2 "
        f"{1e3 * statistics.median(wrapped.times):.1f} ms (FSDP2/plain {ratio:.3f}, eager)",
    ]
    return lines, [Target("fsdp: max relative loss gap to the unwrapped model over 3 steps", gap, 1e-2)]


def fsdp_fit_section(args, out: Path, smoke: bool) -> tuple[list[str], list[Target]]:
    """``experiments fit`` of the tiny LM under ``configs/trainer/fsdp2.yaml`` on one device (ModelParallelStrategy,
    a sharded checkpoint), then resumed from it, against the same steps under the default strategy."""
    from experiments.__main__ import main as experiments_main

    device = ["--trainer.accelerator=cpu" if smoke else "--trainer.accelerator=gpu", "--trainer.devices=1"]
    common = ["fit", "-c", str(ROOT / "configs/lm/tiny.yaml"), *device, "--trainer.limit_val_batches=1",
              "--trainer.val_check_interval=10", "--trainer.num_sanity_val_steps=0", "--summary.log_every_n_steps=1",
              "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
              "--model.init_args.optim.warmup_steps=10", "--run_name=run"]  # fmt: skip
    if smoke:  # and a validation split of 0.5 % (81 batches): the whole-split pass is what is checked, not its size
        common += [*TINY_LM_SMOKE, "--data.init_args.val_fraction=0.005"]
    fsdp2 = ["-c", str(ROOT / "configs/trainer/fsdp2.yaml"), "--trainer.strategy.data_parallel_size=1"]
    env = {name: os.environ.get(name) for name in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK")}
    curves, whole = {}, {}
    no_final = "--final_validation.enabled=false"  # the whole-split pass (thousands of batches on a GPU): once only
    for name, extra in (("plain", []), ("fsdp2", fsdp2)):
        runs = out / f"fsdp2-{name}"
        experiments_main([*common, *extra, f"--runs_root={runs}", "--trainer.max_steps=10", no_final])
        last = [] if name == "fsdp2" else [no_final]  # the whole split validated under FSDP2, after the resume
        experiments_main([*common, *extra, f"--runs_root={runs}", "--trainer.max_steps=20", "--ckpt_path=last", *last])
        summary = json.loads(next(runs.glob("lm/*/run/summary.json")).read_text())
        curves[name] = [loss for _, loss in summary["train_curve"]]
        whole[name] = summary.get("whole_split_val_protocol", {}).get("batches_per_rank")
    import torch.distributed as dist

    if dist.is_initialized():  # ModelParallelStrategy on one device leaves its one-rank group (and variables)
        dist.destroy_process_group()
    for name, value in env.items():
        os.environ.pop(name, None) if value is None else os.environ.__setitem__(name, value)
    sharded = next((out / "fsdp2-fsdp2").glob("lm/*/run/checkpoints/last.ckpt"))
    worst = max(abs(f - p) / p for p, f in zip(curves["plain"], curves["fsdp2"], strict=True))
    lines = [
        f"- 10 steps, saved, resumed to 20; final loss plain {curves['plain'][-1]:.4f}, "
        f"FSDP2 {curves['fsdp2'][-1]:.4f}",
        f"- the FSDP2 run's last.ckpt is {'a folder of shards' if sharded.is_dir() else 'a file'}",
        f"- the whole validation split after the FSDP2 resume: {whole['fsdp2']} batches",
    ]
    return lines, [Target("fsdp2 fit: max relative loss gap to the default strategy, 20 steps", worst, LOSS_RTOL)]


def _fit(out: Path, name: str, smoke: bool, steps: int, *extra: str) -> Path:
    """One ``experiments fit`` of the tiny LM under ``out/name``; the run's directory. Restores the process group
    and the distributed environment a one-device ModelParallelStrategy leaves behind."""
    import torch.distributed as dist

    from experiments.__main__ import main as experiments_main

    env = {k: os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK")}
    runs = out / name
    argv = ["fit", "-c", str(ROOT / "configs/lm/tiny.yaml"), f"--trainer.max_steps={steps}",
            "--trainer.limit_val_batches=1", f"--trainer.val_check_interval={steps}",
            "--trainer.num_sanity_val_steps=0", "--summary.log_every_n_steps=1", "--trainer.log_every_n_steps=1",
            "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false", f"--runs_root={runs}",
            "--run_name=run", "--final_validation.enabled=false",  # curves are compared; no whole-split pass
            *(TINY_LM_SMOKE if smoke else []), *extra]  # fmt: skip
    experiments_main(argv)
    if dist.is_initialized():
        dist.destroy_process_group()
    for key, value in env.items():
        os.environ.pop(key, None) if value is None else os.environ.__setitem__(key, value)
    return next(runs.glob("lm/*/run"))


def _curve(run: Path) -> list[float]:
    return [loss for _, loss in json.loads((run / "summary.json").read_text())["train_curve"]]


def _gap(a: list[float], b: list[float]) -> float:
    """The largest relative gap of two curves' means over windows of (up to) 20 steps."""
    window = min(20, len(a))
    means = [(statistics.fmean(a[i : i + window]), statistics.fmean(b[i : i + window]))
             for i in range(0, len(a) - window + 1, window)]  # fmt: skip
    return max(abs(y - x) / x for x, y in means)


def bf16_params_section(args, out: Path, smoke: bool) -> tuple[list[str], list[Target]]:
    """FSDP2 with bfloat16 parameters (hyper, siamese) against the default strategy in float32."""
    accel = "--trainer.accelerator=cpu" if smoke else "--trainer.accelerator=gpu"
    fsdp2 = ["-c", str(ROOT / "configs/trainer/fsdp2.yaml"), "--trainer.strategy.data_parallel_size=1",
             "--trainer.devices=1", "--model.init_args.parallel.param_dtype=bfloat16"]  # fmt: skip
    lines, targets = [], []
    for scheme in ("hyper", "siamese"):
        norm = ["-c", str(ROOT / f"configs/norm/{scheme}.yaml")]
        plain = _fit(out, f"bf16-{scheme}-fp32", smoke, args.loss_steps, *norm, accel, "--trainer.devices=1")
        bf16 = _fit(out, f"bf16-{scheme}-bf16", smoke, args.loss_steps, *norm, accel, *fsdp2)
        gap = _gap(_curve(plain), _curve(bf16))
        perf = json.loads((bf16 / "summary.json").read_text()).get("perf", {})
        lines.append(
            f"- {scheme}: final loss fp32 {_curve(plain)[-1]:.4f}, FSDP2 bf16 parameters {_curve(bf16)[-1]:.4f}; "
            f"{perf.get('tokens_per_s', float('nan')):.0f} tokens/s, peak {perf.get('peak_mem_gb', float('nan')):.2f} "
            f"GB, MFU {perf.get('mfu', 'n/a')}"
        )
        targets.append(Target(f"bf16 params ({scheme}): max relative windowed loss gap to fp32", gap, LOSS_RTOL))
    return lines, targets


def moe_section(args, out: Path, smoke: bool) -> tuple[list[str], list[Target]]:
    """The tiny MoE under bf16-mixed on the GPU (bf16 grouped matmul) against float32 on the CPU."""
    moe = ["-c", str(ROOT / "configs/lm/moe-tiny.yaml")]
    gpu = ["--trainer.accelerator=cpu" if smoke else "--trainer.accelerator=gpu", "--trainer.precision=bf16-mixed"]
    cpu = _fit(out, "moe-cpu", smoke, args.loss_steps, *moe, "--trainer.accelerator=cpu", "--trainer.precision=32-true")
    half = _fit(out, "moe-bf16", smoke, args.loss_steps, *moe, *gpu, "--trainer.devices=1")
    gap = _gap(_curve(cpu), _curve(half))
    lines = [f"- final loss CPU fp32 {_curve(cpu)[-1]:.4f}, bf16-mixed {_curve(half)[-1]:.4f}"]
    return lines, [Target("moe: max relative windowed loss gap, bf16-mixed vs fp32", gap, LOSS_RTOL)]


def diag_section(args, out: Path, smoke: bool) -> tuple[list[str], list[Target]]:
    """Diagnostics every step under FSDP2 on one device against the default strategy (both float32)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accel = "--trainer.accelerator=cpu" if smoke else "--trainer.accelerator=gpu"
    diag = ["--trainer.callbacks+=experiments.monitoring.diagnostics.Diagnostics",
            "--trainer.callbacks.every_n_steps=1", accel, "--trainer.devices=1",
            "-c", str(ROOT / "configs/norm/siamese.yaml")]  # fmt: skip
    fsdp2 = ["-c", str(ROOT / "configs/trainer/fsdp2.yaml"), "--trainer.strategy.data_parallel_size=1",
             "--model.init_args.parallel.param_dtype=float32"]  # fmt: skip
    steps = min(args.loss_steps, 10)

    def tags(run: Path) -> dict[str, dict[int, float]]:
        acc = EventAccumulator(str(next(run.rglob("events.out.tfevents.*"))), size_guidance={"scalars": 0})
        acc.Reload()
        return {t: {e.step: e.value for e in acc.Scalars(t)} for t in acc.Tags()["scalars"] if t.startswith("diag/")}

    plain, sharded = (
        tags(_fit(out, "diag-plain", smoke, steps, *diag)),
        tags(_fit(out, "diag-fsdp2", smoke, steps, *diag, *fsdp2)),
    )
    gaps = [abs(sharded[t][s] - v) / max(abs(v), 1e-6) for t, vs in plain.items() for s, v in vs.items()
            if s in sharded.get(t, {})]  # fmt: skip
    missing = sorted(set(plain) ^ set(sharded))
    lines = [f"- {len(plain)} diag/ tags over {steps} steps; tags only one run logged: {missing or 'none'}"]
    worst = max(gaps) if gaps and not missing else float("inf")
    return lines, [Target("diag: max relative gap of every diag/ tag, FSDP2 vs default strategy", worst, 1e-3)]


def meta_init_section(args, out: Path, smoke: bool) -> tuple[list[str], list[Target]]:
    """A network built on the meta device and filled on the GPU rank gives the first loss of one built in full;
    then one rank's init time and peak host memory for olmo-1b at world 8 (scripts/meta_init_cost.py)."""
    accel = "--trainer.accelerator=cpu" if smoke else "--trainer.accelerator=gpu"
    fsdp2 = ["-c", str(ROOT / "configs/trainer/fsdp2.yaml"), "--trainer.strategy.data_parallel_size=1",
             "--trainer.devices=1", "--model.init_args.parallel.param_dtype=float32", accel,
             "-c", str(ROOT / "configs/norm/siamese.yaml")]  # fmt: skip
    full = _curve(_fit(out, "meta-full", smoke, 2, *fsdp2))
    meta = _curve(_fit(out, "meta-meta", smoke, 2, *fsdp2, "--model.init_args.meta_init=true"))
    lines = [f"- first loss built in full {full[0]:.6f}, on meta then filled {meta[0]:.6f}"]
    if smoke:  # two more interpreters and builds add nothing a CPU smoke run shows
        lines.append("- init time and peak host memory of olmo-1b: not measured in the CPU smoke run")
    for meta_flag in [] if smoke else ([], ["--meta"]):
        config = "configs/lm/olmo-1b.yaml"
        done = subprocess.run([sys.executable, str(ROOT / "scripts/meta_init_cost.py"), config, *meta_flag],
                              capture_output=True, text=True, timeout=3600)  # fmt: skip
        said = (
            done.stdout.strip().splitlines()[-1] if done.returncode == 0 and done.stdout.strip() else done.stderr[-300:]
        )
        lines.append(f"- {config} rank 0 of 8 {'meta' if meta_flag else 'full'}: {said}")
    return lines, [
        Target("meta init: relative gap of the first loss, meta vs full build", _gap(full[:1], meta[:1]), 1e-6)
    ]


def loss_section(args, out: Path, smoke: bool) -> tuple[list[str], list[Target]]:
    """``experiments fit`` of the tiny LM on the GPU (bf16) and on the CPU (fp32); their train curves."""
    from experiments.__main__ import main as experiments_main

    steps = args.loss_steps
    common = ["fit", "-c", str(ROOT / "configs/lm/tiny.yaml"), f"--trainer.max_steps={steps}",
              "--trainer.limit_val_batches=0", "--trainer.num_sanity_val_steps=0", "--summary.log_every_n_steps=1",
              "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
              "--trainer.enable_checkpointing=false", "--trainer.callbacks=[]"]  # fmt: skip
    if smoke:
        common += TINY_LM_SMOKE
    gpu = ["--trainer.accelerator=cpu" if smoke else "--trainer.accelerator=gpu", "--trainer.precision=bf16-mixed"]
    curves = {}
    for name, extra in (("cpu", ["--trainer.accelerator=cpu", "--trainer.precision=32-true"]), ("gpu", gpu)):
        runs = out / f"loss-{name}"
        start = time.perf_counter()
        status = experiments_main([*common, *extra, f"--runs_root={runs}", "--run_name=run"])
        if status not in (None, 0):
            raise RuntimeError(f"experiments fit on {name} exited with {status}")
        summary = json.loads(next(runs.glob("lm/*/run/summary.json")).read_text())
        curves[name] = ([loss for _, loss in summary["train_curve"]], time.perf_counter() - start)
    (cpu, cpu_s), (gpu_curve, gpu_s) = curves["cpu"], curves["gpu"]
    window = min(20, len(cpu))
    means = [(statistics.fmean(cpu[i : i + window]), statistics.fmean(gpu_curve[i : i + window]))
             for i in range(0, len(cpu) - window + 1, window)]  # fmt: skip
    worst = max(abs(g - c) / c for c, g in means)
    lines = [
        f"- {len(cpu)} steps each; CPU fp32 {cpu_s:.0f} s, {'CPU (smoke)' if smoke else 'GPU'} bf16 {gpu_s:.0f} s "
        "(including start-up)",
        "- mean training loss per window of 20 steps, CPU / GPU: " + ", ".join(f"{c:.3f}/{g:.3f}" for c, g in means),
        f"- final step: CPU {cpu[-1]:.4f}, GPU {gpu_curve[-1]:.4f}",
    ]
    return lines, [Target("loss: max relative gap of the windowed curves, GPU bf16 vs CPU fp32", worst, LOSS_RTOL)]


#################################################################################
#                                     Main                                      #
#################################################################################


def _flash(opts: Options):
    """SDPA restricted to the flash kernel on CUDA (bf16); the CPU keeps torch's choice."""
    if opts.device.type != "cuda":
        return nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION])


def main(argv: Sequence[str] | None = None) -> dict[str, object]:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    if not sections or any(s not in SECTIONS for s in sections):
        raise SystemExit(f"error: --sections {args.sections!r}; valid: a comma list of {', '.join(SECTIONS)}")
    smoke = args.cpu_smoke or not torch.cuda.is_available()
    args.loss_steps = args.loss_steps or (10 if smoke else 200)
    if smoke and not args.cpu_smoke:
        print("note: no CUDA device; running the CPU smoke shapes (the numbers only show the script works)")
    device = torch.device("cpu" if smoke else "cuda")
    if smoke:
        torch.set_num_threads(1)
        lm, images, size = SIZES["micro"]["lm"], [SIZES["micro"]["vit"], SIZES["micro"]["dit"]], "micro (cpu smoke)"
        name = "cpu"
    else:
        paper = paper_workloads(args.lm_depth, args.lm_batch, dit_batch=64, vit_batch=128)
        lm, images, size = paper["lm"], [paper["vit"], paper["dit"]], "paper"
        name = torch.cuda.get_device_name(device)
        torch.backends.cuda.matmul.allow_tf32 = True
    peak = args.peak_tflops if args.peak_tflops is not None else peak_tflops(name)
    opts = Options(device, bf16=True, compile=not args.no_compile and not smoke)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    header = {"command": shlex.join(["python", "scripts/gpu_check.py", *argv]), **machine_info(device)}
    header["settings"] = (
        f"bf16 autocast, compile {'on' if opts.compile else 'off'}, SDPA flash on CUDA; {args.steps} measured "
        f"rounds after {args.warmup}; MFU against {peak:g} TFLOP/s; budget {args.budget_s:.0f} s"
    )
    report: dict[str, object] = {"rows": [], "notes": [], "parts": [], "targets": []}
    start = time.perf_counter()
    runners: dict[str, Callable[[], None]] = {}

    def tables(rows: list[Row], notes: list[str]) -> None:
        report["rows"] += rows
        report["notes"] += notes

    def parts(title: str, result: tuple[list[str], list[Target]]) -> None:
        report["parts"].append((title, result[0]))
        report["targets"] += result[1]

    runners["lm"] = lambda: tables(*lm_section(lm, size, opts, args, peak))
    runners["train-compiled"] = lambda: parts(
        "Compiled training step (every scheme, eager and compiled)",
        train_compiled_section(lm, size, opts, args, out, smoke, header),
    )
    runners["images"] = lambda: tables(*images_section(images, size, opts, args, peak))
    runners["fsdp"] = lambda: parts("FSDP2 on one device (siamese LM slice)", fsdp_section(lm, opts, args, out))
    runners["fsdp2-fit"] = lambda: parts(
        "fit / resume under configs/trainer/fsdp2.yaml", fsdp_fit_section(args, out, smoke)
    )
    runners["loss"] = lambda: parts(f"{args.loss_steps} real steps of the tiny LM", loss_section(args, out, smoke))
    runners["bf16-params"] = lambda: parts("bf16 parameters under FSDP2", bf16_params_section(args, out, smoke))
    runners["moe"] = lambda: parts("MoE under bf16-mixed", moe_section(args, out, smoke))
    runners["diag"] = lambda: parts("Diagnostics under FSDP2", diag_section(args, out, smoke))
    runners["meta-init"] = lambda: parts("Meta-device init", meta_init_section(args, out, smoke))
    for section in sections:
        elapsed = time.perf_counter() - start
        if elapsed > args.budget_s:
            report["notes"].append(f"section {section} skipped: {elapsed:.0f} s spent of the {args.budget_s:.0f} s")
            continue
        print(f"== {section} ({elapsed:.0f} s so far)", flush=True)
        runners[section]()
        if opts.device.type == "cuda":
            torch.cuda.empty_cache()
        header["wall time"] = f"{time.perf_counter() - start:.0f} s"
        _write(out, header, report, opts)
    header["load average after (1, 5, 15 min)"] = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    text = _write(out, header, report, opts)
    print(text)
    print(f"wrote {out / 'gpu_check.md'}")
    return report


def _write(out: Path, header: dict[str, str], report: dict, opts: Options) -> str:
    text = markdown(report["rows"], header, report["notes"], compiled=opts.compile).replace(
        "# Training-step benchmark", "# GPU check", 1
    )
    for title, lines in report["parts"]:
        text += f"\n## {title}\n\n" + "\n".join(lines) + "\n"
    if report["targets"]:
        text += "\n## Checks\n\n" + "\n".join(t.line() for t in report["targets"]) + "\n"
    (out / "gpu_check.md").write_text(text)
    return text


if __name__ == "__main__":
    main()
