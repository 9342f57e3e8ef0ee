"""Entry point: ``python -m experiments [--debug] COMMAND ...``.

The training commands are LightningCLI's (``fit``, ``validate``, ``test``, ``predict``); the tools
compare and analyse runs (``sweep``, ``compare``, ``prune``, ``logit-lens``, ``fid``, ``evaluate``, ``lm-eval``,
``bench``, ``export``, ``estimate``).
``python -m experiments`` alone (or ``--help``) lists them all.

Bad input ends with one line ``error: <what is wrong and what would be valid>`` on stderr and exit
status 2; an interrupted fit (SIGTERM, Ctrl-C) says where its resumable checkpoint is and exits with
143 / 130. ``--debug`` (anywhere on the command line) adds the Python traceback. Anything else
unexpected is a bug and shows its traceback.
"""

from __future__ import annotations

import importlib
import sys
import traceback
from typing import NamedTuple


class Tool(NamedTuple):
    """A subcommand beside LightningCLI's: ``module:function`` called with the arguments after its name."""

    target: str
    summary: str


LIGHTNING_COMMANDS = {
    "fit": "train a model (-c CONFIG [-c OVERLAY ...]); --ckpt_path last resumes",
    "validate": "evaluate a checkpoint on the validation split",
    "test": "evaluate a checkpoint on the test split (perplexity, top-1/top-5, FID ...)",
    "predict": "LM continuations, ViT class probabilities, DiT samples",
}
TOOLS = {
    "sweep": Tool("experiments.sweeps.sweep:main", "run a grid of schemes x lrs x warmups x seeds and compare it"),
    "compare": Tool("experiments.results.compare:main", "rebuild a sweep directory's comparison table and plots"),
    "readme": Tool("experiments.results.readme:main", "regenerate the results blocks of README and docs/"),
    "prune": Tool("experiments.analysis.cli:prune_main", "layer-pruning sensitivity of a checkpoint"),
    "logit-lens": Tool("experiments.analysis.cli:logit_lens_main", "each residual stream read out alone (LM)"),
    "fid": Tool("experiments.evaluation.fid.cli:main", "FID between two image sets or statistics files"),
    "evaluate": Tool("experiments.evaluation.downstream.cli:evaluate_main", "OLMo's downstream tasks on a checkpoint"),
    "lm-eval": Tool("experiments.evaluation.downstream.cli:lm_eval_main", "lm-evaluation-harness on an LM checkpoint"),
    "bench": Tool("experiments.bench.cli:main", "step time and activation memory of every scheme, side by side"),
    "export": Tool("experiments.sharing.cli:main", "a trained model as a transformers / timm / diffusers folder"),
    "estimate": Tool("experiments.parallel.estimate_cli:main", "per-GPU peak memory of a run before it runs"),
}
DEBUG_FLAG = "--debug"


def usage() -> str:
    """The overview ``python -m experiments --help`` prints."""
    width = max(map(len, [*LIGHTNING_COMMANDS, *TOOLS]))
    lines = ["usage: python -m experiments [--debug] COMMAND [options]", "", "training (LightningCLI):"]
    lines += [f"  {name:<{width}}  {text}" for name, text in LIGHTNING_COMMANDS.items()]
    lines += ["", "tools:"]
    lines += [f"  {name:<{width}}  {tool.summary}" for name, tool in TOOLS.items()]
    lines += ["", "python -m experiments COMMAND --help shows a command's options; --debug adds tracebacks to errors."]
    return "\n".join(lines)


def run_tool(name: str, args: list[str]) -> None:
    """Calls a tool; a tool returning a non-zero int exits with it."""
    module, function = TOOLS[name].target.split(":")
    status = getattr(importlib.import_module(module), function)(args)
    if isinstance(status, int) and not isinstance(status, bool) and status:
        raise SystemExit(status)


def main(argv: list[str] | None = None) -> None:
    """Runs a subcommand; on a user error or interrupt prints one line and raises ``SystemExit(status)``."""
    from_command_line = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = DEBUG_FLAG in argv
    # Only this process's view: Lightning's DDP launcher re-runs sys.argv, flag included, for the other ranks.
    argv = [a for a in argv if a != DEBUG_FLAG]
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return
    try:
        if argv[0] in TOOLS:
            run_tool(argv[0], argv[1:])
            return
        from experiments.cli import main as cli_main

        # LightningCLI warns when given args while sys.argv has some too: let it read sys.argv when they agree.
        cli_main(None if from_command_line and not debug else argv)
    except BaseException as exc:  # noqa: BLE001 - every exit goes through one place
        from experiments.reliability.errors import describe

        described = describe(exc)
        if described is None:
            raise  # SystemExit with its own status, or a bug: Python prints the traceback
        status, message = described
        if argv and argv[0] not in TOOLS:
            from experiments.reliability.config_files import add_origin

            message = add_origin(message, argv[1:])  # which file set the value a model check refused
        if debug:
            traceback.print_exception(exc)
        print(f"error: {message}", file=sys.stderr, flush=True)
        raise SystemExit(status) from None


if __name__ == "__main__":
    main()
