"""Where DyT or Derf trains on the tiny LM: one run per starting alpha beside the RMSNorm baseline, then a table and
the loss curves.

    python scripts/alpha_sweep.py --layer derf --alphas port,2,4,8,16 --out docs/results/derf-alpha
    python scripts/alpha_sweep.py --layer dyt --alphas port,2,4,8,16 --out docs/results/dyt-alpha

Every run is ``python -m experiments fit`` on the zoo's settings (configs/sweeps/zoo.yaml: 120 steps, warm-up 12,
``--lr``, seed ``--seed``) with Diagnostics every 20 steps, into ``runs/lm/<layer>-alpha/``: ``base`` is Pre-Norm
with RMSNorm and the ports' attention (configs/norm/pre-no-qk-norm.yaml), ``<layer>-port`` the port's own recipe
(configs/norm/pre-dyt-llama.yaml: the width rule; pre-derf-gpt2.yaml: alpha 1.0), ``<layer>-a<alpha>`` the same
with every alpha set to ``alpha``. A finished run is not trained again. Written to ``--out`` (an existing table
only with ``--overwrite``): ``alpha.md`` (final losses, the residual stream's RMS after the last block and the
saturated share of the point-wise inputs, |z| > 2, at steps 20 and 100) and ``curves.png`` (training loss per run).

The data module keeps its own sampling seed (1234) unless ``--data-seed`` is given; a sweep sets it to the run's
seed (``--data.init_args.seed``), so a zoo run of the same cell and seed sees other batches and ends elsewhere
(pre-no-qk-norm, seed 1, lr 1e-2: val 2.264 here, 2.169 in the zoo). The tables in docs/results/{dyt,derf}-alpha
were made without it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a file from anywhere

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

from experiments.reliability.errors import ArgumentParser, UsageExit  # noqa: E402
from experiments.results.compare import status_of  # noqa: E402
from experiments.results.runs import check_summary  # noqa: E402
from experiments.sweeps.jobs import DONE  # noqa: E402
from fileio import InputError, atomic_file, atomic_write_text, new_file, read_json  # noqa: E402

CELL = {"dyt": "pre-dyt-llama", "derf": "pre-derf-gpt2"}
STEPS = (20, 100)  # the Diagnostics steps the table reports


def alpha_args(alpha: float) -> list[str]:
    """Every DyT / Derf alpha of the tiny LM's Pre-Norm at ``alpha`` (the per-site ones beat the width rule)."""
    keys = ("dyt_alpha_init", "dyt_alpha_init_attn", "dyt_alpha_init_mlp", "dyt_alpha_init_final")
    return [f"--model.init_args.trunk.{k}={alpha:g}" for k in keys]


def train(
    name: str, overlay: str, extra: list[str], experiment: str, lr: float, seed: int, data_seed: int | None
) -> Path:
    run_dir = ROOT / "runs" / "lm" / experiment / name
    summary = run_dir / "summary.json"
    if summary.is_file() and read_json(summary, "run summary").get("status") in DONE:  # as a sweep skips it
        return run_dir
    command = [sys.executable, "-m", "experiments", "fit", "-c", "configs/lm/tiny.yaml", "-c", overlay,
               f"--seed_everything={seed}", "--trainer.max_steps=120", "--trainer.val_check_interval=60",
               "--model.init_args.optim.warmup_steps=12", f"--model.init_args.optim.lr={lr:g}",
               "--trainer.callbacks+=experiments.monitoring.diagnostics.Diagnostics",
               "--trainer.callbacks.every_n_steps=20", "--trainer.enable_progress_bar=false",
               f"--experiment={experiment}", f"--run_name={name}", *extra]  # fmt: skip
    if data_seed is not None:
        command.append(f"--data.init_args.seed={data_seed}")
    print(f"training {name} ...", flush=True)
    subprocess.run(command, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    return run_dir


def diagnostics(run_dir: Path) -> dict[str, dict[int, float]]:
    events = EventAccumulator(str(run_dir))
    events.Reload()
    return {t: {e.step: e.value for e in events.Scalars(t)} for t in events.Tags()["scalars"] if t.startswith("diag/")}


def row(name: str, alpha: str, run_dir: Path) -> tuple[str, dict]:
    summary = check_summary(read_json(run_dir / "summary.json", "run summary"), run_dir / "summary.json")
    diag = diagnostics(run_dir)
    last_block = max((t for t in diag if t.startswith("diag/rms/x/block_")), key=lambda t: int(t.rsplit("_", 1)[1]))
    mlp = [t for t in diag if t.startswith("diag/saturation/norm/sublayer_") and int(t.rsplit("_", 1)[1]) % 2 == 1]

    def at(tags: list[str], step: int) -> str:
        values = [diag[t][step] for t in tags if step in diag[t]]
        return f"{sum(values) / len(values):.3f}" if values else "-"

    rms = " -> ".join(f"{diag[last_block].get(s, float('nan')):.0f}" for s in STEPS)
    sat_mlp = " -> ".join(at(mlp, s) for s in STEPS) if mlp else "-"
    sat_f = " -> ".join(at(["diag/saturation/norm_f"], s) for s in STEPS) if "diag/saturation/norm_f" in diag else "-"
    line = (f"| {name} | {alpha} | {summary['final_train_loss']:.3f} | {summary['final_val']['val/loss']:.3f} | "
            f"{status_of(summary, None)} | {rms} | {sat_mlp} | {sat_f} |")  # fmt: skip
    return line, summary


def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(prog="scripts/alpha_sweep.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--layer", choices=sorted(CELL), required=True)
    parser.add_argument("--alphas", default="port,2,4,8,16", help="comma-separated: port (the recipe's) or numbers")
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--data-seed", type=int, default=None, help="the data's sampling seed (a sweep's: --seed)")
    parser.add_argument("--out", type=Path, required=True, help="folder for alpha.md and curves.png")
    parser.add_argument("--overwrite", action="store_true", help="replace alpha.md and curves.png in --out")
    args = parser.parse_args(argv)
    alphas = [a.strip() for a in args.alphas.split(",") if a.strip()]
    for a in alphas:
        if a != "port":
            try:
                if float(a) <= 0:
                    raise ValueError
            except ValueError:
                parser.error(f"--alphas: {a!r} is not 'port' or a positive number")
    try:  # before any training: an existing table is not replaced without --overwrite
        md, png = (new_file(args.out / name, "--out", args.overwrite) for name in ("alpha.md", "curves.png"))
    except InputError as e:
        parser.error(str(e))
    experiment = f"{args.layer}-alpha"
    runs = [("base", "RMSNorm", "configs/norm/pre-no-qk-norm.yaml", [])]
    for a in alphas:
        overlay = f"configs/norm/{CELL[args.layer]}.yaml"
        runs.append((f"{args.layer}-{a}" if a == "port" else f"{args.layer}-a{a}", "recipe" if a == "port" else a,
                     overlay, [] if a == "port" else alpha_args(float(a))))  # fmt: skip
    lines = ["| run | alpha | final train | final val | status | stream RMS after the last block, step "
             f"{STEPS[0]} -> {STEPS[1]} | saturated share (\\|z\\| > 2), MLP-site norms | the same, final norm |",
             "| --- | --- | ---: | ---: | --- | --- | --- | --- |"]  # fmt: skip
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, alpha, overlay, extra in runs:
        run_dir = train(name, overlay, extra, experiment, args.lr, args.seed, args.data_seed)
        line, summary = row(name, alpha, run_dir)
        lines.append(line)
        steps, losses = zip(*summary["train_curve"], strict=True)
        ax.plot(steps, losses, label=f"{name} (val {summary['final_val']['val/loss']:.3f})",
                color="black" if name == "base" else None, linewidth=2 if name == "base" else 1.2)  # fmt: skip
    baseline = summary["baseline_loss"]
    ax.axhline(baseline, color="grey", linestyle=":", label=f"unigram loss {baseline:.3f}")
    ax.set(xlabel="step", ylabel="training loss (nats/byte)",
           title=f"{args.layer} on the tiny LM: starting alpha (lr {args.lr:g}, seed {args.seed})")  # fmt: skip
    ax.legend(fontsize=8)
    with atomic_file(png) as f:
        fig.savefig(f, format="png", dpi=110)
    atomic_write_text(md, "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    try:
        main()
    except UsageExit as e:  # a bad option: its one line, exit status 2, before any training
        sys.exit(print(e.code, file=sys.stderr) or 2)
