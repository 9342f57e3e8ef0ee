"""``python -m experiments fit|validate|test|predict -c CONFIG [-c OVERLAY ...]``: the suite's LightningCLI.

Every run is written to ``<root>/<task>/<experiment>/<run_name>/`` (:mod:`experiments.reliability.layout`;
root: ``--trainer.default_root_dir`` or ``--runs_root``): TensorBoard events, checkpoints, ``summary.json``
and each subcommand's resolved config (``config.yaml`` from ``fit``, ``config.<subcommand>.yaml`` from the
others; each reruns with ``python -m experiments <subcommand> -c <it>``). Runs of one experiment under
different norm schemes overlay in one TensorBoard view: ``tensorboard --logdir runs/lm/tiny``.

What a run may touch:
    fit                       a fresh run directory, or the run it resumes (``--ckpt_path``); another run's
                              directory only with ``--overwrite`` (and only one the suite made)
    validate / test / predict the run directory of the checkpoint they evaluate (``.../<run>/checkpoints/x.ckpt``),
                              else that of the run whose saved config is given (``-c RUN/config.yaml``),
                              wherever the run now lies, unless the user names a run (``--experiment``,
                              ``--run_name``); the names a saved config records never send output elsewhere;
                              ``predict`` files are never replaced without ``--overwrite``
    every subcommand          one at a time per run directory (:mod:`experiments.reliability.run_lock`)

Every run also gets (:mod:`experiments.reliability.checkpointing`): atomic checkpoint writes, checkpoints
read with ``weights_only=True``, a resumable ``checkpoints/interrupted.ckpt`` on SIGTERM / Ctrl-C, exact
resume and a checked ``--ckpt_path`` ("last" = the newest readable checkpoint of the run, naming the file
it took; a named file is used as given or refused in one line). Configs and options are checked before
anything is built (:mod:`experiments.reliability.config_files`).
"""

from __future__ import annotations

import copy
import errno
import logging
import re
import sys
import warnings
from pathlib import Path

import lightning as L
import torch
import yaml
from jsonargparse import ActionYesNo, ArgumentError
from lightning.pytorch.cli import LightningCLI, SaveConfigCallback
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only

from experiments.monitoring.divergence import DivergenceDetector
from experiments.monitoring.final_validation import FinalValidation
from experiments.monitoring.first_validation import FirstValidationNote
from experiments.monitoring.model_summary import has_model_summary, model_summary
from experiments.monitoring.progress_bar import has_progress_bar, progress_bar
from experiments.monitoring.summary import RunSummary
from experiments.monitoring.tensorboard import SuiteTensorBoardLogger, epochs_are_the_budget
from experiments.parallel.config import check_parallel_layout
from experiments.reliability.checkpointing import (
    LIGHTNING_KEYWORDS,
    AtomicCheckpointIO,
    ExactResume,
    InterruptCheckpoint,
    check_checkpoint_fits,
    checkpoint_dir,
    newest_readable,
    resolve_checkpoint,
)
from experiments.reliability.config_files import (
    TRUST_OPTION,
    check_config_files,
    check_finite_numbers,
    check_parsed_class_paths,
    command_line_flag,
    command_line_values,
    config_paths,
    explain_parse_error,
    origin_of,
    read_config,
    trust_packages,
)
from experiments.reliability.errors import OutputDirError, SuiteError, free_space_note
from experiments.reliability.layout import (
    NAME_PATTERN,
    NAME_RULE,
    check_name,
    claim_run_dir,
    clear_output_dir,
    ensure_writable,
    mark,
    refuse_existing,
    run_dir_for,
    run_dir_of_checkpoint,
    run_dir_of_config,
    task_name,
)
from experiments.reliability.refusals import discard_if_refused
from experiments.reliability.run_lock import acquire_run_lock, record_holder, release_run_locks
from experiments.reliability.signals import BoundedStop
from fileio.atomic import atomic_write_bytes

PROG = "python -m experiments"
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


class SuiteCLI(LightningCLI):
    """LightningCLI with subclass mode for model and data, data-derived links, run naming and safe checkpoints."""

    def __init__(self, *args, **kwargs) -> None:
        self._run_dir: Path | None = None  # set while parsing, checked before the trainer is built
        self._argv: list[str] = []
        self._overwrite = False  # --overwrite as given (the saved config records false)
        self._vae_path: str | None = None  # --model.init_args.vae_path as given (it wins over the data's)
        self._keep_config: Path | None = None  # --resume_with_changes: the run's config.yaml before this resume
        kwargs.setdefault("subclass_mode_model", True)
        kwargs.setdefault("subclass_mode_data", True)
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})  # config.<subcommand>.yaml: the latest one
        # Parse errors raise (and become one line in __main__) instead of printing usage and exiting.
        parser_kwargs = {"exit_on_error": False, "prog": PROG}
        kwargs["parser_kwargs"] = {**parser_kwargs, **(kwargs.get("parser_kwargs") or {})}
        # Persistent callbacks: added to whatever callbacks the config lists.
        defaults = dict(kwargs.get("trainer_defaults") or {})
        given = defaults.get("callbacks") or []
        persistent = [ExactResume(), InterruptCheckpoint(), FirstValidationNote()]
        defaults["callbacks"] = [*(given if isinstance(given, list) else [given]), *persistent]
        kwargs["trainer_defaults"] = defaults
        super().__init__(L.LightningModule, L.LightningDataModule, *args, **kwargs)

    def add_arguments_to_parser(self, parser) -> None:
        parser.add_argument("--runs_root", type=str, default="runs", help="where run directories are made")
        parser.add_argument("--experiment", type=str | None, default=None, help="defaults to the first config's name")
        parser.add_argument("--run_name", type=str | None, default=None, help="defaults to the norm scheme")
        parser.add_argument(
            "--overwrite", action=ActionYesNo, default=False, help="replace a run (fit) or outputs that exist"
        )
        parser.add_argument(
            "--resume_with_changes",
            action=ActionYesNo,
            default=False,
            help="fit --ckpt_path: resume although the model / data settings differ from the run's config.yaml "
            "(both are then recorded: config.yaml's changed_on_resume, the old config kept beside it)",
        )
        parser.add_argument(
            f"--{TRUST_OPTION}",
            type=list[str] | None,
            default=None,
            help="a package of your own whose classes (callbacks, loggers, profilers) configs may name: "
            "--trust_package NAME, repeatable; only from the command line, recorded in config.yaml, and a rerun "
            "of that config needs it typed again",
        )
        parser.add_argument(
            "--changed_on_resume",
            type=list[str] | None,
            default=None,
            help="(written by the suite) the settings a --resume_with_changes resume changed, old -> new",
        )
        parser.add_argument(
            "--hparams_columns",
            type=list[str] | None,
            default=None,
            help="the HPARAMS-tab columns this run shows (a sweep passes what its grid varies); default: the "
            "task's short set (scheme, lr, warmup, seed, depth, width)",
        )
        # Callbacks every run gets, configurable as --summary.* / --divergence.* / --final_validation.*
        parser.add_lightning_class_args(RunSummary, "summary")
        parser.add_lightning_class_args(FinalValidation, "final_validation")  # after fit: the whole val split
        parser.add_lightning_class_args(DivergenceDetector, "divergence")
        parser.add_lightning_class_args(BoundedStop, "interrupt")  # --interrupt.grace_s: a stop in bounded time
        # Values only the data knows, linked into every task that takes them.
        for source, target in [
            ("data.vocab_size", "model.init_args.vocab_size"),
            ("data.seq_len", "model.init_args.seq_len"),
            ("data.num_classes", "model.init_args.num_classes"),
            ("data.image_size", "model.init_args.img_size"),
            ("data.latent_size", "model.init_args.latent_size"),
            ("data.latent_channels", "model.init_args.latent_channels"),
            ("data.vae_path", "model.init_args.vae_path"),  # unless the user gives one: see instantiate_classes
        ]:
            parser.link_arguments(source, target, apply_on="instantiate")

    ############################################################## parsing

    def parse_arguments(self, parser, args) -> None:
        """Checks the ``-c`` files first, then parses; a parse error becomes one line naming its origin."""
        given = sys.argv[1:] if args is None else args
        argv = [str(a) for a in given] if isinstance(given, list | tuple) else []  # (a dict: nothing to scan)
        self._argv = argv
        trusted = trust_packages(argv)  # the consent of the person typing, before any config is read
        if trusted:  # (jsonargparse takes a list option once: the command line's values as one list)
            args = [a for i, a in enumerate(argv) if not _is_trust_token(argv, i)] + [f"--{TRUST_OPTION}={trusted}"]
        check_config_files(argv)
        try:
            super().parse_arguments(parser, args)
        except ArgumentError as err:
            missing = _missing_sections(str(err), argv)
            if missing is not None:
                raise SuiteError(missing) from None
            raise SuiteError(explain_parse_error(str(err), argv, _option_names(self, parser, argv))) from None

    def instantiate_classes(self) -> None:
        """Builds data, model and trainer; a ``--model.init_args.vae_path`` the user gave (command line or a -c
        file) wins over the one linked from the data (synthetic latents link None: predict could not decode),
        as every value the user gives wins."""
        super().instantiate_classes()
        hparams = getattr(self.model, "hparams", None)
        if self._vae_path is not None and hparams is not None and "vae_path" in hparams:
            hparams["vae_path"] = self._vae_path
            initial = getattr(self.model, "_hparams_initial", None)  # what the logger records as hparams
            if initial is not None and "vae_path" in initial:
                initial["vae_path"] = self._vae_path

    def before_instantiate_classes(self) -> None:
        """Names the run directory (see :mod:`experiments.reliability.layout`) and records the experiment name
        in the config, so the saved config reruns into the same experiment."""
        config = self.config[self.subcommand] if self.subcommand else self.config
        check_parsed_class_paths(config)
        init_args = config.model.get("init_args") if config.get("model") is not None else None
        self._vae_path = init_args.get("vae_path") if init_args is not None and "vae_path" in init_args else None
        init_from = init_args.get("init_from") if init_args is not None and "init_from" in init_args else None
        subcommand = self.subcommand or "fit"
        if init_from is not None and subcommand == "fit":
            _check_init_from(str(init_from), self._argv)
        parser = self._subcommand_parsers.get(self.subcommand, self.parser) if self.subcommand else self.parser
        check_finite_numbers(config, parser.get_defaults(), self._argv)
        self._overwrite = command_line_flag(self._argv, "overwrite")  # typed by the person, never from a file
        config[TRUST_OPTION] = command_line_values(self._argv, TRUST_OPTION) or None  # recorded: what was typed
        config.overwrite = False  # asked for this once: a saved config never replaces anything on its own
        if config.get("weights_only") is False:
            raise SuiteError(
                "--weights_only=false would let a checkpoint run code while it loads; valid: true or unset "
                "(the suite's checkpoints hold tensors and plain data only)"
            )
        trunk = config.model.init_args.get("trunk")
        scheme = trunk.norm_scheme if trunk is not None else "model"
        task = task_name(config.model.class_path)
        ckpt = config.get("ckpt_path")
        evaluated = _evaluated_run(subcommand, ckpt, self._argv) if not _names_a_place(self._argv) else None
        if evaluated is not None:  # test / predict a checkpoint: write into its run, never another one
            self._run_dir = evaluated
            return
        if config.experiment is not None:
            experiment = check_name("--experiment", config.experiment)
        else:
            experiment = _experiment_from(config)
            if not NAME_PATTERN.fullmatch(experiment):
                raise SuiteError(
                    f"the experiment name {experiment!r} (the first config's file name) is not a valid name; "
                    f"valid: --experiment NAME ({NAME_RULE})"
                )
        config.experiment = experiment  # saved: a rerun from config.yaml lands in the same experiment
        run_name = check_name("--run_name", config.run_name) if config.run_name is not None else scheme
        root = config.trainer.get("default_root_dir") or config.runs_root
        self._run_dir = run_dir_for(root, task, experiment, run_name)
        if subcommand == "fit" and ckpt is not None:
            self._check_resume(config, parser)

    def _check_resume(self, config, parser) -> None:
        """``fit --ckpt_path`` into a run whose ``config.yaml`` says other model / data settings (a scheme, a
        width, a learning rate, the data) would make the run's records describe a run that did not happen:
        refused, naming the keys, unless ``--resume_with_changes``; then the changes are recorded in the new
        config.yaml (``changed_on_resume``) and the old one is kept as ``config.before-resume-<n>.yaml``."""
        saved_path = self._run_dir / "config.yaml" if self._run_dir is not None else None
        if saved_path is None or not saved_path.is_file():
            return
        try:
            saved = read_config(str(saved_path))
        except SuiteError as err:
            raise SuiteError(f"--ckpt_path: the run's {err}; valid: a run whose config.yaml reads back") from None
        config_now = yaml.safe_load(parser.dump(config, skip_check=True, skip_none=False))
        changes = _changed_settings(saved, config_now)
        allowed = command_line_flag(self._argv, "resume_with_changes")  # typed, never from a file
        config.resume_with_changes = False  # asked for this resume only: a rerun of config.yaml asks again
        if not changes:
            return
        if not allowed:
            shown = "; ".join(changes[:4]) + (f"; {len(changes) - 4} more" if len(changes) > 4 else "")
            raise SuiteError(
                f"--ckpt_path resumes {self._run_dir} with other settings than its config.yaml: {shown}; valid: the "
                "run's own settings (fit -c RUN/config.yaml --ckpt_path last), --run_name NEW for a new run, or "
                "--resume_with_changes to resume with these changes recorded"
            )
        earlier = list(saved.get("changed_on_resume") or [])
        config.changed_on_resume = [*earlier, *changes]
        self._keep_config = saved_path

    ############################################################## the trainer

    def instantiate_trainer(self, **kwargs):
        """The trainer in the run directory: its logger (``epoch`` only where epochs are the budget),
        default_root_dir, the subcommand's config file name, atomic checkpoint IO, a progress bar without
        Lightning's version number and a model summary without an unmeasured FLOPs count."""
        config = self.config[self.subcommand] if self.subcommand else self.config
        trainer_config = self._get(self.config_init, "trainer", default={})
        run_dir = self._run_dir
        if run_dir is not None:
            if self.subcommand is not None:  # run=False (analysis, tests) only parses and builds
                last = self.subcommand != "fit" and str(config.get("ckpt_path")) == "last"
                if last and newest_readable(run_dir / "checkpoints") is None:  # the error, before anything is written
                    resolve_checkpoint("last", run_dir / "checkpoints", stage=self.subcommand)
                if self.subcommand == "fit":
                    self._check_before_writing(config, run_dir)
                if rank_zero_only.rank == 0:  # before the run is written; the other DDP ranks are the same run
                    acquire_run_lock(run_dir)
                self._made_run_dir = not run_dir.exists()  # a refusal from here on removes what this made
                try:
                    if self.subcommand == "fit":
                        claim_run_dir(run_dir, resuming=config.get("ckpt_path") is not None, overwrite=self._overwrite)
                        if self._keep_config is not None:  # --resume_with_changes: the config it resumed from stays
                            kept = _free_name(run_dir, "config.before-resume-{}.yaml")
                            atomic_write_bytes(kept, self._keep_config.read_bytes())
                    ensure_writable(run_dir)
                    mark(run_dir, self.subcommand)
                    record_holder(run_dir, self.subcommand)
                except BaseException as err:
                    self._discard_if_refused(err)
                    raise
            kwargs["default_root_dir"] = str(run_dir)
            if trainer_config.get("logger") in (None, True) and "logger" not in kwargs:
                kwargs["logger"] = SuiteTensorBoardLogger(
                    save_dir=str(run_dir.parent),
                    name="",
                    version=run_dir.name,
                    default_hp_metric=False,
                    log_epoch=epochs_are_the_budget(trainer_config),
                )
        filename = "config.yaml" if self.subcommand in (None, "fit") else f"config.{self.subcommand}.yaml"
        self.save_config_kwargs = {**self.save_config_kwargs, "config_filename": filename}
        if trainer_config.get("plugins") is None and "plugins" not in kwargs:
            kwargs["plugins"] = [AtomicCheckpointIO()]
        if trainer_config.get("enable_progress_bar") is not False and not has_progress_bar(trainer_config):
            self.trainer_defaults["callbacks"] = [*self.trainer_defaults["callbacks"], progress_bar()]
        if trainer_config.get("enable_model_summary") is not False and not has_model_summary(trainer_config):
            self.trainer_defaults["callbacks"] = [*self.trainer_defaults["callbacks"], model_summary()]
            kwargs["enable_model_summary"] = False  # Lightning adds none of its own (nor says it skipped one)
        try:
            return super().instantiate_trainer(**kwargs)
        except BaseException as err:
            self._discard_if_refused(err)
            raise

    def _check_before_writing(self, config, run_dir: Path) -> None:
        """What ``fit`` refuses before it claims, creates or writes anything (the model is built, nothing is
        launched): the parallel layout, the checkpoint it resumes (it must fit the model, shapes and scheme)
        and the export ``init_from`` starts from (its weights must load into the model)."""
        model = self.model
        net = getattr(model, "net", None)
        seq_len = getattr(model, "sequence_length", None)
        parallel_cfg = getattr(model, "parallel_cfg", None)
        experts_split = bool(getattr(parallel_cfg, "expert_parallel", False))
        check_parallel_layout(
            config.get("trainer"), getattr(net, "trunk", None), seq_len if isinstance(seq_len, int) else None,
            lambda key: origin_of(key, self._argv), experts_split, getattr(parallel_cfg, "expert_parallel_size", 0),
        )  # fmt: skip
        ckpt = config.get("ckpt_path")
        if ckpt is not None:
            resolved = resolve_checkpoint(str(ckpt), run_dir / "checkpoints", stage="fit")
            self._resolved_ckpt = (str(ckpt), run_dir / "checkpoints", resolved)
            if resolved is not None and Path(resolved).exists() and "://" not in resolved:
                check_checkpoint_fits(model, resolved)
        init_from = (getattr(model, "hparams", None) or {}).get("init_from")
        if init_from is not None and isinstance(net, torch.nn.Module):
            _check_init_from(str(init_from), self._argv, net)

    def _discard_if_refused(self, err: BaseException) -> None:
        """A refusal leaves nothing behind (:mod:`experiments.reliability.refusals`)."""
        made, trainer = getattr(self, "_made_run_dir", False), getattr(self, "trainer", None)
        if discard_if_refused(self._run_dir, made, trainer, err):
            self._made_run_dir = False

    def _parse_ckpt_path(self) -> None:
        """Keeps the model config as given. LightningCLI would replace it with the hyperparameters saved in
        ``--ckpt_path`` (and crash on a truncated file); the suite checks the checkpoint against the config
        instead (:meth:`_check_ckpt_path`), so a saved config.yaml still says what ran."""

    def _check_ckpt_path(self) -> None:
        """Resolves ``--ckpt_path`` ("last": the newest readable one) and refuses a checkpoint that does not fit."""
        config = self.config_init[self.subcommand]
        ckpt_path = config.get("ckpt_path")
        if ckpt_path is None:
            if self.subcommand != "fit":
                rank_zero_info(f"{self.subcommand}: no --ckpt_path given, so the untrained model is evaluated")
            return
        where = checkpoint_dir(self.trainer)
        early = getattr(self, "_resolved_ckpt", None)  # fit: resolved before anything was written
        checked = early is not None and early[:2] == (str(ckpt_path), where)  # (and checked against the model)
        resolved = early[2] if checked else resolve_checkpoint(str(ckpt_path), where, stage=self.subcommand)
        config["ckpt_path"] = resolved
        config["weights_only"] = True
        if resolved is not None and Path(resolved).is_file() and not checked:
            check_checkpoint_fits(self.model, resolved)

    def _check_outputs(self) -> None:
        """Refuses to start when a file the task would write besides the run's own already exists (``--overwrite``
        allows it; an output directory inside the run is then cleared first)."""
        outputs = getattr(self.model, "output_paths", None)
        if outputs is None or self._run_dir is None:
            return
        paths = [Path(p) for p in outputs(self.subcommand, self._run_dir)]
        overwrite = self._overwrite
        refuse_existing(paths, overwrite=overwrite, what=self.subcommand)
        for path in paths:
            if overwrite and path.is_dir() and self._run_dir.resolve() in path.resolve().parents:
                clear_output_dir(path)

    def _set_hparams_columns(self) -> None:
        """Hands ``--hparams_columns`` to the task, refusing a name the task does not have as a column."""
        config = self.config[self.subcommand]
        shown = config.get("hparams_columns")
        columns = getattr(self.model, "hparams_columns", None)
        if shown is None or not callable(columns):
            return
        valid = list(columns())
        unknown = [name for name in shown if name not in valid]
        if unknown:
            raise SuiteError(f"--hparams_columns: {unknown[0]!r} is not an HPARAMS column; valid: {', '.join(valid)}")
        self.model.hparams_shown = list(shown)

    def _set_changed_on_resume(self) -> None:
        """Hands the run's ``changed_on_resume`` (``--resume_with_changes``) to the task: its HPARAMS row says it."""
        changes = self.config[self.subcommand].get("changed_on_resume")
        if changes:
            self.model.changed_on_resume = list(changes)

    def _before_subcommand(self) -> None:
        self._check_ckpt_path()
        self._check_outputs()
        self._set_hparams_columns()
        self._set_changed_on_resume()

    before_fit = before_validate = before_test = before_predict = _before_subcommand

    def _run_subcommand(self, subcommand: str) -> None:
        """Runs the subcommand; a full disk becomes one line naming the run directory and its newest good checkpoint."""
        try:
            super()._run_subcommand(subcommand)
        except BaseException as err:
            self._discard_if_refused(err)
            if self._run_dir is None or not _disk_full(err):
                raise
            newest = newest_readable(checkpoint_dir(self.trainer))
            good = f"the newest good checkpoint is {newest} (it loads; --ckpt_path last resumes from it)"
            raise OutputDirError(
                f"disk full while writing to {self._run_dir}{free_space_note(self._run_dir)}; "
                f"{good if newest else 'no checkpoint was saved'}"
            ) from err

    def after_fit(self) -> None:
        """Validates the final weights on the whole validation split (every rank), then says where the run is."""
        final = next((c for c in self.trainer.callbacks if isinstance(c, FinalValidation)), None)
        if final is not None:
            final.run(self.trainer, self.model, self.datamodule)
        self._say_where("run")

    def after_test(self) -> None:
        self._say_where("test results")

    def after_validate(self) -> None:
        self._say_where("validation")

    def after_predict(self) -> None:
        self._say_where("predictions")

    def _say_where(self, what: str) -> None:
        # The logger's own directory: Trainer.log_dir would broadcast, and only rank zero gets here.
        where = getattr(self.trainer.logger, "log_dir", None) or self._run_dir
        if self.trainer.is_global_zero and where and not self.trainer.fast_dev_run:
            run = Path(where)
            print(f"{what} saved to {run} (tensorboard --logdir {run.parent})", flush=True)


# Options that name the run an evaluation writes into; given by the user (on the command line, or in a -c file that
# is not a run's own saved config), they decide; a saved config's copies of them do not. (``--runs_root`` /
# ``--trainer.default_root_dir`` only say where new runs go: an evaluated checkpoint's run stays its own.)
PLACE_OPTIONS = ("experiment", "run_name")


def _names_a_place(argv: list[str]) -> bool:
    """Whether the user named where to write: a :data:`PLACE_OPTIONS` option on the command line, or in a ``-c``
    file of their own (a run's saved ``config*.yaml`` records the names of the run it came from, which may
    have been copied or moved since: those do not count)."""
    for arg in argv:
        option = arg[2:].split("=", 1)[0] if arg.startswith("--") else None
        if option in PLACE_OPTIONS:
            return True
    for path in config_paths(argv):
        if run_dir_of_config(path) is not None:
            continue
        try:
            data = read_config(path)
        except SuiteError:
            continue
        if any(data.get(k) is not None for k in PLACE_OPTIONS):
            return True
    return False


# What a resume may not change without the run's records going wrong (how long it trains and how it logs may):
# the model, the data, the seed, and the job's shape: the world size (devices x nodes) and the strategy, since a
# resume on another world size changes the global batch, and config.yaml would claim it for the whole run.
RESUME_COMPARED = ("model", "data", "seed_everything", "trainer.devices", "trainer.num_nodes", "trainer.strategy")


def _at(config: dict, dotted: str):
    for part in dotted.split("."):
        config = config.get(part) if isinstance(config, dict) else None
    if isinstance(config, str) and config.lstrip("-").isdigit():
        return int(config)  # (--trainer.devices=2 parses as the string '2'; the saved config holds 2)
    return config


def _changed_settings(saved: dict, now: dict) -> list[str]:
    """``["model.init_args.optim.lr: 0.001 -> 0.002", ...]``: the :data:`RESUME_COMPARED` settings that differ."""
    old, new = (
        dict(_flat({k: _at(saved, k) for k in RESUME_COMPARED})),
        dict(_flat({k: _at(now, k) for k in RESUME_COMPARED})),
    )
    return [f"{key}: {old.get(key)!r} -> {new.get(key)!r}" for key in sorted(set(old) | set(new))
            if old.get(key) != new.get(key)]  # fmt: skip


def _flat(value, prefix: str = ""):
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _flat(item, f"{prefix}.{key}" if prefix else str(key))
    else:
        yield prefix, value


def _free_name(directory: Path, pattern: str) -> Path:
    n = 1
    while (directory / pattern.format(n)).exists():
        n += 1
    return directory / pattern.format(n)


def _is_trust_token(argv: list[str], i: int) -> bool:
    """Whether ``argv[i]`` is a ``--trust_package`` option or the value after ``--trust_package NAME``."""
    option = argv[i].partition("=")[0].removesuffix("+")
    after = i > 0 and argv[i - 1] == f"--{TRUST_OPTION}"
    return option == f"--{TRUST_OPTION}" or after


def _missing_sections(text: str, argv: list[str]) -> str | None:
    """For "the following arguments are required: test.data, test.model": which -c file should have held them
    (a run's config.yaml cut short, or a config of another kind), with where the file ends."""
    match = re.search(r"the following arguments are required: (.*)", text)
    if match is None:
        return None
    missing = [name.split(".")[-1] for name in re.split(r",\s*", match[1].strip())]
    paths = config_paths(argv)
    if not paths:
        example = "configs/lm/tiny.yaml"
        return f"no {' and no '.join(missing)} given; valid: -c CONFIG with model: and data: sections ({example})"
    last = paths[-1]
    try:
        lines = Path(last).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        lines = []
    ending = f"it ends at line {len(lines)}: {lines[-1].strip()[:60]!r}" if lines else "it is empty"
    named = " and ".join(f"{m}:" for m in missing)
    return (
        f"config {last} (and any other -c) sets no {named} section ({ending}; is it cut short?); valid: a config "
        "with model: and data: sections, e.g. a run's whole config.yaml or configs/lm/tiny.yaml"
    )


def _check_init_from(folder: str, argv: list[str], net: torch.nn.Module | None = None) -> None:
    """Reads the folder ``init_from`` names (config.json and weights, checked) before any run directory is made,
    so a corrupted, swapped or foreign export is one line naming it and where it was given; with ``net``, also
    loads it into a copy of the network on the meta device (no memory): an export that does not fit is refused
    before the run is claimed, not in ``setup`` after."""
    from models.loaders.suite_export import load_suite_export, read_suite_export

    try:
        if net is None:
            read_suite_export(folder)
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # ("copying ... to a meta parameter is a no-op": the point)
                load_suite_export(_meta_copy(net), folder)
    except ValueError as err:
        origin = origin_of("model.init_args.init_from", argv)
        raise SuiteError(f"model.init_args.init_from={folder} ({origin}): {err}") from None


def _meta_copy(net: torch.nn.Module) -> torch.nn.Module:
    """``net`` copied with every parameter and buffer on the meta device (tied weights stay tied)."""
    memo: dict[int, object] = {}
    for tensor in [*net.parameters(), *net.buffers()]:
        empty = torch.empty_like(tensor, device="meta")
        is_parameter = isinstance(tensor, torch.nn.Parameter)
        memo[id(tensor)] = torch.nn.Parameter(empty, tensor.requires_grad) if is_parameter else empty
    return copy.deepcopy(net, memo)


def _evaluated_run(subcommand: str, ckpt: object, argv: list[str]) -> Path | None:
    """Where validate / test / predict write when the user named no place: the run directory of the checkpoint
    they evaluate, if it is a suite run's; else (``--ckpt_path last``, or a checkpoint outside any run) the run
    directory whose saved config is the last ``-c`` file, if it is one: a run copied elsewhere is evaluated
    where it now is, not where its config says it was made."""
    if subcommand == "fit":
        return None
    if ckpt is not None and str(ckpt) != "last" and str(ckpt) not in LIGHTNING_KEYWORDS:
        found = run_dir_of_checkpoint(str(ckpt))
        if found is not None:
            return found
    runs = [run for path in config_paths(argv) if (run := run_dir_of_config(path)) is not None]
    return runs[-1] if runs else None


def _disk_full(err: BaseException | None) -> bool:
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in _DISK_FULL:
            return True
        err = err.__cause__ or err.__context__
    return False


def _option_names(cli: LightningCLI, parser, argv: list[str]) -> list[str]:
    """Every ``--option`` of the subcommand being parsed (for "did you mean")."""
    subcommand = next((a for a in argv if a in cli.subcommands()), None)
    target = cli._subcommand_parsers.get(subcommand, parser) if subcommand else parser
    return [s for action in target._actions for s in action.option_strings if s.startswith("--")]


def _experiment_from(config) -> str:
    paths = config.get("config") or []
    return Path(str(paths[0])).stem if paths else "default"


class _DropTips(logging.Filter):
    """Drops Lightning's advertisements ("💡 Tip: ... litlogger / litmodels"): not the user's business."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "💡 Tip" not in record.getMessage()


# Lightning warnings about its own internals or about what the suite does on purpose (EMA copies in eval mode,
# resuming into a run's own checkpoint directory); anything about the user's config stays visible.
QUIET_WARNINGS = (
    r".*isinstance\(treespec, LeafSpec\)` is deprecated",
    r"Found \d+ module\(s\) in eval mode at the start of training",
    r"Checkpoint directory .* exists and is not empty",
    r"LightningCLI's args parameter is intended to run from within Python",
    r"Using `DistributedSampler` with the dataloaders. During `trainer.validate\(\)`",  # final validation (pads)
)


def quiet_lightning() -> None:
    """Silences Lightning's advertisements and the known warnings listed in :data:`QUIET_WARNINGS`."""
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropTips) for f in logger.filters):
            logger.addFilter(_DropTips())
    for pattern in QUIET_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern)


def main(args: list[str] | None = None) -> None:
    quiet_lightning()
    try:
        SuiteCLI(args=args, save_config_callback=SaveConfigCallback)
    finally:
        release_run_locks()  # the command is over (or failed): the run directory is free again
        trust_packages([])  # and its consent ends with it (a next command in this process asks again)
