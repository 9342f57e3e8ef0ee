"""Where DyT or Derf trains on the tiny LM: one run per starting alpha beside the RMSNorm baseline, then a table and
the loss curves.

    python scripts/alpha_sweep.py --layer derf --alphas port,2,4,8,16 --out docs/results/derf-alpha
    python scripts/alpha_sweep.py --layer dyt --alphas port,2,4,8,16 --out docs/results/dyt-alpha
    python scripts/alpha_sweep.py --layer dyt --lr 0.05 --alphas port,4,8,16,32 --out docs/results/dyt-alpha-lr0.05
    python scripts/alpha_sweep.py --layer dyt --scheme siamese --alphas port,4,8,16,32 \
        --out docs/results/siamese-dyt-alpha

Every run is ``python -m experiments fit`` as the zoo trains its cells (configs/sweeps/zoo.yaml: its configs and
``args``, 120 steps, warm-up 12, Diagnostics every 25 steps; ``--lr``; seed ``--seed``, which also sets the data's
sampling order, as a sweep's seed does; one thread per run, ``--parallel`` at once), into
``runs/lm/alpha-lr<lr>-s<seed>/`` (DyT and Derf share it and its ``base``). ``base`` is RMSNorm Pre-Norm on the ports'
trunk (configs/norm/pre-port-trunk.yaml: no QK-norm, learnable sqrt(d) embedding scale), ``<layer>-port`` the port's
own recipe (configs/norm/pre-dyt-llama.yaml: the width rule; pre-derf-gpt2.yaml: alpha 1.0), ``<layer>-a<alpha>`` the
same with every alpha set to ``alpha``; ``base`` and the tuned alphas are thus the zoo's own runs of pre-port-trunk
and pre-dyt-llama-a8 / pre-derf-gpt2-a4 at that rate and seed. ``--scheme siamese`` does the same under SiameseNorm
(DyT only: configs/norm/siamese-dyt-llama.yaml against siamese-port-trunk.yaml; runs ``siamese-...``). A finished run
is not trained again. Written to ``--out`` (an existing table only with ``--overwrite``): ``alpha.md`` (final losses,
the residual stream's RMS after the last block (SiameseNorm: its Pre-Norm-like stream's) and the saturated share of
the point-wise inputs, |z| > 2, at steps 25 and 100) and ``curves.png`` (training loss per run).

Every option, and every config file each run would read, is checked before the first run: a bad value or a missing
file is one ``error:`` line and exit status 2; a run that fails is one line naming it and exit status 1.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a file from anywhere

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

from experiments.reliability.errors import ArgumentParser, SuiteError  # noqa: E402
from experiments.results.compare import status_of  # noqa: E402
from experiments.results.runs import check_summary  # noqa: E402
from experiments.sweeps.jobs import DONE  # noqa: E402
from experiments.sweeps.spec import Run, SweepSpec  # noqa: E402
from fileio import InputError, atomic_file, atomic_write_text, new_file, number, read_json  # noqa: E402

PORT = {"dyt": "dyt-llama", "derf": "derf-gpt2"}  # the layer's LM recipe: configs/norm/<scheme>-<port>.yaml
ZOO = ROOT / "configs" / "sweeps" / "zoo.yaml"
STEPS = (25, 100)  # the Diagnostics steps the table reports (the zoo's Diagnostics run every 25)
MAX_SEED = 2**32 - 1  # what Lightning's seed_everything (numpy's generator) accepts


class RunFailed(Exception):
    """A run's ``fit`` exited with an error (its output went to this script's stderr)."""


def alpha_args(alpha: float) -> list[str]:
    """Every DyT / Derf alpha of the tiny LM's Pre-Norm at ``alpha`` (the per-site ones beat the width rule)."""
    keys = ("dyt_alpha_init", "dyt_alpha_init_attn", "dyt_alpha_init_mlp", "dyt_alpha_init_final")
    return [f"--model.init_args.trunk.{k}={alpha:g}" for k in keys]


@functools.cache
def zoo() -> SweepSpec:
    return SweepSpec.load(str(ZOO))


def command(name: str, overlay: str, extra: list[str], experiment: str, lr: float, seed: int) -> list[str]:
    """The run's ``fit`` command: the sweep's own command for the cell (``Run.argv``: its configs and args; the seed
    sets the data order too), under this script's experiment and run name."""
    spec = dataclasses.replace(zoo(), name=experiment, lrs=[lr], seeds=[seed])
    argv = Run(Path(overlay).stem, lr, None, seed).argv(spec, extra=extra)
    return [f"--run_name={name}" if a.startswith("--run_name=") else a for a in argv]  # the cell's name otherwise


def missing_config(argv: list[str]) -> str | None:
    """The first ``-c`` file of a command that is not a file under ROOT (None when every one is)."""
    configs = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "-c"]
    return next((c for c in configs if not (ROOT / c).is_file()), None)


def train(name: str, overlay: str, extra: list[str], experiment: str, lr: float, seed: int, threads: int) -> Path:
    """One run as the zoo trains it (:func:`command`); skipped when it finished.

    Raises:
        RunFailed: the fit exited with an error.
    """
    run_dir = ROOT / "runs" / "lm" / experiment / name
    summary = run_dir / "summary.json"
    if summary.is_file() and read_json(summary, "run summary").get("status") in DONE:  # as a sweep skips it
        return run_dir
    argv = command(name, overlay, extra, experiment, lr, seed)
    print(f"training {name} ...", flush=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    try:
        subprocess.run([*argv, "--trainer.enable_progress_bar=false"], cwd=ROOT, check=True,
                       stdout=subprocess.DEVNULL, env=env)  # fmt: skip
    except subprocess.CalledProcessError as err:
        raise RunFailed(
            f"run {name} failed: fit exited with {err.returncode} (its output is above); {run_dir}"
        ) from None
    return run_dir


def diagnostics(run_dir: Path) -> dict[str, dict[int, float]]:
    events = EventAccumulator(str(run_dir))
    events.Reload()
    return {t: {e.step: e.value for e in events.Scalars(t)} for t in events.Tags()["scalars"] if t.startswith("diag/")}


def row(name: str, alpha: str, run_dir: Path) -> tuple[str, dict]:
    summary = check_summary(read_json(run_dir / "summary.json", "run summary"), run_dir / "summary.json")
    diag = diagnostics(run_dir)
    stream = "x" if any(t.startswith("diag/rms/x/") for t in diag) else "pre"  # SiameseNorm: its Pre-Norm-like stream
    blocks = [t for t in diag if t.startswith(f"diag/rms/{stream}/block_")]
    last_block = max(blocks, key=lambda t: int(t.rsplit("_", 1)[1]))
    site = re.compile(r"diag/saturation/norm[^/]*/sublayer_(\d+)")  # every norm of a sublayer (SiameseNorm: three)
    mlp = [t for t in diag if (m := site.fullmatch(t)) and int(m[1]) % 2 == 1]
    final = [t for t in diag if re.fullmatch(r"diag/saturation/norm_[a-z]+", t)]  # norm_f; SiameseNorm's a, b, o

    def at(tags: list[str], step: int) -> str:
        values = [diag[t][step] for t in tags if step in diag[t]]
        return f"{sum(values) / len(values):.3f}" if values else "-"

    rms = " -> ".join(f"{diag[last_block].get(s, float('nan')):.0f}" for s in STEPS)
    sat_mlp = " -> ".join(at(mlp, s) for s in STEPS) if mlp else "-"
    sat_f = " -> ".join(at(final, s) for s in STEPS) if final else "-"
    line = (f"| {name} | {alpha} | {summary['final_train_loss']:.3f} | {summary['final_val']['val/loss']:.3f} | "
            f"{status_of(summary, None)} | {rms} | {sat_mlp} | {sat_f} |")  # fmt: skip
    return line, summary


def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(prog="scripts/alpha_sweep.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--layer", choices=sorted(PORT), required=True)
    parser.add_argument("--scheme", choices=("pre", "siamese"), default="pre", help="the placement the layer runs in")
    parser.add_argument("--alphas", default="port,2,4,8,16", help="comma-separated: port (the recipe's) or numbers")
    parser.add_argument("--lr", default="1e-2", help="the learning rate of every run (a finite number > 0)")
    parser.add_argument("--seed", default="1", help=f"the seed of every run and of its data order (0 to {MAX_SEED})")
    parser.add_argument("--parallel", type=int, default=2, help="runs at once (one thread each, as the zoo's)")
    parser.add_argument("--out", type=Path, required=True, help="folder for alpha.md and curves.png")
    parser.add_argument("--overwrite", action="store_true", help="replace alpha.md and curves.png in --out")
    args = parser.parse_args(argv)
    alphas = [a.strip() for a in args.alphas.split(",") if a.strip()]
    try:  # the shared number check: nan, inf and 1e400 are refused as well as 0 and -2
        for a in alphas:
            if a != "port":
                number(a, "--alphas", low=0, low_open=True, where="command line; each 'port' or a number")
        args.lr = number(args.lr, "--lr", low=0, low_open=True, where="command line")
        args.seed = number(args.seed, "--seed", kind=int, low=0, high=MAX_SEED, where="command line")
    except InputError as e:
        parser.error(str(e))
    if not alphas:
        parser.error(f"--alphas={args.alphas!r} names no alpha; valid: comma-separated 'port' or numbers > 0")
    try:  # before any training: an existing table is not replaced without --overwrite
        md, png = (new_file(args.out / name, "--out", args.overwrite) for name in ("alpha.md", "curves.png"))
    except InputError as e:
        parser.error(str(e))
    if args.parallel < 1:
        parser.error(f"--parallel={args.parallel}; valid: an integer >= 1")
    cell = Path("configs/norm") / f"{args.scheme}-{PORT[args.layer]}.yaml"
    if not (ROOT / cell).is_file():
        parser.error(f"--layer {args.layer} --scheme {args.scheme}: no {cell}; valid: both layers under pre, dyt under "
                     "siamese")  # fmt: skip
    experiment = f"alpha-lr{args.lr:g}-s{args.seed}"  # the two layers share its base run
    prefix = "" if args.scheme == "pre" else f"{args.scheme}-"
    runs = [(f"{prefix}base", "RMSNorm", f"configs/norm/{args.scheme}-port-trunk.yaml", [])]
    for a in alphas:
        name = prefix + (f"{args.layer}-{a}" if a == "port" else f"{args.layer}-a{a}")
        runs.append((name, "recipe" if a == "port" else a, str(cell), [] if a == "port" else alpha_args(float(a))))
    for name, _, overlay, extra in runs:  # every config every run reads exists, before the first one starts
        if (config := missing_config(command(name, overlay, extra, experiment, args.lr, args.seed))) is not None:
            parser.error(f"run {name}: its config {config} does not exist (the zoo cell's, {ZOO.relative_to(ROOT)}); "
                         "valid: restore it (git checkout) or choose another --layer / --scheme")  # fmt: skip
    lines = ["| run | alpha | final train | final val | status | stream RMS after the last block, step "
             f"{STEPS[0]} -> {STEPS[1]} | saturated share (\\|z\\| > 2), MLP-site norms | the same, final norm |",
             "| --- | --- | ---: | ---: | --- | --- | --- | --- |"]  # fmt: skip
    fig, ax = plt.subplots(figsize=(8, 4.5))
    threads = max(1, (os.cpu_count() or 1) // args.parallel)
    with ThreadPoolExecutor(args.parallel) as pool:  # each a subprocess: the threads only wait
        run_dirs = list(pool.map(lambda r: train(r[0], r[2], r[3], experiment, args.lr, args.seed, threads), runs))
    for (name, alpha, _, _), run_dir in zip(runs, run_dirs, strict=True):
        line, summary = row(name, alpha, run_dir)
        lines.append(line)
        steps, losses = zip(*summary["train_curve"], strict=True)
        ax.plot(steps, losses, label=f"{name} (val {summary['final_val']['val/loss']:.3f})",
                color="black" if alpha == "RMSNorm" else None, linewidth=2 if alpha == "RMSNorm" else 1.2)  # fmt: skip
    baseline = summary["baseline_loss"]
    ax.axhline(baseline, color="grey", linestyle=":", label=f"unigram loss {baseline:.3f}")
    ax.set(xlabel="step", ylabel="training loss (nats/byte)",
           title=f"{args.layer}{'' if args.scheme == 'pre' else ' in ' + args.scheme} on the tiny LM: starting alpha "
                 f"(lr {args.lr:g}, seed {args.seed})")  # fmt: skip
    ax.legend(fontsize=8)
    with atomic_file(png) as f:
        fig.savefig(f, format="png", dpi=110)
    atomic_write_text(md, "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    try:
        main()
    except SuiteError as e:  # a bad option or file (zoo.yaml too): its one line, exit status 2, before any training
        sys.exit(print(f"error: {e}", file=sys.stderr) or 2)
    except RunFailed as e:
        sys.exit(print(f"error: {e}", file=sys.stderr) or 1)
