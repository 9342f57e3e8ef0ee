"""A sweep file: its keys, their validation, and the grid of runs it expands to.

    configs/sweeps/x.yaml --load--> [SweepSpec, ...]   one per part (a file may hold several, e.g. ViT and DiT)
    SweepSpec --grid--> [Run, ...]                     schemes x overlays x lrs x warmups x seeds
    Run --argv--> python -m experiments fit -c ... --runs_root=... --experiment=<name> --run_name=<run>

Every value of a sweep file is checked on load, and every mistake is one line naming the file and the key
(``error: lrs[0]='abc' is not a number (configs/sweeps/x.yaml); valid: ...``): numbers PyYAML reads as
strings (``1e-3``; YAML 1.1 wants ``1.0e-3``) are converted, an empty grid, two grid points that map to one
run name, and a name that is not one safe path component (``../../x``) are refused before anything is
written. The suite's run directories live in ``<runs_root>/<task>/<name>/<run>``; nothing is created or
deleted outside them.
"""

from __future__ import annotations

import copy
import itertools
import math
import re
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from experiments.reliability.errors import SuiteError
from experiments.sweeps.compute_option import COMPUTE_KEY, parse_compute_multiples, split_protocol
from experiments.sweeps.options import parse_last_evals, parse_margins, parse_protocol, parse_stages
from fileio.checks import InputError, number
from models.schemes import NormScheme

NORM_OVERLAYS = Path("configs/norm")
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}")
BUDGET_KEYS = ("tokens", "steps", "epochs")
LAUNCHER_KINDS = ("process", "submitit")
CLUSTERS = ("slurm", "local")
# What a submitit launcher takes (submitit's own names where it has them); None: the cluster's default.
LAUNCHER_DEFAULTS: dict[str, Any] = {
    "kind": "process",
    "cluster": "slurm",
    "partition": None,
    "nodes": 1,
    "gpus_per_node": 0,
    "cpus_per_task": None,
    "mem_gb": None,
    "timeout_min": 60,
    "array_parallelism": 256,
    "account": None,
    "qos": None,
    "signal_delay_s": 120,
    "max_requeues": 20,
    "setup": [],
    "extra": {},
}
COMPUTE_DEFAULTS: dict[str, Any] = {"gpu": "H100 SXM, bf16 dense", "peak_tflops": 989.0, "mfu": 0.40}
DATASET_KEYS = ("train_images", "num_classes", "latent_size", "latent_channels")


class SpecError(SuiteError):
    """A sweep file holds a value the sweep cannot run."""


def check_name(value: object, what: str, where: str) -> str:
    """``value`` if it is one path component of safe characters, else a one-line :class:`SpecError`."""
    if not isinstance(value, str) or not SAFE_NAME.fullmatch(value):
        raise SpecError(
            f"{what}={value!r} ({where}); valid: one path component of letters, digits, '.', '_', '+', '-' "
            "starting with a letter or digit"
        )
    return value


def _number(value: object, key: str, where: str, kind: type, **bounds: Any) -> float | int:
    """A finite float or int from YAML or the command line, strings such as ``"1e-3"`` (which PyYAML does not
    read as numbers) converted; ``inf`` / ``nan`` / ``1e400`` refused (:func:`fileio.checks.number`)."""
    try:
        return number(value, key, kind=kind, where=where, **bounds)
    except InputError as err:
        raise SpecError(str(err)) from None


def _list(raw: dict, key: str, where: str) -> list:
    value = raw.get(key, [])
    if value is None:
        return []
    return list(value) if isinstance(value, list | tuple) else [value]  # a lone value is a one-point axis


def _strings(raw: dict, key: str, where: str) -> list[str]:
    values = _list(raw, key, where)
    for i, v in enumerate(values):
        if not isinstance(v, str) or not v:
            raise SpecError(f"{key}[{i}]={v!r} is not a non-empty string ({where})")
    return values


def _numbers(raw: dict, key: str, where: str, kind: type, positive: bool, minimum: float | None = None) -> list:
    out = []
    for i, v in enumerate(_list(raw, key, where)):
        number = _number(v, f"{key}[{i}]", where, kind)
        if (positive and number <= 0) or (minimum is not None and number < minimum):
            bound = "> 0" if positive else f">= {minimum:g}"
            raise SpecError(f"{key}[{i}]={v!r} must be {bound} ({where})")
        out.append(number)
    return out


def _mapping(raw: dict, key: str, where: str) -> dict:
    value = raw.get(key) or {}
    if not isinstance(value, dict):
        raise SpecError(f"{key}={value!r} is not a mapping ({where}); valid: key: value lines under {key}:")
    return dict(value)


@dataclass
class SweepSpec:
    """One sweep (one part of a sweep file). Empty axes mean "what the config says".

    Attributes:
        name: experiment name; runs land in ``<runs_root>/<task>/<name>/<run>``.
        configs: task configs stacked before each scheme overlay (may be empty when every overlay is a whole
            task config, e.g. DeiT-T and DeiT-S).
        schemes: norm schemes, or named variants of one (each adds ``configs/norm/<entry>.yaml``).
        overlays: configs of which each run stacks one (the shapes of a depth study); the run name gets its stem.
        lrs: peak learning rates.
        warmups: warmup lengths in steps.
        seeds: seeds; each sets ``seed_everything`` and, unless ``seed_data`` is false, the data order.
        seed_data: whether a seed also varies the data order.
        baseline: the scheme every other scheme is compared with, seed by seed.
        args: extra CLI arguments for every run.
        metric: the column the table is sorted by and the bar plot shows.
        parallel: runs at once (process launcher).
        test: also run ``test`` on each run's newest checkpoint.
        runs_root: root of run directories.
        budget: at most one of ``tokens`` (LM: steps follow from the global batch), ``steps``, ``epochs``;
            overridable with ``--budget KEY=VALUE``. The paper's values are the shipped defaults.
        launcher: ``kind: process`` (runs as local processes) or ``kind: submitit`` with its resources
            (see ``LAUNCHER_DEFAULTS``); overridable with ``--launcher KEY=VALUE``.
        dataset: facts about the data the compute estimate needs when the config cannot say
            (``train_images``, ``num_classes``, ``latent_size``, ``latent_channels``).
        compute: the accelerator the estimate assumes (``gpu``, ``peak_tflops``, ``mfu``).
        progress_every_s: seconds between progress lines while runs train.
        protocol: ``kind: tune_then_compare`` with ``lrs``, ``tuning_seeds``, ``fresh_seeds``: every scheme at its
            own best learning rate (:mod:`experiments.sweeps.protocol`), and optionally ``compute_multiples``
            (:mod:`experiments.sweeps.compute_option`); None: the plain grid.
        stages: seeds per cell at each look (the last is ``len(seeds)``): undecided cells get more seeds
            (:mod:`experiments.sweeps.stages`); []: every seed at once.
        last_evals: the metric is the mean of each run's last ``last_evals`` validations
            (:mod:`experiments.results.measurement`); 1: the final one.
        margins: ``{metric: delta}``: the equivalence margins of the verdicts, over the documented defaults
            (:data:`experiments.results.equivalence.MARGINS`); recorded in ``sweep.yaml``, read by ``compare``.
        source: the file the spec was read from.
    """

    name: str
    configs: list[str]
    schemes: list[str]
    overlays: list[str] = field(default_factory=list)
    lrs: list[float] = field(default_factory=list)
    warmups: list[int] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)
    seed_data: bool = True
    baseline: str | None = None
    args: list[str] = field(default_factory=list)
    metric: str = "val/loss"
    parallel: int = 1
    test: bool = False
    runs_root: str = "runs"
    budget: dict = field(default_factory=dict)
    launcher: dict = field(default_factory=lambda: dict(LAUNCHER_DEFAULTS))
    dataset: dict = field(default_factory=dict)
    compute: dict = field(default_factory=lambda: dict(COMPUTE_DEFAULTS))
    progress_every_s: float = 30.0
    protocol: dict | None = None
    stages: list[int] = field(default_factory=list)
    last_evals: int = 1
    margins: dict = field(default_factory=dict)
    source: str = ""

    @classmethod
    def load(cls, path: str, overrides: dict[str, dict] | None = None) -> SweepSpec:
        """The single sweep of a file (a file with several parts: use :func:`load_specs`)."""
        specs = load_specs(path, overrides)
        if len(specs) != 1:
            raise SpecError(f"{path} holds {len(specs)} sweeps (parts); load them with load_specs")
        return specs[0]

    @property
    def submitit(self) -> bool:
        return self.launcher["kind"] == "submitit"


SPEC_KEYS = {f.name for f in fields(SweepSpec)} - {"source"}


def load_specs(path: str, overrides: dict[str, dict] | None = None) -> list[SweepSpec]:
    """Reads and checks a sweep file: one spec, or one per entry of its ``parts`` (top-level keys are defaults).

    Args:
        path: the sweep YAML.
        overrides: ``{"launcher": {...}, "budget": {...}, "compute": {...}}`` from the command line.
    """
    if not Path(path).is_file():
        raise SpecError(f"sweep file {path!r} does not exist; valid: a YAML file such as configs/sweeps/demo.yaml")
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise SpecError(f"{path} is not valid YAML{at}: {getattr(err, 'problem', err)}") from None
    if not isinstance(raw, dict) or not raw:
        raise SpecError(f"{path} holds no sweep; valid: a mapping with name, configs, schemes, ...")
    parts = raw.pop("parts", None)
    if parts is None:
        parts = [{}]
    if not isinstance(parts, list) or not parts or not all(isinstance(p, dict) for p in parts):
        raise SpecError(f"parts in {path} must be a non-empty list of mappings")
    specs = [
        _build(
            {**copy.deepcopy(raw), **part}, f"{path}" + (f" part {i + 1}" if len(parts) > 1 else ""), overrides or {}
        )
        for i, part in enumerate(parts)
    ]
    for spec in specs:
        spec.source = path
    dirs = [(task_of(s), s.name, s.runs_root) for s in specs]
    if len(set(dirs)) != len(dirs):
        raise SpecError(f"two parts of {path} share one sweep directory <runs_root>/<task>/<name>; give them names")
    return specs


def _build(raw: dict, where: str, overrides: dict[str, dict]) -> SweepSpec:
    unknown = set(raw) - SPEC_KEYS
    if unknown:
        raise SpecError(f"unknown sweep keys {sorted(unknown)} ({where}); valid: {sorted(SPEC_KEYS | {'parts'})}")
    for key in ("name", "configs", "schemes"):
        if key not in raw:
            raise SpecError(f"{key} is missing ({where})")
    rest, multiples = split_protocol(raw.get("protocol"))
    protocol = parse_protocol(rest, raw, where)
    if protocol is not None and multiples is not None:  # only when given: a protocol without it is unchanged
        protocol[COMPUTE_KEY] = parse_compute_multiples(multiples, raw.get("baseline"), where)
    if protocol is not None:  # the grid's rates and seeds are the protocol's; which of them run, it decides
        raw = {**raw, "lrs": protocol["lrs"], "seeds": [*protocol["tuning_seeds"], *protocol["fresh_seeds"]]}
    kwargs: dict[str, Any] = {
        "name": check_name(raw["name"], "name", where),
        "configs": _strings(raw, "configs", where),
        "schemes": _strings(raw, "schemes", where),
        "overlays": _strings(raw, "overlays", where),
        "lrs": _numbers(raw, "lrs", where, float, positive=True),
        "warmups": _numbers(raw, "warmups", where, int, positive=False, minimum=0),
        "seeds": _numbers(raw, "seeds", where, int, positive=False, minimum=0),
        "args": _strings(raw, "args", where),
    }
    for key, kind in (("seed_data", bool), ("test", bool), ("metric", str), ("runs_root", str)):
        if key in raw:
            if not isinstance(raw[key], kind) or (kind is str and not raw[key]):
                raise SpecError(f"{key}={raw[key]!r} ({where}); valid: a {kind.__name__}")
            kwargs[key] = raw[key]
    if raw.get("baseline") is not None:
        kwargs["baseline"] = raw["baseline"]
    if "parallel" in raw:
        kwargs["parallel"] = _number(raw["parallel"], "parallel", where, int)
        if kwargs["parallel"] < 1:
            raise SpecError(f"parallel={raw['parallel']!r} must be >= 1 ({where})")
    if "progress_every_s" in raw:
        kwargs["progress_every_s"] = _number(raw["progress_every_s"], "progress_every_s", where, float)
        if kwargs["progress_every_s"] <= 0:
            raise SpecError(f"progress_every_s={raw['progress_every_s']!r} must be > 0 ({where})")
    kwargs["protocol"] = protocol
    kwargs["stages"] = parse_stages(raw.get("stages"), kwargs["seeds"], raw.get("baseline"), where)
    if kwargs["stages"] and protocol is not None:
        raise SpecError(f"stages beside protocol ({where}); valid: one of the two in a sweep")
    kwargs["last_evals"] = parse_last_evals(raw.get("last_evals"), raw.get("metric", "val/loss"), where)
    kwargs["margins"] = parse_margins(raw.get("margins"), where)
    given = overrides.get("budget", {})
    kwargs["budget"] = _budget({**_mapping(raw, "budget", where), **given}, where, given)
    launcher, given = _mapping(raw, "launcher", where), overrides.get("launcher", {})
    extra = {**_extra(launcher, where), **_extra(given, "command line --launcher")}
    kwargs["launcher"] = _launcher({**launcher, **given, **({"extra": extra} if extra else {})}, where, given)
    kwargs["compute"] = _compute({**_mapping(raw, "compute", where), **overrides.get("compute", {})}, where)
    kwargs["dataset"] = _dataset(_mapping(raw, "dataset", where), where)
    spec = SweepSpec(**kwargs)
    _check_grid(spec, where)
    return spec


def _where(key: str, given: dict, option: str, where: str) -> str:
    """Where a value came from: ``--budget`` on the command line, or the sweep file."""
    return f"command line {option}" if key in given else where


def _budget(budget: dict, where: str, given: dict | None = None) -> dict:
    given = given or {}
    unknown = set(budget) - set(BUDGET_KEYS)
    if unknown:
        origin = "command line --budget" if unknown & set(given) else where
        raise SpecError(f"unknown budget keys {sorted(unknown)} ({origin}); valid: one of {', '.join(BUDGET_KEYS)}")
    budget = {k: v for k, v in budget.items() if v is not None}
    if len(budget) > 1:
        raise SpecError(f"budget gives {sorted(budget)} ({where}); valid: one of {', '.join(BUDGET_KEYS)}")
    out = {}
    for key, value in budget.items():
        kind = int if key != "tokens" else float
        origin = _where(key, given, "--budget", where)
        out[key] = int(_number(value, f"budget.{key}", origin, kind, low=0, low_open=True))
    return out


def _extra(launcher: dict, where: str) -> dict:
    value = launcher.get("extra") or {}
    if not isinstance(value, dict):
        raise SpecError(
            f"launcher.extra={value!r} ({where}); valid: a mapping of #SBATCH options, e.g. extra.constraint=h100"
        )
    return value


# Strings the launcher writes into the sbatch script: one line each, or a value could add directives of its own.
_SCRIPT_KEY = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")


def _one_line(value: object, key: str, where: str) -> None:
    if isinstance(value, str) and ("\n" in value or "\r" in value):
        raise SpecError(f"launcher.{key}={value!r} spans several lines ({where}); valid: one line")


def _launcher(given: dict, where: str, command_line: dict | None = None) -> dict:
    command_line = command_line or {}

    def origin(key: str) -> str:
        return _where(key, command_line, "--launcher", where)

    unknown = set(given) - set(LAUNCHER_DEFAULTS)
    if unknown:
        raise SpecError(
            f"unknown launcher keys {sorted(unknown)} ({origin(sorted(unknown)[0])}); "
            f"valid: {', '.join(LAUNCHER_DEFAULTS)}"
        )
    launcher = {**copy.deepcopy(LAUNCHER_DEFAULTS), **given}
    if launcher["kind"] not in LAUNCHER_KINDS:
        raise SpecError(f"launcher.kind={launcher['kind']!r} ({origin('kind')}); valid: {', '.join(LAUNCHER_KINDS)}")
    if launcher["cluster"] not in CLUSTERS:
        raise SpecError(f"launcher.cluster={launcher['cluster']!r} ({origin('cluster')}); valid: {', '.join(CLUSTERS)}")
    for key in ("nodes", "gpus_per_node", "cpus_per_task", "timeout_min", "array_parallelism", "signal_delay_s",
                "max_requeues"):  # fmt: skip
        if launcher[key] is not None:
            low = 0 if key in ("gpus_per_node", "max_requeues") else 1
            launcher[key] = _number(launcher[key], f"launcher.{key}", origin(key), int, low=low)
    if launcher["mem_gb"] is not None:
        launcher["mem_gb"] = _number(
            launcher["mem_gb"], "launcher.mem_gb", origin("mem_gb"), float, low=0, low_open=True
        )
    if launcher["signal_delay_s"] >= 60 * launcher["timeout_min"]:
        raise SpecError(
            f"launcher.signal_delay_s={launcher['signal_delay_s']} must be below timeout_min "
            f"({origin('signal_delay_s')})"
        )
    for key in ("partition", "account", "qos"):
        if launcher[key] is not None and not isinstance(launcher[key], str):
            raise SpecError(f"launcher.{key}={launcher[key]!r} ({origin(key)}); valid: a string")
        _one_line(launcher[key], key, origin(key))
    launcher["setup"] = _strings(launcher, "setup", origin("setup"))
    for line in launcher["setup"]:
        _one_line(line, "setup", origin("setup"))
    for name, value in launcher["extra"].items():
        if not isinstance(name, str) or not _SCRIPT_KEY.fullmatch(name):
            raise SpecError(f"launcher.extra key {name!r} ({origin('extra')}); valid: an #SBATCH option name")
        if isinstance(value, dict | list) or (isinstance(value, float) and not math.isfinite(value)):
            raise SpecError(f"launcher.extra.{name}={value!r} ({origin('extra')}); valid: a string or a number")
        _one_line(value, f"extra.{name}", origin("extra"))
    return launcher


def _compute(given: dict, where: str) -> dict:
    unknown = set(given) - set(COMPUTE_DEFAULTS)
    if unknown:
        raise SpecError(f"unknown compute keys {sorted(unknown)} ({where}); valid: {', '.join(COMPUTE_DEFAULTS)}")
    compute = {**COMPUTE_DEFAULTS, **given}
    compute["peak_tflops"] = _number(compute["peak_tflops"], "compute.peak_tflops", where, float)
    compute["mfu"] = _number(compute["mfu"], "compute.mfu", where, float)
    if compute["peak_tflops"] <= 0 or not 0 < compute["mfu"] <= 1:
        raise SpecError(f"compute.peak_tflops must be > 0 and compute.mfu in (0, 1] ({where})")
    return compute


def _dataset(given: dict, where: str) -> dict:
    unknown = set(given) - set(DATASET_KEYS)
    if unknown:
        raise SpecError(f"unknown dataset keys {sorted(unknown)} ({where}); valid: {', '.join(DATASET_KEYS)}")
    return {k: _number(v, f"dataset.{k}", where, int) for k, v in given.items()}


def _check_grid(spec: SweepSpec, where: str) -> None:
    if not spec.schemes:
        raise SpecError(f"schemes is empty ({where}): the grid has no run; valid: one or more norm schemes")
    if not spec.configs and not spec.overlays:
        raise SpecError(f"configs and overlays are empty ({where}); valid: one or more task configs")
    variants = sorted(p.stem for p in NORM_OVERLAYS.glob("*.yaml") if p.stem not in set(NormScheme))
    for scheme in spec.schemes:
        if scheme not in NormScheme.__members__.values() and scheme not in variants:
            raise SpecError(f"unknown scheme {scheme!r} ({where}); valid: {', '.join([*NormScheme, *variants])}")
    if spec.baseline is not None and spec.baseline not in spec.schemes:
        raise SpecError(f"baseline {spec.baseline!r} ({where}) is not one of its schemes {spec.schemes}")
    for cfg in [*spec.configs, *spec.overlays]:
        if not Path(cfg).is_file():
            raise SpecError(f"config {cfg!r} named in {where} does not exist")
    runs = grid(spec)
    names = [r.name(spec) for r in runs]
    for name in names:
        check_name(name, "run name", where)
    seen: dict[str, Run] = {}
    for run, name in zip(runs, names, strict=True):
        if name in seen:
            raise SpecError(f"two grid points map to the run name {name!r} ({where}): {seen[name]} and {run}")
        seen[name] = run


@dataclass(frozen=True)
class Run:
    """One point of the grid; ``scheme`` is a scheme or a named variant of one (its norm overlay's name)."""

    scheme: str
    lr: float | None
    warmup: int | None
    seed: int | None
    overlay: str | None = None

    def name(self, spec: SweepSpec) -> str:
        parts = [self.scheme]
        if len(spec.overlays) > 1:
            parts.append(Path(self.overlay).stem)
        if len(spec.lrs) > 1:
            parts.append(f"lr{self.lr:g}")
        if len(spec.warmups) > 1:
            parts.append(f"wu{self.warmup}")
        if len(spec.seeds) > 1:
            parts.append(f"s{self.seed}")
        return "-".join(parts)

    def argv(self, spec: SweepSpec, sub: str = "fit", extra: list[str] | None = None) -> list[str]:
        """``python -m experiments <sub> ...``: the configs, the run's place and grid point, then ``extra``
        (the budget, the launcher's devices) and the spec's ``args`` last, so a spec can override anything."""
        argv = [sys.executable, "-m", "experiments", sub]
        overlays = [self.overlay] if self.overlay else []
        for cfg in [*spec.configs, *overlays, str(NORM_OVERLAYS / f"{self.scheme}.yaml")]:
            argv += ["-c", cfg]
        argv += [f"--runs_root={spec.runs_root}", f"--experiment={spec.name}", f"--run_name={self.name(spec)}"]
        argv.append(f"--hparams_columns=[{','.join(varied_columns(spec))}]")
        if self.lr is not None:
            argv.append(f"--model.init_args.optim.lr={self.lr}")
        if self.warmup is not None:
            argv.append(f"--model.init_args.optim.warmup_steps={self.warmup}")
        if self.seed is not None:
            argv.append(f"--seed_everything={self.seed}")
            if spec.seed_data:
                argv.append(f"--data.init_args.seed={self.seed}")
        return argv + list(extra or []) + list(spec.args)

    def record(self, spec: SweepSpec) -> dict:
        """What ``sweep.yaml`` keeps of the run: its name and its coordinates in the grid."""
        overlay = Path(self.overlay).stem if self.overlay else None
        return {
            "name": self.name(spec),
            "scheme": self.scheme,
            "overlay": overlay,
            "lr": self.lr,
            "warmup": self.warmup,
            "seed": self.seed,
        }


def varied_columns(spec: SweepSpec) -> list[str]:
    """The HPARAMS-tab columns of the grid's axes that take more than one value (the scheme always): what a
    user comparing the sweep's runs in TensorBoard needs to see, and nothing that is the same in every run.
    An overlay axis can change the shape, so it shows depth and width."""
    axes = [
        (spec.lrs, ["optim/lr"]),
        (spec.warmups, ["optim/warmup_steps"]),
        (spec.seeds, ["seed"]),
        (spec.overlays, ["trunk/depth", "trunk/dim"]),
    ]
    return ["norm_scheme", *(name for values, names in axes if len(values) > 1 for name in names)]


def grid(spec: SweepSpec) -> list[Run]:
    """Every run: schemes x overlays x lrs x warmups x seeds, seeds varying fastest."""
    return [
        Run(s, lr, wu, seed, overlay)
        for s, overlay, lr, wu, seed in itertools.product(
            spec.schemes, spec.overlays or [None], spec.lrs or [None], spec.warmups or [None], spec.seeds or [None]
        )
    ]


def task_of(spec: SweepSpec) -> str:
    """The short task name ("lm", "vit", ...) of the spec's first config that names a model class."""
    from experiments.reliability.layout import TASK_NAMES

    for cfg in [*spec.configs, *spec.overlays[:1]]:
        try:
            loaded = yaml.safe_load(Path(cfg).read_text()) or {}
        except (OSError, yaml.YAMLError) as err:
            raise SpecError(f"config {cfg!r} named in {spec.source or 'the sweep'} cannot be read: {err}") from None
        class_path = ((loaded if isinstance(loaded, dict) else {}).get("model") or {}).get("class_path", "")
        if class_path:
            return TASK_NAMES.get(class_path.rsplit(".", 1)[-1], "task")
    return "task"


def sweep_dir_of(spec: SweepSpec) -> Path:
    """``<runs_root>/<task>/<name>``: everything the sweep writes lies under it."""
    return Path(spec.runs_root) / task_of(spec) / spec.name


def parse_assignments(pairs: list[str] | None, what: str) -> dict[str, Any]:
    """``["nodes=2", "partition=gpu"]`` from ``--launcher`` / ``--budget`` / ``--compute`` as a mapping.

    Values are read as YAML (``2`` is an int, ``[a, b]`` a list); ``extra.constraint=h100`` sets a nested key.
    """
    out: dict[str, Any] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SpecError(f"--{what} {pair!r}; valid: KEY=VALUE, e.g. --{what} {_EXAMPLES[what]}")
        try:
            parsed = yaml.safe_load(value) if value else None
        except yaml.YAMLError:
            parsed = value
        head, _, tail = key.partition(".")
        if tail:
            out.setdefault(head, {})[tail] = parsed
        else:
            out[key] = parsed
    return out


_EXAMPLES = {"launcher": "partition=gpu", "budget": "tokens=2e9", "compute": "mfu=0.35"}
